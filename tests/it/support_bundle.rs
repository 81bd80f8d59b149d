//! `oxhorn support-bundle`, the binary as a user runs it, against the
//! real API server: a volume with an iSCSI CHAP Secret and a backup
//! target with a credential Secret, both holding one unique planted value,
//! which also sits where a careless collector would pick it up (an
//! annotation of the volume, an env literal of a pod, an event's
//! message, the last-applied configuration of a Secret). The bundle lists
//! every oxhorn.io kind, the Kubernetes objects and the events; its
//! summary says what failed (the logs of a pod no node runs); and no file
//! holds the planted value, in plain or base64, nor the cluster's
//! data-plane key. The real pods' logs are checked on the main job's
//! cluster (`local_cluster.rs`).

use std::collections::BTreeMap;
use std::process::Command;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::core::v1::{Event, Pod, Secret, ServiceAccount};
use oxhorn::support_bundle::OXHORN_RESOURCES;
use oxhorn::types::{BackupTarget, Volume};
use serde_json::json;

use crate::common::{Cluster, MIB, OXHORN};

/// A bundle's files, by their path under its root directory.
pub fn unpack(archive: &[u8]) -> BTreeMap<String, Vec<u8>> {
    let gunzipped = flate2::read::GzDecoder::new(archive);
    let mut tar = tar::Archive::new(gunzipped);
    let mut files = BTreeMap::new();
    let mut root = None;
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        let (top, rest) = path.split_once('/').expect("every file under the root");
        assert!(top.starts_with("oxhorn-support-bundle-"), "{path}");
        assert_eq!(root.get_or_insert(top.to_owned()), top, "{path}");
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
        files.insert(rest.to_owned(), data);
    }
    files
}

/// The files of `files` holding any of `needles`, and which.
pub fn holding(files: &BTreeMap<String, Vec<u8>>, needles: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, data) in files {
        for needle in needles {
            if data.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                found.push(format!("{path}: {needle}"));
            }
        }
    }
    found
}

/// A value no other test writes, long enough to be scrubbed.
pub fn planted(ns: &str) -> String {
    format!("planted-{ns}-{:016x}", fastrand::u64(..))
}

/// The YAML file `path` of `files`.
pub fn yaml(files: &BTreeMap<String, Vec<u8>>, path: &str) -> serde_json::Value {
    serde_yaml_ng::from_str(&text(files, path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

pub fn text(files: &BTreeMap<String, Vec<u8>>, path: &str) -> String {
    let data = files
        .get(path)
        .unwrap_or_else(|| panic!("no {path} in {:?}", files.keys()));
    String::from_utf8_lossy(data).into_owned()
}

async fn create<K>(cluster: &Cluster, object: serde_json::Value)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object).unwrap();
    cluster.create(&object).await;
}

fn support_bundle(args: &[&str]) -> std::process::Output {
    Command::new(OXHORN)
        .arg("support-bundle")
        .arg("--kubeconfig")
        .arg(oxhorn_testbed::shared().kubeconfig())
        .args(args)
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_support_bundle_lists_everything_and_holds_no_secret() {
    let cluster = Cluster::start("bundle", 1).await;
    let ns = cluster.ns.name();
    let secret = planted(ns);
    // Not a Secret's value: redacted by its env var's name alone.
    let literal = planted(ns);
    let last_applied = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "bundle-creds"},
        "stringData": {"AWS_SECRET_ACCESS_KEY": secret}});
    create::<Secret>(
        &cluster,
        json!({
            "metadata": {"name": "bundle-creds", "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": last_applied.to_string()}},
            "stringData": {
                "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEBUNDLE",
                "AWS_SECRET_ACCESS_KEY": secret,
                // Nothing listens there: the target fails its syncs.
                "AWS_ENDPOINTS": "http://127.0.0.1:9",
            },
        }),
    )
    .await;
    create::<Secret>(
        &cluster,
        json!({
            "metadata": {"name": "bundle-chap"},
            "type": "kubernetes.io/iscsi-chap",
            "stringData": {
                "node.session.auth.username": "initiator",
                "node.session.auth.password": secret,
            },
        }),
    )
    .await;
    create::<BackupTarget>(
        &cluster,
        json!({"metadata": {"name": "bundle-target"}, "spec": {
            "backupTargetURL": "s3://bundle@us-east-1/", "credentialSecret": "bundle-creds"}}),
    )
    .await;
    create::<Volume>(
        &cluster,
        json!({
            "metadata": {"name": "bundle-vol", "annotations": {"example.com/note": secret}},
            "spec": {"size": 16 * MIB, "numberOfReplicas": 1, "frontend": "iscsi",
                     "chapSecret": "bundle-chap"},
        }),
    )
    .await;
    // On a node whose kubelet is not there: its logs cannot be read. (No
    // controller makes the namespace's default ServiceAccount, which a
    // pod needs.)
    create::<ServiceAccount>(&cluster, json!({"metadata": {"name": "default"}})).await;
    create::<Pod>(
        &cluster,
        json!({
            "metadata": {"name": "careless"},
            "spec": {"nodeName": cluster.nodes[0].node_id(), "automountServiceAccountToken": false, "containers": [{"name": "main", "image": "busybox", "env": [
                {"name": "NOTE", "value": secret},
                {"name": "AWS_SECRET_ACCESS_KEY", "value": literal},
            ]}]},
        }),
    )
    .await;
    create::<Event>(
        &cluster,
        json!({
            "metadata": {"name": "bundle-vol.planted"},
            "involvedObject": {"apiVersion": "oxhorn.io/v1beta1", "kind": "Volume",
                               "name": "bundle-vol", "namespace": ns},
            "reason": "Planted", "type": "Normal",
            "message": format!("a careless message with {secret} in it"),
        }),
    )
    .await;
    let key = cluster
        .api::<Secret>()
        .get(oxhorn::controller::KEY_SECRET)
        .await
        .unwrap();
    let key: Vec<String> = key
        .data
        .unwrap()
        .into_values()
        .map(|v| STANDARD.encode(v.0))
        .collect();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bundle.tar.gz");
    let output = support_bundle(&["-n", ns, "--since", "1h", "-o", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let files = unpack(&std::fs::read(&path).unwrap());
    let summary = text(&files, "summary.txt");
    assert!(
        stderr.contains("not collected: logs/careless/main.log"),
        "{stderr}\n{summary}"
    );

    // Every kind, the Kubernetes objects, the events, and the summary.
    for resource in OXHORN_RESOURCES {
        assert!(
            files.contains_key(&format!("resources/{resource}.yaml")),
            "{resource}: {:?}",
            files.keys()
        );
    }
    for file in [
        "nodes",
        "pods",
        "secrets",
        "csinodes",
        "storageclasses",
        "persistentvolumes",
        "leases",
    ] {
        assert!(
            files.contains_key(&format!("kubernetes/{file}.yaml")),
            "{file}: {:?}",
            files.keys()
        );
    }
    let volumes = yaml(&files, "resources/volumes.yaml");
    let volume = &volumes["items"][0];
    assert_eq!(volume["kind"], "Volume", "{volumes}");
    assert_eq!(
        (&volume["metadata"]["name"], &volume["spec"]["chapSecret"]),
        (&json!("bundle-vol"), &json!("bundle-chap"))
    );
    let targets = yaml(&files, "resources/backuptargets.yaml");
    assert_eq!(
        targets["items"][0]["spec"]["credentialSecret"], "bundle-creds",
        "{targets}"
    );
    let events = yaml(&files, "events.yaml");
    let reasons: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert!(reasons.contains(&"Planted"), "{reasons:?}");
    let secrets = yaml(&files, "kubernetes/secrets.yaml");
    let creds = secrets["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "bundle-creds");
    assert_eq!(
        creds.map(|s| &s["keys"]),
        Some(&json!([
            "AWS_ACCESS_KEY_ID",
            "AWS_ENDPOINTS",
            "AWS_SECRET_ACCESS_KEY"
        ])),
        "{secrets}"
    );
    let settings = yaml(&files, "settings.yaml");
    let minimal = settings["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == "storage-minimal-available-percentage");
    assert_eq!(
        minimal.map(|s| (&s["value"], &s["set"])),
        Some((&json!("1"), &json!(true))),
        "{settings}"
    );
    assert_eq!(
        yaml(&files, "versions.yaml")["oxhorn"],
        env!("CARGO_PKG_VERSION")
    );
    let pods = yaml(&files, "kubernetes/pods.yaml");
    let env = &pods["items"][0]["spec"]["containers"][0]["env"];
    assert_eq!(
        env[1],
        json!({"name": "AWS_SECRET_ACCESS_KEY", "value": "<redacted>"}),
        "{pods}"
    );
    assert!(
        summary.contains("FAILED   logs/careless/main.log"),
        "{summary}"
    );
    assert!(
        summary.contains("ok       resources/volumes.yaml: 1 objects"),
        "{summary}"
    );
    assert!(
        summary.contains("of the namespace's 3 Secrets"),
        "{summary}"
    );
    for path in files.keys().filter(|p| *p != "summary.txt") {
        assert!(
            summary.contains(&format!("  {path}\n")),
            "{path} not listed:\n{summary}"
        );
    }

    // Nothing secret, in any form, anywhere.
    let base64 = STANDARD.encode(&secret);
    let mut needles = vec![secret.as_str(), base64.as_str(), literal.as_str()];
    needles.extend(key.iter().map(String::as_str));
    let leaks = holding(&files, &needles);
    assert!(leaks.is_empty(), "{leaks:?}");

    // An existing file is never overwritten.
    let again = support_bundle(&["-n", ns, "-o", path.to_str().unwrap()]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("exists"),
        "{again:?}"
    );
    assert_eq!(unpack(&std::fs::read(&path).unwrap()).len(), files.len());

    cluster.delete_volume("bundle-vol").await;
}
