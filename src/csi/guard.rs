//! One operation at a time per volume: CSI lets the CO send concurrent calls
//! for the same volume and asks the plugin to refuse the second with ABORTED.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

/// The volumes with an operation in flight. Clones share the same set.
#[derive(Debug, Clone, Default)]
pub struct VolumeLocks {
    busy: Arc<Mutex<HashSet<String>>>,
}

/// An operation on the volume is in flight; both services answer ABORTED.
#[derive(Debug, thiserror::Error)]
#[error("an operation on volume {0} is in progress")]
pub struct VolumeBusy(String);

/// Marks a volume busy until dropped.
#[derive(Debug)]
pub struct VolumeGuard {
    busy: Arc<Mutex<HashSet<String>>>,
    volume_id: String,
}

impl VolumeLocks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks `volume_id` busy, or says it is.
    pub fn try_lock(&self, volume_id: &str) -> Result<VolumeGuard, VolumeBusy> {
        if !lock(&self.busy).insert(volume_id.to_string()) {
            return Err(VolumeBusy(volume_id.to_string()));
        }
        Ok(VolumeGuard {
            busy: Arc::clone(&self.busy),
            volume_id: volume_id.to_string(),
        })
    }
}

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        lock(&self.busy).remove(&self.volume_id);
    }
}

/// The set is only inserted into and removed from, so it is whole even if a
/// holder panicked: poisoning is ignored.
fn lock(busy: &Mutex<HashSet<String>>) -> std::sync::MutexGuard<'_, HashSet<String>> {
    busy.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_operation_on_the_same_volume_is_refused() {
        let locks = VolumeLocks::new();
        let guard = locks.try_lock("vol-a").unwrap();
        let err = locks.clone().try_lock("vol-a").unwrap_err();
        assert!(err.to_string().contains("vol-a"), "{err}");
        // Other volumes are independent.
        let _other = locks.try_lock("vol-b").unwrap();
        drop(guard);
        let _again = locks.try_lock("vol-a").unwrap();
    }
}
