//! The datastore's caches against the test control plane.
//!
//! A cache keeps up through thousands of changes.

use std::time::Duration;

use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use oxhorn::datastore::Datastore;
use oxhorn::types::{Setting, SettingSpec};
use oxhorn_testbed::{self as testbed, TestNamespace};
use serde_json::json;

use crate::common::eventually;

/// Far more changes of one kind than any fan-out buffer holds, with a
/// subscriber that reads none of them: the cache still keeps up.
#[tokio::test]
async fn a_cache_keeps_up_through_thousands_of_changes() {
    let control_plane = testbed::shared();
    let ns = TestNamespace::create(control_plane, "churn").await.unwrap();
    let client = control_plane.client().unwrap();
    let datastore = Datastore::start(&client, ns.name());
    datastore.wait_until_ready().await;
    let _unread = datastore.settings.subscribe();
    let settings: Api<Setting> = Api::namespaced(client, ns.name());
    let churn = Setting::new("churn", SettingSpec { value: "0".into() });
    settings
        .create(&PostParams::default(), &churn)
        .await
        .unwrap();
    const CHANGES: usize = 5000;
    for value in 1..=CHANGES {
        let patch = json!({"spec": {"value": value.to_string()}});
        settings
            .patch("churn", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    let key = ObjectRef::new("churn").within(ns.name());
    let last = CHANGES.to_string();
    eventually(Duration::from_secs(60), || async {
        let value = datastore.settings.store.get(&key)?.spec.value.clone();
        (value == last).then_some(())
    })
    .await
    .expect("the settings cache stopped following its watch");
}
