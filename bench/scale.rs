//! Control-plane scale: N volumes (default 1000, 3 replicas each, detached)
//! created against one manager; the time until every replica is scheduled
//! and the manager's peak resident memory. The baseline, in the same
//! invocation on the same API server, is creating the same N Volume objects
//! with no manager running: the API server's own cost. Prints both and the
//! ratios. Targets (bench/README.md): all scheduled in under 60 s, peak RSS
//! under 100 MiB.
//!
//! Then the manager's `/metrics` (issue 33's cardinality test): scraped 5
//! times with no volume (its node and disk reported), and 5 times once it
//! owns the N volumes and each is detached. Each scrape is one HTTP/1.1 GET
//! on a new connection, timed until the body's last byte. Prints the body's
//! size, the median and slowest scrape, the sample lines (all, and of the
//! `oxhorn_volume_*` and `oxhorn_replica_*` families) with their ratios to
//! the baseline and per volume, and the families that grew. A detached
//! volume has no engine running, so none of the engine's I/O series: the
//! bound printed for an attached one adds them, counted from
//! src/metrics/families.rs.
//!
//! Then the dashboard's volumes page (`dashboard_page.rs`), with no volume
//! and with the N: its weight, the manager's answer, and in a headless
//! chromium the time until it is rendered.
//!
//!     cargo bench --bench scale [-- N]

#[path = "dashboard_page.rs"]
mod dashboard_page;
#[path = "fleet.rs"]
mod fleet;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use kube::api::Api;
use oxhorn::types::{Replica, Volume, VolumeState};
use oxhorn_testbed::{self as testbed, ControlPlane, ManagerOptions, ManagerProcess};

use fleet::{create_namespace, create_volumes, memory, mib, until_all, until_scheduled};

const REPLICAS: usize = 3;
const NODE: &str = "scale-node";
/// The node's address, of its own so that the metrics port cannot clash:
/// the tests' nodes take 127.0.x.y, the local-cluster example 127.1.0.x.
const IP: [u8; 4] = [127, 2, 0, 1];
/// The manifest's metrics and API ports.
const METRICS_PORT: u16 = 9811;
const API_PORT: u16 = 9500;
const SCRAPES: usize = 5;
/// The engine's I/O series of one attached volume (src/metrics/families.rs):
/// 8 counters (ops of read, write, flush and unmap; bytes of read, write
/// and unmap; bytes its rebuilds copied), an error counter per op, and 3
/// latency histograms (read, write, flush) of 18 finite buckets, +Inf, sum
/// and count. None for a detached volume.
const IO_SERIES: usize = 8 + 4 + 3 * (18 + 1 + 2);
/// The families with series per volume; the rest are per node, disk,
/// backup target, controller or API verb.
const VOLUME_FAMILIES: [&str; 4] = [
    "oxhorn_volume_",
    "oxhorn_replica_",
    "oxhorn_rebuild_",
    "oxhorn_backups{",
];

#[tokio::main]
async fn main() {
    let count: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1000);
    let oxhorn = Path::new(env!("CARGO_BIN_EXE_oxhorn"));
    let control_plane = ControlPlane::start().await.expect("control plane");
    let client = control_plane.client().expect("client");

    let baseline = create_namespace(&client, "baseline").await;
    let started = Instant::now();
    create_volumes(&client, &baseline, count, REPLICAS).await;
    let api_only = started.elapsed();

    let ns = create_namespace(&client, "scale").await;
    fleet::one_node_holds_all(&client, &ns).await;
    testbed::register_kube_node(&client, NODE, &[])
        .await
        .expect("kube node");
    let mut options = ManagerOptions::new(control_plane.kubeconfig(), NODE, &ns);
    options.ip = IpAddr::from(IP);
    options.metrics_port = Some(METRICS_PORT);
    options.api_port = Some(API_PORT);
    let mut manager = ManagerProcess::start(oxhorn, options).expect("manager");
    manager
        .connect(Duration::from_secs(60))
        .await
        .expect("manager serving");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = memory(manager.pid());
    let metrics = manager.metrics_address().expect("a metrics port");
    // The node and its disk are reported once the manager has them.
    until_scraped(metrics, |text| {
        samples(text).any(|l| l.starts_with("oxhorn_disk_capacity_bytes{"))
    })
    .await;
    let before = scrapes(metrics).await;
    let base = format!("http://{}", manager.api_address().expect("an API port"));
    let token = dashboard_page::viewer_token(&client, &ns).await;
    let shots = tempfile::tempdir().expect("a screenshot directory");
    let browser = testbed::webdriver::Browser::start(1280, 800, shots.path()).await;
    dashboard_page::sign_in(&browser, &base, &token).await;
    let page_before = dashboard_page::measure(&browser, &base, &token).await;
    // No page open while the volumes are made: a live one would render
    // again with each change, and load the manager measured.
    browser.goto("about:blank").await;

    let started = Instant::now();
    create_volumes(&client, &ns, count, REPLICAS).await;
    let created = started.elapsed();
    let replicas: Api<Replica> = Api::namespaced(client.clone(), &ns);
    let scheduled_in = tokio::time::timeout(
        Duration::from_secs(900),
        until_scheduled(replicas, count * REPLICAS),
    )
    .await
    .map(|()| started.elapsed())
    .expect("not every replica scheduled within 15 minutes");
    let settled = memory(manager.pid());

    // Every volume this manager's and detached, as the API server has
    // them; then as the manager's caches have them, in a scrape.
    let volumes: Api<Volume> = Api::namespaced(client.clone(), &ns);
    tokio::time::timeout(
        Duration::from_secs(300),
        until_all(volumes, count, |v: &Volume| {
            v.status
                .as_ref()
                .is_some_and(|s| s.owner_id == NODE && s.state == VolumeState::Detached)
        }),
    )
    .await
    .expect("not every volume owned by the manager and detached within 5 minutes");
    until_scraped(metrics, |text| {
        samples(text)
            .filter(|l| l.starts_with("oxhorn_volume_capacity_bytes{"))
            .count()
            == count
    })
    .await;
    let after = scrapes(metrics).await;
    let scraped = memory(manager.pid());
    let page_after = dashboard_page::measure(&browser, &base, &token).await;
    browser.quit().await;

    println!(
        "{count} volumes x {REPLICAS} replicas, one manager, 2 cores shared with the API server and etcd"
    );
    println!(
        "  baseline: {count} Volume objects created, no manager:  {:>8.2?}",
        api_only
    );
    println!(
        "  with the manager: created in {created:>8.2?}, all scheduled in {scheduled_in:>8.2?}  (target < 60 s)"
    );
    println!(
        "  ratio scheduled / baseline: {:.2}",
        scheduled_in.as_secs_f64() / api_only.as_secs_f64()
    );
    println!(
        "  manager RSS idle {:.1} MiB, now {:.1} MiB, peak {:.1} MiB  (target peak < 100 MiB)",
        mib(idle.0),
        mib(settled.0),
        mib(settled.1)
    );
    println!(
        "  ratio peak / idle: {:.2}",
        settled.1 as f64 / idle.0 as f64
    );
    println!(
        "  manager RSS after the scrapes {:.1} MiB, peak {:.1} MiB",
        mib(scraped.0),
        mib(scraped.1)
    );
    report_scrapes(count, &before, &after);
    dashboard_page::report(count, &page_before, &page_after);
    manager.power_off();
}

/// One `/metrics` answer: how long it took and what it said.
struct Scrape {
    time: Duration,
    body: String,
}

/// The sample lines of an exposition: all but comments (and blank lines).
fn samples(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

fn lines_of(scrape: &Scrape, prefix: &str) -> usize {
    samples(&scrape.body)
        .filter(|l| l.starts_with(prefix))
        .count()
}

/// Sample lines per family: the sample's name less a histogram's or a
/// counter's suffix.
fn families(scrape: &Scrape) -> BTreeMap<String, usize> {
    let mut families = BTreeMap::new();
    for line in samples(&scrape.body) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        let family = ["_bucket", "_sum", "_count", "_total", "_created"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        *families.entry(family.to_owned()).or_default() += 1;
    }
    families
}

/// GET /metrics on a new connection, timed from the connect until the
/// body's last byte.
fn scrape(address: SocketAddr) -> Scrape {
    let started = Instant::now();
    let mut stream = TcpStream::connect(address).expect("metrics port");
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .expect("request sent");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).expect("answer read");
    let time = started.elapsed();
    let answer = String::from_utf8(answer).expect("UTF-8");
    let (head, body) = answer.split_once("\r\n\r\n").expect("headers");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let length = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())?
    });
    assert_eq!(length, Some(body.len()), "{head}");
    Scrape {
        time,
        body: body.to_owned(),
    }
}

async fn scrape_async(address: SocketAddr) -> Scrape {
    tokio::task::spawn_blocking(move || scrape(address))
        .await
        .expect("scrape")
}

/// [`SCRAPES`] scrapes one after the other.
async fn scrapes(address: SocketAddr) -> Vec<Scrape> {
    let mut scrapes = Vec::with_capacity(SCRAPES);
    for _ in 0..SCRAPES {
        scrapes.push(scrape_async(address).await);
    }
    scrapes
}

/// Scrapes every 200 ms until a scrape's body satisfies `done`.
async fn until_scraped(address: SocketAddr, done: impl Fn(&str) -> bool) {
    let waited = Instant::now();
    loop {
        if done(&scrape_async(address).await.body) {
            return;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(120),
            "the scrapes did not show it within 2 minutes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// (median, max) scrape time.
fn times(scrapes: &[Scrape]) -> (Duration, Duration) {
    let mut times: Vec<_> = scrapes.iter().map(|s| s.time).collect();
    times.sort();
    (times[times.len() / 2], times[times.len() - 1])
}

fn ratio(after: f64, before: f64) -> String {
    if before == 0.0 {
        "-".to_owned()
    } else {
        format!("{:.1}", after / before)
    }
}

fn report_scrapes(count: usize, before: &[Scrape], after: &[Scrape]) {
    // Sizes and lines from each side's last scrape; times over all.
    let (b, a) = (&before[before.len() - 1], &after[after.len() - 1]);
    let ((b_median, b_max), (a_median, a_max)) = (times(before), times(after));
    println!("  /metrics, {SCRAPES} scrapes each (new connection, until the body's last byte):");
    println!(
        "    {:<24} {:>12} {:>12} {:>8} {:>12}",
        "",
        "no volume",
        format!("{count} volumes"),
        "ratio",
        "per volume"
    );
    let size = (b.body.len() as f64, a.body.len() as f64);
    println!(
        "    {:<24} {:>12} {:>12} {:>8} {:>12.0}",
        "body, bytes",
        b.body.len(),
        a.body.len(),
        ratio(size.1, size.0),
        (size.1 - size.0) / count as f64
    );
    for (what, before, after) in [("median", b_median, a_median), ("max", b_max, a_max)] {
        println!(
            "    {:<24} {:>12} {:>12} {:>8}",
            format!("scrape time, {what}"),
            format!("{before:.2?}"),
            format!("{after:.2?}"),
            ratio(after.as_secs_f64(), before.as_secs_f64())
        );
    }
    let each = |scrapes: &[Scrape]| {
        let times: Vec<_> = scrapes.iter().map(|s| format!("{:.2?}", s.time)).collect();
        times.join(", ")
    };
    println!(
        "    {:<24} {} | {}",
        "each scrape, in turn",
        each(before),
        each(after)
    );
    for (what, prefix) in [
        ("sample lines", ""),
        ("oxhorn_volume_* lines", "oxhorn_volume_"),
        ("oxhorn_replica_* lines", "oxhorn_replica_"),
    ] {
        let (before, after) = (lines_of(b, prefix), lines_of(a, prefix));
        println!(
            "    {what:<24} {before:>12} {after:>12} {:>8} {:>12.2}",
            ratio(after as f64, before as f64),
            (after as f64 - before as f64) / count as f64
        );
    }
    let (b_families, a_families) = (families(b), families(a));
    println!("  families whose lines changed:");
    for (family, after) in &a_families {
        let before = b_families.get(family).copied().unwrap_or(0);
        if *after != before {
            println!("    {family:<48} {before:>6} -> {after}");
        }
    }
    let grown = |prefixes: &[&str]| {
        let lines = |s| prefixes.iter().map(|p| lines_of(s, p)).sum::<usize>();
        lines(a) as f64 - lines(b) as f64
    };
    let per_volume = grown(&VOLUME_FAMILIES) / count as f64;
    println!(
        "  series per detached volume: {per_volume:.2} (the volume's, replicas', rebuilds' and \
         backups' families); not per volume: {:+} lines of the other families",
        grown(&[""]) - grown(&VOLUME_FAMILIES)
    );
    println!(
        "  bound per attached volume of {REPLICAS} replicas: {:.0} = {per_volume:.0} + \
         {IO_SERIES} engine I/O (8 counters + 4 errors + 3 histograms x 21) + \
         {} replica modes (3 per replica); + 1 once backed up, + 1 per backup state, \
         + 1 per rebuilding replica",
        per_volume + (IO_SERIES + 3 * REPLICAS) as f64,
        3 * REPLICAS
    );
}
