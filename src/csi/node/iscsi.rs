//! iSCSI volumes on this node. Staging logs into the target the volume's
//! engine serves and points the volume's device link at the disk the kernel
//! made, so that the rest of staging and publishing is the FUSE frontend's.
//! Unstaging logs out; it needs only the volume id (the target name is the
//! volume's), so it works after the Volume is gone.

use std::fs;
use std::net::SocketAddr;
use std::path::Path;

use tokio::time::{Instant, sleep};
use tracing::{debug, info};

use super::{NodeError, NodeResult, NodeService, POLL};
use crate::frontend::device_link::{self, DeviceLink};
use crate::host::HostError;
use crate::host::iscsi::target_name;
use crate::types::{DesireState, Engine, Frontend, Volume, VolumeFrontend, engine_name};

const SCHEME: &str = "iscsi://";

/// Where an engine serves its volume: `iscsi://<ip>:<port>/<iqn>/<lun>`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct IscsiEndpoint {
    pub portal: SocketAddr,
    pub iqn: String,
    pub lun: u16,
}

impl IscsiEndpoint {
    /// Parses an engine's endpoint; anything but the one form is refused.
    pub(super) fn parse(endpoint: &str) -> Result<Self, String> {
        let refuse = |why: &str| {
            format!("endpoint {endpoint:?} is not iscsi://<ip>:<port>/<iqn>/<lun>: {why}")
        };
        let rest = endpoint
            .strip_prefix(SCHEME)
            .ok_or_else(|| refuse("another scheme"))?;
        let mut parts = rest.split('/');
        let (Some(portal), Some(iqn), Some(lun), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(refuse("not an address, a target and a LUN"));
        };
        let portal = portal
            .parse()
            .map_err(|_| refuse("the address is not <ip>:<port>"))?;
        if iqn.is_empty() {
            return Err(refuse("no target name"));
        }
        // u16's parser takes a leading '+'; the LUN is digits only.
        if lun.is_empty() || !lun.bytes().all(|b| b.is_ascii_digit()) {
            return Err(refuse("the LUN is not a number"));
        }
        let lun = lun.parse().map_err(|_| refuse("the LUN is too large"))?;
        Ok(Self {
            portal,
            iqn: iqn.to_owned(),
            lun,
        })
    }
}

impl NodeService {
    /// Logs into the iSCSI target of `volume` and links its device link to
    /// the disk. A host without an initiator is the CO's to know of
    /// (FAILED_PRECONDITION), not a wait.
    pub(super) async fn attach_iscsi(&self, volume: &Volume) -> NodeResult<()> {
        let volume_id = volume.metadata.name.as_deref().unwrap_or_default();
        self.initiator.available().await.map_err(|reason| {
            NodeError::FailedPrecondition(format!(
                "volume {volume_id} uses the iSCSI frontend, but node {} cannot attach \
                 over iSCSI: {reason}",
                self.config.node_id
            ))
        })?;
        // Logging in from a node the volume is not attached to would add a
        // second writer.
        if volume.spec.node_id != self.config.node_id {
            return Err(self.not_attached_here(volume_id, &volume.spec.node_id));
        }
        let (endpoint, chap_secret) = self.wait_for_endpoint(volume_id).await?;
        // The credentials the running target was started with.
        let chap = self
            .datastore
            .chap_secrets(&chap_secret)
            .map_err(NodeError::FailedPrecondition)?;
        let iqn = target_name(volume_id);
        if endpoint.iqn != iqn {
            return Err(NodeError::FailedPrecondition(format!(
                "the engine of volume {volume_id} serves target {}, not {iqn}",
                endpoint.iqn
            )));
        }
        let disk = self
            .initiator
            .attach(endpoint.portal, &iqn, endpoint.lun, chap.as_ref())
            .await
            .map_err(|e| match e {
                // Logged in but no disk yet: worth a retry, as a FUSE device's wait.
                e @ HostError::IscsiDeviceMissing { .. } => NodeError::Unavailable(e.to_string()),
                e => e.into(),
            })?;
        publish_link(&self.device_link(volume_id), &disk)?;
        info!(portal = %endpoint.portal, iqn, disk = %disk.display(), "attached over iSCSI");
        Ok(())
    }

    /// The volume's endpoint once its engine serves the iSCSI target (the
    /// node's cache may not show the engine's start yet), and the name of
    /// the Secret whose CHAP credentials it asks for.
    async fn wait_for_endpoint(&self, volume_id: &str) -> NodeResult<(IscsiEndpoint, String)> {
        self.wait_for_engine(volume_id, "serves no iSCSI target", |engine| {
            let endpoint = engine.status.as_ref()?.endpoint.as_str();
            endpoint.starts_with(SCHEME).then(|| {
                let endpoint = IscsiEndpoint::parse(endpoint).map_err(|reason| {
                    NodeError::FailedPrecondition(format!(
                        "the engine of volume {volume_id} has an unusable {reason}"
                    ))
                })?;
                Ok((endpoint, engine.spec.chap_secret.clone()))
            })
        })
        .await
    }

    /// The frontend `volume` is presented with on this node: its own
    /// choice, or for `auto` the one the volume controller chose for this
    /// node when it started the engine here.
    pub(super) async fn frontend_here(&self, volume: &Volume) -> NodeResult<Frontend> {
        let volume_id = volume.metadata.name.as_deref().unwrap_or_default();
        match volume.spec.frontend {
            VolumeFrontend::Fuse => return Ok(Frontend::Fuse),
            VolumeFrontend::Iscsi => return Ok(Frontend::Iscsi),
            VolumeFrontend::Auto => {}
        }
        let here = &self.config.node_id;
        if volume.spec.node_id != *here {
            return Err(self.not_attached_here(volume_id, &volume.spec.node_id));
        }
        let started_here = |engine: &Engine| {
            let spec = &engine.spec.instance;
            (spec.node_id == *here && spec.desire_state == DesireState::Running)
                .then_some(Ok(engine.spec.frontend))
        };
        self.wait_for_engine(
            volume_id,
            &format!("has not started on {here}"),
            started_here,
        )
        .await
    }

    /// Waits until `found` finds what it looks for in the volume's engine,
    /// as the node's cache shows it; Unavailable, saying the engine `not`,
    /// if it does not within the device wait.
    async fn wait_for_engine<T>(
        &self,
        volume_id: &str,
        not: &str,
        found: impl Fn(&Engine) -> Option<NodeResult<T>>,
    ) -> NodeResult<T> {
        let name = engine_name(volume_id);
        let deadline = Instant::now() + self.device_wait;
        loop {
            let engine = self.datastore.engines.get(&name);
            if let Some(result) = engine.as_deref().and_then(&found) {
                return result;
            }
            if Instant::now() >= deadline {
                let endpoint = engine
                    .as_ref()
                    .and_then(|e| e.status.as_ref())
                    .map_or("", |s| s.endpoint.as_str());
                return Err(NodeError::Unavailable(format!(
                    "the engine of volume {volume_id} {not} after {:?} (its endpoint is \
                     {endpoint:?})",
                    self.device_wait
                )));
            }
            sleep(POLL).await;
        }
    }

    /// Logs out of the volume's target and removes the link staging made,
    /// when the volume is or may be an iSCSI one. Each step tolerates its
    /// work being done already, so a crash between them is retried cleanly.
    /// Has the kernel see a grown iSCSI volume's new size; a FUSE
    /// volume's device follows by itself.
    pub(super) async fn rescan_iscsi(&self, volume_id: &str) -> NodeResult<()> {
        let iqn = target_name(volume_id);
        let link = self.device_link(volume_id);
        if fs::read_link(&link).is_ok_and(|disk| self.initiator.is_disk_of(&disk, &iqn)) {
            self.initiator.rescan(&iqn).await?;
        }
        Ok(())
    }

    pub(super) async fn detach_iscsi(&self, volume_id: &str) -> NodeResult<()> {
        let iqn = target_name(volume_id);
        let link = self.device_link(volume_id);
        let linked = fs::read_link(&link).is_ok_and(|disk| self.initiator.is_disk_of(&disk, &iqn));
        let frontend = self
            .datastore
            .volumes
            .get(volume_id)
            .map(|v| v.spec.frontend);
        let detach = match (linked, frontend) {
            (true, _) => true,
            (false, Some(VolumeFrontend::Fuse)) => false,
            // No link: a stage that stopped between login and linking, or
            // one refused for want of an initiator; the Volume may be gone
            // (or the cache not synced). A session is possible only where
            // an initiator is.
            (false, Some(VolumeFrontend::Iscsi | VolumeFrontend::Auto) | None) => {
                match self.initiator.available().await {
                    Ok(()) => true,
                    Err(reason) => {
                        debug!(reason, "no iSCSI initiator here: nothing to detach");
                        false
                    }
                }
            }
        };
        if !detach {
            return Ok(());
        }
        // Logged out before the link goes: the link is what says to log out.
        self.initiator.detach(&iqn).await?;
        if linked {
            remove_link(&link)?;
        }
        info!(iqn, "detached over iSCSI");
        Ok(())
    }
}

/// Points `link` at `disk` as the FUSE frontend points its links: a link
/// there is replaced atomically, anything else refused.
fn publish_link(link: &Path, disk: &Path) -> NodeResult<()> {
    DeviceLink::publish(link, disk)?;
    Ok(())
}

fn remove_link(link: &Path) -> NodeResult<()> {
    Ok(device_link::remove_stale(link)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_endpoint_parses() {
        let parsed = IscsiEndpoint::parse("iscsi://10.0.0.7:3260/iqn.2026-01.io.oxhorn:pvc-1/1");
        assert_eq!(
            parsed,
            Ok(IscsiEndpoint {
                portal: "10.0.0.7:3260".parse().unwrap(),
                iqn: "iqn.2026-01.io.oxhorn:pvc-1".into(),
                lun: 1,
            })
        );
        let v6 = IscsiEndpoint::parse("iscsi://[fd00::7]:3260/iqn.2026-01.io.oxhorn:v/0").unwrap();
        assert_eq!(v6.portal, "[fd00::7]:3260".parse().unwrap());
        assert_eq!(v6.lun, 0);
    }

    #[test]
    fn anything_else_is_refused() {
        for endpoint in [
            "",
            "/dev/oxhorn/pvc-1",
            "iscsi://",
            "ISCSI://10.0.0.7:3260/iqn.2026-01.io.oxhorn:v/1",
            "tcp://10.0.0.7:3260/iqn.2026-01.io.oxhorn:v/1",
            "iscsi://10.0.0.7/iqn.2026-01.io.oxhorn:v/1",
            "iscsi://node-1:3260/iqn.2026-01.io.oxhorn:v/1",
            "iscsi://10.0.0.7:3260/iqn.2026-01.io.oxhorn:v",
            "iscsi://10.0.0.7:3260/iqn.2026-01.io.oxhorn:v/",
            "iscsi://10.0.0.7:3260//1",
            "iscsi://10.0.0.7:3260/iqn.2026-01.io.oxhorn:v/1/",
            "iscsi://10.0.0.7:3260/iqn.2026-01.io.oxhorn:v/+1",
            "iscsi://10.0.0.7:3260/iqn.2026-01.io.oxhorn:v/-1",
            "iscsi://10.0.0.7:3260/iqn.2026-01.io.oxhorn:v/65536",
            "iscsi://10.0.0.7:3260/iqn.2026-01.io.oxhorn:v/1?x=y",
            " iscsi://10.0.0.7:3260/iqn.2026-01.io.oxhorn:v/1",
        ] {
            let err = IscsiEndpoint::parse(endpoint).unwrap_err();
            assert!(err.contains("is not iscsi://"), "{endpoint:?}: {err}");
        }
    }

    #[test]
    fn a_link_is_replaced_but_a_file_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("oxhorn/pvc-1");
        publish_link(&link, Path::new("/dev/disk/by-path/a")).unwrap();
        publish_link(&link, Path::new("/dev/disk/by-path/b")).unwrap();
        assert_eq!(
            fs::read_link(&link).unwrap(),
            Path::new("/dev/disk/by-path/b")
        );
        remove_link(&link).unwrap();
        remove_link(&link).unwrap();
        fs::write(&link, b"data").unwrap();
        let err = publish_link(&link, Path::new("/dev/disk/by-path/a")).unwrap_err();
        assert!(err.to_string().contains("not a symbolic link"), "{err}");
        assert_eq!(fs::read(&link).unwrap(), b"data");
    }
}
