//! One operation at a time per volume: CSI lets the CO send concurrent calls
//! for the same volume and asks the plugin to refuse the second with ABORTED.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use tonic::Status;

/// The volumes with an operation in flight. Clones share the same set.
#[derive(Debug, Clone, Default)]
pub struct VolumeLocks {
    busy: Arc<Mutex<HashSet<String>>>,
}

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

    /// Marks `volume_id` busy, or ABORTED if an operation on it is in flight.
    pub fn try_lock(&self, volume_id: &str) -> Result<VolumeGuard, Status> {
        if !lock(&self.busy).insert(volume_id.to_string()) {
            return Err(Status::aborted(format!(
                "an operation on volume {volume_id} is in progress"
            )));
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
    fn a_second_operation_on_the_same_volume_is_aborted() {
        let locks = VolumeLocks::new();
        let guard = locks.try_lock("vol-a").unwrap();
        let err = locks.clone().try_lock("vol-a").unwrap_err();
        assert_eq!(err.code(), tonic::Code::Aborted);
        assert!(err.message().contains("vol-a"), "{}", err.message());
        // Other volumes are independent.
        let _other = locks.try_lock("vol-b").unwrap();
        drop(guard);
        let _again = locks.try_lock("vol-a").unwrap();
    }
}
