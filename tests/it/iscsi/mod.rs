//! The engine's iSCSI target against real initiators, over loopback: an
//! `oxhorn engine --frontend iscsi` over three `oxhorn replica` processes,
//! with tgtd (Debian `tgt`) serving a plain file as the reference.
//!
//! This machine's kernel has no iSCSI initiator (no `iscsi_tcp`), so the
//! initiators are libiscsi's, in user space: `conformance` runs its
//! `iscsi-test-cu` (the SCSI and iSCSI families, 230 tests), `integrity`
//! writes and checks patterns while replicas and the engine are killed,
//! `chap` checks the logins, and `attach` provisions a `frontend: iscsi`
//! volume with a `chapSecret` through the controllers (its engine waits,
//! saying why, until the Secret exists). `kernel` needs a kernel initiator
//! and skips without one. The connection's own unit tests
//! (`dataplane/src/frontend/iscsi/tests.rs`) cover target pings of a silent
//! initiator, session reinstatement and malformed PDUs.

mod attach;
mod chap;
mod conformance;
mod integrity;
mod kernel;

use std::path::Path;
use std::time::Duration;

use oxhorn::protocol::{Access, Key};
use oxhorn_testbed::{EngineProcess, ReplicaProcess};
use tempfile::TempDir;

use crate::common::OXHORN;

/// The volume size: large enough for every libiscsi test (64 MiB and up).
const SIZE: u64 = 256 << 20;
const PATIENCE: Duration = Duration::from_secs(30);

/// A volume served over iSCSI: its replicas and its engine, killed (and
/// their directories removed) when dropped.
pub(crate) struct IscsiVolume {
    pub(crate) replicas: Vec<ReplicaProcess>,
    pub(crate) engine: EngineProcess,
    /// The LUN's URL, `iscsi://127.0.0.1:<port>/<iqn>/1`.
    pub(crate) url: String,
    _dir: TempDir,
}

impl IscsiVolume {
    pub(crate) async fn start(volume: &str, replicas: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let access = Access {
            volume: volume.to_owned(),
            key: Key::generate().for_volume(volume),
            generation: 1,
        };
        let mut processes = Vec::new();
        for i in 0..replicas {
            let path = dir.path().join(format!("r{i}"));
            let mut replica =
                ReplicaProcess::spawn(Path::new(OXHORN), &path, SIZE, &access).unwrap();
            replica.wait_serving(PATIENCE).await.unwrap();
            processes.push(replica);
        }
        let addresses: Vec<String> = processes.iter().map(ReplicaProcess::address).collect();
        let mut engine =
            EngineProcess::spawn_iscsi(Path::new(OXHORN), dir.path(), &access, SIZE, &addresses)
                .unwrap();
        let url = engine.wait_endpoint(PATIENCE).await.unwrap();
        Self {
            replicas: processes,
            engine,
            url,
            _dir: dir,
        }
    }
}
