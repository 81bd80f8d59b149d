//! CHAP against libiscsi's initiator: a target with secrets admits an
//! initiator that proves them, one-way and mutual, and refuses one with
//! a wrong secret or none. The target runs in the test over an engine of
//! two replica processes.

use std::process::Command;
use std::sync::Arc;

use oxhorn::frontend::iscsi::chap::{ChapSecrets, Credential};
use oxhorn::frontend::iscsi::{Target, TargetConfig};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::common::init_tracing;
use crate::dataplane::Replicas;

const USER: &str = "node-1";
const SECRET: &str = "initiator-secret";
const TARGET_USER: &str = "oxhorn";
const TARGET_SECRET: &str = "target-secret-1";

/// Whether libiscsi logs in to `url` and reads the LUN's INQUIRY data.
fn logs_in(url: &str) -> bool {
    Command::new("iscsi-inq")
        .arg(url)
        .output()
        .expect("iscsi-inq (hack/install-test-deps.sh installs libiscsi-bin)")
        .status
        .success()
}

#[tokio::test]
async fn chap_admits_only_initiators_that_prove_the_secret_and_proves_its_own() {
    init_tracing();
    let replicas = Replicas::start("chap", 2).await;
    let engine = replicas.engine().await;
    let mut config = TargetConfig::new("chap");
    config.chap = Some(ChapSecrets {
        initiator: Credential {
            user: USER.into(),
            secret: SECRET.into(),
        },
        target: Some(Credential {
            user: TARGET_USER.into(),
            secret: TARGET_SECRET.into(),
        }),
    });
    let iqn = config.target_name();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let portal = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let serving =
        tokio::spawn(Target::new(config, Arc::clone(&engine)).serve(listener, stop.clone()));

    let url = move |credentials: &str, query: &str| {
        format!("iscsi://{credentials}{portal}/{iqn}/1{query}")
    };
    let mutual = format!("?target_user={TARGET_USER}&target_password={TARGET_SECRET}");
    let checks = tokio::task::spawn_blocking(move || {
        [
            (
                "one-way, right secret",
                logs_in(&url(&format!("{USER}%{SECRET}@"), "")),
            ),
            (
                "mutual, right secrets",
                logs_in(&url(&format!("{USER}%{SECRET}@"), &mutual)),
            ),
            (
                "wrong secret",
                !logs_in(&url(&format!("{USER}%not-the-secret@"), "")),
            ),
            (
                "wrong user",
                !logs_in(&url(&format!("intruder%{SECRET}@"), "")),
            ),
            ("no credentials", !logs_in(&url("", ""))),
            (
                "mutual, the initiator expecting another target secret",
                !logs_in(&url(
                    &format!("{USER}%{SECRET}@"),
                    &format!("?target_user={TARGET_USER}&target_password=another-secret"),
                )),
            ),
        ]
    })
    .await
    .unwrap();
    stop.cancel();
    serving.await.unwrap();
    let failed: Vec<&str> = checks
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(what, _)| *what)
        .collect();
    assert!(failed.is_empty(), "CHAP cases that went wrong: {failed:?}");
}
