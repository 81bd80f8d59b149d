//! A real Kubernetes control plane on loopback, for integration tests and the
//! local cluster: etcd and kube-apiserver (built by hack/install-test-deps.sh)
//! with throwaway data, an admin token, and oxhorn's CRDs applied.
//!
//! A test binary shares one control plane ([`shared`]) and gives each test its
//! own namespace ([`TestNamespace`]), removed again even when the test panics.
//! The processes die with the process that started them, however it ends.
//!
//! Not part of the product: a dev-dependency of `oxhorn`, used by its
//! integration tests, benchmarks and the local-cluster example.

mod account;
pub mod apirelay;
pub mod certs;
mod cgroup;
mod controlplane;
pub mod csi_client;
mod dataplane;
mod error;
pub mod fuse_uring;
mod host_state;
pub mod images;
pub mod install;
mod kube_node;
pub mod kubelet;
mod kubelet_node;
mod manager;
mod mount;
mod namespace;
pub mod netns;
mod nfs;
mod objectstore;
mod process;
pub mod prometheus;
pub mod sidecars;
mod tgtd;
pub mod webdriver;
pub mod writer;

pub use account::account_token;
pub use controlplane::ControlPlane;
pub use dataplane::{EngineProcess, ReplicaProcess, engine_client};
pub use error::{Error, Result};
pub use kube_node::{
    MANAGER_ONLY_TAINT, delete_kube_node, register_kube_node, set_kube_node_ready,
};
pub use kubelet_node::{HostTurn, KubeletNode};
pub use manager::{ManagerOptions, ManagerProcess};
pub use mount::{Mounted, loop_devices_under, mounts_under, release_under};
pub use namespace::TestNamespace;
pub use nfs::NfsServer;
pub use objectstore::{
    AZURITE_ACCOUNT, AZURITE_ACCOUNT_KEY, MINIO_ACCESS_KEY, MINIO_SECRET_KEY, ObjectServer,
    ObjectServerKind,
};
pub use tgtd::Tgtd;
pub use writer::{Verdict, Writer, WriterOptions};

use std::path::PathBuf;
use std::sync::OnceLock;

/// Where hack/install-test-deps.sh puts the tools: `$OXHORN_CACHE/bin`,
/// default `~/.cache/oxhorn/bin`.
pub fn tools_dir() -> PathBuf {
    let cache = std::env::var_os("OXHORN_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home).join(".cache/oxhorn")
        });
    cache.join("bin")
}

static SHARED: OnceLock<ControlPlane> = OnceLock::new();

/// The control plane shared by every test of this binary, started on first
/// use and stopped when the process exits.
///
/// Panics when it cannot start: no test can run without it.
pub fn shared() -> &'static ControlPlane {
    SHARED.get_or_init(|| {
        let control_plane = start_on_keeper_thread()
            .unwrap_or_else(|e| panic!("the test control plane did not start: {e}"));
        // Statics are never dropped; stop the processes and remove the data
        // when the test harness exits.
        extern "C" fn stop_at_exit() {
            if let Some(control_plane) = SHARED.get() {
                control_plane.stop();
            }
        }
        // SAFETY: registering a plain extern "C" fn with no preconditions.
        unsafe { nix::libc::atexit(stop_at_exit) };
        control_plane
    })
}

/// Starts the control plane from a thread that lives as long as the process:
/// the children are told to die with the thread that spawned them
/// (PR_SET_PDEATHSIG), and a test's own thread ends with the test.
fn start_on_keeper_thread() -> Result<ControlPlane> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("testbed-keeper".into())
        .spawn(move || {
            let started = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Error::io("tokio runtime", e))
                .and_then(|rt| rt.block_on(ControlPlane::start()));
            let _ = tx.send(started);
            loop {
                std::thread::park();
            }
        })
        .map_err(|e| Error::io("testbed-keeper thread", e))?;
    rx.recv()
        .map_err(|_| Error::Failed("the keeper thread died while starting".into()))?
}
