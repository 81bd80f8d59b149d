//! Which volume capabilities oxhorn serves: block or mount access, by the
//! pods of one node. Multi-node access needs a share manager, which does not
//! exist yet.

use super::error::ControllerServiceError;
use super::proto::VolumeCapability;
use super::proto::volume_capability::access_mode::Mode;
use super::proto::volume_capability::{AccessMode, AccessType};

/// The single-node modes, in the order CSI numbers them.
pub const SUPPORTED_MODES: [Mode; 4] = [
    Mode::SingleNodeWriter,
    Mode::SingleNodeReaderOnly,
    Mode::SingleNodeSingleWriter,
    Mode::SingleNodeMultiWriter,
];

/// Checks one capability; the error says what is wrong with it.
pub fn check(capability: &VolumeCapability) -> Result<(), String> {
    match &capability.access_type {
        Some(AccessType::Block(_)) => {}
        Some(AccessType::Mount(mount)) => {
            if !mount.fs_type.is_empty() {
                super::parameters::fs_type(&mount.fs_type)
                    .map_err(|why| format!("fs_type {:?}: {why}", mount.fs_type))?;
            }
        }
        None => return Err("access_type must be block or mount".into()),
    }
    let mode = capability
        .access_mode
        .as_ref()
        .map(AccessMode::mode)
        .unwrap_or(Mode::Unknown);
    match mode {
        m if SUPPORTED_MODES.contains(&m) => Ok(()),
        Mode::Unknown => Err("access_mode is required".into()),
        other => Err(format!(
            "access mode {} needs a share manager, which oxhorn does not have yet; use a single-node mode",
            other.as_str_name()
        )),
    }
}

/// Checks a request's capabilities: at least one, each served.
pub fn check_all(capabilities: &[VolumeCapability]) -> Result<(), ControllerServiceError> {
    if capabilities.is_empty() {
        return Err(ControllerServiceError::InvalidArgument(
            "volume_capabilities are required".into(),
        ));
    }
    capabilities
        .iter()
        .try_for_each(check)
        .map_err(ControllerServiceError::InvalidArgument)
}

/// A mount capability needs its filesystem grown after the volume grows.
pub fn is_block(capability: Option<&VolumeCapability>) -> bool {
    matches!(
        capability.and_then(|c| c.access_type.as_ref()),
        Some(AccessType::Block(_))
    )
}

/// The capability's access mode is single-writer-pod (ReadWriteOncePod).
pub fn is_single_writer(capabilities: &[VolumeCapability]) -> bool {
    capabilities
        .iter()
        .any(|c| c.access_mode.as_ref().map(AccessMode::mode) == Some(Mode::SingleNodeSingleWriter))
}

#[cfg(test)]
mod tests {
    use super::super::proto::volume_capability::{BlockVolume, MountVolume};
    use tonic::Status;

    use super::*;

    fn capability(access: Option<AccessType>, mode: Mode) -> VolumeCapability {
        VolumeCapability {
            access_type: access,
            access_mode: Some(AccessMode { mode: mode.into() }),
        }
    }

    fn mount(fs: &str) -> Option<AccessType> {
        Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        }))
    }

    #[test]
    fn single_node_modes_with_block_or_ext4_or_xfs_are_served() {
        for mode in SUPPORTED_MODES {
            for access in [
                Some(AccessType::Block(BlockVolume {})),
                mount(""),
                mount("ext4"),
                mount("xfs"),
            ] {
                assert_eq!(check(&capability(access, mode)), Ok(()));
            }
        }
    }

    #[test]
    fn multi_node_modes_unknown_filesystems_and_missing_fields_are_refused() {
        let refused = [
            (
                capability(mount(""), Mode::MultiNodeMultiWriter),
                "share manager",
            ),
            (
                capability(mount(""), Mode::MultiNodeReaderOnly),
                "share manager",
            ),
            (
                capability(mount("btrfs"), Mode::SingleNodeWriter),
                "ext4 or xfs",
            ),
            (capability(None, Mode::SingleNodeWriter), "block or mount"),
            (capability(mount(""), Mode::Unknown), "access_mode"),
        ];
        for (cap, says) in refused {
            let why = check(&cap).unwrap_err();
            assert!(why.contains(says), "{why}");
        }
        assert_eq!(
            check_all(&[]).map_err(Status::from).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
