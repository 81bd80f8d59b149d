//! The recurring-job scheduler's cost: N detached volumes (default 1000, 1
//! replica each) owned by one `oxhorn manager`, and a RecurringJob over all
//! of them every minute, `concurrency` volumes at once (default 10). Its
//! task, `snapshot-cleanup`, skips a detached volume at once ("the volume
//! is detached"), so what is measured is the scheduling itself: each run
//! started, every volume given its turn with its jitter, its record
//! written in its status and counted by the job. The baseline, in the same
//! invocation, is the same manager owning the same volumes with no job,
//! over a window as long.
//!
//! Prints the CPU time of the manager, the API server and etcd over each
//! window (and in millicores), their ratios, the job's cost per minute
//! (one run), the manager's memory, and each run due and finished in the
//! window: its volumes, what became of them, and how long after its time
//! it finished.
//!
//!     cargo bench --bench recurring [-- N] [--concurrency C] [--window SECONDS]

#[path = "fleet.rs"]
mod fleet;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use kube::api::{Api, PostParams};
use oxhorn::metrics::process::stat;
use oxhorn::types::{JobRun, RecurringJob, Replica, Volume, VolumeState};
use oxhorn_testbed::{self as testbed, ControlPlane, ManagerOptions, ManagerProcess};
use serde_json::json;

use fleet::{create_namespace, create_volumes, memory, mib, until_all, until_scheduled};

const NODE: &str = "recurring-node";
/// The node's address, of its own: the tests take 127.0.x.y, the scale
/// bench 127.2.0.1, the standby bench 127.3.0.x.
const IP: [u8; 4] = [127, 4, 0, 1];
const JOB: &str = "every-minute";
/// How long the manager is left after the volumes are made, before either
/// window: their creation's own work done.
const REST: Duration = Duration::from_secs(30);

struct Args {
    count: usize,
    concurrency: u32,
    window: Duration,
}

fn args() -> Args {
    let mut args = Args {
        count: 1000,
        concurrency: 10,
        window: Duration::from_secs(180),
    };
    let mut given = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(arg) = given.next() {
        let mut value = || {
            given
                .next()
                .unwrap_or_else(|| panic!("{arg} takes a value"))
        };
        match arg.as_str() {
            "--concurrency" => args.concurrency = value().parse().expect("a count"),
            "--window" => args.window = Duration::from_secs(value().parse().expect("seconds")),
            count => args.count = count.parse().expect("a volume count"),
        }
    }
    args
}

/// The processes measured, by name.
struct Measured(Vec<(&'static str, u32)>);

impl Measured {
    /// The manager, and this bench's API server and etcd (its children).
    fn find(manager: u32) -> Self {
        let mut found = vec![("manager", manager)];
        let me = std::process::id();
        let entries = std::fs::read_dir("/proc").expect("/proc");
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            if stat(pid).is_none_or(|s| s.parent != me) {
                continue;
            }
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            match comm.trim() {
                "kube-apiserver" => found.push(("kube-apiserver", pid)),
                "etcd" => found.push(("etcd", pid)),
                _ => {}
            }
        }
        Self(found)
    }

    fn cpu(&self) -> BTreeMap<&'static str, Duration> {
        self.0
            .iter()
            .map(|(name, pid)| (*name, stat(*pid).map_or(Duration::ZERO, |s| s.cpu)))
            .collect()
    }
}

/// CPU time each process used over `window`, and the job's runs due and
/// finished in it.
async fn window(
    measured: &Measured,
    window: Duration,
    jobs: &Api<RecurringJob>,
) -> (BTreeMap<&'static str, Duration>, Vec<JobRun>) {
    let before = measured.cpu();
    let started = Instant::now();
    let opened = jiff::Timestamp::now();
    let mut runs: BTreeMap<String, JobRun> = BTreeMap::new();
    while started.elapsed() < window {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let run = jobs
            .get_opt(JOB)
            .await
            .expect("job")
            .and_then(|job| job.status?.last_run);
        if let Some(run) = run.filter(|r| r.finished_at.is_some() && r.scheduled_at.0 >= opened) {
            runs.insert(run.scheduled_at.0.to_string(), run);
        }
    }
    let after = measured.cpu();
    let used = after
        .iter()
        .map(|(name, cpu)| (*name, cpu.saturating_sub(before[name])))
        .collect();
    (used, runs.into_values().collect())
}

#[tokio::main]
async fn main() {
    let args = args();
    let oxhorn = Path::new(env!("CARGO_BIN_EXE_oxhorn"));
    let control_plane = ControlPlane::start().await.expect("control plane");
    let client = control_plane.client().expect("client");
    let ns = create_namespace(&client, "recurring").await;
    fleet::one_node_holds_all(&client, &ns).await;
    testbed::register_kube_node(&client, NODE, &[])
        .await
        .expect("kube node");
    let mut options = ManagerOptions::new(control_plane.kubeconfig(), NODE, &ns);
    options.ip = IpAddr::from(IP);
    let mut manager = ManagerProcess::start(oxhorn, options).expect("manager");
    manager
        .connect(Duration::from_secs(60))
        .await
        .expect("manager serving");

    create_volumes(&client, &ns, args.count, 1).await;
    until_scheduled(Api::<Replica>::namespaced(client.clone(), &ns), args.count).await;
    let volumes: Api<Volume> = Api::namespaced(client.clone(), &ns);
    until_all(volumes, args.count, |v: &Volume| {
        v.status
            .as_ref()
            .is_some_and(|s| s.owner_id == NODE && s.state == VolumeState::Detached)
    })
    .await;
    tokio::time::sleep(REST).await;
    let measured = Measured::find(manager.pid());
    let jobs: Api<RecurringJob> = Api::namespaced(client.clone(), &ns);
    let (idle, _) = window(&measured, args.window, &jobs).await;
    let idle_memory = memory(manager.pid());

    let spec = json!({"task": "snapshot-cleanup", "cron": "* * * * *", "groups": ["default"],
                      "concurrency": args.concurrency});
    let job = RecurringJob::new(JOB, serde_json::from_value(spec).expect("spec"));
    jobs.create(&PostParams::default(), &job)
        .await
        .expect("job");
    // The first run makes each volume's record: measured from its end.
    let waited = Instant::now();
    loop {
        let status = jobs.get(JOB).await.expect("job").status.unwrap_or_default();
        if status.last_run.is_some_and(|r| r.finished_at.is_some()) {
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(300),
            "the job's first run did not finish within 5 minutes"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (busy, runs) = window(&measured, args.window, &jobs).await;
    let busy_memory = memory(manager.pid());
    manager.power_off();

    report(&args, &idle, &busy, idle_memory, busy_memory, &runs);
}

fn report(
    args: &Args,
    idle: &BTreeMap<&'static str, Duration>,
    busy: &BTreeMap<&'static str, Duration>,
    idle_memory: (u64, u64),
    busy_memory: (u64, u64),
    runs: &[JobRun],
) {
    let seconds = args.window.as_secs_f64();
    println!(
        "{} detached volumes on one manager, a job every minute over all of them \
         (concurrency {}); {}-s windows, 2 cores shared with the API server and etcd",
        args.count, args.concurrency, seconds
    );
    println!(
        "  {:<16} {:>14} {:>14} {:>8} {:>16}",
        "CPU", "no job", "the job", "ratio", "the job's cost"
    );
    let minutes = seconds / 60.0;
    for (name, busy_cpu) in busy {
        let idle_cpu = idle[name];
        let millicores = |cpu: Duration| cpu.as_secs_f64() * 1000.0 / seconds;
        let cost = busy_cpu.as_secs_f64() - idle_cpu.as_secs_f64();
        println!(
            "  {:<16} {:>7.2} s {:>3.0} m {:>7.2} s {:>3.0} m {:>8.2} {:>9.2} s/min",
            name,
            idle_cpu.as_secs_f64(),
            millicores(idle_cpu),
            busy_cpu.as_secs_f64(),
            millicores(*busy_cpu),
            busy_cpu.as_secs_f64() / idle_cpu.as_secs_f64().max(0.001),
            cost / minutes,
        );
    }
    println!(
        "  manager RSS: {:.1} MiB with no job, {:.1} MiB with it (peak {:.1} MiB)",
        mib(idle_memory.0),
        mib(busy_memory.0),
        mib(busy_memory.1)
    );
    println!("  runs due and finished in the window (one a minute):");
    for run in runs {
        let took = run
            .finished_at
            .as_ref()
            .map(|end| end.0.duration_since(run.scheduled_at.0));
        println!(
            "    {}: {} volumes, {} succeeded, {} skipped, {} failed; finished {:.0?} after its time",
            run.scheduled_at.0,
            run.volumes,
            run.succeeded,
            run.skipped,
            run.failed,
            took.map(|t| Duration::try_from(t).unwrap_or_default()),
        );
    }
}
