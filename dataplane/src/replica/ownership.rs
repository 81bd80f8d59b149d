//! Who the replica belongs to and who may change it: its volume, its id, the
//! highest engine generation it admitted (older engines are fenced), and the
//! newest record of the volume's I/O path it was given. All of it lives in
//! `volume.meta` and is durable before it is acted on.

use super::ReplicaStore;
use super::error::{Result, StorageError};
use super::lock;
use super::meta::IoPath;

impl ReplicaStore {
    /// Claims the replica for `volume` (a replica made before volumes were
    /// recorded adopts it) and gives it an id if it has none; returns the
    /// id. A replica of another volume is refused.
    pub fn claim(&self, volume: &str) -> Result<String> {
        let mut state = lock::write(&self.state)?;
        if !state.meta.volume.is_empty() && state.meta.volume != volume {
            return Err(StorageError::WrongVolume {
                path: self.dir.path().to_path_buf(),
                holds: state.meta.volume.clone(),
                asked: volume.to_string(),
            });
        }
        if state.meta.volume.is_empty() || state.meta.id.is_empty() {
            let id = format!("{:016x}", fastrand::u64(..));
            state.update_meta(&self.dir, |meta| {
                meta.volume = volume.to_string();
                if meta.id.is_empty() {
                    meta.id = id;
                }
            })?;
        }
        Ok(state.meta.id.clone())
    }

    /// The volume the replica was claimed for; empty before the first claim.
    pub fn volume(&self) -> Result<String> {
        Ok(lock::read(&self.state)?.meta.volume.clone())
    }

    pub fn id(&self) -> Result<String> {
        Ok(lock::read(&self.state)?.meta.id.clone())
    }

    /// The highest engine generation admitted so far.
    pub fn generation(&self) -> Result<u64> {
        Ok(lock::read(&self.state)?.meta.generation)
    }

    /// Admits engine `generation`: refused below the highest admitted, made
    /// durable when higher. The caller keeps older engines' requests out
    /// while this runs (see the service's fence).
    pub fn admit_generation(&self, generation: u64) -> Result<()> {
        let mut state = lock::write(&self.state)?;
        let current = state.meta.generation;
        if generation < current {
            return Err(StorageError::Fenced {
                asked: generation,
                current,
            });
        }
        if generation > current {
            state.update_meta(&self.dir, |meta| meta.generation = generation)?;
        }
        Ok(())
    }

    pub fn io_path(&self) -> Result<Option<IoPath>> {
        Ok(lock::read(&self.state)?.meta.io_path.clone())
    }

    /// Records `path` as the volume's newest I/O path. An older record than
    /// the one held is refused; the same one again changes nothing.
    pub fn set_io_path(&self, mut path: IoPath) -> Result<()> {
        path.members.sort();
        path.members.dedup();
        let mut state = lock::write(&self.state)?;
        if let Some(held) = &state.meta.io_path {
            if path.order() < held.order() {
                return Err(StorageError::StaleIoPath {
                    asked: path.order(),
                    held: held.order(),
                });
            }
            if *held == path {
                return Ok(());
            }
        }
        state.update_meta(&self.dir, |meta| meta.io_path = Some(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::BLOCK_SIZE;

    fn store() -> (tempfile::TempDir, ReplicaStore) {
        let tmp = tempfile::tempdir().unwrap();
        let store = ReplicaStore::create(tmp.path().join("r"), 16 * BLOCK_SIZE).unwrap();
        (tmp, store)
    }

    fn reopen(tmp: &tempfile::TempDir, store: ReplicaStore) -> ReplicaStore {
        store.close().unwrap();
        ReplicaStore::open(tmp.path().join("r")).unwrap()
    }

    #[test]
    fn a_replica_belongs_to_one_volume_and_keeps_its_id() {
        let (tmp, store) = store();
        let id = store.claim("vol-a").unwrap();
        assert_eq!(id.len(), 16);
        assert_eq!(store.claim("vol-a").unwrap(), id);
        assert!(matches!(
            store.claim("vol-b"),
            Err(StorageError::WrongVolume { ref holds, .. }) if holds == "vol-a"
        ));
        let store = reopen(&tmp, store);
        assert_eq!(
            store.claim("vol-a").unwrap(),
            id,
            "the id survives a restart"
        );
    }

    #[test]
    fn older_generations_are_fenced_for_good() {
        let (tmp, store) = store();
        store.admit_generation(3).unwrap();
        store.admit_generation(3).unwrap();
        assert!(matches!(
            store.admit_generation(2),
            Err(StorageError::Fenced {
                asked: 2,
                current: 3
            })
        ));
        let store = reopen(&tmp, store);
        assert_eq!(store.generation().unwrap(), 3, "durable");
        assert!(store.admit_generation(1).is_err());
    }

    #[test]
    fn io_path_records_only_move_forward() {
        let (tmp, store) = store();
        let record = |generation, version, members: &[&str]| IoPath {
            generation,
            version,
            members: members.iter().map(|m| m.to_string()).collect(),
        };
        store.set_io_path(record(2, 1, &["b", "a"])).unwrap();
        assert_eq!(store.io_path().unwrap(), Some(record(2, 1, &["a", "b"])));
        assert!(matches!(
            store.set_io_path(record(1, 9, &["c"])),
            Err(StorageError::StaleIoPath { .. })
        ));
        store.set_io_path(record(2, 2, &["a"])).unwrap();
        let store = reopen(&tmp, store);
        assert_eq!(store.io_path().unwrap(), Some(record(2, 2, &["a"])));
    }
}
