//! What never leaves in a bundle: the values of Secrets, and anything
//! shaped like a credential. Three layers, each catching what the one
//! before might miss:
//! - structure ([`redact_json`]): in every object written, string fields
//!   named like a credential, env literals whose name is one, and
//!   kubectl's last-applied-configuration annotation (itself redacted)
//!   are `<redacted>`; Secrets are written as names, types and keys only
//!   (`resources.rs`);
//! - values ([`Redactor`]): every byte written is scrubbed of the value of
//!   every Secret in oxhorn's namespace (the volumes' CHAP credentials,
//!   the backup targets', the data-plane key, the API's TLS key), in each
//!   form it could be written in: as it is, base64, JSON-escaped, and a
//!   multi-line value's lines;
//! - patterns: bearer tokens, JWTs (service account tokens), private keys
//!   in PEM, and `key=value` or `key: value` with a credential's name.

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::core::v1::Secret;
use regex::bytes::{Captures, Regex};
use serde_json::Value;
use std::sync::LazyLock;

/// What a redacted value becomes.
pub const REDACTED: &str = "<redacted>";

/// Secret values shorter than this are not scrubbed by value: a short
/// value ("true", a port) would blank out the bundle wherever it occurs.
/// The patterns still take them where a credential's name stands beside.
pub const SCRUB_MIN: usize = 6;

/// A multi-line value's lines are scrubbed on their own from this long.
const LINE_MIN: usize = 16;

/// The last-applied configuration `kubectl apply` keeps: the object as
/// applied, a Secret's values included.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Field names (lowercase, without `_`, `-` and `.`) whose string value is
/// a credential when the name ends with one of them. `chapSecret` and
/// `credentialSecret` name a Secret, and are kept.
const CREDENTIAL_ENDINGS: &[&str] = &[
    "password",
    "passwordin",
    "passwd",
    "passphrase",
    "secretaccesskey",
    "accountkey",
    "privatekey",
    "apikey",
    "clientsecret",
    "token",
    "sessionkey",
    "sharedkey",
    "sastoken",
];

/// Env var names whose literal value is a credential.
static CREDENTIAL_ENV: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(
        r"(?i)(password|passwd|passphrase|secret|token|credential|private|chap|(^|_)key($|_)|apikey|accountkey|sas)",
    )
    .expect("a valid pattern")
});

/// Text patterns of credentials, each with how its match is replaced.
static PATTERNS: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [
        // Bearer tokens: the scheme stays.
        r"(?i)\b(bearer)(\s+)[A-Za-z0-9\-._~+/]{8,}=*",
        // JWTs: service account tokens, OIDC tokens.
        r"eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*",
        // Private keys in PEM, whole, with literal or escaped newlines.
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?s:.*?)-----END [A-Z0-9 ]*PRIVATE KEY-----",
        // `name=value`, `name: value`, `"name":"value"` with a credential's
        // name; the name stays, and values that are no secret (true,
        // false, null, numbers, one already redacted) are kept.
        r#"(?i)([A-Za-z0-9_.\-]*(?:password(?:_in)?|passwd|passphrase|secret[_\-]?access[_\-]?key|account[_\-]?key|private[_\-]?key|api[_\-]?key|client[_\-]?secret|access[_\-]?token|auth[_\-]?token|session[_\-]?token|refresh[_\-]?token|\btoken))(\\?["']?)(\s*[:=]\s*)((?:\\?["'])?)([^\s"'\\,;}\]&<]+)"#,
    ]
    .into_iter()
    .map(|pattern| Regex::new(pattern).expect("a valid pattern"))
    .collect()
});

/// Scrubs the values of Secrets out of text, and credential-shaped text.
pub struct Redactor {
    /// Every form of every value, longest first where two overlap.
    values: Option<AhoCorasick>,
    /// How many values are scrubbed, and how many were too short to be.
    pub scrubbed: usize,
    pub too_short: usize,
}

impl Redactor {
    /// Scrubs by pattern only: no Secret could be read.
    pub fn patterns_only() -> Self {
        Self {
            values: None,
            scrubbed: 0,
            too_short: 0,
        }
    }

    /// Scrubs the values of `secrets` too (their keys that name someone, a
    /// CHAP user or an account, are no secret and are left).
    pub fn new(secrets: &[Secret]) -> Self {
        let mut needles: Vec<Vec<u8>> = Vec::new();
        let (mut scrubbed, mut too_short) = (0, 0);
        for secret in secrets {
            let data = secret.data.iter().flatten();
            for (_, value) in data.filter(|(key, _)| !names_someone(key)) {
                let value = &value.0;
                if value.trim_ascii().len() < SCRUB_MIN {
                    too_short += 1;
                    continue;
                }
                scrubbed += 1;
                needles.extend(forms(value));
            }
        }
        needles.sort();
        needles.dedup();
        let values = (!needles.is_empty()).then(|| {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&needles)
                .expect("literal needles always build")
        });
        Self {
            values,
            scrubbed,
            too_short,
        }
    }

    /// `data` scrubbed, and how many redactions it took.
    pub fn scrub(&self, data: Vec<u8>) -> (Vec<u8>, usize) {
        let (mut data, mut count) = match &self.values {
            Some(values) if values.is_match(&data) => {
                let count = values.find_iter(&data).count();
                let mut out = Vec::with_capacity(data.len());
                values.replace_all_with_bytes(&data, &mut out, |_, _, dst| {
                    dst.extend_from_slice(REDACTED.as_bytes());
                    true
                });
                (out, count)
            }
            _ => (data, 0),
        };
        for (index, pattern) in PATTERNS.iter().enumerate() {
            if !pattern.is_match(&data) {
                continue;
            }
            let mut replaced = 0;
            let out = pattern.replace_all(&data, |caps: &Captures| {
                let (kept, counted) = replacement(index, caps);
                replaced += usize::from(counted);
                kept
            });
            if replaced > 0 {
                data = out.into_owned();
                count += replaced;
            }
        }
        (data, count)
    }
}

/// What pattern `index`'s match becomes, and whether that redacted it.
fn replacement(index: usize, caps: &Captures) -> (Vec<u8>, bool) {
    let whole = caps[0].to_vec();
    match index {
        0 => {
            let mut out = caps[1].to_vec();
            out.extend_from_slice(&caps[2]);
            out.extend_from_slice(REDACTED.as_bytes());
            (out, true)
        }
        3 => {
            let value = &caps[5];
            if is_no_secret(value) {
                return (whole, false);
            }
            let mut out = Vec::with_capacity(whole.len());
            for group in 1..=4 {
                out.extend_from_slice(&caps[group]);
            }
            out.extend_from_slice(REDACTED.as_bytes());
            (out, true)
        }
        _ => (REDACTED.as_bytes().to_vec(), true),
    }
}

/// Values a credential's field may hold that are no secret.
fn is_no_secret(value: &[u8]) -> bool {
    let lower = value.to_ascii_lowercase();
    matches!(lower.as_slice(), b"true" | b"false" | b"null" | b"none")
        || value.iter().all(u8::is_ascii_digit)
}

/// The endings (as [`normalized`]) of a Secret's keys that name someone or
/// somewhere rather than hold a secret: `node.session.auth.username`,
/// `AZBLOB_ACCOUNT_NAME`, `AWS_ENDPOINTS`, a token Secret's `namespace`.
const NAMING_ENDINGS: &[&str] = &[
    "username",
    "usernamein",
    "user",
    "accountname",
    "endpoint",
    "endpoints",
    "region",
    "namespace",
];

/// Whether a Secret's key names someone or somewhere (see
/// [`NAMING_ENDINGS`]): its value is left, for scrubbing it would blank out
/// every mention of that user, host or namespace.
fn names_someone(key: &str) -> bool {
    let key = normalized(key);
    NAMING_ENDINGS.iter().any(|ending| key.ends_with(ending))
}

/// Every form `value` could be written in.
fn forms(value: &[u8]) -> Vec<Vec<u8>> {
    let mut forms = vec![value.to_vec(), STANDARD.encode(value).into_bytes()];
    if let Ok(text) = std::str::from_utf8(value) {
        // As JSON and YAML write it in a double-quoted string.
        let escaped = serde_json::to_string(text).unwrap_or_default();
        let escaped = escaped.trim_matches('"');
        if escaped.as_bytes() != value {
            forms.push(escaped.as_bytes().to_vec());
        }
        for line in text.lines().map(str::trim) {
            if line.len() >= LINE_MIN && line.len() < text.trim().len() {
                forms.push(line.as_bytes().to_vec());
            }
        }
    }
    forms
}

/// A field name as [`CREDENTIAL_ENDINGS`] are written.
fn normalized(name: &str) -> String {
    name.chars()
        .filter(|c| !matches!(c, '_' | '-' | '.'))
        .flat_map(char::to_lowercase)
        .collect()
}

fn is_credential_field(name: &str) -> bool {
    let name = normalized(name);
    name == "secret" || CREDENTIAL_ENDINGS.iter().any(|e| name.ends_with(e))
}

/// Redacts `value` in place (see the module's comment); how many fields it
/// redacted.
pub fn redact_json(value: &mut Value) -> usize {
    match value {
        Value::Array(items) => items.iter_mut().map(redact_json).sum(),
        Value::Object(map) => {
            let mut count = 0;
            // An env var (or any name/value pair) whose name is a
            // credential's.
            let credential_pair = map
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(|name| CREDENTIAL_ENV.is_match(name));
            for (key, field) in map.iter_mut() {
                let is_string = field.is_string();
                if key == LAST_APPLIED && is_string {
                    count += redact_last_applied(field);
                } else if is_string
                    && (is_credential_field(key) || (credential_pair && key == "value"))
                {
                    if field.as_str() != Some(REDACTED) {
                        *field = Value::String(REDACTED.into());
                        count += 1;
                    }
                } else {
                    count += redact_json(field);
                }
            }
            count
        }
        _ => 0,
    }
}

/// kubectl's last applied configuration, itself redacted; all of it when
/// it is not JSON.
fn redact_last_applied(field: &mut Value) -> usize {
    let parsed = field
        .as_str()
        .and_then(|s| serde_json::from_str::<Value>(s).ok());
    let Some(mut applied) = parsed else {
        *field = Value::String(REDACTED.into());
        return 1;
    };
    // A Secret's, whatever it held, goes whole.
    if applied.get("kind").and_then(Value::as_str) == Some("Secret") {
        *field = Value::String(REDACTED.into());
        return 1;
    }
    let count = redact_json(&mut applied);
    *field = Value::String(applied.to_string());
    count
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use serde_json::json;

    use super::*;

    const PLANTED: &str = "s3cr3t-PLANTED-value-4711";

    fn secret(data: &[(&str, &str)]) -> Secret {
        let data: BTreeMap<String, ByteString> = data
            .iter()
            .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
            .collect();
        Secret {
            data: Some(data),
            ..Secret::default()
        }
    }

    fn scrubbed(redactor: &Redactor, text: &str) -> String {
        String::from_utf8(redactor.scrub(text.as_bytes().to_vec()).0).unwrap()
    }

    #[test]
    fn a_secret_value_is_scrubbed_in_every_form() {
        let redactor = Redactor::new(&[secret(&[
            ("AWS_SECRET_ACCESS_KEY", PLANTED),
            ("node.session.auth.username", "oxhorn"),
            ("short", "abc"),
            (
                "multi",
                "first line of the key 12345\nsecond line of it 67890",
            ),
            ("quoted", "with \"quotes\" in it"),
        ])]);
        assert_eq!((redactor.scrubbed, redactor.too_short), (3, 1));
        let base64 = STANDARD.encode(PLANTED);
        let text = format!(
            "a {PLANTED} b {base64} c oxhorn d abc e second line of it 67890 f with \\\"quotes\\\" in it"
        );
        let out = scrubbed(&redactor, &text);
        assert!(!out.contains(PLANTED) && !out.contains(&base64), "{out}");
        assert!(
            !out.contains("second line") && !out.contains("quotes"),
            "{out}"
        );
        // The user's name and a short value are no secret to scrub.
        assert!(out.contains("c oxhorn d abc e"), "{out}");
    }

    #[test]
    fn credential_shaped_text_is_redacted_and_the_rest_kept() {
        let redactor = Redactor::patterns_only();
        let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJl";
        let cases = [
            (
                "Authorization: Bearer abcdefgh12345678",
                "Authorization: Bearer <redacted>",
            ),
            (&format!("token {jwt} used"), "token <redacted> used"),
            ("password=hunter2 next", "password=<redacted> next"),
            (
                "AWS_SECRET_ACCESS_KEY: wJalrXUtnFEMI",
                "AWS_SECRET_ACCESS_KEY: <redacted>",
            ),
            (
                r#"{"node.session.auth.password_in":"abcdefghijkl"}"#,
                r#"{"node.session.auth.password_in":"<redacted>"}"#,
            ),
            (
                r#"msg="login token=\"abcdef\"""#,
                r#"msg="login token=\"<redacted>\"""#,
            ),
            (
                "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----",
                "<redacted>",
            ),
            // Not secrets.
            (
                "automountServiceAccountToken: false",
                "automountServiceAccountToken: false",
            ),
            ("chapSecret: my-chap", "chapSecret: my-chap"),
            ("credentialSecret: s3-creds", "credentialSecret: s3-creds"),
            ("oxhorn_api_tokens_total 3", "oxhorn_api_tokens_total 3"),
            ("password: <redacted>", "password: <redacted>"),
        ];
        for (text, wanted) in cases {
            assert_eq!(scrubbed(&redactor, text), wanted, "{text}");
        }
    }

    #[test]
    fn objects_lose_credential_fields_env_literals_and_applied_secrets() {
        let applied = json!({"kind": "Pod", "spec": {"containers": [{"env": [
            {"name": "AZBLOB_ACCOUNT_KEY", "value": "k"}]}]}});
        let mut pod = json!({
            "metadata": {"annotations": {LAST_APPLIED: applied.to_string(), "note": "kept"}},
            "spec": {"automountServiceAccountToken": false, "containers": [{"env": [
                {"name": "AWS_SECRET_ACCESS_KEY", "value": "literal"},
                {"name": "S3_SECRET", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "secret"}}},
                {"name": "POD_IP", "value": "10.0.0.1"},
            ]}]},
            "parameters": {"csi.storage.k8s.io/provisioner-secret-name": "ref", "password": "p"},
        });
        assert_eq!(redact_json(&mut pod), 3);
        let env = &pod["spec"]["containers"][0]["env"];
        assert_eq!(env[0]["value"], REDACTED);
        assert_eq!(env[1]["valueFrom"]["secretKeyRef"]["key"], "secret");
        assert_eq!(env[2]["value"], "10.0.0.1");
        assert_eq!(pod["parameters"]["password"], REDACTED);
        assert_eq!(
            pod["parameters"]["csi.storage.k8s.io/provisioner-secret-name"],
            "ref"
        );
        assert_eq!(pod["spec"]["automountServiceAccountToken"], false);
        let annotations = &pod["metadata"]["annotations"];
        assert_eq!(annotations["note"], "kept");
        let applied: Value =
            serde_json::from_str(annotations[LAST_APPLIED].as_str().unwrap()).unwrap();
        assert_eq!(
            applied["spec"]["containers"][0]["env"][0]["value"],
            REDACTED
        );

        let mut secret = json!({"metadata": {"annotations": {
            LAST_APPLIED: json!({"kind": "Secret", "data": {"k": "dmFsdWU="}}).to_string()}}});
        assert_eq!(redact_json(&mut secret), 1);
        assert_eq!(secret["metadata"]["annotations"][LAST_APPLIED], REDACTED);
    }
}
