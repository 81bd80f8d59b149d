//! The `oxhorn` command line: what it prints and how it refuses bad input.

use std::process::{Command, Output};

use crate::common::OXHORN;

fn oxhorn(args: &[&str]) -> Output {
    Command::new(OXHORN)
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("NODE_ID")
        .env_remove("CSI_ENDPOINT")
        .output()
        .unwrap()
}

#[test]
fn crds_prints_what_deploy_holds() {
    let output = oxhorn(&["crds"]);
    assert!(output.status.success());
    let printed = String::from_utf8(output.stdout).unwrap();
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/crds.yaml")).unwrap();
    assert!(
        printed == committed,
        "deploy/crds.yaml is stale: run `cargo run -- crds > deploy/crds.yaml`"
    );
    for kind in ["Volume", "Engine", "Replica", "Node", "Setting"] {
        assert!(
            printed.contains(&format!("    kind: {kind}\n")),
            "{kind} missing"
        );
    }
}

#[test]
fn version_names_the_release_and_the_csi_spec() {
    let output = oxhorn(&["version"]);
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        format!("oxhorn {} (CSI 1.12)\n", env!("CARGO_PKG_VERSION"))
    );
}

/// Runs `oxhorn manager` with `args`, expects a failure and returns stderr.
fn manager_refuses(args: &[&str]) -> String {
    let mut all = vec!["manager"];
    all.extend_from_slice(args);
    let output = oxhorn(&all);
    assert!(!output.status.success(), "accepted {args:?}");
    String::from_utf8(output.stderr).unwrap()
}

#[test]
fn manager_refuses_bad_endpoints_and_node_ids_before_touching_anything() {
    let stderr = manager_refuses(&[
        "--ip=127.0.0.1",
        "--node-id=n1",
        "--csi-endpoint=tcp://127.0.0.1:9000",
    ]);
    assert!(
        stderr.contains("only unix:// endpoints are supported"),
        "{stderr}"
    );

    let stderr = manager_refuses(&[
        "--ip=127.0.0.1",
        "--node-id=n1",
        "--csi-endpoint=unix://relative.sock",
    ]);
    assert!(
        stderr.contains("the socket path must be absolute"),
        "{stderr}"
    );

    let stderr = manager_refuses(&[
        "--ip=127.0.0.1",
        "--node-id=../etc",
        "--csi-endpoint=unix:///tmp/x.sock",
    ]);
    assert!(
        stderr.contains("node id \"../etc\" may contain only"),
        "{stderr}"
    );

    let stderr = manager_refuses(&["--csi-endpoint=unix:///tmp/x.sock"]);
    assert!(stderr.contains("--node-id <NODE_ID>"), "{stderr}");
}

#[test]
fn manager_logs_json_when_asked() {
    let stderr = manager_refuses(&[
        "--log-format=json",
        "--ip=127.0.0.1",
        "--node-id=n1",
        "--csi-endpoint=tcp://x",
    ]);
    let line = stderr.lines().next().unwrap();
    let event: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(event["level"], "ERROR");
    assert!(
        event["error"]
            .as_str()
            .unwrap()
            .contains("invalid CSI endpoint")
    );
}
