//! The engine <-> replica data protocol: a compact binary framing over TCP
//! with request ids, so that many requests are in flight on one connection
//! and answers may come back in any order. A malformed frame closes that
//! connection, never the process. Control operations use gRPC instead
//! (proto/dataplane.proto) on the port after the data port.

mod auth;
mod channel;
mod client;
mod frame;
mod handshake;
mod server;
mod token;

pub use auth::{
    Access, Claim, GENERATION_HEADER, KEY_ENV, Key, KeyError, Role, TOKEN_HEADER, random,
};
pub use channel::{CONTROL_DEADLINE, control_channel, control_endpoint, within_deadline};
pub use client::{Connection, ConnectionError, KEEPALIVE, PING_TIMEOUT, REQUEST_TIMEOUT};
pub use frame::{
    ClientCodec, MAX_PAYLOAD, MAX_RESPONSE, Op, Request, Response, ServerCodec, Status,
    encode_corrupt,
};
pub use handshake::{HANDSHAKE_TIMEOUT, HandshakeError, introduce};
pub use server::{Handler, MAX_CONNECTIONS, Peer, serve};
pub use token::{AttachToken, RequireToken, TokenChannel, generation_of, with_token};

/// Code generated from proto/dataplane.proto: the control APIs of replicas
/// and engines.
pub mod control {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("oxhorn.dataplane.v1");
}

/// The control (gRPC) port that goes with a data port.
pub fn control_port(data_port: u16) -> Option<u16> {
    data_port.checked_add(1)
}
