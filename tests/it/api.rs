//! oxhorn's custom resources on a real kube-apiserver: every kind round-trips,
//! status goes only through the status subresource, bad specs are refused with
//! messages a user can act on, and kubectl shows the printer columns.

use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use oxhorn::types::*;
use oxhorn_testbed::{self as testbed, TestNamespace};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const GIB: i64 = 1 << 30;

fn instance(volume: &str) -> InstanceSpec {
    InstanceSpec {
        volume_name: volume.into(),
        volume_size: GIB,
        node_id: "node-1".into(),
        desire_state: DesireState::Running,
        image: String::new(),
    }
}

/// Whether `actual` holds everything in `expected`; objects may have more
/// keys (the API server fills in defaults).
fn contains(actual: &Value, expected: &Value) -> bool {
    match (actual, expected) {
        (Value::Object(actual), Value::Object(expected)) => expected
            .iter()
            .all(|(key, value)| actual.get(key).is_some_and(|a| contains(a, value))),
        (Value::Array(actual), Value::Array(expected)) => {
            actual.len() == expected.len()
                && actual.iter().zip(expected).all(|(a, e)| contains(a, e))
        }
        _ => actual == expected,
    }
}

/// Creates `object`, reads it back, changes its spec with `edit`, writes a
/// status through the subresource, and checks that a status sent to the main
/// resource is ignored.
async fn round_trip<K>(api: &Api<K>, object: K, edit: impl Fn(&mut K), status: Value)
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned,
{
    let name = object.name_any();
    let created = api.create(&PostParams::default(), &object).await.unwrap();
    assert!(created.meta().uid.is_some());

    let mut changed = api.get(&name).await.unwrap();
    edit(&mut changed);
    let replaced = api
        .replace(&name, &PostParams::default(), &changed)
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_value(&replaced).unwrap()["spec"],
        serde_json::to_value(&changed).unwrap()["spec"],
        "{name}: spec update did not stick"
    );

    let patch = Patch::Merge(json!({ "status": status }));
    api.patch_status(&name, &PatchParams::default(), &patch)
        .await
        .unwrap();
    let read = serde_json::to_value(api.get_status(&name).await.unwrap()).unwrap();
    assert!(
        contains(&read["status"], &status),
        "{name}: wrote status {status}, read back {}",
        read["status"]
    );

    // The main resource ignores status: only the owning controller writes it.
    let ignored = json!({ "status": { "ownerID": "intruder" } });
    let after = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&ignored))
        .await
        .unwrap();
    assert_ne!(
        serde_json::to_value(&after).unwrap()["status"]["ownerID"],
        "intruder"
    );
    api.delete(&name, &Default::default()).await.unwrap();
}

#[tokio::test]
async fn every_kind_round_trips_with_status_through_the_subresource() {
    let control_plane = testbed::shared();
    let ns = TestNamespace::create(control_plane, "round-trip")
        .await
        .unwrap();
    let client = control_plane.client().unwrap();

    let volume = Volume::new(
        "vol-a",
        VolumeSpec {
            size: GIB,
            number_of_replicas: 3,
            frontend: VolumeFrontend::Fuse,
            chap_secret: String::new(),
            node_id: String::new(),
            data_locality: DataLocality::BestEffort,
            stale_replica_timeout: 30,
            from_backup: String::new(),
            salvage_request: String::new(),
            disk_selector: vec!["ssd".into()],
            node_selector: vec![],
            replica_auto_balance: ReplicaAutoBalance::Ignored,
            access_mode: AccessMode::Rwo,
            data_source: None,
            revert: None,
            standby: false,
        },
    );
    round_trip(
        &Api::namespaced(client.clone(), ns.name()),
        volume,
        |v: &mut Volume| {
            v.spec.node_id = "node-1".into();
            v.spec.size = 2 * GIB;
        },
        json!({"ownerID": "node-1", "state": "attached", "robustness": "healthy",
               "currentNodeID": "node-1", "actualSize": 4096,
               "conditions": [{"type": "Scheduled", "status": "True", "reason": "ReplicasScheduled"}]}),
    )
    .await;

    let engine = Engine::new(
        "vol-a-e-0",
        EngineSpec {
            instance: instance("vol-a"),
            replica_address_map: BTreeMap::from([("vol-a-r-1".into(), "127.0.0.1:10000".into())]),
            frontend: Frontend::Fuse,
            chap_secret: String::new(),
            generation: 0,
            salvage: false,
            salvage_request: String::new(),
        },
    );
    round_trip(
        &Api::namespaced(client.clone(), ns.name()),
        engine,
        |e: &mut Engine| e.spec.instance.desire_state = DesireState::Stopped,
        json!({"ownerID": "node-1", "currentState": "running", "port": 10010, "started": true,
               "replicaModeMap": {"vol-a-r-1": "RW"}, "endpoint": "/dev/oxhorn/vol-a",
               "rebuildStatus": {"127.0.0.1:10000": {"isRebuilding": true, "progress": 42}}}),
    )
    .await;

    let replica = Replica::new(
        "vol-a-r-1",
        ReplicaSpec {
            instance: instance("vol-a"),
            engine_name: "vol-a-e-0".into(),
            disk_id: "fsid-1".into(),
            disk_path: "/var/lib/oxhorn".into(),
            data_directory_name: "vol-a-1a2b3c".into(),
            healthy_at: None,
            failed_at: None,
            rejoins: 0,
        },
    );
    round_trip(
        &Api::namespaced(client.clone(), ns.name()),
        replica,
        |r: &mut Replica| r.spec.instance.node_id = "node-2".into(),
        json!({"ownerID": "node-2", "currentState": "running", "ip": "127.0.0.1", "port": 10000}),
    )
    .await;

    let node = Node::new(
        "node-1",
        NodeSpec {
            disks: BTreeMap::from([(
                "default".into(),
                DiskSpec {
                    path: "/var/lib/oxhorn".into(),
                    allow_scheduling: true,
                    storage_reserved: GIB,
                    tags: vec!["ssd".into()],
                    eviction_requested: false,
                },
            )]),
            allow_scheduling: true,
            tags: vec![],
            eviction_requested: false,
        },
    );
    round_trip(
        &Api::namespaced(client.clone(), ns.name()),
        node,
        |n: &mut Node| n.spec.allow_scheduling = false,
        json!({"ownerID": "node-1", "zone": "zone-a",
               "diskStatus": {"default": {"storageMaximum": 10 * GIB, "storageAvailable": 5 * GIB, "fsid": "fsid-1"}}}),
    )
    .await;

    let setting = Setting::new("default-replica-count", SettingSpec { value: "3".into() });
    round_trip(
        &Api::namespaced(client, ns.name()),
        setting,
        |s: &mut Setting| s.spec.value = "2".into(),
        json!({"applied": true}),
    )
    .await;
}

#[tokio::test]
async fn defaults_are_applied_by_the_api_server() {
    let control_plane = testbed::shared();
    let ns = TestNamespace::create(control_plane, "defaults")
        .await
        .unwrap();
    let volumes = dynamic::<Volume>(control_plane, ns.name());
    let minimal = object::<Volume>("minimal", json!({"size": GIB}));
    let created = volumes
        .create(&PostParams::default(), &minimal)
        .await
        .unwrap();
    let spec = &created.data["spec"];
    assert_eq!(spec["numberOfReplicas"], 3);
    assert_eq!(spec["frontend"], "auto");
    assert_eq!(spec["chapSecret"], "");
    assert_eq!(spec["dataLocality"], "disabled");
    assert_eq!(spec["accessMode"], "rwo");
    assert_eq!(spec["staleReplicaTimeout"], 2880);
    assert_eq!(spec["nodeID"], "");
}

fn dynamic<K: Resource<DynamicType = ()>>(
    control_plane: &testbed::ControlPlane,
    namespace: &str,
) -> Api<DynamicObject> {
    Api::namespaced_with(
        control_plane.client().unwrap(),
        namespace,
        &ApiResource::erase::<K>(&()),
    )
}

fn object<K: Resource<DynamicType = ()>>(name: &str, spec: Value) -> DynamicObject {
    let resource = ApiResource::erase::<K>(&());
    DynamicObject::new(name, &resource).data(json!({ "spec": spec }))
}

/// Creates `object` and returns the API server's refusal.
async fn refusal(api: &Api<DynamicObject>, object: &DynamicObject) -> String {
    match api.create(&PostParams::default(), object).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{}", status.message);
            status.message
        }
        other => panic!("{} was accepted: {other:?}", object.name_any()),
    }
}

#[tokio::test]
async fn invalid_specs_are_refused_with_clear_messages() {
    let control_plane = testbed::shared();
    let ns = TestNamespace::create(control_plane, "invalid")
        .await
        .unwrap();
    let volumes = dynamic::<Volume>(control_plane, ns.name());

    let cases = [
        (
            json!({"size": -1}),
            "spec.size: Invalid value: -1: spec.size in body should be greater than or equal to 4096",
        ),
        (
            json!({"size": 5000}),
            "size must be a whole number of 4096-byte blocks",
        ),
        (
            json!({"size": GIB, "frontend": "nbd"}),
            "spec.frontend: Unsupported value: \"nbd\": supported values: \"fuse\", \"iscsi\", \"auto\"",
        ),
        (
            json!({"size": GIB, "frontend": "fuse", "chapSecret": "chap"}),
            "chapSecret authenticates iSCSI logins; frontend fuse has none",
        ),
        (
            json!({"size": GIB, "chapSecret": "../chap"}),
            "spec.chapSecret in body should match",
        ),
        (json!({"numberOfReplicas": 2}), "spec.size: Required value"),
        (
            json!({"size": GIB, "numberOfReplicas": 0}),
            "spec.numberOfReplicas in body should be greater than or equal to 1",
        ),
        (
            json!({"size": GIB, "dataLocality": "nearby"}),
            "spec.dataLocality: Unsupported value: \"nearby\"",
        ),
        (
            json!({"size": GIB, "salvageRequest": "x".repeat(254)}),
            "spec.salvageRequest: Too long: may not be more than 253",
        ),
    ];
    for (i, (spec, expected)) in cases.into_iter().enumerate() {
        let message = refusal(
            &volumes,
            &object::<Volume>(&format!("bad-{i}"), spec.clone()),
        )
        .await;
        assert!(message.contains(expected), "{spec}: {message}");
    }

    let nodes = dynamic::<Node>(control_plane, ns.name());
    let relative = object::<Node>(
        "node-x",
        json!({"disks": {"d": {"path": "var/lib/oxhorn"}}}),
    );
    let message = refusal(&nodes, &relative).await;
    assert!(message.contains("disk path must be absolute"), "{message}");

    let replicas = dynamic::<Replica>(control_plane, ns.name());
    let escaping = object::<Replica>(
        "r-x",
        json!({"volumeName": "v", "volumeSize": GIB, "dataDirectoryName": "../../etc"}),
    );
    let message = refusal(&replicas, &escaping).await;
    assert!(
        message.contains("spec.dataDirectoryName in body should match"),
        "{message}"
    );

    let engines = dynamic::<Engine>(control_plane, ns.name());
    let message = refusal(
        &engines,
        &object::<Engine>("e-x", json!({"volumeSize": GIB})),
    )
    .await;
    assert!(
        message.contains("spec.volumeName: Required value"),
        "{message}"
    );
}

#[tokio::test]
async fn a_volume_cannot_shrink() {
    let control_plane = testbed::shared();
    let ns = TestNamespace::create(control_plane, "shrink")
        .await
        .unwrap();
    let volumes = dynamic::<Volume>(control_plane, ns.name());
    volumes
        .create(
            &PostParams::default(),
            &object::<Volume>("v", json!({"size": 2 * GIB})),
        )
        .await
        .unwrap();
    let grow = Patch::Merge(json!({"spec": {"size": 3 * GIB}}));
    volumes
        .patch("v", &PatchParams::default(), &grow)
        .await
        .unwrap();
    let shrink = Patch::Merge(json!({"spec": {"size": GIB}}));
    match volumes.patch("v", &PatchParams::default(), &shrink).await {
        Err(kube::Error::Api(status)) => {
            assert!(
                status.message.contains("size cannot shrink"),
                "{}",
                status.message
            )
        }
        other => panic!("shrinking was accepted: {other:?}"),
    }
}

/// Runs kubectl and returns its stdout, failing the test on a non-zero exit.
fn kubectl(args: &[&str]) -> String {
    let output = testbed::shared().kubectl(args).unwrap();
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test]
async fn kubectl_shows_the_printer_columns() {
    let control_plane = testbed::shared();
    let ns = TestNamespace::create(control_plane, "columns")
        .await
        .unwrap();
    let volumes: Api<Volume> = Api::namespaced(control_plane.client().unwrap(), ns.name());
    let mut volume = Volume::new(
        "shown",
        serde_json::from_value(json!({"size": GIB})).unwrap(),
    );
    volume = volumes
        .create(&PostParams::default(), &volume)
        .await
        .unwrap();
    let status = json!({"status": {"state": "attached", "robustness": "degraded", "currentNodeID": "node-2"}});
    volumes
        .patch_status(
            &volume.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .unwrap();

    let table = kubectl(&["get", "volumes.oxhorn.io", "-n", ns.name()]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "STATE",
            "ROBUSTNESS",
            "REPLICAS",
            "SIZE",
            "NODE",
            "AGE"
        ]
    );
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        &row[..6],
        ["shown", "attached", "degraded", "3", "1073741824", "node-2"]
    );

    // Short name and the category reach the same objects.
    assert!(kubectl(&["get", "oxv", "-n", ns.name(), "-o", "name"]).contains("shown"));
    assert!(
        kubectl(&["get", "oxhorn", "-n", ns.name(), "-o", "name"])
            .contains("volume.oxhorn.io/shown")
    );
}

#[tokio::test]
async fn every_crd_is_served_with_status_subresource_and_short_name() {
    let resources = kubectl(&["api-resources", "--api-group=oxhorn.io", "-o", "wide"]);
    for (plural, short, kind) in [
        ("volumes", "oxv", "Volume"),
        ("engines", "oxe", "Engine"),
        ("replicas", "oxr", "Replica"),
        ("nodes", "oxn", "Node"),
        ("settings", "oxs", "Setting"),
    ] {
        let line = resources
            .lines()
            .find(|l| l.starts_with(&format!("{plural} ")))
            .unwrap_or_else(|| panic!("{plural} not served:\n{resources}"));
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            &fields[..5],
            [plural, short, "oxhorn.io/v1beta1", "true", kind],
            "{line}"
        );
    }
    let crd = kubectl(&[
        "get",
        "crd",
        "volumes.oxhorn.io",
        "-o",
        "jsonpath={.spec.versions[0].subresources}",
    ]);
    assert_eq!(crd, r#"{"status":{}}"#);
}
