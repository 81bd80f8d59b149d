//! Reverting a detached volume to one of its snapshots, through the REST
//! API, on a real API server with two `oxhorn manager` nodes: the volume
//! reads what it held at the snapshot on its whole range, the snapshots
//! after it go with the writes, and a revert is refused while the volume is
//! attached (by the API, and by the volume's owner when the spec is written
//! directly), to a caller who may not change the volume, and without a
//! token.

use oxhorn::api::volumes::VolumeView;
use oxhorn::types::{RevertPhase, Robustness, Snapshot, VolumeState};
use reqwest::Method;
use serde_json::json;

use crate::common::*;
use crate::rest_api::{Client, READ, account_with, code, oxhorn};

/// Small enough to write whole a few times.
const SIZE: i64 = 32 * MIB;
const WRITE: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];

async fn take_snapshot(cluster: &Cluster, api: &Client, token: &str, name: &str) {
    let (status, body) = api
        .post("/v1/volumes/vol/snapshots", token, &json!({"name": name}))
        .await;
    assert_eq!(status, 201, "{body}");
    cluster
        .until("the snapshot taken", || async {
            let snapshot = cluster.api::<Snapshot>().get_opt(name).await.unwrap()?;
            snapshot.status.filter(|s| s.ready_to_use).map(drop)
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_volume_reverts_to_a_snapshot_on_every_replica() {
    require_root();
    let cluster = Cluster::start("revert", 2).await;
    let node = cluster.nodes[0].node_id().to_owned();
    let admin = account_with(
        &cluster,
        "admin",
        &[oxhorn(&["volumes", "snapshots"], WRITE)],
    )
    .await;
    let reader = account_with(
        &cluster,
        "reader",
        &[oxhorn(&["volumes", "snapshots"], READ)],
    )
    .await;
    let api = Client::new(&cluster);
    let whole = SIZE as usize;

    cluster.create_volume("vol", SIZE, 2).await;
    cluster
        .until_volume("vol", "the volume detached and healthy", |s| {
            s.state == VolumeState::Detached && s.robustness == Robustness::Healthy
        })
        .await;
    let device = cluster.attach("vol", &node).await;
    let at_a = write_pattern(&device, whole, 1);
    take_snapshot(&cluster, &api, &admin, "a").await;
    let at_b = write_pattern(&device, whole, 2);
    take_snapshot(&cluster, &api, &admin, "b").await;
    let latest = write_pattern(&device, whole, 3);

    let revert = "/v1/volumes/vol/snapshots/a/revert";
    // Attached: the API refuses.
    let (status, body) = api.send(Method::POST, revert, Some(&admin), None).await;
    assert_eq!((status, code(&body)), (409, "conflict"), "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("attached"),
        "{body}"
    );
    // Asked behind the API's back: the owner refuses, and nothing changes.
    cluster
        .patch_volume(
            "vol",
            json!({"spec": {"revert": {"snapshot": "a", "request": "behind-its-back"}}}),
        )
        .await;
    let refused = cluster
        .until_volume("vol", "the revert of an attached volume refused", |s| {
            s.revert
                .as_ref()
                .is_some_and(|r| r.request == "behind-its-back" && r.phase == RevertPhase::Failed)
        })
        .await;
    let message = &refused.status.unwrap().revert.unwrap().message;
    assert!(message.contains("attach"), "{message}");
    assert_eq!(refused.spec.node_id, node);
    assert!(
        read_device(&device, whole) == latest,
        "the refused revert changed the attached volume"
    );

    cluster.detach("vol").await;
    // Without a token, as a reader, to an unknown snapshot: refused.
    let (status, body) = api.send(Method::POST, revert, None, None).await;
    assert_eq!((status, code(&body)), (401, "unauthenticated"), "{body}");
    let (status, body) = api.send(Method::POST, revert, Some(&reader), None).await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    let unknown = "/v1/volumes/vol/snapshots/nope/revert";
    let (status, body) = api.send(Method::POST, unknown, Some(&admin), None).await;
    assert_eq!((status, code(&body)), (404, "not_found"), "{body}");

    // Reverted: every replica, and the snapshot after a goes.
    let (status, body) = api.send(Method::POST, revert, Some(&admin), None).await;
    assert_eq!(status, 202, "{body}");
    let done = cluster
        .until_volume("vol", "the volume reverted", |s| {
            s.revert.as_ref().is_some_and(|r| {
                r.request != "behind-its-back" && r.phase != RevertPhase::Reverting
            })
        })
        .await;
    let answer = done.status.unwrap().revert.unwrap();
    assert_eq!(answer.phase, RevertPhase::Reverted, "{answer:?}");
    let (_, body) = api.get("/v1/volumes/vol", Some(&reader)).await;
    let view: VolumeView = serde_json::from_value(body).unwrap();
    assert_eq!(view.revert.map(|r| r.phase).as_deref(), Some("reverted"));
    cluster
        .until("snapshot b deleted with the writes after a", || async {
            let gone = cluster
                .api::<Snapshot>()
                .get_opt("b")
                .await
                .unwrap()
                .is_none();
            gone.then_some(())
        })
        .await;
    let a = cluster.api::<Snapshot>().get("a").await.unwrap();
    assert!(a.status.is_some_and(|s| s.ready_to_use));

    let device = cluster.attach("vol", &node).await;
    assert!(
        read_device(&device, whole) == at_a,
        "the volume differs from snapshot a"
    );
    assert!(at_a != at_b);
    cluster
        .until_volume("vol", "both replicas serve", |s| {
            s.robustness == Robustness::Healthy
        })
        .await;
    let reasons = cluster.event_reasons().await;
    for reason in ["Reverting", "Reverted", "RevertFailed"] {
        assert!(reasons.contains(reason), "no {reason} event: {reasons:?}");
    }

    cluster.detach("vol").await;
    cluster.delete_volume("vol").await;
}
