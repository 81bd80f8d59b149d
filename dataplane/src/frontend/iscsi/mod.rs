//! The iSCSI target the engine serves a volume through (RFC 7143), written
//! here rather than run as a separate daemon. [`target`] accepts
//! connections and keeps the sessions; each `connection` logs in
//! ([`login`], answering the initiator's offer by the rules of
//! [`negotiate`], with [`chap`] when the target has secrets) and then serves its SCSI tasks (`scsi_task`, a write's
//! data gathered by [`data_out`]) and task management
//! (`task_management`). Below them, [`pdu`] frames and checks PDUs and
//! [`text`] reads and writes the key=value text of logins and text
//! requests.

pub mod chap;
mod connection;
pub mod data_out;
pub mod login;
pub mod negotiate;
pub mod pdu;
mod scsi_task;
pub mod target;
mod task_management;
#[cfg(test)]
mod tests;
pub mod text;

pub use target::{IQN_PREFIX, Target, TargetConfig};
