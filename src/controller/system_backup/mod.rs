//! System backup and restore (docs/system-backup.md). A SystemBackup's
//! owner takes the volume backups its policy asks for, waits for them, and
//! then writes Oxhorn's objects to the target ([`take`]); a target's sync
//! makes a SystemBackup of each system backup its store holds that the
//! cluster lacks ([`found`]); deleting one deletes it from the store
//! ([`remove`]); a SystemRestore's owner makes the objects of
//! one again, leaving alone those that exist ([`restore`]).

mod document;
mod found;
mod remove;
mod restore;
mod take;

use document::OXHORN_VERSION;
pub use found::reconcile_found;
pub use restore::reconcile as reconcile_restore;
pub use take::reconcile as reconcile_backup;

use std::time::Duration;

/// How often a system backup or restore waiting on other objects looks
/// again.
const WAIT: Duration = Duration::from_secs(2);
