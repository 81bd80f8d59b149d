//! One CSI operation per volume at a time: a second call for a volume whose
//! operation is still running gets ABORTED, as the CSI spec asks, instead of
//! racing the first one.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use tonic::Status;

/// The volumes (or snapshots) with an operation in flight.
#[derive(Clone, Default)]
pub struct VolumeLocks {
    busy: Arc<Mutex<HashSet<String>>>,
}

/// Held while an operation on one id runs; dropping it frees the id.
pub struct VolumeGuard {
    id: String,
    busy: Arc<Mutex<HashSet<String>>>,
}

impl VolumeLocks {
    /// Takes `id`, or ABORTED when an operation on it is in progress.
    pub fn try_lock(&self, id: &str) -> Result<VolumeGuard, Status> {
        // A panic while the set was held cannot leave it half-changed.
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        if !busy.insert(id.to_owned()) {
            return Err(Status::aborted(format!(
                "an operation on {id} is in progress; retry later"
            )));
        }
        Ok(VolumeGuard {
            id: id.to_owned(),
            busy: Arc::clone(&self.busy),
        })
    }
}

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        busy.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_operation_on_a_busy_id_is_aborted_until_the_first_ends() {
        let locks = VolumeLocks::default();
        let first = locks.try_lock("vol-a").unwrap();
        let second = locks.try_lock("vol-a").err().unwrap();
        assert_eq!(second.code(), tonic::Code::Aborted);
        assert!(second.message().contains("vol-a"), "{}", second.message());
        let _other = locks.try_lock("vol-b").expect("other ids are free");
        drop(first);
        locks.try_lock("vol-a").expect("free again");
    }
}
