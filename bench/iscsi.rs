//! The iSCSI target's read IOPS with libiscsi's `iscsi-perf`, against tgtd
//! serving a plain file in the same run (the baseline): oxhorn's engine
//! over 1 and over 3 replica processes, all on loopback, every LUN 256 MiB
//! filled with data first (hack/iscsi-pattern.c) so no read hits a hole.
//! Prints IOPS and the ratios to tgtd (targets: 1 replica >= 1.0, 3
//! replicas >= 0.5).
//!
//!     cargo bench --bench iscsi [-- SECONDS]      (default 10 per run)

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use oxhorn::protocol::{Access, Key};
use oxhorn_testbed::{EngineProcess, ReplicaProcess, Tgtd};

const SIZE: u64 = 256 << 20;
const BLOCKS: u64 = SIZE / 4096;
const PATIENCE: Duration = Duration::from_secs(30);

/// The workloads: name, iscsi-perf arguments.
const WORKLOADS: [(&str, &[&str]); 2] = [
    ("4K random read QD32", &["-r", "-m", "32", "-b", "1"]),
    ("256K sequential read QD8", &["-m", "8", "-b", "64"]),
];

/// Runs iscsi-perf for `seconds` and returns its average IOPS.
fn iops(url: &str, args: &[&str], seconds: u64) -> f64 {
    let child = Command::new("iscsi-perf")
        .args(args)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("iscsi-perf (hack/install-test-deps.sh installs libiscsi-bin)");
    std::thread::sleep(Duration::from_secs(seconds));
    // It runs until interrupted, then prints its totals.
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
    let _ = kill(pid, Signal::SIGINT);
    let output = child.wait_with_output().expect("iscsi-perf ran");
    let text = String::from_utf8_lossy(&output.stdout);
    text.rsplit("iops average ")
        .next()
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no average in iscsi-perf's output: {text}"))
}

/// Fills a LUN with data through the target.
fn fill(url: &str) {
    let pattern = oxhorn_testbed::tools_dir().join("iscsi-pattern");
    let status = Command::new(pattern)
        .args(["write", url, "1", "0", &BLOCKS.to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("iscsi-pattern (hack/install-test-deps.sh builds it)");
    assert!(status.success(), "filling {url}");
}

struct Served {
    _replicas: Vec<ReplicaProcess>,
    _engine: EngineProcess,
    url: String,
}

async fn serve(oxhorn: &Path, dir: &Path, name: &str, replicas: usize) -> Served {
    let access = Access {
        volume: name.into(),
        key: Key::generate().for_volume(name),
        generation: 1,
    };
    let mut processes = Vec::new();
    for i in 0..replicas {
        let path = dir.join(format!("{name}-r{i}"));
        let mut replica = ReplicaProcess::spawn(oxhorn, &path, SIZE, &access).expect("replica");
        replica
            .wait_serving(PATIENCE)
            .await
            .expect("replica serving");
        processes.push(replica);
    }
    let addresses: Vec<String> = processes.iter().map(ReplicaProcess::address).collect();
    let mut engine =
        EngineProcess::spawn_iscsi(oxhorn, dir, &access, SIZE, &addresses).expect("engine");
    let url = engine
        .wait_endpoint(PATIENCE)
        .await
        .expect("engine serving");
    fill(&url);
    Served {
        _replicas: processes,
        _engine: engine,
        url,
    }
}

#[tokio::main]
async fn main() {
    let seconds = std::env::args()
        .skip(1)
        .find_map(|arg| arg.parse().ok())
        .unwrap_or(10);
    let oxhorn = Path::new(env!("CARGO_BIN_EXE_oxhorn"));
    // On the disk replicas normally live on, not tmpfs.
    let work = tempfile::Builder::new()
        .prefix("oxhorn-bench-")
        .tempdir_in("/var/tmp")
        .expect("work dir");
    let file = work.path().join("tgtd.img");
    std::fs::File::create(&file)
        .and_then(|f| f.set_len(SIZE))
        .expect("tgtd's file");
    let tgtd = Tgtd::start(work.path()).expect("tgtd");
    let baseline = tgtd
        .serve(1, "iqn.2026-01.io.oxhorn.bench:tgtd", &file, 4096)
        .expect("tgtd serving");
    fill(&baseline);
    let one = serve(oxhorn, work.path(), "one", 1).await;
    let three = serve(oxhorn, work.path(), "three", 3).await;

    println!("iscsi-perf, {seconds} s a run, 256 MiB LUNs of 4 KiB blocks, loopback");
    println!(
        "{:<26} {:>12} {:>14} {:>9} {:>14} {:>9}",
        "workload", "tgtd IOPS", "1 replica", "ratio", "3 replicas", "ratio"
    );
    for (name, args) in WORKLOADS {
        let base = iops(&baseline, args, seconds);
        let a = iops(&one.url, args, seconds);
        let b = iops(&three.url, args, seconds);
        println!(
            "{name:<26} {base:>12.0} {a:>14.0} {:>9.2} {b:>14.0} {:>9.2}",
            a / base,
            b / base
        );
    }
}
