//! `GET /v1/support-bundle`: a caller bound to the manifest's two support
//! bundle roles (deploy/parts/13-rbac-users.yaml) gets the tar.gz, with
//! every oxhorn.io kind, the Secret values of the namespace scrubbed and
//! their names left out (the roles do not list Secrets); a caller who may
//! read oxhorn's objects but not the pods' logs is refused, naming what
//! is missing; a bad `since` is refused.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use super::{Client, READ, account_with, code, oxhorn};
use crate::common::Cluster;
use crate::support_bundle::{holding, planted, text, unpack};

/// The manifest's ClusterRole `name`, as JSON.
fn shipped_role(name: &str) -> Value {
    let part = include_str!("../../../deploy/parts/13-rbac-users.yaml");
    serde_yaml_ng::Deserializer::from_str(part)
        .map(|document| serde::Deserialize::deserialize(document).unwrap())
        .find(|role: &Value| role["kind"] == "ClusterRole" && role["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no ClusterRole {name} in 13-rbac-users.yaml"))
}

/// Binds the test namespace's `account` as the docs say: the first
/// role in the namespace, the second cluster-wide, each a copy of the
/// manifest's named after the namespace. The cluster-wide objects' name,
/// for the caller to delete.
async fn bind_support_roles(cluster: &Cluster, account: &str) -> String {
    let ns = cluster.ns.name();
    let name = format!("{ns}-support-bundle");
    let post = PostParams::default();
    let roles: Api<ClusterRole> = Api::all(cluster.client.clone());
    let subject = json!([{"kind": "ServiceAccount", "name": account, "namespace": ns}]);
    for (shipped, copy) in [
        ("oxhorn-support-bundle", name.clone()),
        ("oxhorn-support-bundle-cluster", format!("{name}-cluster")),
    ] {
        let mut role = shipped_role(shipped);
        role["metadata"] = json!({"name": copy});
        roles
            .create(&post, &serde_json::from_value(role).unwrap())
            .await
            .unwrap();
    }
    let role_ref = |role: &str| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role});
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name}, "roleRef": role_ref(&name), "subjects": subject}))
    .unwrap();
    cluster
        .api::<RoleBinding>()
        .create(&post, &binding)
        .await
        .unwrap();
    let cluster_role = format!("{name}-cluster");
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": cluster_role}, "roleRef": role_ref(&cluster_role), "subjects": subject}))
    .unwrap();
    Api::<ClusterRoleBinding>::all(cluster.client.clone())
        .create(&post, &binding)
        .await
        .unwrap();
    name
}

async fn unbind_support_roles(cluster: &Cluster, name: &str) {
    let delete = DeleteParams::default();
    let cluster_role = format!("{name}-cluster");
    Api::<ClusterRoleBinding>::all(cluster.client.clone())
        .delete(&cluster_role, &delete)
        .await
        .unwrap();
    let roles: Api<ClusterRole> = Api::all(cluster.client.clone());
    for role in [name, cluster_role.as_str()] {
        roles.delete(role, &delete).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_streams_a_bundle_to_whom_may_read_all_it_holds() {
    let cluster = Cluster::start("bundle-api", 1).await;
    let ns = cluster.ns.name();
    let value = planted(ns);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "bundle-creds"}, "stringData": {"AWS_SECRET_ACCESS_KEY": value}}))
    .unwrap();
    cluster
        .api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    cluster.create_volume("bundle-vol", 16 << 20, 1).await;
    cluster
        .patch_volume(
            "bundle-vol",
            json!({"metadata": {"annotations": {"note": value}}}),
        )
        .await;
    let support = account_with(&cluster, "support", &[]).await;
    let roles = bind_support_roles(&cluster, "support").await;
    let viewer = account_with(
        &cluster,
        "viewer",
        &[oxhorn(oxhorn::support_bundle::OXHORN_RESOURCES, READ)],
    )
    .await;
    let api = Client::new(&cluster);

    let (status, body) = api.get("/v1/support-bundle", Some(&viewer)).await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains(":viewer may not list pods"), "{message}");
    let (status, body) = api
        .get("/v1/support-bundle?since=soon", Some(&support))
        .await;
    assert_eq!((status, code(&body)), (400, "invalid"), "{body}");

    let (status, headers, archive) = api.get_bytes("/v1/support-bundle?since=1h", &support).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&archive));
    assert_eq!(headers["content-type"], "application/gzip");
    let disposition = headers["content-disposition"].to_str().unwrap();
    assert!(
        disposition.starts_with("attachment; filename=\"oxhorn-support-bundle-"),
        "{disposition}"
    );
    let files = unpack(&archive);
    let summary = text(&files, "summary.txt");
    assert!(
        summary.contains(&format!("for system:serviceaccount:{ns}:support")),
        "{summary}"
    );
    assert!(
        summary.contains("skipped  kubernetes/secrets.yaml"),
        "{summary}"
    );
    assert!(text(&files, "resources/volumes.yaml").contains("bundle-vol"));
    for resource in oxhorn::support_bundle::OXHORN_RESOURCES {
        assert!(
            files.contains_key(&format!("resources/{resource}.yaml")),
            "{resource}"
        );
    }
    let base64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &value);
    let leaks = holding(&files, &[&value, &base64]);
    assert!(leaks.is_empty(), "{leaks:?}");

    unbind_support_roles(&cluster, &roles).await;
    cluster.delete_volume("bundle-vol").await;
}
