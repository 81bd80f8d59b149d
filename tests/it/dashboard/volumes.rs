//! The volumes table as a person uses it: a page at a time, its sort kept
//! from page to page; and actions on the volumes selected in it, each
//! volume's done or refused as it would be alone, and each outcome shown.

use oxhorn::types::{Snapshot, Volume};
use oxhorn_testbed::webdriver::Browser;

use super::{Shots, until_at};
use crate::common::Cluster;

/// The names of the volumes the table shows, in its order.
async fn rows(browser: &Browser) -> Vec<String> {
    let names = browser
        .run(
            "arguments[arguments.length - 1](
               [...document.querySelectorAll('tr[data-volume]')].map((r) => r.dataset.volume));",
        )
        .await;
    serde_json::from_value(names).unwrap()
}

/// Waits until bulk dialog `dialog` has listed `n` outcomes.
async fn until_outcomes(cluster: &Cluster, browser: &Browser, dialog: &str, n: usize) {
    cluster
        .until(&format!("{n} outcomes in {dialog}"), || async {
            let listed = browser.count(&format!("{dialog} li[data-outcome]")).await;
            (listed == n).then_some(())
        })
        .await;
}

/// The names of `volume`'s snapshots.
async fn snapshots_of(cluster: &Cluster, volume: &str) -> Vec<String> {
    let all = cluster.api::<Snapshot>().list(&Default::default()).await;
    all.unwrap()
        .items
        .into_iter()
        .filter(|s| s.spec.volume == volume)
        .map(|s| kube::ResourceExt::name_any(&s))
        .collect()
}

/// With the volumes `db` (attached, no claim), `spare` (detached) and
/// `web` (attached, a claim's), the browser signed in as one who may do
/// everything.
pub async fn table_and_bulk_actions(
    cluster: &Cluster,
    browser: &Browser,
    base: &str,
    shots: &Shots<'_>,
) {
    // Two a page: the second holds the third; sorting starts over at the
    // first page and keeps the page size.
    browser.goto(&format!("{base}/ui/volumes?limit=2")).await;
    assert_eq!(browser.text("#showing").await, "Showing 1–2 of 3");
    assert_eq!(rows(browser).await, ["db", "spare"]);
    browser.click("a[rel=next]").await;
    until_at(cluster, browser, "/ui/volumes?page=2&limit=2").await;
    assert_eq!(browser.text("#showing").await, "Showing 3–3 of 3");
    assert_eq!(rows(browser).await, ["web"]);
    shots.take("volumes-page-2").await;
    browser.click("th[aria-sort=ascending] a").await;
    until_at(cluster, browser, "/ui/volumes?desc=true&limit=2").await;
    assert_eq!(rows(browser).await, ["web", "spare"]);

    // A volume no claim uses says so.
    browser.goto(&format!("{base}/ui/volumes/db")).await;
    let none = browser.text("#workload [data-workload=none]").await;
    assert_eq!(none, "No PersistentVolume uses this volume.");

    // A snapshot of two volumes at once.
    browser.goto(&format!("{base}/ui/volumes")).await;
    assert!(!browser.enabled("[data-open=bulk-snapshot]").await);
    browser.click("input[data-select][value=db]").await;
    browser.click("input[data-select][value=web]").await;
    assert_eq!(browser.text("#selected-count").await, "2 volumes selected");
    shots.take("volumes-selected").await;
    browser.resize(420, 800).await;
    shots.take("volumes-selected-narrow").await;
    browser.resize(1280, 800).await;
    browser.click("[data-open=bulk-snapshot]").await;
    let listed = browser.text("#bulk-snapshot [data-selection]").await;
    assert_eq!(listed.lines().collect::<Vec<_>>(), ["db", "web"]);
    browser.click("#bulk-snapshot button[type=submit]").await;
    until_outcomes(cluster, browser, "#bulk-snapshot", 2).await;
    let done = browser.count("#bulk-snapshot li[data-outcome=done]").await;
    let summary = browser.text("#bulk-snapshot .summary").await;
    assert_eq!((done, summary.as_str()), (2, "All 2 done."));
    shots.take("bulk-snapshot").await;
    for volume in ["db", "web"] {
        let taken = snapshots_of(cluster, volume).await;
        let timed = format!("{volume}-2");
        assert!(taken.iter().any(|s| s.starts_with(&timed)), "{taken:?}");
    }
    browser.click("#bulk-snapshot [data-close]").await;

    // Every volume of the page selected at once, and none.
    browser.click("input[data-select-all]").await;
    assert_eq!(browser.text("#selected-count").await, "3 volumes selected");
    browser.click("input[data-select-all]").await;
    assert_eq!(browser.text("#selected-count").await, "None selected");

    // Deleting two: only once their number is typed; the attached one is
    // refused, as it would be alone, and the other deleted.
    browser.click("input[data-select][value=db]").await;
    browser.click("input[data-select][value=spare]").await;
    browser.click("[data-open=bulk-delete]").await;
    let delete = "#bulk-delete button[type=submit]";
    assert!(!browser.enabled(delete).await);
    browser
        .type_into("#bulk-delete [data-confirm-bulk]", "3")
        .await;
    assert!(!browser.enabled(delete).await);
    browser
        .type_into("#bulk-delete [data-confirm-bulk]", "delete")
        .await;
    assert!(!browser.enabled(delete).await, "a word, not the number");
    browser
        .type_into("#bulk-delete [data-confirm-bulk]", "2")
        .await;
    assert!(browser.enabled(delete).await);
    shots.take("bulk-delete-confirm").await;
    browser.click(delete).await;
    until_outcomes(cluster, browser, "#bulk-delete", 2).await;
    let outcome = |volume: &str| {
        let css = format!("#bulk-delete li[data-result={volume}]");
        async move {
            let shown = browser.text(&css).await;
            let how = browser
                .run(&format!(
                    "arguments[arguments.length - 1](document.querySelector('{css}').dataset.outcome);"
                ))
                .await;
            (how.as_str().unwrap_or_default().to_owned(), shown)
        }
    };
    let (how, shown) = outcome("db").await;
    assert_eq!(how, "failed", "{shown}");
    assert!(shown.contains("is attached to"), "{shown}");
    assert_eq!(outcome("spare").await.0, "done");
    assert_eq!(
        browser.text("#bulk-delete .summary").await,
        "1 of 2 done, 1 failed."
    );
    shots.take("bulk-delete-outcome").await;
    browser.click("#bulk-delete [data-close]").await;
    cluster
        .until("the spare volume deleted", || async {
            let gone = cluster.api::<Volume>().get_opt("spare").await.unwrap();
            gone.is_none().then_some(())
        })
        .await;
    assert!(cluster.volume("db").await.is_some());
    cluster
        .until("the table without the deleted volume", || async {
            (rows(browser).await == ["db", "web"]).then_some(())
        })
        .await;
}
