//! Lock helpers. A poisoned lock means a thread panicked while changing the
//! replica's state (e.g. half way through a snapshot); carrying on could
//! serve wrong data, so poisoning becomes an error and the engine reopens the
//! replica from disk instead of unwrapping.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::error::{Result, StorageError};

pub fn read<T>(lock: &RwLock<T>) -> Result<RwLockReadGuard<'_, T>> {
    lock.read().map_err(|_| StorageError::Poisoned)
}

pub fn write<T>(lock: &RwLock<T>) -> Result<RwLockWriteGuard<'_, T>> {
    lock.write().map_err(|_| StorageError::Poisoned)
}

pub fn mutex<T>(lock: &Mutex<T>) -> Result<MutexGuard<'_, T>> {
    lock.lock().map_err(|_| StorageError::Poisoned)
}
