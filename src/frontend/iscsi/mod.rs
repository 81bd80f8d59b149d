//! The iSCSI target the engine serves a volume through (RFC 7143), written
//! here rather than run as a separate daemon: its wire layer, [`pdu`], frames
//! and checks PDUs; [`text`] reads and writes the key=value text that login
//! and text requests carry; [`login`] takes a connection through its login
//! phase, answering the initiator's offer by the rules of [`negotiate`].

pub mod login;
pub mod negotiate;
pub mod pdu;
pub mod text;
