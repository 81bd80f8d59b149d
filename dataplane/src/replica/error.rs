//! The replica storage's error type. Every variant that concerns a file names
//! its path, because an operator reading a log has only the message to go on.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use super::BLOCK_SIZE;

/// Result of replica storage operations.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("I/O at offset {offset} length {len} is not aligned to {BLOCK_SIZE}-byte blocks")]
    Unaligned { offset: u64, len: u64 },

    #[error("I/O at offset {offset} length {len} is beyond the volume size {size}")]
    OutOfRange { offset: u64, len: u64, size: u64 },

    #[error(
        "invalid volume size {size}: must be a positive multiple of {BLOCK_SIZE} bytes below 2^63"
    )]
    InvalidSize { size: u64 },

    #[error("cannot shrink the volume from {size} to {requested} bytes")]
    CannotShrink { size: u64, requested: u64 },

    #[error("a check of {len} bytes at once exceeds the {max} a scrub reads in one call")]
    TooLong { len: u64, max: u64 },

    #[error("corrupt metadata in {path}: {reason}")]
    CorruptMetadata { path: PathBuf, reason: String },

    #[error("{path} is missing")]
    MissingFile { path: PathBuf },

    #[error("no space left on the device holding {path}")]
    NoSpace { path: PathBuf },

    /// Blocks whose data does not match their checksum: rotten on disk.
    #[error("{path}: {}", describe_mismatch(blocks))]
    ChecksumMismatch {
        path: PathBuf,
        /// Block ranges `[start, end)`, ascending.
        blocks: Vec<(u64, u64)>,
    },

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("snapshot {0:?} not found")]
    SnapshotNotFound(String),

    #[error("snapshot {0:?} already exists")]
    SnapshotExists(String),

    #[error(
        "snapshot {0:?} is out of order in the chain being installed: listed twice, or newer \
         here than a layer the chain lists above it"
    )]
    ChainOrder(String),

    #[error("invalid snapshot name {0:?}: must match [a-z0-9][a-z0-9._-]{{0,62}}")]
    InvalidName(String),

    #[error("{path} is not empty; refusing to create a replica in it")]
    DirectoryNotEmpty { path: PathBuf },

    #[error("{path} is in use by another replica process")]
    Busy { path: PathBuf },

    #[error(
        "the filesystem holding {path} does not report written {BLOCK_SIZE}-byte blocks exactly \
         through SEEK_DATA/SEEK_HOLE ({reason}); replicas cannot be stored on it"
    )]
    UnsupportedFilesystem { path: PathBuf, reason: String },

    #[error("{path} holds a replica of volume {holds:?}, not of {asked:?}")]
    WrongVolume {
        path: PathBuf,
        holds: String,
        asked: String,
    },

    #[error("engine generation {asked} is fenced: generation {current} has taken over")]
    Fenced { asked: u64, current: u64 },

    #[error(
        "connection {session} of engine generation {generation} is superseded by its connection {current}"
    )]
    Superseded {
        generation: u64,
        session: u64,
        current: u64,
    },

    #[error("a read-only connection cannot {0}")]
    ReadOnly(&'static str),

    #[error("I/O-path record {asked:?} is older than the one held, {held:?} (generation, version)")]
    StaleIoPath { asked: (u64, u64), held: (u64, u64) },

    #[error("replica state lock poisoned by a panic in another thread; reopen the replica")]
    Poisoned,

    // The `oxhorn replica` process's own failures, which end it.
    #[error("invalid configuration: {0}")]
    Config(String),

    #[error("{address}: {source}")]
    Listen {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },

    #[error("gRPC server: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// "block 7 does not match ..." or "blocks 7-9, 12 (4 blocks) do not
/// match ..." (at most the first 4 ranges).
fn describe_mismatch(ranges: &[(u64, u64)]) -> String {
    let count: u64 = ranges.iter().map(|(s, e)| e - s).sum();
    if let [(s, e)] = ranges
        && e - s == 1
    {
        return format!("block {s} does not match its checksum");
    }
    let mut listed: Vec<String> = ranges
        .iter()
        .take(4)
        .map(|&(s, e)| {
            if e - s == 1 {
                s.to_string()
            } else {
                format!("{s}-{}", e - 1)
            }
        })
        .collect();
    if ranges.len() > 4 {
        listed.push("...".into());
    }
    format!(
        "blocks {} ({count} blocks) do not match their checksums",
        listed.join(", ")
    )
}

impl StorageError {
    /// Wraps an I/O error on `path`, singling out the causes callers act on:
    /// a full disk (the engine reports it instead of failing the replica
    /// blindly) and a missing file.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        let path = path.to_path_buf();
        match source.raw_os_error() {
            Some(code) if code == Errno::ENOSPC as i32 => Self::NoSpace { path },
            Some(code) if code == Errno::ENOENT as i32 => Self::MissingFile { path },
            _ => Self::Io { path, source },
        }
    }

    /// Wraps a failed system call made through nix.
    pub fn errno(path: &Path, errno: Errno) -> Self {
        Self::io(path, std::io::Error::from(errno))
    }

    pub(super) fn corrupt(path: &Path, reason: impl Into<String>) -> Self {
        Self::CorruptMetadata {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enospc_maps_to_no_space() {
        let err = StorageError::io(
            Path::new("/x/head-1.img"),
            std::io::Error::from_raw_os_error(Errno::ENOSPC as i32),
        );
        assert!(
            matches!(err, StorageError::NoSpace { ref path } if path == Path::new("/x/head-1.img"))
        );
        assert!(err.to_string().contains("/x/head-1.img"));
    }

    #[test]
    fn enoent_maps_to_missing_file() {
        let err = StorageError::errno(Path::new("/x/volume.meta"), Errno::ENOENT);
        assert!(matches!(err, StorageError::MissingFile { .. }));
        assert_eq!(err.to_string(), "/x/volume.meta is missing");
    }

    #[test]
    fn a_checksum_mismatch_names_the_blocks() {
        let one = StorageError::ChecksumMismatch {
            path: "/r/head-1.img".into(),
            blocks: vec![(7, 8)],
        };
        assert_eq!(
            one.to_string(),
            "/r/head-1.img: block 7 does not match its checksum"
        );
        let many = StorageError::ChecksumMismatch {
            path: "/r".into(),
            blocks: vec![(1, 2), (4, 7), (9, 10), (11, 12), (20, 21)],
        };
        assert_eq!(
            many.to_string(),
            "/r: blocks 1, 4-6, 9, 11, ... (7 blocks) do not match their checksums"
        );
    }

    #[test]
    fn other_errors_keep_path_and_source() {
        let err = StorageError::errno(Path::new("/x/a"), Errno::EIO);
        assert!(matches!(err, StorageError::Io { .. }));
        assert!(err.to_string().starts_with("/x/a: "));
    }
}
