//! The manifests that install and uninstall Oxhorn (deploy/oxhorn.yaml,
//! deploy/uninstall.yaml): generated from their parts, and every object in
//! them accepted by a real API server. The example a user applies first
//! (examples/pvc-pod.yaml) claims the manifest's default StorageClass.

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use oxhorn_testbed as testbed;
use serde::Deserialize;

const MANIFEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/oxhorn.yaml");
const UNINSTALL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/uninstall.yaml");
const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/pvc-pod.yaml");
const README: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");

/// Held by a test that creates the manifest's namespace, oxhorn-system.
pub static OXHORN_SYSTEM: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[test]
fn the_manifest_is_what_its_parts_make() {
    let committed = std::fs::read_to_string(MANIFEST).unwrap();
    let generated = oxhorn::cmd::manifest::manifest_yaml().unwrap();
    assert!(
        committed == generated,
        "deploy/oxhorn.yaml is stale: run `cargo run -- manifest > deploy/oxhorn.yaml`"
    );
    let committed = std::fs::read_to_string(UNINSTALL).unwrap();
    let generated = oxhorn::cmd::manifest::uninstall_yaml().unwrap();
    assert!(
        committed == generated,
        "deploy/uninstall.yaml is stale: run `cargo run -- manifest --uninstall > deploy/uninstall.yaml`"
    );
}

/// examples/pvc-pod.yaml, the README's first volume: its claim is on the
/// manifest's default StorageClass, its pod mounts that claim, and the
/// README shows the file as it is.
#[test]
fn the_example_claims_the_default_storage_class() {
    let documents = |text: &str| -> Vec<serde_yaml_ng::Value> {
        serde_yaml_ng::Deserializer::from_str(text)
            .map(|document| serde_yaml_ng::Value::deserialize(document).unwrap())
            .collect()
    };
    let of_kind = |objects: &[serde_yaml_ng::Value], kind: &str| -> Vec<serde_yaml_ng::Value> {
        objects
            .iter()
            .filter(|o| o["kind"].as_str() == Some(kind))
            .cloned()
            .collect()
    };
    let manifest = documents(&std::fs::read_to_string(MANIFEST).unwrap());
    let default_classes: Vec<_> = of_kind(&manifest, "StorageClass")
        .into_iter()
        .filter(|class| {
            class["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"].as_str()
                == Some("true")
        })
        .collect();
    let [default_class] = default_classes.as_slice() else {
        panic!(
            "the manifest has {} default StorageClasses",
            default_classes.len()
        );
    };
    let text = std::fs::read_to_string(EXAMPLE).unwrap();
    let example = documents(&text);
    let [claim] = of_kind(&example, "PersistentVolumeClaim")
        .try_into()
        .unwrap();
    let [pod] = of_kind(&example, "Pod").try_into().unwrap();
    assert_eq!(
        claim["spec"]["storageClassName"],
        default_class["metadata"]["name"]
    );
    assert_eq!(
        pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
        claim["metadata"]["name"]
    );
    let yaml = &text[text.find("apiVersion").unwrap()..];
    assert!(
        std::fs::read_to_string(README).unwrap().contains(yaml),
        "README.md's first volume differs from examples/pvc-pod.yaml: copy the file's YAML from its first `apiVersion:` on"
    );
}

/// The kinds and names of the objects in the manifest, in order.
fn objects(manifest: &str) -> Vec<(String, String)> {
    serde_yaml_ng::Deserializer::from_str(manifest)
        .filter_map(|document| {
            let value = serde_yaml_ng::Value::deserialize(document).ok()?;
            let kind = value.get("kind")?.as_str()?.to_string();
            let name = value.get("metadata")?.get("name")?.as_str()?.to_string();
            Some((kind, name))
        })
        .collect()
}

/// A server-side dry run of both manifests: the API server validates
/// every object (schemas, RBAC rules, references to priority classes and
/// kinds) without keeping any. Its namespace exists for real meanwhile.
#[tokio::test]
async fn every_object_is_accepted_by_the_api_server() {
    let _turn = OXHORN_SYSTEM.lock().await;
    let control_plane = testbed::shared();
    testbed::sidecars::apply_snapshot_crds(control_plane)
        .await
        .unwrap();
    let namespaces: Api<Namespace> = Api::all(control_plane.client().unwrap());
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "oxhorn-system"}})).unwrap();
    let created = namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .is_ok();

    let output = control_plane
        .kubectl(&[
            "apply",
            "--server-side",
            "--dry-run=server",
            "--field-manager=oxhorn-install-test",
            "-f",
            MANIFEST,
            "-f",
            UNINSTALL,
        ])
        .unwrap();
    if created {
        namespaces
            .delete("oxhorn-system", &DeleteParams::default())
            .await
            .unwrap();
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "kubectl apply refused the manifest:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let manifest = std::fs::read_to_string(MANIFEST).unwrap();
    let uninstall = std::fs::read_to_string(UNINSTALL).unwrap();
    let objects = [objects(&manifest), objects(&uninstall)].concat();
    for (kind, name) in &objects {
        let applied = stdout.lines().any(|line| {
            line.to_lowercase().starts_with(&kind.to_lowercase())
                && line.contains(&format!("/{name} "))
        });
        assert!(applied, "{kind} {name} not applied:\n{stdout}");
    }
    let kinds: Vec<&str> = objects.iter().map(|(k, _)| k.as_str()).collect();
    for kind in [
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "Role",
        "DaemonSet",
        "Deployment",
        "CSIDriver",
        "StorageClass",
        "VolumeSnapshotClass",
        "Job",
    ] {
        assert!(kinds.contains(&kind), "no {kind} in the manifests");
    }
}
