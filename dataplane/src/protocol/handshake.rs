//! How a data connection opens, before any frame: the replica sends a
//! nonce, the peer answers with its role, volume and generation and a proof
//! of the volume's key over all of them and the nonce, and the replica
//! admits or refuses it.
//!
//! ```text
//! replica -> peer    challenge: magic u16 | version u8 | 0 u8 | nonce [32]
//! peer    -> replica hello:     magic u16 | version u8 | role u8 | generation u64
//!                               | volume length u8 | volume | proof [32]
//! replica -> engine  verdict:   magic u16 | version u8 | code u8
//!                               | message length u16 | message
//! ```
//!
//! Every step is bounded in size and in time, so a peer that is not ours
//! costs the replica a few hundred bytes and [`HANDSHAKE_TIMEOUT`] at most.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::auth::{Claim, Key, Role, random};

const MAGIC: u16 = 0x4f48; // "OH"
/// 2: the hello carries the peer's role.
const VERSION: u8 = 2;
const NONCE: usize = 32;
const PROOF: usize = 32;
/// Volume names are DNS subdomains, at most 253 bytes.
const MAX_VOLUME: usize = 253;
const MAX_MESSAGE: usize = 1024;

/// A peer that has not finished the handshake in this long is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum HandshakeError {
    #[error("handshake: {0}")]
    Protocol(String),
    #[error("handshake not finished within {HANDSHAKE_TIMEOUT:?}")]
    Timeout,
    #[error("refused: {0}")]
    Denied(String),
    /// A newer engine generation has connected to the replica.
    #[error("fenced: {0}")]
    Fenced(String),
}

/// The replica's answer to a hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Verdict {
    Admitted = 0,
    Denied = 1,
    Fenced = 2,
}

fn io(error: std::io::Error) -> HandshakeError {
    HandshakeError::Protocol(error.to_string())
}

async fn bounded<T>(
    step: impl Future<Output = Result<T, HandshakeError>>,
) -> Result<T, HandshakeError> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, step)
        .await
        .map_err(|_| HandshakeError::Timeout)?
}

async fn read_preamble(stream: &mut (impl AsyncRead + Unpin)) -> Result<u8, HandshakeError> {
    let magic = stream.read_u16().await.map_err(io)?;
    let version = stream.read_u8().await.map_err(io)?;
    if magic != MAGIC || version != VERSION {
        return Err(HandshakeError::Protocol(format!(
            "expected magic {MAGIC:#06x} version {VERSION}, got {magic:#06x} version {version}"
        )));
    }
    stream.read_u8().await.map_err(io)
}

fn preamble(code: u8) -> Vec<u8> {
    let mut out = MAGIC.to_be_bytes().to_vec();
    out.extend([VERSION, code]);
    out
}

/// The replica's side, up to the hello: sends a nonce, reads the hello and
/// checks its proof against `key`. The caller decides on the claim and
/// then calls [`admit`] or [`refuse`].
pub async fn challenge<S>(stream: &mut S, key: &Key) -> Result<Claim, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    bounded(async {
        let nonce = random();
        let mut out = preamble(0);
        out.extend(nonce);
        stream.write_all(&out).await.map_err(io)?;
        let role = read_preamble(stream).await?;
        let role = Role::from_u8(role)
            .ok_or_else(|| HandshakeError::Protocol(format!("unknown role {role}")))?;
        let generation = stream.read_u64().await.map_err(io)?;
        let length = usize::from(stream.read_u8().await.map_err(io)?);
        if length > MAX_VOLUME {
            return Err(HandshakeError::Protocol(format!(
                "volume name of {length} bytes"
            )));
        }
        let mut volume = vec![0; length];
        stream.read_exact(&mut volume).await.map_err(io)?;
        let mut proof = [0; PROOF];
        stream.read_exact(&mut proof).await.map_err(io)?;
        let volume = String::from_utf8(volume)
            .map_err(|_| HandshakeError::Protocol("volume name is not UTF-8".into()))?;
        let claim = Claim {
            volume,
            generation,
            role,
        };
        if !key.verify(&nonce, &claim, &proof) {
            return Err(HandshakeError::Denied(format!(
                "no valid proof of the key of volume {:?}",
                claim.volume
            )));
        }
        Ok(claim)
    })
    .await
}

async fn verdict<S>(stream: &mut S, verdict: Verdict, message: &str) -> Result<(), HandshakeError>
where
    S: AsyncWrite + Unpin,
{
    let message = &message.as_bytes()[..message.len().min(MAX_MESSAGE)];
    let mut out = preamble(verdict as u8);
    // At most MAX_MESSAGE, which fits.
    out.extend((message.len() as u16).to_be_bytes());
    out.extend(message);
    bounded(async { stream.write_all(&out).await.map_err(io) }).await
}

/// Tells the engine it is admitted.
pub async fn admit<S: AsyncWrite + Unpin>(stream: &mut S) -> Result<(), HandshakeError> {
    verdict(stream, Verdict::Admitted, "").await
}

/// Tells the peer why it is refused; the caller then closes the connection.
/// A failure to say so changes nothing: the connection closes either way.
pub async fn refuse<S: AsyncWrite + Unpin>(stream: &mut S, error: &HandshakeError) {
    let (code, message) = match error {
        HandshakeError::Fenced(message) => (Verdict::Fenced, message.clone()),
        other => (Verdict::Denied, other.to_string()),
    };
    let _ = verdict(stream, code, &message).await;
}

/// The peer's side: proves `key` for `claim` and waits for the replica's
/// verdict.
pub async fn introduce<S>(stream: &mut S, key: &Key, claim: &Claim) -> Result<(), HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let volume = &claim.volume;
    if volume.len() > MAX_VOLUME {
        return Err(HandshakeError::Protocol(format!(
            "volume name of {} bytes",
            volume.len()
        )));
    }
    bounded(async {
        read_preamble(stream).await?;
        let mut nonce = [0; NONCE];
        stream.read_exact(&mut nonce).await.map_err(io)?;
        let mut out = preamble(claim.role as u8);
        out.extend(claim.generation.to_be_bytes());
        // At most MAX_VOLUME, checked above.
        out.push(volume.len() as u8);
        out.extend(volume.as_bytes());
        out.extend(key.proof(&nonce, claim));
        stream.write_all(&out).await.map_err(io)?;
        let code = read_preamble(stream).await?;
        let length = usize::from(stream.read_u16().await.map_err(io)?);
        if length > MAX_MESSAGE {
            return Err(HandshakeError::Protocol(format!(
                "verdict of {length} bytes"
            )));
        }
        let mut message = vec![0; length];
        stream.read_exact(&mut message).await.map_err(io)?;
        let message = String::from_utf8_lossy(&message).into_owned();
        match code {
            0 => Ok(()),
            1 => Err(HandshakeError::Denied(message)),
            2 => Err(HandshakeError::Fenced(message)),
            other => Err(HandshakeError::Protocol(format!("unknown verdict {other}"))),
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn exchange(
        server_key: Key,
        client_key: Key,
        volume: &str,
    ) -> (Result<Claim, HandshakeError>, Result<(), HandshakeError>) {
        let (mut client, mut server) = tokio::io::duplex(4096);
        let volume = volume.to_string();
        let replica = tokio::spawn(async move {
            let hello = challenge(&mut server, &server_key).await;
            match &hello {
                Ok(hello) if hello.generation < 5 => {
                    refuse(&mut server, &HandshakeError::Fenced("below 5".into())).await
                }
                Ok(_) => admit(&mut server).await.unwrap(),
                Err(error) => refuse(&mut server, error).await,
            }
            hello
        });
        let claim = Claim {
            volume,
            generation: 7,
            role: Role::Reader,
        };
        let engine = introduce(&mut client, &client_key, &claim).await;
        (replica.await.unwrap(), engine)
    }

    #[tokio::test]
    async fn the_right_key_is_admitted_with_its_claim() {
        let key = Key::generate().for_volume("vol");
        let (hello, engine) = exchange(key.clone(), key, "vol").await;
        assert_eq!(
            hello,
            Ok(Claim {
                volume: "vol".into(),
                generation: 7,
                role: Role::Reader,
            })
        );
        assert_eq!(engine, Ok(()));
    }

    #[tokio::test]
    async fn another_key_is_refused_and_told_why() {
        let cluster = Key::generate();
        let (hello, engine) = exchange(
            cluster.for_volume("vol"),
            cluster.for_volume("other"),
            "vol",
        )
        .await;
        assert!(matches!(hello, Err(HandshakeError::Denied(_))), "{hello:?}");
        assert!(
            matches!(&engine, Err(HandshakeError::Denied(m)) if m.contains("proof")),
            "{engine:?}"
        );
    }

    #[tokio::test]
    async fn a_peer_that_says_nothing_is_dropped_in_time() {
        tokio::time::pause();
        let (_client, mut server) = tokio::io::duplex(4096);
        let key = Key::generate();
        let result = challenge(&mut server, &key).await;
        assert_eq!(result, Err(HandshakeError::Timeout));
    }

    #[tokio::test]
    async fn garbage_is_a_protocol_error() {
        let (mut client, mut server) = tokio::io::duplex(4096);
        let key = Key::generate();
        let replica = tokio::spawn(async move { challenge(&mut server, &key).await });
        let mut nonce = [0; 4 + NONCE];
        client.read_exact(&mut nonce).await.unwrap();
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert!(matches!(
            replica.await.unwrap(),
            Err(HandshakeError::Protocol(_))
        ));
    }

    #[tokio::test]
    async fn an_unknown_role_is_a_protocol_error() {
        let (mut client, mut server) = tokio::io::duplex(4096);
        let key = Key::generate();
        let replica = tokio::spawn(async move { challenge(&mut server, &key).await });
        let mut nonce = [0; 4 + NONCE];
        client.read_exact(&mut nonce).await.unwrap();
        client.write_all(&preamble(7)).await.unwrap();
        let refused = replica.await.unwrap();
        assert!(
            matches!(&refused, Err(HandshakeError::Protocol(m)) if m.contains("role 7")),
            "{refused:?}"
        );
    }
}
