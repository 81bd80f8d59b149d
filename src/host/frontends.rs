//! Which frontends a node can present volumes with: FUSE needs /dev/fuse
//! and loop devices, iSCSI the host's open-iscsi and its kernel initiator
//! ([`Initiator::available`]).

use std::path::Path;

use super::Host;
use super::iscsi::Initiator;
use crate::types::Frontend;

/// Each frontend, and why this node cannot use it, if it cannot.
pub async fn support(host: &Host, dev: &Path) -> Vec<(Frontend, Result<(), String>)> {
    let iscsi = Initiator::new(host.clone()).available().await;
    vec![(Frontend::Fuse, fuse(dev)), (Frontend::Iscsi, iscsi)]
}

/// FUSE's device and the loop devices' control node, under `dev`.
fn fuse(dev: &Path) -> Result<(), String> {
    let missing: Vec<String> = ["fuse", "loop-control"]
        .iter()
        .map(|name| dev.join(name))
        .filter(|path| !path.exists())
        .map(|path| path.display().to_string())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} missing (the fuse and loop modules)",
            missing.join(" and ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuse_needs_its_device_and_loop_control() {
        let dev = tempfile::tempdir().unwrap();
        let error = fuse(dev.path()).unwrap_err();
        assert!(
            error.contains("fuse and") && error.contains("loop-control"),
            "{error}"
        );
        std::fs::write(dev.path().join("fuse"), "").unwrap();
        std::fs::write(dev.path().join("loop-control"), "").unwrap();
        assert_eq!(fuse(dev.path()), Ok(()));
    }
}
