//! The iSCSI CHAP credentials a volume names: a Secret in oxhorn's
//! namespace with the keys of a `kubernetes.io/iscsi-chap` Secret, as
//! Kubernetes' own iSCSI volumes take them. The engine's target asks
//! initiators for `node.session.auth.username`/`.password`; with
//! `.username_in`/`.password_in` too, it proves those in return (mutual).

use k8s_openapi::api::core::v1::Secret;

use super::Datastore;
use crate::engine::CHAP_MIN_SECRET;
use crate::frontend::iscsi::chap::{ChapSecrets, Credential};

const USERNAME: &str = "node.session.auth.username";
const PASSWORD: &str = "node.session.auth.password";
const USERNAME_IN: &str = "node.session.auth.username_in";
const PASSWORD_IN: &str = "node.session.auth.password_in";
/// open-iscsi's longest user name or secret (AUTH_STR_MAX_LEN).
const MAX_LEN: usize = 256;

impl Datastore {
    /// The credentials in Secret `name` of oxhorn's namespace, as cached;
    /// None for no name. Why not, when the Secret is missing or unusable.
    pub fn chap_secrets(&self, name: &str) -> Result<Option<ChapSecrets>, String> {
        if name.is_empty() {
            return Ok(None);
        }
        let secret = self.secrets.get(name).ok_or_else(|| {
            format!(
                "CHAP Secret {name} does not exist in namespace {}",
                self.namespace
            )
        })?;
        chap_from_secret(&secret)
            .map(Some)
            .map_err(|why| format!("CHAP Secret {name}: {why}"))
    }
}

/// The credentials in `secret`: the initiator's pair always, the target's
/// both or neither.
fn chap_from_secret(secret: &Secret) -> Result<ChapSecrets, String> {
    let initiator = credential(secret, USERNAME, PASSWORD)?
        .ok_or_else(|| format!("{USERNAME} and {PASSWORD} are required"))?;
    let target = credential(secret, USERNAME_IN, PASSWORD_IN)?;
    Ok(ChapSecrets { initiator, target })
}

fn credential(
    secret: &Secret,
    user_key: &str,
    secret_key: &str,
) -> Result<Option<Credential>, String> {
    let user = value(secret, user_key)?;
    let password = value(secret, secret_key)?;
    match (user, password) {
        (None, None) => Ok(None),
        (Some(user), Some(password)) => {
            if password.len() < CHAP_MIN_SECRET {
                return Err(format!(
                    "{secret_key} must be at least {CHAP_MIN_SECRET} bytes (RFC 7143 §12.1.3)"
                ));
            }
            Ok(Some(Credential {
                user,
                secret: password,
            }))
        }
        _ => Err(format!("{user_key} and {secret_key} go together")),
    }
}

/// A key's value: text an initiator's configuration can hold, 1 to 256
/// bytes without control characters.
fn value(secret: &Secret, key: &str) -> Result<Option<String>, String> {
    // The API server keeps stringData in data; only data is read back.
    let Some(bytes) = secret.data.as_ref().and_then(|data| data.get(key)) else {
        return Ok(None);
    };
    let text =
        String::from_utf8(bytes.0.clone()).map_err(|_| format!("{key} is not UTF-8 text"))?;
    if text.is_empty() || text.len() > MAX_LEN || text.chars().any(char::is_control) {
        return Err(format!(
            "{key} must be 1 to {MAX_LEN} bytes without control characters"
        ));
    }
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;

    fn secret(pairs: &[(&str, &[u8])]) -> Secret {
        let data: BTreeMap<String, ByteString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
            .collect();
        Secret {
            data: Some(data),
            ..Secret::default()
        }
    }

    #[test]
    fn one_way_and_mutual_credentials_are_read() {
        let one_way = secret(&[(USERNAME, b"node"), (PASSWORD, b"initiator-secret")]);
        let chap = chap_from_secret(&one_way).unwrap();
        assert_eq!(chap.initiator.user, "node");
        assert_eq!(chap.initiator.secret, "initiator-secret");
        assert_eq!(chap.target, None);
        let mutual = secret(&[
            (USERNAME, b"node"),
            (PASSWORD, b"initiator-secret"),
            (USERNAME_IN, b"target"),
            (PASSWORD_IN, b"target-secret-1"),
        ]);
        let target = chap_from_secret(&mutual).unwrap().target.unwrap();
        assert_eq!(
            (target.user.as_str(), target.secret.as_str()),
            ("target", "target-secret-1")
        );
    }

    #[test]
    fn unusable_secrets_say_which_key_is_wrong() {
        for (pairs, says) in [
            (
                vec![],
                "node.session.auth.username and node.session.auth.password are required",
            ),
            (vec![(USERNAME, &b"node"[..])], "go together"),
            (
                vec![(USERNAME, b"node"), (PASSWORD, b"short")],
                "at least 12 bytes",
            ),
            (
                vec![(USERNAME, b""), (PASSWORD, b"initiator-secret")],
                "1 to 256 bytes",
            ),
            (
                vec![(USERNAME, b"node"), (PASSWORD, b"initiator\nsecret")],
                "control characters",
            ),
            (
                vec![(USERNAME, b"node"), (PASSWORD, b"\xff\xfe-not-utf8-at-all")],
                "not UTF-8",
            ),
            (
                vec![
                    (USERNAME, b"node"),
                    (PASSWORD, b"initiator-secret"),
                    (PASSWORD_IN, b"target-secret-1"),
                ],
                "node.session.auth.username_in and node.session.auth.password_in go together",
            ),
        ] {
            let error = chap_from_secret(&secret(&pairs)).unwrap_err();
            assert!(error.contains(says), "{pairs:?}: {error}");
        }
    }
}
