//! Rebuild speed: a 1 GiB volume with 512 MiB written in 2 replicas; an
//! empty third one is added and rebuilt with no bandwidth limit. The
//! baseline, run in the same invocation on the same disk, is
//! `cp --sparse=always` of the source replica's files. Prints both and the
//! ratio (target: >= 0.8).
//!
//! Then the volume's own I/O while a replica rebuilds: 4 KiB random reads
//! and writes at queue depth 8 through the engine, with the three replicas
//! healthy, then while a fourth one is added and rebuilt with no bandwidth
//! limit, at the default limit (100 MiB/s) and at 25 MiB/s, each time a
//! new one. The baseline is four replicas just after a snapshot: a replica
//! being rebuilt takes the volume's writes too, and a rebuild starts with a
//! snapshot, after which writes land in new, empty layers and allocate
//! their blocks. Prints the rates, their ratio to the baseline, and how
//! long each rebuild took under that load.
//!
//!     cargo bench --bench rebuild

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use oxhorn::engine::{DEFAULT_REBUILD_LIMIT, Engine};
use oxhorn::frontend::BlockDevice;
use oxhorn::protocol::control::ReplicaMode;
use oxhorn::protocol::{Access, Key};
use oxhorn_testbed::ReplicaProcess;

const SIZE: u64 = 1 << 30;
const WRITTEN: u64 = 512 << 20;
const WRITE: usize = 1 << 20;
/// The volume's own I/O during the second rebuild: requests in flight, and
/// how long the rate is measured before it.
const LOAD_DEPTH: usize = 8;
const LOAD_BASELINE: Duration = Duration::from_secs(5);
/// A limit below the default, to show what the volume gets back.
const SLOW_LIMIT: u64 = 25 << 20;

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
    for name in ["a", "b", "c", "d", "e", "f"] {
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

    engine.set_rebuild_limit(0);
    let (rebuild, _) = rebuilt_in(&engine, &addresses[2], Duration::from_millis(10)).await;

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
        "  ratio (speed vs cp)   {:>8.2}  (target >= 0.80)",
        copy.as_secs_f64() / rebuild.as_secs_f64()
    );

    let (before, ()) = load(&engine, tokio::time::sleep(LOAD_BASELINE)).await;
    // A fourth replica rebuilt at each limit, under load, then taken out
    // again; the last stays for the baseline.
    let limits = [0, DEFAULT_REBUILD_LIMIT, SLOW_LIMIT];
    let mut rebuilds = Vec::new();
    for (i, limit) in limits.into_iter().enumerate() {
        let address = &addresses[3 + i];
        engine.set_rebuild_limit(limit);
        let rebuilt = rebuilt_in(&engine, address, Duration::from_millis(500));
        rebuilds.push((limit, load(&engine, rebuilt).await));
        if i + 1 < limits.len() {
            engine.remove_replica(address).await.expect("remove");
        }
    }
    engine.snapshot("baseline", false).await.expect("snapshot");
    let (baseline, ()) = load(&engine, tokio::time::sleep(LOAD_BASELINE)).await;

    println!("volume I/O, 4 KiB random reads and writes at QD{LOAD_DEPTH}");
    println!("  3 replicas                          {before:>8.0} IOPS");
    println!("  4 replicas, just after a snapshot   {baseline:>8.0} IOPS  (the baseline)");
    for (limit, (during, (took, copied))) in rebuilds {
        let what = match limit {
            0 => "no limit".to_owned(),
            limit => format!("at {} MiB/s", limit >> 20),
        };
        println!(
            "  while a 4th rebuilds, {what:<13} {during:>8.0} IOPS  (ratio {:.2}; it copied {} MiB in {:.1} s)",
            during / baseline,
            copied >> 20,
            took.as_secs_f64()
        );
    }
}

/// Adds the replica at `address` and waits until it is rebuilt and RW,
/// asking every `poll`: status asks every replica, so under load not so
/// often that it loads them. Returns how long it took and what it copied.
async fn rebuilt_in(engine: &Engine, address: &str, poll: Duration) -> (Duration, u64) {
    let started = Instant::now();
    engine.add_replica(address).await.expect("add replica");
    let copied = loop {
        let status = engine.status().await;
        let replica = status.replicas.iter().find(|r| r.address == address);
        match replica.map(|r| (r.mode(), r.last_rebuild_bytes_copied)) {
            Some((ReplicaMode::Rw, copied)) => break copied,
            Some((ReplicaMode::Err, _)) => panic!("rebuild failed: {status:#?}"),
            _ => tokio::time::sleep(poll).await,
        }
    };
    sync();
    (started.elapsed(), copied)
}

/// Runs 4 KiB random reads and writes (half each) through the engine until
/// `until` completes; its IOPS meanwhile, and what `until` returned.
async fn load<T>(engine: &Arc<Engine>, until: impl Future<Output = T>) -> (f64, T) {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..LOAD_DEPTH)
        .map(|_| {
            let (engine, stop, done) = (engine.clone(), stop.clone(), done.clone());
            tokio::spawn(async move {
                let block = Bytes::from(vec![0x5a; 4096]);
                let mut rng = fastrand::Rng::new();
                while !stop.load(Ordering::Acquire) {
                    let offset = rng.u64(..SIZE / 4096) * 4096;
                    if rng.bool() {
                        engine.write(offset, block.clone()).await.expect("write");
                    } else {
                        engine.read(offset, 4096).await.expect("read");
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let started = Instant::now();
    let result = until.await;
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Release);
    for worker in workers {
        worker.await.expect("load worker");
    }
    (
        done.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64(),
        result,
    )
}

fn sync() {
    let _ = Command::new("sync").status();
}
