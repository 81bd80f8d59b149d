//! Data written through the iSCSI target reads back as written, with a
//! libiscsi client (hack/iscsi-pattern.c, built by
//! hack/install-test-deps.sh) that fails on any error or dropped
//! connection: while a replica is killed mid-run, and after the engine is
//! killed once a SYNCHRONIZE CACHE has completed.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use super::{IscsiVolume, PATIENCE};
use crate::common::{eventually, init_tracing, require_root};

/// 64 MiB of 4 KiB blocks.
const BLOCKS: &str = "16384";

fn pattern(args: &[&str]) -> Command {
    let mut command = Command::new(oxhorn_testbed::tools_dir().join("iscsi-pattern"));
    command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn assert_success(what: &str, output: &Output, volume: &IscsiVolume) {
    assert!(
        output.status.success(),
        "{what}: {}{}\nengine log:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        volume.engine.log()
    );
}

/// Bytes the files of a replica's directory take on its disk.
fn allocated(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok()?.metadata().ok())
                .map(|metadata| metadata.blocks() * 512)
                .sum()
        })
        .unwrap_or(0)
}

#[tokio::test]
async fn a_replica_killed_mid_write_is_not_seen_by_the_initiator() {
    init_tracing();
    require_root();
    let mut volume = IscsiVolume::start("integrity", 3).await;
    let url = volume.url.clone();
    let writer = pattern(&["write", &url, "7", "0", BLOCKS]).spawn().unwrap();
    let first = volume.replicas[0].dir().to_path_buf();
    eventually(PATIENCE, || async {
        (allocated(&first) > 16 << 20).then_some(())
    })
    .await
    .expect("16 MiB written to the first replica");
    volume.replicas[1].kill();
    let written = writer.wait_with_output().unwrap();
    assert_success("writing while a replica died", &written, &volume);
    let verified = pattern(&["verify", &url, "7", "0", BLOCKS])
        .output()
        .unwrap();
    assert_success("reading back", &verified, &volume);
    let log = volume.engine.log();
    assert!(
        log.contains("replica ERR"),
        "the engine never lost the replica:\n{log}"
    );
    assert!(
        !log.contains("iSCSI connection ended"),
        "the initiator's connection dropped:\n{log}"
    );
}

#[tokio::test]
async fn a_write_synchronized_before_the_engine_is_killed_survives_it() {
    init_tracing();
    require_root();
    let mut volume = IscsiVolume::start("durable", 3).await;
    let url = volume.url.clone();
    let written = pattern(&["write", &url, "11", "100", "4096", "sync"])
        .output()
        .unwrap();
    assert_success("writing and synchronizing", &written, &volume);
    volume.engine.kill();
    volume.engine.start().unwrap();
    let url = volume
        .engine
        .wait_endpoint(PATIENCE + Duration::from_secs(30))
        .await
        .unwrap();
    let verified = pattern(&["verify", &url, "11", "100", "4096"])
        .output()
        .unwrap();
    assert_success(
        "reading back after the engine's restart",
        &verified,
        &volume,
    );
}
