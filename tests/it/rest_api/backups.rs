//! Backups through the API: a volume backed up to a target, the target,
//! the backup volume and the backup listed, a volume restored from it, the
//! backup deleted; bad input refused.

use oxhorn::api::backups::{BackupTargetView, BackupView};
use oxhorn::types::{Backup, BackupTarget, DEFAULT_BACKUP_TARGET};
use reqwest::Method;
use serde_json::json;

use super::{Client, READ, account_with, code, oxhorn};
use crate::backup::{create_target, until_target};
use crate::common::{Cluster, MIB, require_root};

const KINDS: &[&str] = &[
    "volumes",
    "snapshots",
    "backups",
    "backuptargets",
    "backupvolumes",
];
const WRITE: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_is_backed_up_and_restored_through_the_api() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start("rest-bk", 1).await;
    let node = cluster.nodes[0].node_id().to_owned();
    let url = format!("file://{}", dir.path().display());
    create_target(&cluster, DEFAULT_BACKUP_TARGET, &url, "", "300s").await;
    until_target(&cluster, DEFAULT_BACKUP_TARGET, "Synced").await;
    let admin = account_with(&cluster, "admin", &[oxhorn(KINDS, WRITE)]).await;
    let reader = account_with(&cluster, "reader", &[oxhorn(KINDS, READ)]).await;
    let api = Client::new(&cluster);
    cluster.create_volume("vol", 16 * MIB, 1).await;
    cluster.attach("vol", &node).await;

    let (status, body) = api.get("/v1/backup-targets", Some(&reader)).await;
    assert_eq!(status, 200, "{body}");
    let targets: Vec<BackupTargetView> = serde_json::from_value(body).unwrap();
    assert_eq!(targets.len(), 1);
    assert!(targets[0].available, "{targets:?}");
    assert_eq!(targets[0].url, url);

    // Bad input, and a reader's attempt: refused, nothing made.
    let backups = "/v1/volumes/vol/backups";
    for bad in [
        json!({"target": "nowhere"}),
        json!({"snapshot": "not-of-vol"}),
        json!({"name": "Bad Name"}),
        json!({"when": "now"}),
    ] {
        let (status, body) = api.post(backups, &admin, &bad).await;
        assert_eq!((status, code(&body)), (400, "invalid"), "{bad}: {body}");
    }
    let (status, body) = api.post(backups, &reader, &json!({})).await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    let made = cluster
        .api::<Backup>()
        .list(&Default::default())
        .await
        .unwrap();
    assert!(made.items.is_empty(), "{:?}", made.items);

    // Backed up: listed completed, with its volume in the target.
    let (status, body) = api
        .post(
            backups,
            &admin,
            &json!({"name": "bk", "labels": {"why": "test"}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let backup = cluster
        .until("the backup completed", || async {
            let (_, body) = api.get("/v1/backups?volume=vol", Some(&reader)).await;
            let listed: Vec<BackupView> = serde_json::from_value(body).unwrap();
            listed
                .into_iter()
                .find(|b| b.name == "bk" && b.state == "completed")
        })
        .await;
    assert_eq!(
        (backup.size, backup.labels["why"].as_str()),
        (16 * MIB, "test")
    );
    assert!(!backup.snapshot.is_empty(), "{backup:?}");
    let (status, body) = api.get("/v1/backups?volume=other", Some(&reader)).await;
    assert_eq!((status, body), (200, json!([])));
    let (status, body) = api.get("/v1/backups?bogus=1", Some(&reader)).await;
    assert_eq!((status, code(&body)), (400, "invalid"), "{body}");
    let (status, body) = api
        .post("/v1/backup-targets/default/sync", &admin, &json!({}))
        .await;
    assert_eq!(status, 202, "{body}");
    let target = cluster.api::<BackupTarget>().get("default").await.unwrap();
    assert!(target.spec.sync_requested_at.is_some());
    cluster
        .until("the backup volume listed", || async {
            let (_, body) = api.get("/v1/backup-volumes", Some(&reader)).await;
            let listed = body.as_array()?;
            listed
                .iter()
                .any(|v| v["volume"] == "vol" && v["lastBackup"] == "bk")
                .then_some(())
        })
        .await;

    // Restored into a new volume of the backup's size.
    let (status, body) = api
        .post(
            "/v1/volumes",
            &admin,
            &json!({"name": "restored", "fromBackup": "bk"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let restored = cluster.volume("restored").await.unwrap();
    assert_eq!(
        (restored.spec.size, restored.spec.from_backup.as_str()),
        (16 * MIB, "bk")
    );
    let small = json!({"name": "small", "fromBackup": "bk", "size": 8 * MIB});
    let (status, body) = api.post("/v1/volumes", &admin, &small).await;
    assert_eq!((status, code(&body)), (400, "invalid"), "{body}");

    // Deleted by who may.
    let delete = Method::DELETE;
    let (status, body) = api
        .call(delete.clone(), "/v1/backups/bk", Some(&reader))
        .await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    let (status, body) = api.call(delete, "/v1/backups/bk", Some(&admin)).await;
    assert_eq!(status, 202, "{body}");
    cluster
        .until("the backup gone", || async {
            let gone = cluster
                .api::<Backup>()
                .get_opt("bk")
                .await
                .unwrap()
                .is_none();
            gone.then_some(())
        })
        .await;
    cluster.delete_volume("restored").await;
    cluster.detach("vol").await;
    cluster.delete_volume("vol").await;
}
