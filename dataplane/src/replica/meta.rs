//! JSON metadata files: `volume.meta` for the replica and `<layer>.meta` for
//! each layer. Everything read back is validated, since names in it become
//! paths and sizes bound every I/O.

use std::collections::BTreeMap;
use std::fs;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use super::BLOCK_SIZE;
use super::dir::ReplicaDir;
use super::error::{Result, StorageError};
use super::naming::{VOLUME_META, head_index_of, meta_file, snapshot_name_of};

/// `volume.meta`. Written atomically; replacing it is the commit point of
/// snapshot and revert (it names the head, and the head's metadata names the
/// rest of the chain).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMeta {
    /// Volume size in bytes.
    pub size: u64,
    /// Always [`BLOCK_SIZE`]; stored so a future format change is detected.
    pub block_size: u64,
    /// Head layer file name, `head-<n>.img`.
    pub head: String,
    /// Newest snapshot layer file name, or empty. A mirror of the head's
    /// parent for people reading the directory; `open` repairs it.
    pub parent: String,
    /// Written since the last clean close: the revision counter may lag the
    /// data.
    pub dirty: bool,
    /// Being rebuilt from another replica: its data is incomplete.
    pub rebuilding: bool,
    /// The volume this replica belongs to; empty in a replica made before
    /// it was recorded, which adopts the first volume it is served as.
    #[serde(default)]
    pub volume: String,
    /// This replica's identity in I/O-path records, made once.
    #[serde(default)]
    pub id: String,
    /// The highest engine generation admitted: older engines are fenced.
    #[serde(default)]
    pub generation: u64,
    /// The newest record of the volume's I/O path this replica was given.
    #[serde(default)]
    pub io_path: Option<IoPath>,
}

/// Which replicas an engine had in its I/O path (RW): each of them holds
/// every write acknowledged since, and nothing else does. Ordered by
/// (generation, version): a newer record supersedes an older one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoPath {
    /// The engine generation that wrote it.
    pub generation: u64,
    /// Counts the changes that engine made.
    pub version: u64,
    /// Replica ids, sorted.
    pub members: Vec<String>,
}

impl IoPath {
    /// The order of records: the newer is the greater.
    pub fn order(&self) -> (u64, u64) {
        (self.generation, self.version)
    }
}

/// `<layer>.img.meta`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerMeta {
    /// The layer's file name (checked against the file it describes).
    pub name: String,
    /// The next older layer's file name (always a snapshot), or empty.
    pub parent: String,
    /// Creation time, seconds since the Unix epoch.
    pub created: u64,
    /// Taken by a user rather than by the system (e.g. for a rebuild).
    pub user_created: bool,
    /// `<layer>.crc` holds the checksum of every block the layer holds.
    /// Layers written before checksums existed lack it (and the field):
    /// their checksums are computed when they are next opened.
    #[serde(default)]
    pub checksums: bool,
    /// The length the layer's file was found cut to, kept (durably, before
    /// the file is touched) until the blocks it lost are marked as such:
    /// a crash meanwhile must not leave them looking like holes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_at: Option<u64>,
    pub labels: BTreeMap<String, String>,
}

/// Checks that `size` can be a volume size: whole blocks, and small enough
/// that every byte offset fits the kernel's signed `off_t`.
pub fn check_size(size: u64) -> Result<()> {
    if size == 0 || !size.is_multiple_of(BLOCK_SIZE) || size > i64::MAX as u64 {
        return Err(StorageError::InvalidSize { size });
    }
    Ok(())
}

impl VolumeMeta {
    pub fn new(size: u64, head: String) -> Self {
        Self {
            size,
            block_size: BLOCK_SIZE,
            head,
            parent: String::new(),
            dirty: false,
            rebuilding: false,
            volume: String::new(),
            id: String::new(),
            generation: 0,
            io_path: None,
        }
    }

    pub fn load(dir: &ReplicaDir) -> Result<Self> {
        let path = dir.join(VOLUME_META);
        let meta: Self = read_json(dir, VOLUME_META)?;
        if meta.block_size != BLOCK_SIZE {
            return Err(StorageError::corrupt(
                &path,
                format!("unsupported block size {}", meta.block_size),
            ));
        }
        check_size(meta.size).map_err(|e| StorageError::corrupt(&path, e.to_string()))?;
        if head_index_of(&meta.head).is_none() {
            return Err(StorageError::corrupt(
                &path,
                format!("invalid head layer name {:?}", meta.head),
            ));
        }
        Ok(meta)
    }

    pub fn save(&self, dir: &ReplicaDir) -> Result<()> {
        write_json(dir, VOLUME_META, self)
    }
}

impl LayerMeta {
    pub fn new(
        name: String,
        parent: String,
        user_created: bool,
        labels: BTreeMap<String, String>,
    ) -> Self {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self {
            name,
            parent,
            created,
            user_created,
            checksums: true,
            cut_at: None,
            labels,
        }
    }

    pub fn load(dir: &ReplicaDir, layer_file: &str) -> Result<Self> {
        let name = meta_file(layer_file);
        let meta: Self = read_json(dir, &name)?;
        let path = dir.join(&name);
        if meta.name != layer_file {
            return Err(StorageError::corrupt(
                &path,
                format!("describes layer {:?}", meta.name),
            ));
        }
        if !meta.parent.is_empty() && snapshot_name_of(&meta.parent).is_none() {
            return Err(StorageError::corrupt(
                &path,
                format!("invalid parent layer name {:?}", meta.parent),
            ));
        }
        Ok(meta)
    }

    pub fn save(&self, dir: &ReplicaDir) -> Result<()> {
        write_json(dir, &meta_file(&self.name), self)
    }
}

fn read_json<T: DeserializeOwned>(dir: &ReplicaDir, name: &str) -> Result<T> {
    let path = dir.join(name);
    let bytes = fs::read(&path).map_err(|e| StorageError::io(&path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| StorageError::corrupt(&path, e.to_string()))
}

fn write_json<T: Serialize>(dir: &ReplicaDir, name: &str, value: &T) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| StorageError::corrupt(&dir.join(name), e.to_string()))?;
    bytes.push(b'\n');
    dir.write_atomic(name, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::testutil::locked;

    #[test]
    fn sizes() {
        assert!(check_size(BLOCK_SIZE).is_ok());
        assert!(check_size(1 << 40).is_ok());
        for bad in [0, 1, BLOCK_SIZE + 1, u64::MAX - BLOCK_SIZE + 1] {
            assert!(
                matches!(check_size(bad), Err(StorageError::InvalidSize { size }) if size == bad)
            );
        }
    }

    #[test]
    fn volume_meta_round_trips() {
        let (_tmp, dir) = locked();
        let mut meta = VolumeMeta::new(8 * BLOCK_SIZE, "head-1.img".into());
        meta.parent = "snap-a.img".into();
        meta.dirty = true;
        meta.save(&dir).unwrap();
        assert_eq!(VolumeMeta::load(&dir).unwrap(), meta);
    }

    #[test]
    fn volume_meta_is_validated() {
        let (_tmp, dir) = locked();
        let path = dir.join(VOLUME_META);
        for (meta, reason) in [
            (
                VolumeMeta {
                    block_size: 512,
                    ..VolumeMeta::new(BLOCK_SIZE, "head-1.img".into())
                },
                "block size",
            ),
            (
                VolumeMeta::new(100, "head-1.img".into()),
                "invalid volume size",
            ),
            (
                VolumeMeta::new(BLOCK_SIZE, "../head-1.img".into()),
                "head layer name",
            ),
        ] {
            meta.save(&dir).unwrap();
            match VolumeMeta::load(&dir) {
                Err(StorageError::CorruptMetadata { path: p, reason: r }) => {
                    assert_eq!(p, path);
                    assert!(r.contains(reason), "{r}");
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn layer_meta_is_validated() {
        let (_tmp, dir) = locked();
        let meta = LayerMeta::new(
            "snap-a.img".into(),
            "snap-b.img".into(),
            true,
            BTreeMap::new(),
        );
        meta.save(&dir).unwrap();
        assert_eq!(LayerMeta::load(&dir, "snap-a.img").unwrap(), meta);
        fs::copy(dir.join("snap-a.img.meta"), dir.join("snap-c.img.meta")).unwrap();
        let err = LayerMeta::load(&dir, "snap-c.img").unwrap_err();
        assert!(err.to_string().contains("snap-c.img.meta"), "{err}");
        LayerMeta::new(
            "head-1.img".into(),
            "/etc/passwd".into(),
            false,
            BTreeMap::new(),
        )
        .save(&dir)
        .unwrap();
        assert!(matches!(
            LayerMeta::load(&dir, "head-1.img"),
            Err(StorageError::CorruptMetadata { .. })
        ));
    }

    #[test]
    fn garbage_and_missing_files_are_named() {
        let (_tmp, dir) = locked();
        let path = dir.join(VOLUME_META);
        assert!(
            matches!(VolumeMeta::load(&dir), Err(StorageError::MissingFile { path: p }) if p == path)
        );
        fs::write(&path, b"\x00garbage").unwrap();
        let err = VolumeMeta::load(&dir).unwrap_err();
        assert!(matches!(err, StorageError::CorruptMetadata { path: ref p, .. } if *p == path));
        assert!(err.to_string().contains("volume.meta"));
    }
}
