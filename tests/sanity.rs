//! csi-sanity (kubernetes-csi/csi-test, built by hack/install-test-deps.sh)
//! against a real `oxhorn manager`: the services implemented so far must pass
//! every csi-sanity spec that covers them.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use oxhorn::testbed::{self, ManagerProcess, TestNamespace};

const OXHORN: &str = env!("CARGO_BIN_EXE_oxhorn");

/// The csi-sanity specs for the services oxhorn serves today.
const FOCUS: &str = "Identity Service";

#[tokio::test]
async fn csi_sanity_passes_for_the_served_services() {
    let control_plane = testbed::shared();
    let ns = TestNamespace::create(control_plane, "sanity")
        .await
        .unwrap();
    let mut manager =
        ManagerProcess::spawn(Path::new(OXHORN), control_plane, "node-1", ns.name()).unwrap();
    manager.connect(Duration::from_secs(30)).await.unwrap();

    let work = tempfile::tempdir().unwrap();
    let output = Command::new(testbed::tools_dir().join("csi-sanity"))
        .arg(format!("--csi.endpoint={}", manager.socket().display()))
        .arg(format!(
            "--csi.mountdir={}",
            work.path().join("mount").display()
        ))
        .arg(format!(
            "--csi.stagingdir={}",
            work.path().join("staging").display()
        ))
        .arg(format!("--ginkgo.focus={FOCUS}"))
        .arg("--ginkgo.no-color")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    println!("{report}{}", String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success(),
        "csi-sanity failed; manager log:\n{}",
        manager.log()
    );
    let summary = report
        .lines()
        .find(|l| l.starts_with("Ran "))
        .unwrap_or_else(|| panic!("no csi-sanity summary in:\n{report}"));
    assert!(!summary.starts_with("Ran 0 "), "{summary}");
}
