//! Rebuild speed: a 1 GiB volume with 512 MiB written in 3 replicas; one
//! replica is replaced by an empty one and rebuilt. The baseline, run in the
//! same invocation on the same disk, is `cp --sparse=always` of the source
//! replica's files. Prints both and the ratio (target: >= 0.5).
//!
//!     cargo bench --bench rebuild

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use oxhorn::engine::Engine;
use oxhorn::frontend::BlockDevice;
use oxhorn::protocol::control::ReplicaMode;
use oxhorn::protocol::{Access, Key};
use oxhorn_testbed::ReplicaProcess;

const SIZE: u64 = 1 << 30;
const WRITTEN: u64 = 512 << 20;
const WRITE: usize = 1 << 20;

#[tokio::main]
async fn main() {
    let oxhorn = Path::new(env!("CARGO_BIN_EXE_oxhorn"));
    // On the disk replicas normally live on, not tmpfs.
    let work = tempfile::Builder::new()
        .prefix("oxhorn-bench-")
        .tempdir_in("/var/tmp")
        .expect("work dir");
    let access = Access {
        volume: "bench".into(),
        key: Key::generate().for_volume("bench"),
        generation: 1,
    };
    let mut replicas = Vec::new();
    for name in ["a", "b", "c"] {
        let mut replica =
            ReplicaProcess::spawn(oxhorn, &work.path().join(name), SIZE, &access).expect("replica");
        replica
            .wait_serving(Duration::from_secs(30))
            .await
            .expect("replica serving");
        replicas.push(replica);
    }
    let addresses: Vec<String> = replicas.iter().map(ReplicaProcess::address).collect();
    let engine = Engine::start(&access, SIZE, &addresses[..2], false)
        .await
        .expect("engine");

    // Every other MiB, so the layers are sparse like real ones.
    let data = Bytes::from(
        (0..WRITE)
            .map(|i| (i * 31 % 251) as u8)
            .collect::<Vec<u8>>(),
    );
    for i in 0..WRITTEN / WRITE as u64 {
        engine
            .write(i * 2 * WRITE as u64, data.clone())
            .await
            .expect("write");
    }
    engine.flush().await.expect("flush");
    sync();

    let started = Instant::now();
    engine
        .add_replica(&addresses[2])
        .await
        .expect("add replica");
    loop {
        let status = engine.status().await;
        let mode = status
            .replicas
            .iter()
            .find(|r| r.address == addresses[2])
            .map(|r| r.mode());
        match mode {
            Some(ReplicaMode::Rw) => break,
            Some(ReplicaMode::Err) => panic!("rebuild failed: {status:#?}"),
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    sync();
    let rebuild = started.elapsed();

    let copy_to = work.path().join("copy");
    std::fs::create_dir(&copy_to).expect("copy dir");
    let started = Instant::now();
    let status = Command::new("sh")
        .arg("-c")
        .arg("cp --sparse=always \"$1\"/*.img \"$2\"/ && sync")
        .args([
            "sh",
            &replicas[0].dir().display().to_string(),
            &copy_to.display().to_string(),
        ])
        .status()
        .expect("cp");
    assert!(status.success());
    let copy = started.elapsed();

    let mib = WRITTEN as f64 / (1 << 20) as f64;
    println!(
        "rebuild of a {} MiB replica with {mib} MiB written",
        SIZE >> 20
    );
    println!(
        "  oxhorn rebuild        {:>8.2} s  {:>8.1} MiB/s",
        rebuild.as_secs_f64(),
        mib / rebuild.as_secs_f64()
    );
    println!(
        "  cp --sparse=always    {:>8.2} s  {:>8.1} MiB/s",
        copy.as_secs_f64(),
        mib / copy.as_secs_f64()
    );
    println!(
        "  ratio (speed vs cp)   {:>8.2}  (target >= 0.50)",
        copy.as_secs_f64() / rebuild.as_secs_f64()
    );
}

fn sync() {
    let _ = Command::new("sync").status();
}
