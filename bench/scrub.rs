//! Scrub speed: a 1 GiB volume of 3 replicas with 512 MiB written, a
//! snapshot, and 64 MiB more written on top, scrubbed with no bandwidth
//! limit: every block of both layers on every replica checked against its
//! checksum, and every chunk of the volume compared across the replicas.
//! The baseline, in the same invocation on the same files, is the least a
//! scrub must do: each replica's layer files read (their data extents
//! only) and CRC-32C'd, the three replicas at once. Both run from the page
//! cache, after a `sync`. Prints both, and the ratio (speed vs the
//! baseline).
//!
//!     cargo bench --bench scrub

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use nix::unistd::{Whence, lseek};
use oxhorn::engine::Engine;
use oxhorn::frontend::BlockDevice;
use oxhorn::protocol::{Access, Key};
use oxhorn_testbed::ReplicaProcess;

const SIZE: u64 = 1 << 30;
const WRITTEN: u64 = 512 << 20;
const ON_TOP: u64 = 64 << 20;
const WRITE: usize = 1 << 20;
const ROUNDS: usize = 3;

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
    let engine = Engine::start(&access, SIZE, &addresses, false)
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
    engine.snapshot("base", true).await.expect("snapshot");
    for i in 0..ON_TOP / WRITE as u64 {
        engine
            .write(i * 4 * WRITE as u64, data.clone())
            .await
            .expect("write");
    }
    engine.flush().await.expect("flush");
    sync();

    let dirs: Vec<PathBuf> = replicas.iter().map(|r| r.dir().to_path_buf()).collect();
    let mut scrubs = Vec::new();
    let mut plains = Vec::new();
    let mut checked = 0;
    for _ in 0..ROUNDS {
        let started = Instant::now();
        engine.run_scrub(0).await.expect("scrub");
        scrubs.push(started.elapsed());
        let status = engine.scrub_status();
        assert_eq!(
            status.rotten_bytes + status.mismatched_chunks,
            0,
            "{status:?}"
        );
        checked = status.checked_bytes;
        let started = Instant::now();
        let read = read_layers(&dirs);
        plains.push(started.elapsed());
        assert_eq!(read, checked, "the baseline read what the scrub checked");
    }
    let scrub = median(scrubs);
    let plain = median(plains);
    let mib = checked as f64 / (1 << 20) as f64;
    println!(
        "scrub of a {} MiB volume, 3 replicas, {mib:.0} MiB of layers in all (median of {ROUNDS})",
        SIZE >> 20
    );
    println!(
        "  oxhorn scrub          {:>8.2} s  {:>8.1} MiB/s",
        scrub.as_secs_f64(),
        mib / scrub.as_secs_f64()
    );
    println!(
        "  read + CRC-32C        {:>8.2} s  {:>8.1} MiB/s",
        plain.as_secs_f64(),
        mib / plain.as_secs_f64()
    );
    println!(
        "  ratio (speed vs it)   {:>8.2}",
        plain.as_secs_f64() / scrub.as_secs_f64()
    );
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort_unstable();
    times[times.len() / 2]
}

/// Reads every data extent of every layer file under `dirs`, a thread per
/// directory, and CRC-32Cs it; returns the bytes read.
fn read_layers(dirs: &[PathBuf]) -> u64 {
    std::thread::scope(|scope| {
        let readers: Vec<_> = dirs
            .iter()
            .map(|dir| scope.spawn(move || read_dir_layers(dir)))
            .collect();
        readers.into_iter().map(|r| r.join().expect("reader")).sum()
    })
}

fn read_dir_layers(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).expect("replica dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "img") {
            total += read_extents(&path);
        }
    }
    total
}

fn read_extents(path: &Path) -> u64 {
    let file = File::open(path).expect("layer");
    let mut buf = vec![0u8; 1 << 20];
    let (mut pos, mut total, mut crc) = (0i64, 0u64, 0u32);
    while let Ok(data) = lseek(&file, pos, Whence::SeekData) {
        let hole = lseek(&file, data, Whence::SeekHole).expect("SEEK_HOLE");
        let mut at = data;
        while at < hole {
            let len = ((hole - at) as usize).min(buf.len());
            file.read_exact_at(&mut buf[..len], at as u64)
                .expect("read");
            crc ^= crc32c::crc32c(&buf[..len]);
            at += len as i64;
        }
        total += (hole - data) as u64;
        pos = hole;
    }
    std::hint::black_box(crc);
    total
}

fn sync() {
    let _ = Command::new("sync").status();
}
