//! Keeps superseded engines out of a running replica: the newest engine
//! generation admitted and its newest data connection, checked around every
//! request. The durable half, the highest generation the replica ever
//! admitted, is its ownership record (`ownership.rs`).

use super::ReplicaStore;
use super::error::StorageError;
use crate::protocol::{Claim, Peer, Role};

/// Keeps superseded engines out. Requests run while holding the fence
/// shared, and only if their engine is the current one; admitting a newer
/// generation, or a newer connection of the current engine, holds it
/// exclusively. So once a new engine (or the engine's new connection, when
/// it re-adds the replica or restarts with the same generation) is
/// admitted, no request of an older one is still being applied, nor
/// applied later, whatever was left in the old connection's receive buffer.
pub(super) struct Fence {
    current: std::sync::RwLock<Holder>,
}

/// The newest engine admitted: its generation and its connection.
#[derive(Clone, Copy)]
struct Holder {
    generation: u64,
    /// Numbers engine connections in the order they were admitted; this
    /// process's own, since connections die with it.
    session: u64,
}

impl Holder {
    /// Fenced if `generation` is older than the current one.
    fn admits(&self, generation: u64) -> Result<(), StorageError> {
        if generation < self.generation {
            return Err(StorageError::Fenced {
                asked: generation,
                current: self.generation,
            });
        }
        Ok(())
    }

    /// Makes `generation` current if it is newer (durably first); fenced if
    /// it is older. The caller holds the fence exclusively.
    fn raise(&mut self, store: &ReplicaStore, generation: u64) -> Result<(), StorageError> {
        store.admit_generation(generation)?;
        self.generation = self.generation.max(generation);
        Ok(())
    }
}

impl Fence {
    pub(super) fn new(generation: u64) -> Self {
        Self {
            current: std::sync::RwLock::new(Holder {
                generation,
                session: 0,
            }),
        }
    }

    // A plain pair of u64 behind the lock: never left torn by a panic.
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Holder> {
        self.current
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Holder> {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Admits `generation` for control calls (durably, if it is new).
    /// Blocks on the disk.
    pub(super) fn admit(&self, store: &ReplicaStore, generation: u64) -> Result<(), StorageError> {
        self.write().raise(store, generation)
    }

    /// Admits a data connection and numbers it: an engine's supersedes every
    /// connection admitted before it; a reader's supersedes nothing.
    pub(super) fn admit_connection(
        &self,
        store: &ReplicaStore,
        claim: &Claim,
    ) -> Result<u64, StorageError> {
        match claim.role {
            Role::Engine => {
                let mut current = self.write();
                current.raise(store, claim.generation)?;
                current.session += 1;
                Ok(current.session)
            }
            Role::Reader => self.within(claim.generation, || Ok(0)),
        }
    }

    /// Runs `work` if `generation` is the current one.
    pub(super) fn within<T>(
        &self,
        generation: u64,
        work: impl FnOnce() -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        self.read().admits(generation)?;
        work()
    }

    /// Runs `work` for a data connection if it is the current engine's
    /// newest (or a reader of the current generation).
    pub(super) fn within_connection<T>(
        &self,
        peer: Peer,
        work: impl FnOnce() -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let current = self.read();
        current.admits(peer.generation)?;
        if peer.role == Role::Engine && peer.session < current.session {
            return Err(StorageError::Superseded {
                generation: peer.generation,
                session: peer.session,
                current: current.session,
            });
        }
        work()
    }
}
