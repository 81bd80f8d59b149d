//! The CSI Identity service of a real `oxhorn manager` process, asked over its
//! unix socket by a tonic client, against the real control plane.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use oxhorn::csi::proto::identity_client::IdentityClient;
use oxhorn::csi::proto::plugin_capability::{self, service, volume_expansion};
use oxhorn::csi::proto::{GetPluginCapabilitiesRequest, GetPluginInfoRequest, ProbeRequest};
use oxhorn_testbed::{self as testbed, ManagerOptions, ManagerProcess, TestNamespace};
use tonic::transport::Channel;

use crate::common::{OXHORN, eventually};

const START: Duration = Duration::from_secs(30);

async fn probe(client: &mut IdentityClient<Channel>) -> Option<bool> {
    client
        .probe(ProbeRequest {})
        .await
        .unwrap()
        .into_inner()
        .ready
}

/// Polls Probe until it reports ready.
async fn until_ready(client: &IdentityClient<Channel>) {
    eventually(START, || {
        let mut client = client.clone();
        async move { (probe(&mut client).await == Some(true)).then_some(()) }
    })
    .await
    .expect("manager ready");
}

#[tokio::test]
async fn identity_answers_over_the_unix_socket() {
    let control_plane = testbed::shared();
    let ns = TestNamespace::create(control_plane, "identity")
        .await
        .unwrap();
    let mut manager =
        ManagerProcess::spawn(Path::new(OXHORN), control_plane, "node-1", ns.name()).unwrap();
    let mut identity = IdentityClient::new(manager.connect(START).await.unwrap());

    let info = identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "driver.oxhorn.io");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));

    let capabilities = identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    let mut services = Vec::new();
    let mut expansion = Vec::new();
    for capability in capabilities {
        match capability.r#type.unwrap() {
            plugin_capability::Type::Service(s) => services.push(s.r#type()),
            plugin_capability::Type::VolumeExpansion(e) => expansion.push(e.r#type()),
        }
    }
    // Volumes are reachable from every node, so no accessibility constraints.
    assert_eq!(services, [service::Type::ControllerService]);
    assert_eq!(expansion, [volume_expansion::Type::Online]);

    until_ready(&identity).await;

    let socket = std::fs::metadata(manager.socket()).unwrap();
    assert!(socket.file_type().is_socket());
    assert_eq!(socket.permissions().mode() & 0o777, 0o660);

    let status = manager
        .terminate(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}\n{}", manager.log()));
    assert!(
        status.success(),
        "SIGTERM exit: {status}\n{}",
        manager.log()
    );
    assert!(
        !manager.socket().exists(),
        "socket left behind after SIGTERM"
    );
}

#[tokio::test]
async fn probe_is_not_ready_while_the_api_server_is_unreachable() {
    let control_plane = testbed::shared();
    // Same credentials, but a port nothing listens on.
    let dir = tempfile::tempdir().unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let original = std::fs::read_to_string(control_plane.kubeconfig()).unwrap();
    let server_line = original
        .lines()
        .find(|l| l.trim_start().starts_with("server:"))
        .unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        original.replace(
            server_line,
            &format!("    server: https://127.0.0.1:{closed}"),
        ),
    )
    .unwrap();

    let socket = dir.path().join("csi.sock");
    let log_dir = tempfile::tempdir().unwrap();
    let options = ManagerOptions::new(&kubeconfig, "node-1", "default");
    let mut manager =
        ManagerProcess::spawn_at(Path::new(OXHORN), options, socket, log_dir).unwrap();
    let mut identity = IdentityClient::new(manager.connect(START).await.unwrap());
    for _ in 0..10 {
        assert_eq!(probe(&mut identity).await, Some(false));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Identity itself does not depend on the caches.
    let info = identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "driver.oxhorn.io");
}

#[tokio::test]
async fn a_restarted_manager_replaces_the_socket_a_crash_left_behind() {
    let control_plane = testbed::shared();
    let ns = TestNamespace::create(control_plane, "restart")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let spawn = || {
        let options = ManagerOptions::new(control_plane.kubeconfig(), "node-1", ns.name());
        ManagerProcess::spawn_at(
            Path::new(OXHORN),
            options,
            socket.clone(),
            tempfile::tempdir().unwrap(),
        )
        .unwrap()
    };

    let mut first = spawn();
    first.connect(START).await.unwrap();
    first.kill();
    assert!(socket.exists(), "SIGKILL leaves the socket file");

    let mut second = spawn();
    let identity = IdentityClient::new(second.connect(START).await.unwrap());
    until_ready(&identity).await;

    // A second manager on a live socket refuses to start and leaves it alone.
    let mut intruder = spawn();
    let status = intruder.wait(START).unwrap();
    assert!(!status.success());
    assert!(
        intruder.log().contains("is in use by a running server"),
        "{}",
        intruder.log()
    );
    assert!(socket.exists());
    until_ready(&identity).await;
}
