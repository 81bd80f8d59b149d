//! The dashboard's volumes page, as a person signed in gets it: its weight
//! and how long the manager takes to answer it (plain GETs with the session
//! cookie), and in Debian's headless chromium the time to the response's
//! end and to DOMContentLoaded (the browser's Navigation Timing). The page
//! is whole in its HTML, its stylesheet in its head, so it first renders
//! at DOMContentLoaded; headless chromium records no paint timing to say
//! so itself. For bench/scale.rs, with its N volumes and with none.

use std::time::{Duration, Instant};

use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::Client;
use oxhorn_testbed::webdriver::Browser;

/// Loads of the page each side takes.
const LOADS: usize = 5;

/// What one side measured: medians over [`LOADS`] loads.
pub struct PageLoad {
    pub bytes: usize,
    pub server: Duration,
    pub response_end_ms: f64,
    pub dom_ready_ms: f64,
}

/// A token of a ServiceAccount of `ns` that may read what the page shows.
pub async fn viewer_token(client: &Client, ns: &str) -> String {
    let read = PolicyRule {
        api_groups: Some(vec!["oxhorn.io".into()]),
        resources: Some(vec!["*".into()]),
        verbs: vec!["get".into(), "list".into()],
        ..PolicyRule::default()
    };
    oxhorn_testbed::account_token(client, ns, "bench-viewer", vec![read])
        .await
        .expect("a token")
}

/// Signs `browser` in at `base` with `token`.
pub async fn sign_in(browser: &Browser, base: &str, token: &str) {
    browser.goto(&format!("{base}/ui/signin")).await;
    browser.type_into("#token", token).await;
    browser.click("button[type=submit]").await;
    let waited = Instant::now();
    while !browser.url().await.ends_with("/ui/") {
        assert!(waited.elapsed() < Duration::from_secs(60), "not signed in");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The volumes page, loaded [`LOADS`] times each way.
pub async fn measure(browser: &Browser, base: &str, token: &str) -> PageLoad {
    let url = format!("{base}/ui/volumes");
    let http = reqwest::Client::new();
    let mut served = Vec::new();
    let mut bytes = 0;
    for _ in 0..LOADS {
        let started = Instant::now();
        let answer = http
            .get(&url)
            .header("cookie", format!("oxhorn_session={token}"))
            .send()
            .await
            .expect("the page");
        assert_eq!(answer.status(), 200);
        bytes = answer.bytes().await.expect("the page's body").len();
        served.push(started.elapsed());
    }
    let (mut response_end, mut dom_ready) = (vec![], vec![]);
    for _ in 0..LOADS {
        browser.goto(&url).await;
        let timing = browser
            .run(
                "const done = arguments[arguments.length - 1];
                 const n = performance.getEntriesByType('navigation')[0];
                 done({responseEnd: n.responseEnd, dom: n.domContentLoadedEventEnd});",
            )
            .await;
        let ms = |key: &str| timing[key].as_f64().unwrap_or(f64::NAN);
        response_end.push(ms("responseEnd"));
        dom_ready.push(ms("dom"));
    }
    PageLoad {
        bytes,
        server: median(served),
        response_end_ms: median_f(response_end),
        dom_ready_ms: median_f(dom_ready),
    }
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn median_f(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Prints both sides and their ratios.
pub fn report(count: usize, none: &PageLoad, all: &PageLoad) {
    let row = |what: &str, before: f64, after: f64, unit: &str| {
        println!(
            "    {what:<34} {before:>10.1} {after:>10.1} {unit:<3} ratio {:.1}",
            after / before
        );
    };
    println!("  the dashboard's volumes page, medians of {LOADS} loads (no volume | {count}):");
    row("page weight (HTML)", kib(none.bytes), kib(all.bytes), "KiB");
    row(
        "manager's answer (GET, cookie)",
        none.server.as_secs_f64() * 1e3,
        all.server.as_secs_f64() * 1e3,
        "ms",
    );
    row(
        "browser: response end",
        none.response_end_ms,
        all.response_end_ms,
        "ms",
    );
    row(
        "browser: DOMContentLoaded (rendered)",
        none.dom_ready_ms,
        all.dom_ready_ms,
        "ms",
    );
}

fn kib(bytes: usize) -> f64 {
    bytes as f64 / 1024.0
}
