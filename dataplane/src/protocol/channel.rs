//! gRPC channels to control ports. A peer that stops answering (a stopped
//! process, a dropped link) is noticed by HTTP/2 keepalive within
//! [`KEEPALIVE`] + [`PING_TIMEOUT`], which fails every call in flight on the
//! channel, streams included; unary calls also get [`CONTROL_DEADLINE`], for
//! a peer that still answers pings but never the call. An idle channel
//! sends no pings: with no call to fail, they would cost each side a
//! wake-up every few seconds for nothing (an engine's replicas' liveness
//! is its data connections' concern).
//! What every call carries, and what servers admit, is in `token.rs`.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use super::client::{CONNECT_TIMEOUT, KEEPALIVE, PING_TIMEOUT};

/// The longest a unary control call may take. Generous: a snapshot or a
/// flush of a large head is slow but alive.
pub const CONTROL_DEADLINE: Duration = Duration::from_secs(30);

/// The control service at `address` (host:port), with the connect timeout
/// and keepalive above.
pub fn control_endpoint(address: &str) -> Result<Endpoint, tonic::transport::Error> {
    Ok(Endpoint::from_shared(format!("http://{address}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(PING_TIMEOUT)
        .keep_alive_while_idle(false))
}

/// A channel to the control service at `address` (host:port).
pub async fn control_channel(address: &str) -> Result<Channel, tonic::transport::Error> {
    control_endpoint(address)?.connect().await
}

/// Runs a unary control call within [`CONTROL_DEADLINE`].
pub async fn within_deadline<T>(
    call: impl Future<Output = Result<T, tonic::Status>>,
) -> Result<T, tonic::Status> {
    tokio::time::timeout(CONTROL_DEADLINE, call)
        .await
        .unwrap_or_else(|_| {
            Err(tonic::Status::deadline_exceeded(format!(
                "no answer within {CONTROL_DEADLINE:?}"
            )))
        })
}
