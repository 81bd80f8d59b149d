//! The volume's control token on every control call: callers attach it and
//! their engine generation ([`AttachToken`]); the data-plane servers admit
//! only calls whose token matches their volume's key ([`RequireToken`]).

use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::auth::{Access, GENERATION_HEADER, Key, TOKEN_HEADER};

/// A control channel whose calls carry a [`AttachToken`].
pub type TokenChannel = InterceptedService<Channel, AttachToken>;

/// Adds the control token and the generation to every call.
#[derive(Clone)]
pub struct AttachToken {
    token: AsciiMetadataValue,
    generation: AsciiMetadataValue,
}

impl AttachToken {
    pub fn new(access: &Access) -> Self {
        // Invariant: hex digits and decimal digits are valid ASCII metadata.
        Self {
            token: AsciiMetadataValue::try_from(access.key.control_token())
                .unwrap_or_else(|_| AsciiMetadataValue::from_static("")),
            generation: AsciiMetadataValue::from(access.generation),
        }
    }
}

impl Interceptor for AttachToken {
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

/// `channel` with the token and generation of `access` on every call.
pub fn with_token(channel: Channel, access: &Access) -> TokenChannel {
    InterceptedService::new(channel, AttachToken::new(access))
}

/// Admits only calls that carry the control token of `key`.
#[derive(Clone)]
pub struct RequireToken {
    key: Key,
}

impl RequireToken {
    pub fn new(key: Key) -> Self {
        Self { key }
    }
}

impl Interceptor for RequireToken {
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

/// The engine generation a call was with_token with; 0 if none.
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
