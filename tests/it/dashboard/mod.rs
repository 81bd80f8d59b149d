//! The dashboard as a person uses it, in a real browser (Debian's
//! headless chromium over WebDriver): signing in with a token, making a
//! volume and seeing it healthy and who uses it, a replica killed and the
//! volume seen degraded, rebuilding with its progress and healthy again
//! without a reload, a snapshot taken and backed up to MinIO and restored
//! into a new volume, a volume deleted only once its name is typed; the
//! volumes table a page at a time, and actions on several volumes at once
//! (`volumes.rs`); a read-only user offered nothing to destroy, and a
//! request forged without the session's CSRF token refused. Screenshots
//! of each step are kept in the test's target directory (`dashboard/`),
//! to look at.

mod volumes;

use std::cell::{Cell, RefCell};
use std::path::PathBuf;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use oxhorn::types::{DEFAULT_BACKUP_TARGET, Node, Setting, Volume};
use oxhorn_testbed::ObjectServerKind;
use serde_json::json;

use crate::backup::{BUCKET, Store, create_target, credential_secret, until_target};
use crate::common::{Cluster, MIB, require_root, write_pattern};
use crate::metrics::replica_process;
use crate::rest_api::workload::{make_workload, may_get_persistent_volumes, remove_workload};
use crate::rest_api::{READ, Rule, account_with, oxhorn};
use oxhorn_testbed::webdriver::Browser;

const KINDS: &[&str] = &[
    "volumes",
    "snapshots",
    "replicas",
    "backups",
    "backuptargets",
    "backupvolumes",
    "nodes",
    "settings",
];
const WRITE: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];

fn shots() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard")
}

/// Reading the namespace's events, as `kubectl get events` does.
fn events<'a>() -> Rule<'a> {
    Rule {
        group: "",
        resources: &["events"],
        verbs: &["list"],
    }
}

/// Reading the claims and Pods of the test's namespace, as a volume's
/// workload needs (with getting PersistentVolumes).
fn workloads<'a>() -> Rule<'a> {
    Rule {
        group: "",
        resources: &["persistentvolumeclaims", "pods"],
        verbs: &["get", "list"],
    }
}

/// Screenshots, numbered in the order taken.
struct Shots<'a> {
    browser: &'a Browser,
    step: Cell<u32>,
}

impl Shots<'_> {
    async fn take(&self, name: &str) {
        self.step.set(self.step.get() + 1);
        let path = self
            .browser
            .screenshot(&format!("{:02}-{name}", self.step.get()))
            .await;
        eprintln!("screenshot: {}", path.display());
    }
}

/// Waits until the browser shows the page at `path`.
async fn until_at(cluster: &Cluster, browser: &Browser, path: &str) {
    cluster
        .until(&format!("the browser at {path}"), || async {
            browser.url().await.ends_with(path).then_some(())
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_as_a_person_uses_it() {
    require_root();
    let store = Store::start(ObjectServerKind::Minio);
    let cluster = Cluster::start("ui", 2).await;
    let node = cluster.nodes[0].node_id().to_owned();
    credential_secret(&cluster, "minio", &store, true).await;
    let url = store.url(BUCKET);
    create_target(&cluster, DEFAULT_BACKUP_TARGET, &url, "minio", "300s").await;
    until_target(&cluster, DEFAULT_BACKUP_TARGET, "Synced").await;
    let admin_rules = [oxhorn(KINDS, WRITE), events(), workloads()];
    let admin = account_with(&cluster, "admin", &admin_rules).await;
    let may_read_pvs = may_get_persistent_volumes(&cluster, "admin").await;
    let reader = account_with(&cluster, "reader", &[oxhorn(KINDS, READ), events()]).await;
    let base = format!("http://{}", cluster.nodes[0].api_address().unwrap());
    // What the volumes table and its bulk actions are tried on (beside
    // the volume made from the dashboard): one in use, one not.
    cluster.create_volume("db", 16 * MIB, 1).await;
    cluster.create_volume("spare", 16 * MIB, 1).await;
    cluster.attach("db", &node).await;
    // The volume about to be made is a claim's, as the CSI provisioner
    // would have it, and a Pod uses the claim.
    let pv = make_workload(&cluster, "web", "data", &[("app", "data")]).await;
    let browser = Browser::start(1280, 800, &shots()).await;
    let shots = Shots {
        browser: &browser,
        step: Cell::new(0),
    };

    // Signing in: a page of the dashboard asks for a token first.
    browser.goto(&format!("{base}/ui/volumes")).await;
    assert!(browser.url().await.ends_with("/ui/signin"));
    shots.take("sign-in").await;
    browser.type_into("#token", "not a token").await;
    browser.click("button[type=submit]").await;
    let error = browser.text("p.error").await;
    assert!(error.contains("not a Kubernetes token"), "{error}");
    browser.type_into("#token", &admin).await;
    browser.click("button[type=submit]").await;
    until_at(&cluster, &browser, "/ui/").await;
    let who = browser.text(".who strong").await;
    assert!(who.ends_with(":admin"), "{who}");
    shots.take("overview").await;

    // A volume made from the dashboard.
    browser.goto(&format!("{base}/ui/volumes")).await;
    browser.click("[data-open=create-volume]").await;
    browser
        .type_into("#create-volume [data-field=name]", "web")
        .await;
    browser
        .type_into("#create-volume [data-field=size]", "16")
        .await;
    browser
        .click("#create-volume select[data-unit-for=size] option[value='1048576']")
        .await;
    browser
        .type_into("#create-volume [data-field=numberOfReplicas]", "2")
        .await;
    shots.take("create-volume").await;
    browser.click("#create-volume button[type=submit]").await;
    cluster
        .until("the volume's page", || async {
            browser
                .url()
                .await
                .ends_with("/ui/volumes/web")
                .then_some(())
        })
        .await;
    let made = cluster.volume("web").await.unwrap();
    assert_eq!(
        (made.spec.size, made.spec.number_of_replicas),
        (16 << 20, 2)
    );
    // From here on, the page is never loaded again: what changes, changes
    // live.
    browser
        .run("window.kept = true; arguments[arguments.length - 1](true);")
        .await;

    // Attached from the dashboard: healthy.
    browser.click("[data-open=attach]").await;
    browser.type_into("#attach [data-field=node]", &node).await;
    browser.click("#attach button[type=submit]").await;
    let badge = "header.page .badge";
    cluster
        .until("the volume shown healthy", || async {
            (browser.text(badge).await == "healthy").then_some(())
        })
        .await;
    shots.take("volume-healthy").await;

    // Who uses it: the PersistentVolume, its claim, and the claim's Pod.
    let pv_shown = browser.text("#workload [data-fact=pv]").await;
    assert!(pv_shown.starts_with(&pv), "{pv_shown}");
    let claim = browser.text("#workload [data-fact=claim]").await;
    assert!(
        claim.starts_with(&format!("{}/data", cluster.ns.name())),
        "{claim}"
    );
    let pod = browser.text("#workload tr[data-pod=app]").await;
    assert!(pod.contains("no-kubelet-here"), "{pod}");

    // A replica killed: degraded, then rebuilding with progress, then
    // healthy again, as it happens. The rebuild is slowed to be seen.
    let engine = cluster.engine_of("web").await.unwrap();
    let device = engine.status.as_ref().unwrap().endpoint.clone();
    write_pattern(&device, 12 << 20, 5);
    cluster.set("replica-rebuild-bandwidth-limit", "2").await;
    let victim = cluster
        .replicas_of("web")
        .await
        .into_iter()
        .find(|r| r.spec.instance.node_id != node)
        .unwrap();
    let address = &engine.spec.replica_address_map[&kube::ResourceExt::name_any(&victim)];
    let pid = replica_process(address).unwrap_or_else(|| panic!("no replica serves {address}"));
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    let seen = RefCell::new(Vec::<String>::new());
    let progress_seen = Cell::new(false);
    cluster
        .until("the volume shown degraded, rebuilding, healthy", || async {
            let now = browser.text(badge).await;
            if seen.borrow().last() != Some(&now) {
                seen.borrow_mut().push(now.clone());
                shots.take(&format!("volume-{now}")).await;
            }
            if browser.count("[data-progress]").await > 0 {
                progress_seen.set(true);
            }
            let rebuilt = seen.borrow().iter().any(|s| s == "rebuilding");
            (rebuilt && now == "healthy").then_some(())
        })
        .await;
    assert!(progress_seen.get(), "no rebuild progress shown: {seen:?}");
    cluster.set("replica-rebuild-bandwidth-limit", "0").await;

    // A snapshot, seen in the chain; a backup of it, restored.
    browser.click("[data-open=take-snapshot]").await;
    browser
        .type_into("#take-snapshot [data-field=name]", "before-upgrade")
        .await;
    browser.click("#take-snapshot button[type=submit]").await;
    cluster
        .until("the snapshot in the chain", || async {
            let taken = browser.count("li[data-snapshot=before-upgrade]").await == 1;
            let ready = browser
                .count("li[data-snapshot=before-upgrade] .badge.rebuilding")
                .await
                == 0;
            (taken && ready).then_some(())
        })
        .await;
    shots.take("snapshot").await;
    browser.click("[data-open=back-up]").await;
    browser
        .click("#back-up select[data-field=snapshot] option[value=before-upgrade]")
        .await;
    browser.click("#back-up button[type=submit]").await;
    let backup = cluster
        .until("the backup completed", || async {
            browser
                .find("tr[data-backup][data-state=completed]")
                .await?;
            Some(browser.text("tr[data-backup] td").await)
        })
        .await;
    shots.take("backup").await;
    let kept = browser
        .run("arguments[arguments.length - 1](window.kept === true);")
        .await;
    assert_eq!(kept, json!(true), "the page was loaded again");
    browser
        .click(&format!("[data-open='restore-{backup}']"))
        .await;
    browser
        .type_into(
            &format!("#restore-{backup} [data-field=name]"),
            "web-restored",
        )
        .await;
    browser
        .click(&format!("#restore-{backup} button[type=submit]"))
        .await;
    cluster
        .until("the restored volume's page", || async {
            browser
                .url()
                .await
                .ends_with("/ui/volumes/web-restored")
                .then_some(())
        })
        .await;
    let restored = cluster.volume("web-restored").await.unwrap();
    assert_eq!(restored.spec.from_backup, backup);
    shots.take("restored").await;

    // A request forged without the session's CSRF token is refused, cookie
    // or not.
    let forged = browser
        .run(
            "const done = arguments[arguments.length - 1];
             fetch('/v1/volumes/web-restored', {method: 'DELETE', credentials: 'same-origin'})
               .then((r) => done(r.status));",
        )
        .await;
    assert_eq!(forged, json!(403));
    assert!(cluster.volume("web-restored").await.is_some());

    // Deleting asks for the volume's name.
    browser.click("[data-open=delete-volume]").await;
    let delete = "#delete-volume button[type=submit]";
    assert!(!browser.enabled(delete).await);
    browser
        .type_into("#delete-volume [data-confirm]", "web-restore")
        .await;
    assert!(!browser.enabled(delete).await);
    browser
        .type_into("#delete-volume [data-confirm]", "web-restored")
        .await;
    assert!(browser.enabled(delete).await);
    shots.take("delete-confirm").await;
    browser.click(delete).await;
    cluster
        .until("the restored volume deleted", || async {
            let refused = browser
                .run(
                    "arguments[arguments.length - 1](
                       document.querySelector('#delete-volume .error')?.textContent ?? '');",
                )
                .await;
            assert_eq!(refused, json!(""), "the deletion was refused");
            let gone = cluster
                .api::<Volume>()
                .get_opt("web-restored")
                .await
                .unwrap();
            gone.is_none().then_some(())
        })
        .await;

    volumes::table_and_bulk_actions(&cluster, &browser, &base, &shots).await;

    // Settings: a value out of range is refused with why, one in range set.
    browser.goto(&format!("{base}/ui/settings")).await;
    let row = "[data-setting=default-replica-count]";
    browser.type_into(&format!("{row} input"), "0").await;
    browser.click(&format!("{row} button[type=submit]")).await;
    cluster
        .until("the refusal shown", || async {
            let error = browser.text(&format!("{row} .error")).await;
            (!error.is_empty()).then_some(())
        })
        .await;
    shots.take("settings-refused").await;
    browser.type_into(&format!("{row} input"), "2").await;
    browser.click(&format!("{row} button[type=submit]")).await;
    cluster
        .until("the setting set", || async {
            let setting = cluster
                .api::<Setting>()
                .get_opt("default-replica-count")
                .await
                .unwrap()?;
            (setting.spec.value == "2").then_some(())
        })
        .await;

    // Nodes: scheduling stopped on one, and allowed again.
    browser.goto(&format!("{base}/ui/nodes")).await;
    let switch = format!("section[data-node='{node}'] header form[data-method=PATCH] button");
    let scheduling = |allowed: bool| {
        let cluster = &cluster;
        let node = &node;
        async move {
            cluster
                .until("the node's scheduling switched", || async {
                    let got = cluster.api::<Node>().get(node).await.unwrap();
                    (got.spec.allow_scheduling == allowed).then_some(())
                })
                .await;
        }
    };
    browser.click(&switch).await;
    scheduling(false).await;
    cluster
        .until("the node shown not schedulable", || async {
            let badge = browser
                .text(&format!("section[data-node='{node}'] .badge"))
                .await;
            (badge == "not schedulable").then_some(())
        })
        .await;
    shots.take("nodes").await;
    browser.click(&switch).await;
    scheduling(true).await;
    browser.goto(&format!("{base}/ui/backups")).await;
    browser.get("tr[data-target=default]").await;
    shots.take("backups").await;

    // A read-only user sees no destructive buttons. (Signed out from a page
    // that is not live: a live one follows its lost session to the sign-in
    // page by itself, racing the test's own navigation.)
    browser.goto(&format!("{base}/ui/signin")).await;
    browser.delete_cookies().await;
    browser.type_into("#token", &reader).await;
    browser.click("button[type=submit]").await;
    until_at(&cluster, &browser, "/ui/").await;
    browser.goto(&format!("{base}/ui/volumes/web")).await;
    assert_eq!(browser.text(badge).await, "healthy");
    for destructive in [
        "[data-open=delete-volume]",
        "form[data-method=DELETE]",
        "[data-open=attach]",
        "form[data-path$='/detach']",
        "form[data-path$='/revert']",
        "[data-open=take-snapshot]",
    ] {
        assert_eq!(browser.count(destructive).await, 0, "{destructive}");
    }
    assert_eq!(browser.count("[data-open=create-volume]").await, 0);
    // Nor may it read PersistentVolumes: the page says so in place.
    let note = browser.text("#workload [data-workload=forbidden]").await;
    assert!(note.contains("not allowed to see"), "{note}");
    shots.take("read-only").await;
    browser.goto(&format!("{base}/ui/settings")).await;
    browser.get("[data-setting=default-replica-count]").await;
    assert_eq!(browser.count("#settings form").await, 0);
    browser.goto(&format!("{base}/ui/nodes")).await;
    browser.get(&format!("section[data-node='{node}']")).await;
    assert_eq!(browser.count("section[data-node] form").await, 0);
    // A narrow window: the same pages, one column; the volumes offer the
    // reader nothing to select.
    browser.resize(420, 800).await;
    browser.goto(&format!("{base}/ui/volumes")).await;
    browser.get("table#volumes").await;
    assert_eq!(browser.count("input[data-select], .bulk").await, 0);
    shots.take("volumes-narrow").await;
    browser.goto(&format!("{base}/ui/volumes/web")).await;
    browser.get("#workload").await;
    shots.take("volume-narrow").await;
    browser.quit().await;

    remove_workload(&cluster, &pv, "data", &["app"], &[&may_read_pvs]).await;
    for volume in ["web", "db"] {
        cluster.detach(volume).await;
        cluster.delete_volume(volume).await;
    }
}
