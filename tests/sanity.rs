//! csi-sanity (kubernetes-csi/csi-test, built by hack/install-test-deps.sh)
//! against a real three-node oxhorn cluster: every spec must pass, and the
//! only ones skipped are those for capabilities oxhorn does not advertise.
//! `sanity-tests/run.sh` runs this test and prints csi-sanity's report.

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use kube::api::{Api, PostParams};
use oxhorn::testbed::{self, ManagerOptions, ManagerProcess, TestNamespace};
use oxhorn::types::{Condition, Node, Setting, SettingSpec};

const OXHORN: &str = env!("CARGO_BIN_EXE_oxhorn");
const NODES: u8 = 3;
const MIB: u64 = 1 << 20;

/// The StorageClass parameters csi-sanity creates its volumes with.
const PARAMETERS: &str = "numberOfReplicas: \"2\"\nstaleReplicaTimeout: \"30\"\n";

/// Specs skipped on purpose: none. csi-sanity skips by itself what a
/// capability oxhorn does not advertise would test (ModifyVolume, the node
/// attach limit); the README lists them.
#[tokio::test]
#[ignore = "run by sanity-tests/run.sh, which prints csi-sanity's report"]
async fn csi_sanity_passes_against_a_three_node_cluster() {
    let control_plane = testbed::shared();
    let ns = TestNamespace::create(control_plane, "sanity")
        .await
        .unwrap();
    let client = control_plane.client().unwrap();
    // The test machine's disk may be fuller than the default 25% free.
    let minimal = Setting::new(
        "storage-minimal-available-percentage",
        SettingSpec { value: "1".into() },
    );
    Api::<Setting>::namespaced(client.clone(), ns.name())
        .create(&PostParams::default(), &minimal)
        .await
        .unwrap();
    let mut managers = Vec::new();
    for i in 1..=NODES {
        let name = format!("{}-n{i}", ns.name());
        testbed::register_kube_node(&client, &name, &[])
            .await
            .unwrap();
        let mut options = ManagerOptions::new(control_plane.kubeconfig(), &name, ns.name());
        options.ip = IpAddr::from([127, 0, 40, i]);
        managers.push(ManagerProcess::start(Path::new(OXHORN), options).unwrap());
    }
    for manager in &mut managers {
        manager.connect(Duration::from_secs(30)).await.unwrap();
    }
    until_schedulable(&client, ns.name(), usize::from(NODES)).await;

    let work = tempfile::tempdir().unwrap();
    let parameters = work.path().join("parameters.yaml");
    std::fs::write(&parameters, PARAMETERS).unwrap();
    let output = Command::new(testbed::tools_dir().join("csi-sanity"))
        .arg(format!("--csi.endpoint={}", managers[0].socket().display()))
        .arg(format!(
            "--csi.mountdir={}",
            work.path().join("mount").display()
        ))
        .arg(format!(
            "--csi.stagingdir={}",
            work.path().join("staging").display()
        ))
        .arg(format!(
            "--csi.testvolumeparameters={}",
            parameters.display()
        ))
        .arg(format!("--csi.testvolumesize={}", 32 * MIB))
        .arg(format!("--csi.testvolumeexpandsize={}", 48 * MIB))
        .arg("--ginkgo.no-color")
        .arg("--ginkgo.timeout=40m")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    println!("{report}{}", String::from_utf8_lossy(&output.stderr));
    let logs: String = managers
        .iter()
        .map(|m| format!("==== {} ====\n{}", m.node_id(), m.log()))
        .collect();
    let summary = report
        .lines()
        .find(|l| l.starts_with("Ran "))
        .unwrap_or_else(|| panic!("no csi-sanity summary in:\n{report}"));
    assert!(
        output.status.success(),
        "csi-sanity failed: {summary}\nmanager logs:\n{logs}"
    );
    assert!(!summary.starts_with("Ran 0 "), "{summary}");
    drop(managers);
    assert!(
        testbed::mounts_under(work.path()).is_empty(),
        "csi-sanity left mounts"
    );
}

/// Waits until `count` nodes are Ready and Schedulable: csi-sanity's first
/// volume must find them.
async fn until_schedulable(client: &kube::Client, ns: &str, count: usize) {
    let nodes: Api<Node> = Api::namespaced(client.clone(), ns);
    let mut last = String::new();
    for _ in 0..600 {
        let list = nodes.list(&Default::default()).await.unwrap();
        last = format!(
            "{:?}",
            list.items
                .iter()
                .map(|n| (n.metadata.name.clone(), n.status.clone()))
                .collect::<Vec<_>>()
        );
        let ready = list.items.iter().filter(|n| {
            n.status.as_ref().is_some_and(|s| {
                Condition::is_true(&s.conditions, "Ready")
                    && Condition::is_true(&s.conditions, "Schedulable")
            })
        });
        if ready.count() == count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{count} nodes did not become schedulable within 60 s: {last}");
}
