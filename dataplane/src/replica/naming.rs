//! File names inside a replica directory. Names read from metadata become
//! paths, so every name is validated against these patterns before use: a
//! corrupt or hostile metadata file must not make us open `../../etc/x`.

use super::error::{Result, StorageError};

/// Volume metadata (JSON): size, head layer, flags.
pub const VOLUME_META: &str = "volume.meta";
/// Persisted revision counter.
pub const REVISION_FILE: &str = "revision.counter";
/// Suffix of files being written before an atomic rename.
pub const TMP_SUFFIX: &str = ".tmp";
/// Scratch file used to check the filesystem's hole reporting.
pub const PROBE_FILE: &str = "probe.tmp";
/// The child name reported for the newest snapshot (the head's parent).
pub const VOLUME_HEAD: &str = "volume-head";

const SNAP_PREFIX: &str = "snap-";
const HEAD_PREFIX: &str = "head-";
const IMG_SUFFIX: &str = ".img";
const META_SUFFIX: &str = ".meta";
const CHECKSUM_SUFFIX: &str = ".crc";
const INTENT_SUFFIX: &str = ".intent";
/// The longest snapshot name: snapshots are named by CSI, Snapshot and
/// Backup objects alike, and each checks its name against this.
pub const SNAPSHOT_NAME_MAX: usize = 63;

/// Checks a snapshot name against `[a-z0-9][a-z0-9._-]{0,62}`.
pub fn validate_snapshot_name(name: &str) -> Result<()> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c));
    if first_ok && rest_ok && name.len() <= SNAPSHOT_NAME_MAX {
        Ok(())
    } else {
        Err(StorageError::InvalidName(name.to_string()))
    }
}

/// Layer file of snapshot `name`.
pub fn snapshot_file(name: &str) -> String {
    format!("{SNAP_PREFIX}{name}{IMG_SUFFIX}")
}

/// The snapshot name in a snapshot layer file name, if it is one.
pub fn snapshot_name_of(file: &str) -> Option<&str> {
    let name = file.strip_prefix(SNAP_PREFIX)?.strip_suffix(IMG_SUFFIX)?;
    validate_snapshot_name(name).ok().map(|()| name)
}

/// Layer file of the `index`th head.
pub fn head_file(index: u64) -> String {
    format!("{HEAD_PREFIX}{index}{IMG_SUFFIX}")
}

/// The index in a head layer file name, if it is one.
pub fn head_index_of(file: &str) -> Option<u64> {
    let digits = file.strip_prefix(HEAD_PREFIX)?.strip_suffix(IMG_SUFFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Metadata file of a layer file.
pub fn meta_file(layer_file: &str) -> String {
    format!("{layer_file}{META_SUFFIX}")
}

/// Whether `file` is something this module writes for layers, so that an
/// unreferenced one is debris of an interrupted operation and safe to delete.
/// The file of a layer's block checksums (`checksum.rs`).
pub fn checksum_file(layer_file: &str) -> String {
    format!("{layer_file}{CHECKSUM_SUFFIX}")
}

/// The file recording which of a layer's checksums may be stale (`intent.rs`).
pub fn intent_file(layer_file: &str) -> String {
    format!("{layer_file}{INTENT_SUFFIX}")
}

/// The files beside a layer's data file that belong to it.
pub fn companion_files(layer_file: &str) -> [String; 3] {
    [
        meta_file(layer_file),
        checksum_file(layer_file),
        intent_file(layer_file),
    ]
}

pub fn is_layer_artifact(file: &str) -> bool {
    let layer = [META_SUFFIX, CHECKSUM_SUFFIX, INTENT_SUFFIX]
        .iter()
        .find_map(|suffix| file.strip_suffix(suffix))
        .unwrap_or(file);
    file.ends_with(TMP_SUFFIX)
        || head_index_of(layer).is_some()
        || snapshot_name_of(layer).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names() {
        for ok in ["a", "0", "backup-1.2_x", &"a".repeat(63)] {
            assert!(validate_snapshot_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "../x",
            "a/b",
            "-a",
            ".a",
            "_a",
            "A",
            "a b",
            "é",
            &"a".repeat(64),
        ] {
            assert!(
                matches!(validate_snapshot_name(bad), Err(StorageError::InvalidName(n)) if n == bad)
            );
        }
    }

    #[test]
    fn layer_names_round_trip() {
        assert_eq!(snapshot_name_of(&snapshot_file("s.1")), Some("s.1"));
        assert_eq!(head_index_of(&head_file(42)), Some(42));
        assert_eq!(snapshot_name_of("snap-../x.img"), None);
        assert_eq!(head_index_of("head-.img"), None);
        assert_eq!(head_index_of("head-+1.img"), None);
        assert_eq!(head_index_of("head-1/../x.img"), None);
    }

    #[test]
    fn artifacts() {
        for yes in [
            "head-3.img",
            "head-3.img.meta",
            "snap-a.img",
            "snap-a.img.meta",
            "snap-a.img.crc",
            "head-3.img.intent",
            "volume.meta.tmp",
            "probe.tmp",
        ] {
            assert!(is_layer_artifact(yes), "{yes}");
        }
        for no in [
            VOLUME_META,
            REVISION_FILE,
            "notes.txt",
            "snap-A.img",
            "snap-A.img.crc",
        ] {
            assert!(!is_layer_artifact(no), "{no}");
        }
    }
}
