//! Volumes, their snapshots and replicas through the API: each change has
//! the effect the same change made with `kubectl` has, and bad input is
//! refused before anything is written.

use oxhorn::api::replicas::ReplicaView;
use oxhorn::api::snapshots::SnapshotView;
use oxhorn::types::{CLONE_FOR, Snapshot, Volume, VolumeState};
use reqwest::Method;
use serde_json::{Value, json};

use super::{Client, READ, account_with, code, oxhorn};
use crate::common::{Cluster, MIB, require_root};

const EVERYTHING: &[&str] = &[
    "volumes",
    "snapshots",
    "replicas",
    "backups",
    "backuptargets",
];
const WRITE: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];

/// The status and body of `method` on `path` with `body`, as `token`.
async fn call(api: &Client, method: Method, path: &str, token: &str, body: Value) -> (u16, Value) {
    api.send(method, path, Some(token), Some(&body)).await
}

/// Every path the document names, with each placeholder filled in.
fn operations() -> Vec<(Method, String)> {
    let document = serde_json::to_value(oxhorn::api::openapi()).unwrap();
    let mut operations = vec![];
    for (path, item) in document["paths"].as_object().unwrap() {
        let path = path
            .replace("{name}", "x")
            .replace("{disk}", "d")
            .replace("{key}", "k")
            .replace("{snapshot}", "s");
        for method in item.as_object().unwrap().keys() {
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            operations.push((method, path.clone()));
        }
    }
    operations
}

/// No operation answers without a valid token, nor to a caller who may do
/// nothing: whatever the body, the refusal comes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_refuses_callers_without_a_token_or_the_right() {
    let cluster = Cluster::start("rest-all", 1).await;
    let nobody = account_with(&cluster, "nobody", &[]).await;
    let api = Client::new(&cluster);
    let operations = operations();
    assert!(operations.len() > 20, "{operations:?}");
    for (method, path) in operations {
        let (status, body) = api.send(method.clone(), &path, None, None).await;
        assert_eq!(
            (status, code(&body)),
            (401, "unauthenticated"),
            "{method} {path}"
        );
        for sent in [None, Some(json!({"bogus": true}))] {
            let (status, body) = api
                .send(method.clone(), &path, Some(&nobody), sent.as_ref())
                .await;
            assert_eq!(
                (status, code(&body)),
                (403, "forbidden"),
                "{method} {path}: {body}"
            );
        }
    }
}

/// A volume made, changed, attached, snapshotted, cloned, detached and
/// refused a salvage through the API is what the same changes with
/// `kubectl` make;
/// a read-only caller changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_is_made_and_changed_through_the_api_as_with_kubectl() {
    require_root();
    let cluster = Cluster::start("rest-vol", 1).await;
    let node = cluster.nodes[0].node_id().to_owned();
    let admin = account_with(&cluster, "admin", &[oxhorn(EVERYTHING, WRITE)]).await;
    let reader = account_with(&cluster, "reader", &[oxhorn(EVERYTHING, READ)]).await;
    let api = Client::new(&cluster);
    let post = Method::POST;

    // Made as kubectl would make it from the same fields.
    cluster.create_volume("by-kubectl", 16 * MIB, 1).await;
    let new = json!({"name": "by-api", "size": 16 * MIB, "numberOfReplicas": 1});
    let (status, body) = call(&api, post.clone(), "/v1/volumes", &admin, new.clone()).await;
    assert_eq!(status, 201, "{body}");
    let (by_api, by_kubectl) = (
        cluster.volume("by-api").await.unwrap(),
        cluster.volume("by-kubectl").await.unwrap(),
    );
    assert_eq!(by_api.spec, by_kubectl.spec);
    let (status, body) = call(&api, post.clone(), "/v1/volumes", &admin, new).await;
    assert_eq!((status, code(&body)), (409, "conflict"), "{body}");

    // Bad input: refused, and nothing is made.
    for bad in [
        json!({"name": "Not_A_Name", "size": MIB}),
        json!({"name": "odd", "size": 4097}),
        json!({"name": "nosize"}),
        json!({"name": "extra", "size": MIB, "colour": "red"}),
        json!({"name": "fe", "size": MIB, "frontend": "nbd"}),
        json!({"name": "many", "size": MIB, "numberOfReplicas": 50}),
        json!({"name": "src", "size": MIB, "fromBackup": "nope"}),
        json!("a string"),
    ] {
        let (status, body) = call(&api, post.clone(), "/v1/volumes", &admin, bad.clone()).await;
        assert_eq!((status, code(&body)), (400, "invalid"), "{bad}: {body}");
    }
    let request = reqwest::Client::new()
        .post(format!("{}/v1/volumes", api.base))
        .bearer_auth(&admin)
        .body("{\"name\": \"typeless\", \"size\": 4096}");
    let response = request.send().await.unwrap();
    assert_eq!(response.status().as_u16(), 400);
    let too_big = json!({"name": "big", "size": MIB, "nodeSelector": ["x".repeat(70_000)]});
    let (status, body) = call(&api, post.clone(), "/v1/volumes", &admin, too_big).await;
    assert_eq!((status, code(&body)), (413, "too_large"), "{body}");
    for name in ["many", "typeless", "big"] {
        assert!(cluster.volume(name).await.is_none(), "{name}");
    }

    // The reader changes nothing.
    for (method, path, body) in [
        (
            post.clone(),
            "/v1/volumes",
            json!({"name": "r", "size": MIB}),
        ),
        (
            Method::PATCH,
            "/v1/volumes/by-api",
            json!({"numberOfReplicas": 2}),
        ),
        (
            post.clone(),
            "/v1/volumes/by-api/attach",
            json!({"node": node}),
        ),
        (Method::DELETE, "/v1/volumes/by-api", json!({})),
    ] {
        let (status, body) = call(&api, method, path, &reader, body).await;
        assert_eq!((status, code(&body)), (403, "forbidden"), "{path}: {body}");
    }

    // Replicated and grown, as a patch of the spec would.
    let (status, body) = call(
        &api,
        Method::PATCH,
        "/v1/volumes/by-api",
        &admin,
        json!({"numberOfReplicas": 2}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["replicasWanted"], 2, "{body}");
    let (status, body) = call(
        &api,
        Method::PATCH,
        "/v1/volumes/by-api",
        &admin,
        json!({"numberOfReplicas": 0}),
    )
    .await;
    assert_eq!((status, code(&body)), (400, "invalid"), "{body}");
    cluster
        .until("the cache has the new replica count", || async {
            let (_, body) = api.get("/v1/volumes/by-api", Some(&reader)).await;
            (body["replicasWanted"] == 2).then_some(())
        })
        .await;
    let (status, body) = call(
        &api,
        Method::PATCH,
        "/v1/volumes/by-api",
        &admin,
        json!({"numberOfReplicas": 1}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    cluster
        .until("the cache has the replica count back", || async {
            let (_, body) = api.get("/v1/volumes/by-api", Some(&reader)).await;
            (body["replicasWanted"] == 1).then_some(())
        })
        .await;
    let expand = "/v1/volumes/by-api/expand";
    let (status, body) = call(&api, post.clone(), expand, &admin, json!({"size": 8 * MIB})).await;
    assert_eq!((status, code(&body)), (400, "invalid"), "{body}");
    let (status, body) = call(
        &api,
        post.clone(),
        expand,
        &admin,
        json!({"size": 32 * MIB}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(cluster.volume("by-api").await.unwrap().spec.size, 32 * MIB);

    // Attached where asked; nowhere else meanwhile.
    cluster
        .until("the cache has the new size", || async {
            let (_, body) = api.get("/v1/volumes/by-api", Some(&reader)).await;
            (body["size"] == 32 * MIB).then_some(())
        })
        .await;
    let attach = "/v1/volumes/by-api/attach";
    let (status, body) = call(
        &api,
        post.clone(),
        attach,
        &admin,
        json!({"node": "nowhere"}),
    )
    .await;
    assert_eq!((status, code(&body)), (400, "invalid"), "{body}");
    let (status, body) = call(&api, post.clone(), attach, &admin, json!({"node": node})).await;
    assert_eq!(status, 202, "{body}");
    cluster
        .until_volume("by-api", "attached through the API", |s| {
            s.state == VolumeState::Attached && s.current_node_id == node
        })
        .await;
    let (status, body) = call(
        &api,
        post.clone(),
        attach,
        &admin,
        json!({"node": "elsewhere"}),
    )
    .await;
    assert_eq!(status, 400, "{body}");

    // Its only replica holds its data: not deleted.
    let (status, body) = api.get("/v1/volumes/by-api/replicas", Some(&reader)).await;
    assert_eq!(status, 200, "{body}");
    let replicas: Vec<ReplicaView> = serde_json::from_value(body).unwrap();
    assert_eq!(replicas.len(), 1, "{replicas:?}");
    assert_eq!(replicas[0].node, node);
    let only = format!("/v1/replicas/{}", replicas[0].name);
    cluster
        .until("the replica serving the volume", || async {
            let (_, body) = api.get("/v1/volumes/by-api/replicas", Some(&reader)).await;
            (body[0]["mode"] == "RW").then_some(())
        })
        .await;
    let (status, body) = call(&api, Method::DELETE, &only, &admin, json!({})).await;
    assert_eq!((status, code(&body)), (409, "conflict"), "{body}");

    // Snapshots, as a chain.
    let snapshots = "/v1/volumes/by-api/snapshots";
    for name in ["first", "second"] {
        let (status, body) =
            call(&api, post.clone(), snapshots, &admin, json!({"name": name})).await;
        assert_eq!(status, 201, "{body}");
        cluster
            .until("the snapshot taken", || async {
                let (_, body) = api
                    .get(&format!("/v1/snapshots/{name}"), Some(&reader))
                    .await;
                (body["readyToUse"] == true).then_some(())
            })
            .await;
    }
    let (status, body) = call(&api, post.clone(), snapshots, &admin, json!({})).await;
    assert_eq!(status, 201, "{body}");
    let unnamed = body["name"].as_str().unwrap().to_owned();
    assert!(unnamed.starts_with("by-api-"), "{unnamed}");
    // In the order the engine took them (all three within a second, say).
    let wanted = [
        ("first", None),
        ("second", Some("first")),
        (unnamed.as_str(), Some("second")),
    ];
    cluster
        .until("three snapshots listed as a chain", || async {
            let (_, body) = api.get(snapshots, Some(&reader)).await;
            let listed: Vec<SnapshotView> = serde_json::from_value(body).unwrap();
            let chain: Vec<_> = listed
                .iter()
                .map(|s| (s.name.as_str(), s.parent.as_deref()))
                .collect();
            (chain == wanted).then_some(())
        })
        .await;

    // A clone: a snapshot of the source taken for it, filled from it.
    let (status, body) = call(
        &api,
        post.clone(),
        "/v1/volumes/by-api/clone",
        &admin,
        json!({"name": "copy"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let copy = cluster.volume("copy").await.unwrap();
    assert_eq!(copy.spec.size, 32 * MIB);
    let source = copy.spec.source_snapshot().unwrap().to_owned();
    let snapshot = cluster.api::<Snapshot>().get(&source).await.unwrap();
    assert_eq!(snapshot.spec.volume, "by-api");
    assert_eq!(snapshot.metadata.labels.unwrap()[CLONE_FOR], "copy");

    // Deleted snapshots go; detached as asked.
    let (status, body) = call(
        &api,
        Method::DELETE,
        "/v1/snapshots/second",
        &reader,
        json!({}),
    )
    .await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    let (status, body) = call(
        &api,
        Method::DELETE,
        "/v1/snapshots/second",
        &admin,
        json!({}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    cluster
        .until("the snapshot gone", || async {
            let gone = cluster
                .api::<Snapshot>()
                .get_opt("second")
                .await
                .unwrap()
                .is_none();
            gone.then_some(())
        })
        .await;
    let (status, body) = call(
        &api,
        post.clone(),
        "/v1/volumes/by-api/detach",
        &admin,
        json!({}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    cluster
        .until_volume("by-api", "detached through the API", |s| {
            s.state == VolumeState::Detached
        })
        .await;
    // Salvage is for a faulted volume only: it restarts the engine.
    let (status, body) = call(&api, post, "/v1/volumes/by-api/salvage", &admin, json!({})).await;
    assert_eq!((status, code(&body)), (409, "conflict"), "{body}");
    assert!(
        cluster
            .volume("by-api")
            .await
            .unwrap()
            .spec
            .salvage_request
            .is_empty()
    );
    // A volume with snapshots (which may back VolumeSnapshots), or being
    // cloned, is not deleted, as CSI would not.
    let (status, body) = call(
        &api,
        Method::DELETE,
        "/v1/volumes/by-api",
        &admin,
        json!({}),
    )
    .await;
    assert_eq!((status, code(&body)), (409, "conflict"), "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("cloned") || message.contains("snapshots"),
        "{message}"
    );

    for name in ["copy", "by-api", "by-kubectl"] {
        cluster.delete_volume(name).await;
    }
    let left = cluster
        .api::<Volume>()
        .list(&Default::default())
        .await
        .unwrap();
    assert!(left.items.is_empty());
}

/// A volume Kubernetes attached for a pod is not detached under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_kubernetes_attached_is_not_detached_through_the_api() {
    let cluster = Cluster::start("rest-held", 1).await;
    let admin = account_with(&cluster, "admin", &[oxhorn(EVERYTHING, WRITE)]).await;
    let api = Client::new(&cluster);
    cluster.create_volume("held", 16 * MIB, 1).await;
    cluster
        .patch_volume(
            "held",
            json!({"metadata": {"annotations": {"oxhorn.io/published-readonly": "false"}}}),
        )
        .await;
    cluster
        .until("the cache has the annotation", || async {
            let volume = cluster.volume("held").await?;
            volume
                .metadata
                .annotations?
                .get("oxhorn.io/published-readonly")?;
            Some(())
        })
        .await;
    let detach = "/v1/volumes/held/detach";
    let answer = cluster
        .until("the API sees it attached by Kubernetes", || async {
            let (status, body) = call(&api, Method::POST, detach, &admin, json!({})).await;
            (status == 409).then_some(body)
        })
        .await;
    assert!(
        answer["message"].as_str().unwrap().contains("for a pod"),
        "{answer}"
    );
    cluster.delete_volume("held").await;
}
