//! gRPC channels to control ports. A peer that stops answering (a stopped
//! process, a dropped link) is noticed by HTTP/2 keepalive within
//! [`KEEPALIVE`] + [`PING_TIMEOUT`], which fails every call in flight on the
//! channel, streams included; unary calls also get [`CONTROL_DEADLINE`], for
//! a peer that still answers pings but never the call.
//!
//! Every call carries the volume's control token and the caller's engine
//! generation ([`Stamp`]); the data-plane servers admit only calls whose
//! token matches their volume's key ([`Guard`]).

use std::time::Duration;

use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use super::auth::{Access, GENERATION_HEADER, Key, TOKEN_HEADER};
use super::client::{CONNECT_TIMEOUT, KEEPALIVE, PING_TIMEOUT};

/// A control channel whose calls carry a [`Stamp`].
pub type Stamped = InterceptedService<Channel, Stamp>;

/// Adds the control token and the generation to every call.
#[derive(Clone)]
pub struct Stamp {
    token: AsciiMetadataValue,
    generation: AsciiMetadataValue,
}

impl Stamp {
    pub fn new(access: &Access) -> Self {
        // Invariant: hex digits and decimal digits are valid ASCII metadata.
        Self {
            token: AsciiMetadataValue::try_from(access.key.control_token())
                .unwrap_or_else(|_| AsciiMetadataValue::from_static("")),
            generation: AsciiMetadataValue::from(access.generation),
        }
    }
}

impl Interceptor for Stamp {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        let metadata = request.metadata_mut();
        metadata.insert(TOKEN_HEADER, self.token.clone());
        metadata.insert(GENERATION_HEADER, self.generation.clone());
        Ok(request)
    }
}

/// `channel` with every call stamped for `access`.
pub fn stamped(channel: Channel, access: &Access) -> Stamped {
    InterceptedService::new(channel, Stamp::new(access))
}

/// Admits only calls that carry the control token of `key`.
#[derive(Clone)]
pub struct Guard {
    key: Key,
}

impl Guard {
    pub fn new(key: Key) -> Self {
        Self { key }
    }
}

impl Interceptor for Guard {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let token = request
            .metadata()
            .get(TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if self.key.verify_token(token) {
            Ok(request)
        } else {
            Err(tonic::Status::unauthenticated(
                "no valid token of this volume's key",
            ))
        }
    }
}

/// The engine generation a call was stamped with; 0 if none.
pub fn generation_of(metadata: &MetadataMap) -> Result<u64, tonic::Status> {
    match metadata.get(GENERATION_HEADER) {
        None => Ok(0),
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| tonic::Status::invalid_argument("malformed engine generation")),
    }
}

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
        .keep_alive_while_idle(true))
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
