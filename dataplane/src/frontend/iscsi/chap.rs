//! CHAP in the login's security stage (RFC 7143 §12.1.3, RFC 1994), the
//! target's side: the target sends a challenge, the initiator proves it
//! knows the initiator secret by answering H(id || secret || challenge);
//! with mutual CHAP the initiator then challenges the target, which proves
//! the target secret the same way. MD5 (CHAP_A=5) as every initiator
//! speaks it, and SHA-256 (7) for those that offer it.

use base64::Engine as _;
use md5::Digest as _;
use ring::rand::{SecureRandom, SystemRandom};

use super::text::Text;

/// Bytes of the challenges the target sends.
const CHALLENGE_LEN: usize = 32;
/// The longest challenge or response taken from an initiator.
const MAX_BINARY: usize = 1024;

/// A user name and its secret.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Credential {
    pub user: String,
    pub secret: String,
}

impl std::fmt::Debug for Credential {
    /// Never the secret, wherever a credential is logged.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// What a target asks of initiators: the credential they must prove, and
/// for mutual CHAP the one the target proves in return.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChapSecrets {
    pub initiator: Credential,
    pub target: Option<Credential>,
}

/// Why an initiator is not let in; the login answers "authentication
/// failure" with it.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChapError {
    #[error("CHAP_A={0}: none of these algorithms is MD5 (5) or SHA-256 (7)")]
    Algorithm(String),
    #[error("{0} missing from the CHAP exchange")]
    Missing(&'static str),
    #[error("{key}: not a hex (0x) or base64 (0b) value of at most {MAX_BINARY} bytes")]
    Binary { key: &'static str },
    #[error("CHAP_N={0} is not the user this target admits")]
    User(String),
    #[error("CHAP_R does not prove the initiator secret")]
    Response,
    #[error("the initiator's challenge repeats the target's")]
    ReflectedChallenge,
    #[error("CHAP_I={0}: not an identifier from 0 to 255")]
    Identifier(String),
    #[error("the target has no secret to prove: mutual CHAP is not configured")]
    NoTargetSecret,
    #[error("no random bytes for a challenge")]
    Random,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Algorithm {
    Md5 = 5,
    Sha256 = 7,
}

impl Algorithm {
    fn hash(self, id: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
        match self {
            Algorithm::Md5 => {
                let mut md5 = md5::Md5::new();
                md5.update([id]);
                md5.update(secret);
                md5.update(challenge);
                md5.finalize().to_vec()
            }
            Algorithm::Sha256 => {
                let mut sha = ring::digest::Context::new(&ring::digest::SHA256);
                sha.update(&[id]);
                sha.update(secret);
                sha.update(challenge);
                sha.finish().as_ref().to_vec()
            }
        }
    }
}

#[derive(Debug)]
enum State {
    /// AuthMethod=CHAP agreed: the initiator's CHAP_A comes next.
    Agreed,
    Challenged {
        algorithm: Algorithm,
        id: u8,
        challenge: Vec<u8>,
    },
    Authenticated,
}

/// One login's CHAP exchange.
#[derive(Debug)]
pub struct Chap {
    secrets: ChapSecrets,
    state: State,
}

impl Chap {
    pub fn new(secrets: ChapSecrets) -> Self {
        Self {
            secrets,
            state: State::Agreed,
        }
    }

    /// Whether the initiator has proven its secret (and the target its own,
    /// when asked): the login may leave the security stage.
    pub fn authenticated(&self) -> bool {
        matches!(self.state, State::Authenticated)
    }

    /// Answers the CHAP keys of one security-stage request.
    pub fn step(&mut self, offer: &Text, answer: &mut Text) -> Result<(), ChapError> {
        match &self.state {
            State::Agreed => {
                let Some(algorithms) = offer.get("CHAP_A") else {
                    // The initiator may send CHAP_A in a later request.
                    return Ok(());
                };
                self.challenge(algorithms, answer)
            }
            State::Challenged {
                algorithm,
                id,
                challenge,
            } => {
                let expected =
                    algorithm.hash(*id, self.secrets.initiator.secret.as_bytes(), challenge);
                let algorithm = *algorithm;
                let ours = challenge.clone();
                self.verify(offer, &expected)?;
                self.prove(algorithm, &ours, offer, answer)?;
                self.state = State::Authenticated;
                Ok(())
            }
            State::Authenticated => Ok(()),
        }
    }

    fn challenge(&mut self, algorithms: &str, answer: &mut Text) -> Result<(), ChapError> {
        let algorithm = algorithms
            .split(',')
            .find_map(|a| match a {
                "5" => Some(Algorithm::Md5),
                "7" => Some(Algorithm::Sha256),
                _ => None,
            })
            .ok_or_else(|| ChapError::Algorithm(algorithms.to_owned()))?;
        let mut random = [0; CHALLENGE_LEN + 1];
        SystemRandom::new()
            .fill(&mut random)
            .map_err(|_| ChapError::Random)?;
        let (id, challenge) = (random[0], random[1..].to_vec());
        answer.push("CHAP_A", (algorithm as u8).to_string());
        answer.push("CHAP_I", id.to_string());
        answer.push("CHAP_C", hex(&challenge));
        self.state = State::Challenged {
            algorithm,
            id,
            challenge,
        };
        Ok(())
    }

    /// The initiator's name and response.
    fn verify(&self, offer: &Text, expected: &[u8]) -> Result<(), ChapError> {
        let user = offer.get("CHAP_N").ok_or(ChapError::Missing("CHAP_N"))?;
        let response = binary(offer, "CHAP_R")?.ok_or(ChapError::Missing("CHAP_R"))?;
        if user != self.secrets.initiator.user {
            return Err(ChapError::User(user.to_owned()));
        }
        // Compared in time independent of where they differ.
        let differ = response.len() != expected.len()
            || response
                .iter()
                .zip(expected)
                .fold(0, |acc, (a, b)| acc | (a ^ b))
                != 0;
        if differ {
            return Err(ChapError::Response);
        }
        Ok(())
    }

    /// Mutual CHAP: the target's answer to the initiator's challenge, if
    /// it sent one. Whether to ask is the initiator's call: mutual CHAP
    /// protects the initiator from a target posing as this one.
    fn prove(
        &self,
        algorithm: Algorithm,
        ours: &[u8],
        offer: &Text,
        answer: &mut Text,
    ) -> Result<(), ChapError> {
        let challenge = binary(offer, "CHAP_C")?;
        let id = offer.get("CHAP_I");
        let (challenge, id, target) = match (challenge, id, &self.secrets.target) {
            // One-way CHAP: the initiator asks no proof.
            (None, None, _) => return Ok(()),
            (None, Some(_), Some(_)) => return Err(ChapError::Missing("CHAP_C")),
            (Some(_), None, Some(_)) => return Err(ChapError::Missing("CHAP_I")),
            (Some(_), _, None) | (_, Some(_), None) => return Err(ChapError::NoTargetSecret),
            (Some(challenge), Some(id), Some(target)) => (challenge, id, target),
        };
        if challenge == ours {
            return Err(ChapError::ReflectedChallenge);
        }
        let id: u8 = id
            .parse()
            .map_err(|_| ChapError::Identifier(id.to_owned()))?;
        answer.push("CHAP_N", target.user.clone());
        answer.push(
            "CHAP_R",
            hex(&algorithm.hash(id, target.secret.as_bytes(), &challenge)),
        );
        Ok(())
    }
}

/// A binary value (RFC 7143 §6.1): 0x and hex digits, or 0b and base64.
fn binary(offer: &Text, key: &'static str) -> Result<Option<Vec<u8>>, ChapError> {
    let Some(value) = offer.get(key) else {
        return Ok(None);
    };
    let invalid = || ChapError::Binary { key };
    let bytes = if let Some(digits) = value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
    {
        if digits.len() % 2 != 0 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid());
        }
        (0..digits.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).map_err(|_| invalid()))
            .collect::<Result<Vec<u8>, _>>()?
    } else if let Some(encoded) = value
        .strip_prefix("0b")
        .or_else(|| value.strip_prefix("0B"))
    {
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|_| invalid())?
    } else {
        return Err(invalid());
    };
    if bytes.is_empty() || bytes.len() > MAX_BINARY {
        return Err(invalid());
    }
    Ok(Some(bytes))
}

fn hex(bytes: &[u8]) -> String {
    let digits: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("0x{digits}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(mutual: bool) -> ChapSecrets {
        ChapSecrets {
            initiator: Credential {
                user: "node".into(),
                secret: "initiator-secret".into(),
            },
            target: mutual.then(|| Credential {
                user: "oxhorn".into(),
                secret: "target-secret-1".into(),
            }),
        }
    }

    fn text(pairs: &[(&str, &str)]) -> Text {
        let mut text = Text::default();
        for (key, value) in pairs {
            text.push(key, *value);
        }
        text
    }

    /// The challenge the target sent: algorithm, id, bytes.
    fn challenged(chap: &mut Chap, algorithms: &str) -> (Algorithm, u8, Vec<u8>) {
        let mut answer = Text::default();
        chap.step(&text(&[("CHAP_A", algorithms)]), &mut answer)
            .unwrap();
        let algorithm = match answer.get("CHAP_A") {
            Some("5") => Algorithm::Md5,
            Some("7") => Algorithm::Sha256,
            other => panic!("CHAP_A {other:?}"),
        };
        let id = answer.get("CHAP_I").unwrap().parse().unwrap();
        let challenge = binary(&answer, "CHAP_C").unwrap().unwrap();
        assert_eq!(challenge.len(), CHALLENGE_LEN);
        (algorithm, id, challenge)
    }

    #[test]
    fn md5_follows_rfc_1994() {
        // H(id || secret || challenge) with MD5, computed independently:
        // printf '\x01secret\x02\x03' | md5sum
        let hash = Algorithm::Md5.hash(1, b"secret", &[2, 3]);
        assert_eq!(hex(&hash), "0xf506c24f35d1c70e450edb8fdf933478");
    }

    #[test]
    fn one_way_chap_admits_the_right_secret_only() {
        for algorithms in ["5", "7,5", "99,7"] {
            let mut chap = Chap::new(secrets(false));
            let (algorithm, id, challenge) = challenged(&mut chap, algorithms);
            let right = hex(&algorithm.hash(id, b"initiator-secret", &challenge));
            let mut answer = Text::default();
            chap.step(
                &text(&[("CHAP_N", "node"), ("CHAP_R", &right)]),
                &mut answer,
            )
            .unwrap();
            assert!(chap.authenticated());
            assert!(answer.0.is_empty(), "{answer:?}");
        }
        let mut chap = Chap::new(secrets(false));
        let (algorithm, id, challenge) = challenged(&mut chap, "5");
        let wrong = hex(&algorithm.hash(id, b"guess", &challenge));
        let offer = text(&[("CHAP_N", "node"), ("CHAP_R", &wrong)]);
        assert_eq!(
            chap.step(&offer, &mut Text::default()),
            Err(ChapError::Response)
        );
        assert!(!chap.authenticated());
        let right = hex(&algorithm.hash(id, b"initiator-secret", &challenge));
        let offer = text(&[("CHAP_N", "intruder"), ("CHAP_R", &right)]);
        assert_eq!(
            chap.step(&offer, &mut Text::default()),
            Err(ChapError::User("intruder".into()))
        );
        let mut chap = Chap::new(secrets(false));
        assert_eq!(
            chap.step(&text(&[("CHAP_A", "6,8")]), &mut Text::default()),
            Err(ChapError::Algorithm("6,8".into()))
        );
    }

    #[test]
    fn mutual_chap_proves_the_target_secret_in_return() {
        let mut chap = Chap::new(secrets(true));
        let (algorithm, id, challenge) = challenged(&mut chap, "5");
        let right = hex(&algorithm.hash(id, b"initiator-secret", &challenge));
        let theirs = [7u8; 16];
        let base64 = format!(
            "0b{}",
            base64::engine::general_purpose::STANDARD.encode(theirs)
        );
        let offer = text(&[
            ("CHAP_N", "node"),
            ("CHAP_R", &right),
            ("CHAP_I", "42"),
            ("CHAP_C", &base64),
        ]);
        let mut answer = Text::default();
        chap.step(&offer, &mut answer).unwrap();
        assert!(chap.authenticated());
        assert_eq!(answer.get("CHAP_N"), Some("oxhorn"));
        let proof = hex(&Algorithm::Md5.hash(42, b"target-secret-1", &theirs));
        assert_eq!(answer.get("CHAP_R"), Some(proof.as_str()));

        // An initiator asking no proof is let in one-way; a challenge
        // without its identifier, or the target's own reflected, is
        // refused.
        let mut chap = Chap::new(secrets(true));
        let (algorithm, id, challenge) = challenged(&mut chap, "5");
        let right = hex(&algorithm.hash(id, b"initiator-secret", &challenge));
        let mut answer = Text::default();
        chap.step(
            &text(&[("CHAP_N", "node"), ("CHAP_R", &right)]),
            &mut answer,
        )
        .unwrap();
        assert!(chap.authenticated() && answer.0.is_empty());
        let mut chap = Chap::new(secrets(true));
        let (algorithm, id, challenge) = challenged(&mut chap, "5");
        let right = hex(&algorithm.hash(id, b"initiator-secret", &challenge));
        let offer = text(&[("CHAP_N", "node"), ("CHAP_R", &right), ("CHAP_C", "0x0102")]);
        assert_eq!(
            chap.step(&offer, &mut Text::default()),
            Err(ChapError::Missing("CHAP_I"))
        );
        let mut chap = Chap::new(secrets(true));
        let (algorithm, id, challenge) = challenged(&mut chap, "5");
        let right = hex(&algorithm.hash(id, b"initiator-secret", &challenge));
        let reflected = hex(&challenge);
        let offer = text(&[
            ("CHAP_N", "node"),
            ("CHAP_R", &right),
            ("CHAP_I", "1"),
            ("CHAP_C", &reflected),
        ]);
        assert_eq!(
            chap.step(&offer, &mut Text::default()),
            Err(ChapError::ReflectedChallenge)
        );
    }

    #[test]
    fn binary_values_are_hex_or_base64_and_bounded() {
        let offer = |value: &str| text(&[("CHAP_R", value)]);
        assert_eq!(binary(&offer("0x0aFF"), "CHAP_R"), Ok(Some(vec![10, 255])));
        assert_eq!(binary(&offer("0bAQI="), "CHAP_R"), Ok(Some(vec![1, 2])));
        for bad in ["0x", "0xabc", "0xzz", "1234", "0b@@", ""] {
            assert!(binary(&offer(bad), "CHAP_R").is_err(), "{bad}");
        }
        let long = format!("0x{}", "00".repeat(MAX_BINARY + 1));
        assert!(binary(&offer(&long), "CHAP_R").is_err());
    }
}
