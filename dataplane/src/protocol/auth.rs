//! Who may talk to a volume's data plane: whoever holds the volume's key.
//!
//! Each volume has its own 32-byte key, derived from the cluster's data-plane
//! key (held by the managers in a Secret) and the volume name, so a process
//! of one volume cannot open a connection to another volume's replica. The
//! controller hands the key to the engine and replicas it starts in the
//! environment (`OXHORN_VOLUME_KEY`, hex), never on the command line.
//!
//! Data connections prove the key with an HMAC over a nonce the replica
//! picked (see `handshake.rs`); control calls carry a token derived from the
//! key. This authenticates peers; it does not encrypt the data.

use std::fmt;

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// The environment variable a data-plane process reads its key from.
pub const KEY_ENV: &str = "OXHORN_VOLUME_KEY";
/// The gRPC metadata key carrying the control token.
pub const TOKEN_HEADER: &str = "x-oxhorn-token";
/// The gRPC metadata key carrying the caller's engine generation.
pub const GENERATION_HEADER: &str = "x-oxhorn-generation";

const KEY_LEN: usize = 32;
const CONTROL_MESSAGE: &[u8] = b"oxhorn control v1";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("{KEY_ENV} is not set: a data-plane process needs its volume's key")]
    Missing,
    #[error("{KEY_ENV} must be {} hex digits", KEY_LEN * 2)]
    Malformed,
}

/// A key: the cluster's, or one volume's.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; KEY_LEN]);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    /// A new random key.
    pub fn generate() -> Self {
        Self(random())
    }

    /// The key of `volume`, derived from the cluster key `self`.
    pub fn for_volume(&self, volume: &str) -> Self {
        Self(self.mac(&[b"oxhorn volume key v1\0", volume.as_bytes()]))
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn from_hex(hex: &str) -> Result<Self, KeyError> {
        let hex = hex.trim();
        if hex.len() != KEY_LEN * 2 || !hex.is_ascii() {
            return Err(KeyError::Malformed);
        }
        let mut key = [0; KEY_LEN];
        for (i, byte) in key.iter_mut().enumerate() {
            *byte =
                u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| KeyError::Malformed)?;
        }
        Ok(Self(key))
    }

    /// The key this process was started with.
    pub fn from_env() -> Result<Self, KeyError> {
        let value = std::env::var(KEY_ENV).map_err(|_| KeyError::Missing)?;
        Self::from_hex(&value)
    }

    /// What a data connection presents for `nonce`: binds the volume, the
    /// generation and the role, so none can be changed on the way.
    pub fn proof(&self, nonce: &[u8], claim: &Claim) -> [u8; KEY_LEN] {
        self.mac(&[&proof_message(nonce, claim)])
    }

    /// Whether `proof` is [`Self::proof`] of the same inputs, in constant
    /// time.
    pub fn verify(&self, nonce: &[u8], claim: &Claim, proof: &[u8]) -> bool {
        // ring's verify compares in constant time.
        hmac::verify(
            &hmac::Key::new(hmac::HMAC_SHA256, &self.0),
            &proof_message(nonce, claim),
            proof,
        )
        .is_ok()
    }

    /// The token control calls carry.
    pub fn control_token(&self) -> String {
        Self(self.mac(&[CONTROL_MESSAGE])).to_hex()
    }

    /// Whether `token` is [`Self::control_token`], in constant time.
    pub fn verify_token(&self, token: &str) -> bool {
        Self::from_hex(token).is_ok_and(|tag| {
            hmac::verify(
                &hmac::Key::new(hmac::HMAC_SHA256, &self.0),
                CONTROL_MESSAGE,
                &tag.0,
            )
            .is_ok()
        })
    }

    fn mac(&self, parts: &[&[u8]]) -> [u8; KEY_LEN] {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &self.0);
        let mut context = hmac::Context::with_key(&key);
        for part in parts {
            context.update(part);
        }
        let tag = context.sign();
        let mut out = [0; KEY_LEN];
        out.copy_from_slice(tag.as_ref());
        out
    }
}

/// What an engine (or a controller) presents to a volume's replicas: the
/// volume, its key and the engine generation it acts for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    pub volume: String,
    pub key: Key,
    pub generation: u64,
}

/// How a data connection means to use a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Role {
    /// The engine: reads and writes. Its newest connection to a replica
    /// supersedes its older ones (see the replica's fence).
    Engine = 0,
    /// Reads only and supersedes nothing: for checking a replica's data
    /// while its engine runs.
    Reader = 1,
}

impl Role {
    pub fn from_u8(value: u8) -> Option<Self> {
        match value {
            0 => Some(Role::Engine),
            1 => Some(Role::Reader),
            _ => None,
        }
    }
}

/// What a data connection says it is; its proof binds all of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub volume: String,
    pub generation: u64,
    pub role: Role,
}

fn proof_message(nonce: &[u8], claim: &Claim) -> Vec<u8> {
    [
        b"oxhorn data v2\0".as_slice(),
        nonce,
        claim.volume.as_bytes(),
        b"\0",
        &claim.generation.to_be_bytes(),
        &[claim.role as u8],
    ]
    .concat()
}

/// 32 bytes from the system's secure random source.
pub fn random() -> [u8; KEY_LEN] {
    let mut out = [0; KEY_LEN];
    // Invariant: the system source fails only when the kernel's does, and
    // a fixed nonce or key would be worse than stopping.
    SystemRandom::new()
        .fill(&mut out)
        .expect("the system's secure random source failed");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_binds_key_nonce_volume_generation_and_role() {
        let cluster = Key::generate();
        let key = cluster.for_volume("vol-a");
        let nonce = random();
        let claim = |volume: &str, generation, role| Claim {
            volume: volume.into(),
            generation,
            role,
        };
        let proof = key.proof(&nonce, &claim("vol-a", 7, Role::Reader));
        assert!(key.verify(&nonce, &claim("vol-a", 7, Role::Reader), &proof));
        let verify = |claim: &Claim| key.verify(&nonce, claim, &proof);
        assert!(!verify(&claim("vol-a", 8, Role::Reader)), "generation");
        assert!(!verify(&claim("vol-b", 7, Role::Reader)), "volume");
        assert!(!verify(&claim("vol-a", 7, Role::Engine)), "role");
        let claim = claim("vol-a", 7, Role::Reader);
        assert!(!key.verify(&random(), &claim, &proof), "nonce");
        assert!(!key.verify(&nonce, &claim, &proof[..31]), "length");
        let other = cluster.for_volume("vol-b");
        assert!(!other.verify(&nonce, &claim, &proof), "key");
    }

    #[test]
    fn volume_keys_differ_and_are_stable() {
        let cluster = Key::generate();
        assert_eq!(cluster.for_volume("a"), cluster.for_volume("a"));
        assert_ne!(cluster.for_volume("a"), cluster.for_volume("b"));
        assert_ne!(Key::generate().for_volume("a"), cluster.for_volume("a"));
    }

    #[test]
    fn tokens_verify_only_for_their_key() {
        let key = Key::generate();
        assert!(key.verify_token(&key.control_token()));
        assert!(!key.verify_token(&Key::generate().control_token()));
        assert!(!key.verify_token(""));
    }

    #[test]
    fn hex_round_trips_and_bad_hex_is_refused() {
        let key = Key::generate();
        assert_eq!(Key::from_hex(&key.to_hex()).unwrap(), key);
        assert_eq!(Key::from_hex("abc"), Err(KeyError::Malformed));
        assert_eq!(Key::from_hex(&"zz".repeat(32)), Err(KeyError::Malformed));
        assert!(!format!("{key:?}").contains(&key.to_hex()[..8]));
    }
}
