//! The REST API's nodes and disks, settings, events and workloads, against
//! the real API server: each change shows in the custom resource read
//! back, and each caller may do only what their RBAC allows.

use oxhorn::api::Page;
use oxhorn::api::events::EventList;
use oxhorn::api::nodes::NodeView;
use oxhorn::api::settings::{SettingList, SettingView};
use oxhorn::api::workload::WorkloadView;
use oxhorn::types::{Node, Setting};
use reqwest::Method;
use serde_json::{Value, json};

use super::workload::{make_workload, may_get_persistent_volumes, remove_workload};
use super::{Client, READ, Rule, account_with, code, oxhorn};
use crate::common::{Cluster, MIB};

const DISK: &str = "default-disk";

impl Client {
    async fn patch(&self, path: &str, token: &str, body: &Value) -> (u16, Value) {
        self.send(Method::PATCH, path, Some(token), Some(body))
            .await
    }

    async fn put(&self, path: &str, token: &str, body: &Value) -> (u16, Value) {
        self.send(Method::PUT, path, Some(token), Some(body)).await
    }
}

/// The node as the API shows it once `check` holds of it.
async fn node_when(
    cluster: &Cluster,
    api: &Client,
    token: &str,
    what: &str,
    check: impl Fn(&NodeView) -> bool,
) -> NodeView {
    let path = format!("/v1/nodes/{}", cluster.nodes[0].node_id());
    cluster
        .until(what, || async {
            let (status, body) = api.get(&path, Some(token)).await;
            assert_eq!(status, 200, "{body}");
            let node: NodeView = serde_json::from_value(body).unwrap();
            check(&node).then_some(node)
        })
        .await
}

async fn node_cr(cluster: &Cluster) -> Node {
    cluster
        .api::<Node>()
        .get(cluster.nodes[0].node_id())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_and_disks_are_changed_as_rbac_allows_and_a_used_disk_stays() {
    let cluster = Cluster::start("rest-nodes", 1).await;
    let name = cluster.nodes[0].node_id().to_owned();
    let reader = account_with(&cluster, "reader", &[oxhorn(&["nodes"], READ)]).await;
    let writer = account_with(
        &cluster,
        "writer",
        &[oxhorn(&["nodes"], &["get", "list", "patch"])],
    )
    .await;
    let api = Client::new(&cluster);
    let node_path = format!("/v1/nodes/{name}");
    let disks_path = format!("{node_path}/disks");

    // Listed and got, with the default disk as its manager measured it.
    let (status, body) = api.get("/v1/nodes", Some(&reader)).await;
    assert_eq!(status, 200, "{body}");
    let page: Page<NodeView> = serde_json::from_value(body).unwrap();
    assert_eq!(
        (page.total, page.items[0].name.as_str()),
        (1, name.as_str())
    );
    let node = node_when(&cluster, &api, &reader, "the default disk measured", |n| {
        n.disks
            .iter()
            .any(|d| d.name == DISK && d.storage_maximum > 0 && d.schedulable)
    })
    .await;
    assert!(
        node.ready && node.schedulable && node.allow_scheduling,
        "{node:?}"
    );
    let (status, body) = api.get("/v1/nodes/nope", Some(&reader)).await;
    assert_eq!((status, code(&body)), (404, "not_found"), "{body}");

    // The reader may not change it.
    let (status, body) = api
        .patch(&node_path, &reader, &json!({"allowScheduling": false}))
        .await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    assert!(node_cr(&cluster).await.spec.allow_scheduling);

    // The writer may: scheduling off, tags sorted without repeats.
    let change = json!({"allowScheduling": false, "tags": ["b", "a", "a"]});
    let (status, body) = api.patch(&node_path, &writer, &change).await;
    assert_eq!(status, 200, "{body}");
    let spec = node_cr(&cluster).await.spec;
    assert_eq!(
        (spec.allow_scheduling, spec.tags),
        (false, vec!["a".to_owned(), "b".to_owned()])
    );
    node_when(&cluster, &api, &reader, "scheduling off in the API", |n| {
        !n.allow_scheduling
    })
    .await;
    for bad in [
        json!({"allowScheduling": "no"}),
        json!({"zone": "x"}),
        json!({"tags": ["a b"]}),
    ] {
        let (status, body) = api.patch(&node_path, &writer, &bad).await;
        assert_eq!((status, code(&body)), (400, "invalid"), "{bad}: {body}");
    }
    let (status, body) = api.patch("/v1/nodes/nope", &writer, &json!({})).await;
    assert_eq!((status, code(&body)), (404, "not_found"), "{body}");
    let (status, body) = api
        .patch(&node_path, &writer, &json!({"allowScheduling": true}))
        .await;
    assert_eq!(status, 200, "{body}");
    node_when(&cluster, &api, &reader, "scheduling on again", |n| {
        n.allow_scheduling
    })
    .await;

    // An eviction requested and withdrawn, by the writer only.
    let evict = json!({"evictionRequested": true});
    let (status, body) = api.patch(&node_path, &reader, &evict).await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    let (status, body) = api.patch(&node_path, &writer, &evict).await;
    assert_eq!(status, 200, "{body}");
    assert!(node_cr(&cluster).await.spec.eviction_requested);
    node_when(
        &cluster,
        &api,
        &reader,
        "the node evicting in the API",
        |n| n.eviction_requested && n.replicas_to_evict == 0,
    )
    .await;
    let (status, body) = api
        .patch(&node_path, &writer, &json!({"evictionRequested": "yes"}))
        .await;
    assert_eq!((status, code(&body)), (400, "invalid"), "{body}");
    let (status, body) = api
        .patch(&node_path, &writer, &json!({"evictionRequested": false}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(!node_cr(&cluster).await.spec.eviction_requested);

    // A disk added (named after the default one: it sorts after it, so
    // the default keeps its filesystem), refused when bad or taken.
    let extra_dir = cluster.nodes[0].data_dir().with_extension("extra-disk");
    std::fs::create_dir_all(&extra_dir).unwrap();
    let extra_path = extra_dir.display().to_string();
    let disk =
        json!({"name": "extra", "path": extra_path, "allowScheduling": true, "tags": ["ssd"]});
    let (status, body) = api.post(&disks_path, &reader, &disk).await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    for bad in [
        json!({"name": "Extra", "path": extra_path}),
        json!({"name": "extra", "path": "relative/dir"}),
        json!({"name": "extra", "path": "/var/../etc"}),
        json!({"name": "extra", "path": extra_path, "storageReserved": -1}),
        json!({"name": "extra", "path": extra_path, "bogus": 1}),
    ] {
        let (status, body) = api.post(&disks_path, &writer, &bad).await;
        assert_eq!((status, code(&body)), (400, "invalid"), "{bad}: {body}");
    }
    let (status, body) = api.post(&disks_path, &writer, &disk).await;
    assert_eq!(status, 201, "{body}");
    let added = node_cr(&cluster).await.spec.disks["extra"].clone();
    assert_eq!(
        (added.path.as_str(), added.tags),
        (extra_path.as_str(), vec!["ssd".to_owned()])
    );
    node_when(&cluster, &api, &reader, "the disk in the API", |n| {
        n.disks.len() == 2
    })
    .await;
    let (status, body) = api.post(&disks_path, &writer, &disk).await;
    assert_eq!((status, code(&body)), (409, "conflict"), "{body}");
    let (status, body) = api.post("/v1/nodes/nope/disks", &writer, &disk).await;
    assert_eq!((status, code(&body)), (404, "not_found"), "{body}");

    // Changed, then removed once it takes no replicas.
    let extra = format!("{disks_path}/extra");
    let (status, body) = api.call(Method::DELETE, &extra, Some(&writer)).await;
    assert_eq!((status, code(&body)), (409, "conflict"), "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("allowScheduling false"),
        "{body}"
    );
    let change = json!({"allowScheduling": false, "storageReserved": MIB, "tags": []});
    let (status, body) = api.patch(&extra, &writer, &change).await;
    assert_eq!(status, 200, "{body}");
    let changed = node_cr(&cluster).await.spec.disks["extra"].clone();
    assert_eq!(
        (changed.allow_scheduling, changed.storage_reserved),
        (false, MIB)
    );
    assert!(changed.tags.is_empty() && changed.path == extra_path);
    let (status, body) = api
        .patch(&format!("{disks_path}/nope"), &writer, &change)
        .await;
    assert_eq!((status, code(&body)), (404, "not_found"), "{body}");
    let (status, body) = api
        .patch(&extra, &writer, &json!({"path": "/elsewhere"}))
        .await;
    assert_eq!((status, code(&body)), (400, "invalid"), "{body}");
    node_when(
        &cluster,
        &api,
        &reader,
        "the disk unschedulable in the API",
        |n| {
            n.disks
                .iter()
                .any(|d| d.name == "extra" && !d.allow_scheduling)
        },
    )
    .await;
    let (status, body) = api.call(Method::DELETE, &extra, Some(&reader)).await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    let (status, body) = api.patch(&extra, &reader, &json!({"tags": []})).await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    let nope = format!("{disks_path}/nope");
    let (status, body) = api.call(Method::DELETE, &nope, Some(&writer)).await;
    assert_eq!((status, code(&body)), (404, "not_found"), "{body}");
    let (status, body) = api.call(Method::DELETE, &extra, Some(&writer)).await;
    assert_eq!(status, 200, "{body}");
    assert!(!node_cr(&cluster).await.spec.disks.contains_key("extra"));
    node_when(&cluster, &api, &reader, "the disk gone from the API", |n| {
        n.disks.len() == 1
    })
    .await;

    // The default disk holds a replica: it stays, and the refusal names it.
    cluster.create_volume("vol-a", 16 * MIB, 1).await;
    let replica = cluster
        .until("the replica scheduled", || async {
            let replicas = cluster.replicas_of("vol-a").await;
            replicas.into_iter().find(|r| !r.spec.disk_id.is_empty())
        })
        .await;
    let (status, body) = api
        .patch(
            &format!("{disks_path}/{DISK}"),
            &writer,
            &json!({"allowScheduling": false}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    node_when(
        &cluster,
        &api,
        &reader,
        "the default disk holding the replica",
        |n| {
            n.disks
                .iter()
                .any(|d| d.name == DISK && !d.allow_scheduling && d.replicas == 1)
        },
    )
    .await;
    let (status, body) = api
        .call(
            Method::DELETE,
            &format!("{disks_path}/{DISK}"),
            Some(&writer),
        )
        .await;
    assert_eq!((status, code(&body)), (409, "conflict"), "{body}");
    let message = body["message"].as_str().unwrap();
    let replica_name = replica.metadata.name.unwrap();
    assert!(message.contains(&replica_name), "{message}");
    assert!(node_cr(&cluster).await.spec.disks.contains_key(DISK));

    // Evicting the disk: the one node has nowhere else, so the replica
    // stays, counted as still to move, in the API and the Node's status.
    let default_disk = format!("{disks_path}/{DISK}");
    let (status, body) = api
        .patch(&default_disk, &reader, &json!({"evictionRequested": true}))
        .await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    let (status, body) = api
        .patch(&default_disk, &writer, &json!({"evictionRequested": true}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(node_cr(&cluster).await.spec.disks[DISK].eviction_requested);
    node_when(
        &cluster,
        &api,
        &reader,
        "the disk evicting with its replica left",
        |n| {
            n.replicas_to_evict == 1
                && n.disks
                    .iter()
                    .any(|d| d.name == DISK && d.eviction_requested && d.replicas == 1)
        },
    )
    .await;
    cluster
        .until(
            "the Node's status counting the replica to evict",
            || async {
                let status = node_cr(&cluster).await.status?;
                let disk = status.disk_status.get(DISK)?;
                (status.replicas_to_evict == 1 && disk.scheduled_replicas == 1).then_some(())
            },
        )
        .await;
    cluster.delete_volume("vol-a").await;
    std::fs::remove_dir_all(&extra_dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_are_listed_and_set_within_their_ranges() {
    let cluster = Cluster::start("rest-settings", 1).await;
    let reader = account_with(&cluster, "reader", &[oxhorn(&["settings"], READ)]).await;
    let updater = account_with(
        &cluster,
        "updater",
        &[oxhorn(&["settings"], &["get", "update"])],
    )
    .await;
    let writer = account_with(
        &cluster,
        "writer",
        &[oxhorn(&["settings"], &["get", "list", "update", "create"])],
    )
    .await;
    let api = Client::new(&cluster);

    // Every setting, with its value: the Setting's (the test clusters set
    // this one), else the default.
    let (status, body) = api.get("/v1/settings", Some(&reader)).await;
    assert_eq!(status, 200, "{body}");
    let list: SettingList = serde_json::from_value(body).unwrap();
    let item = |key: &str| list.items.iter().find(|s| s.key == key).unwrap().clone();
    let minimal = item("storage-minimal-available-percentage");
    assert_eq!(
        (
            minimal.value.as_str(),
            minimal.set,
            minimal.default.as_str()
        ),
        ("1", true, "25")
    );
    let count = item("default-replica-count");
    assert_eq!(
        (count.value.as_str(), count.set, count.applied),
        ("3", false, Some(true))
    );
    assert_eq!(
        (count.minimum, count.maximum, count.kind.as_str()),
        (Some(1), Some(20), "integer")
    );
    let (status, body) = api.get("/v1/settings/nope", Some(&reader)).await;
    assert_eq!((status, code(&body)), (404, "not_found"), "{body}");

    let path = "/v1/settings/default-replica-count";
    let (status, body) = api.put(path, &reader, &json!({"value": "2"})).await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    // Creating the Setting takes `create` as well as `update`.
    let (status, body) = api.put(path, &updater, &json!({"value": "2"})).await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("create"),
        "{body}"
    );
    let (status, body) = api.put(path, &writer, &json!({"value": "0"})).await;
    assert_eq!((status, code(&body)), (400, "invalid"), "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("from 1 to 20"),
        "{body}"
    );
    for bad in [
        json!({"value": 2}),
        json!({"value": "2", "why": "x"}),
        json!({}),
    ] {
        let (status, body) = api.put(path, &writer, &bad).await;
        assert_eq!((status, code(&body)), (400, "invalid"), "{bad}: {body}");
    }
    let (status, body) = api
        .put("/v1/settings/nope", &writer, &json!({"value": "2"}))
        .await;
    assert_eq!((status, code(&body)), (404, "not_found"), "{body}");
    assert!(
        cluster
            .api::<Setting>()
            .get_opt("default-replica-count")
            .await
            .unwrap()
            .is_none()
    );

    // Created, then changed; the managers apply it.
    let (status, body) = api.put(path, &writer, &json!({"value": "2"})).await;
    assert_eq!(status, 200, "{body}");
    let setting = cluster
        .api::<Setting>()
        .get("default-replica-count")
        .await
        .unwrap();
    assert_eq!(setting.spec.value, "2");
    cluster
        .until("the value applied, in the API", || async {
            let (_, body) = api.get(path, Some(&reader)).await;
            let shown: SettingView = serde_json::from_value(body).unwrap();
            (shown.value == "2" && shown.applied == Some(true)).then_some(())
        })
        .await;
    let (status, body) = api.put(path, &updater, &json!({"value": "4"})).await;
    assert_eq!(status, 200, "{body}");
    let setting = cluster
        .api::<Setting>()
        .get("default-replica-count")
        .await
        .unwrap();
    assert_eq!(setting.spec.value, "4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volumes_events_and_workload_are_shown_to_who_may_read_them() {
    let cluster = Cluster::start("rest-events", 1).await;
    cluster.create_volume("vol-a", 16 * MIB, 1).await;
    let events = Rule {
        group: "",
        resources: &["events"],
        verbs: &["list"],
    };
    let workload = Rule {
        group: "",
        resources: &["persistentvolumeclaims", "pods"],
        verbs: &["get", "list"],
    };
    let volumes = oxhorn(&["volumes"], READ);
    let reader = account_with(&cluster, "reader", &[volumes, events, workload]).await;
    let cluster_role = may_get_persistent_volumes(&cluster, "reader").await;
    let volumes = oxhorn(&["volumes"], READ);
    let no_events = account_with(&cluster, "no-events", &[volumes]).await;
    let api = Client::new(&cluster);

    // The volume's events, once its controller reported one.
    for bad in [
        "",
        "?kind=Volume",
        "?name=vol-a",
        "?kind=Pod&name=vol-a",
        "?kind=Volume&name=vol-a&limit=0",
    ] {
        let (status, body) = api.get(&format!("/v1/events{bad}"), Some(&reader)).await;
        assert_eq!((status, code(&body)), (400, "invalid"), "{bad}: {body}");
    }
    let (status, body) = api
        .get("/v1/events?kind=Volume&name=vol-a", Some(&no_events))
        .await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("list events"),
        "{body}"
    );
    let (status, body) = api
        .get("/v1/events?kind=Volume&name=nope", Some(&reader))
        .await;
    assert_eq!((status, code(&body)), (404, "not_found"), "{body}");
    let listed = cluster
        .until("the volume's events listed", || async {
            let (status, body) = api
                .get("/v1/events?kind=Volume&name=vol-a", Some(&reader))
                .await;
            if status == 404 {
                return None; // Not in the manager's cache yet.
            }
            assert_eq!(status, 200, "{body}");
            let list: EventList = serde_json::from_value(body).unwrap();
            list.items
                .iter()
                .any(|e| e.reason == "Detached")
                .then_some(list)
        })
        .await;
    let detached = listed
        .items
        .iter()
        .find(|e| e.reason == "Detached")
        .unwrap();
    assert_eq!(
        (detached.r#type.as_str(), detached.source.as_str()),
        ("Normal", "oxhorn-manager")
    );
    assert!(
        detached.count >= 1 && detached.last.is_some(),
        "{detached:?}"
    );
    let times: Vec<_> = listed.items.iter().map(|e| e.last.clone()).collect();
    assert!(
        times.windows(2).all(|w| w[0] >= w[1]),
        "newest first: {times:?}"
    );

    // Its workload: none, until a PersistentVolume, claim and Pod use it.
    let path = "/v1/volumes/vol-a/workload";
    let (status, body) = api.get(path, Some(&reader)).await;
    assert_eq!(status, 200, "{body}");
    let shown: WorkloadView = serde_json::from_value(body).unwrap();
    assert!(
        shown.persistent_volume.is_none() && shown.pods.is_empty(),
        "{shown:?}"
    );
    let (status, body) = api.get(path, Some(&no_events)).await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("persistentvolumes"),
        "{body}"
    );
    let (status, body) = api.get("/v1/volumes/nope/workload", Some(&reader)).await;
    assert_eq!((status, code(&body)), (404, "not_found"), "{body}");

    let ns = cluster.ns.name().to_owned();
    let pods = [("web", "data"), ("other", "elsewhere")];
    let pv_name = make_workload(&cluster, "vol-a", "data", &pods).await;

    let (status, body) = api.get(path, Some(&reader)).await;
    assert_eq!(status, 200, "{body}");
    let shown: WorkloadView = serde_json::from_value(body).unwrap();
    let pv = shown.persistent_volume.expect("the PersistentVolume");
    assert_eq!(
        (pv.name.as_str(), pv.storage_class.as_str()),
        (pv_name.as_str(), "oxhorn-test")
    );
    assert_eq!(pv.reclaim_policy, "Retain");
    let claim = shown.claim.expect("the claim");
    assert_eq!(
        (claim.namespace.as_str(), claim.name.as_str()),
        (ns.as_str(), "data")
    );
    assert_eq!(claim.storage_class, "oxhorn-test");
    let users: Vec<_> = shown
        .pods
        .iter()
        .map(|p| (p.name.as_str(), p.node.as_str(), p.ready))
        .collect();
    assert_eq!(users, [("web", "no-kubelet-here", false)]);

    remove_workload(
        &cluster,
        &pv_name,
        "data",
        &["web", "other"],
        &[&cluster_role],
    )
    .await;
    cluster.delete_volume("vol-a").await;
}
