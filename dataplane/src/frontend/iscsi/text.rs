//! The key=value text of Login and Text PDUs (RFC 7143 §6.1): each pair
//! followed by one zero byte, a text possibly continued over several PDUs.
//! Parsed strictly and within bounds, since it comes from the network.

use std::collections::HashSet;

use bytes::{BufMut, Bytes, BytesMut};

/// Longest key name (RFC 7143 §6.1).
pub const MAX_KEY_LEN: usize = 63;
/// Longest value taken. Most values are bounded at 255 bytes by their key's
/// definition; this bounds any key, known or not.
pub const MAX_VALUE_LEN: usize = 8192;
/// Longest text taken across the PDUs of one request (RFC 7143 §6.1
/// advises at least 8 KiB per request; 64 KiB leaves room).
pub const MAX_TEXT_LEN: usize = 64 << 10;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    #[error("text of more than {MAX_TEXT_LEN} bytes")]
    TooLong,
    #[error("the last key=value pair is not followed by a zero byte")]
    Unterminated,
    #[error("{0:?} is not a key=value pair")]
    NoEquals(String),
    #[error(
        "key {0:?} does not begin with a capital letter, is longer than {MAX_KEY_LEN} bytes or has other characters than A-Z a-z 0-9 . - + @ _"
    )]
    BadKey(String),
    #[error("the value of {0} is longer than {MAX_VALUE_LEN} bytes or not UTF-8")]
    BadValue(String),
    #[error("key {0} appears twice")]
    Duplicate(String),
}

/// Key=value pairs in the order they came.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Text(pub Vec<(String, String)>);

impl Text {
    /// Parses a whole text (its PDUs' data segments joined).
    pub fn parse(bytes: &[u8]) -> Result<Self, TextError> {
        if bytes.len() > MAX_TEXT_LEN {
            return Err(TextError::TooLong);
        }
        if bytes.last().is_some_and(|b| *b != 0) {
            return Err(TextError::Unterminated);
        }
        let mut pairs: Vec<(String, String)> = Vec::new();
        let mut seen = HashSet::new();
        // Empty items (zero bytes in a row) carry nothing and are skipped.
        for item in bytes.split(|b| *b == 0).filter(|item| !item.is_empty()) {
            let lossy = || String::from_utf8_lossy(item).into_owned();
            let at = item
                .iter()
                .position(|b| *b == b'=')
                .ok_or_else(|| TextError::NoEquals(lossy()))?;
            let (key, value) = (&item[..at], &item[at + 1..]);
            let key = std::str::from_utf8(key)
                .ok()
                .filter(|k| valid_key(k))
                .ok_or_else(|| TextError::BadKey(String::from_utf8_lossy(key).into_owned()))?;
            let value = std::str::from_utf8(value)
                .ok()
                .filter(|v| v.len() <= MAX_VALUE_LEN)
                .ok_or_else(|| TextError::BadValue(key.to_owned()))?;
            if !seen.insert(key) {
                return Err(TextError::Duplicate(key.to_owned()));
            }
            pairs.push((key.to_owned(), value.to_owned()));
        }
        Ok(Self(pairs))
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn push(&mut self, key: &str, value: impl Into<String>) {
        self.0.push((key.to_owned(), value.into()));
    }

    /// The text as sent: each pair followed by a zero byte.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        for (key, value) in &self.0 {
            out.put_slice(key.as_bytes());
            out.put_u8(b'=');
            out.put_slice(value.as_bytes());
            out.put_u8(0);
        }
        out.freeze()
    }
}

/// RFC 7143 §6.1: key names of letters, digits, '.', '-', '+', '@', '_',
/// beginning with a capital letter.
fn valid_key(key: &str) -> bool {
    key.starts_with(|c: char| c.is_ascii_uppercase())
        && key.len() <= MAX_KEY_LEN
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-+@_".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_parse_in_order_and_encode_back() {
        let wire = b"InitiatorName=iqn.2026-01.io.test:host\0SessionType=Normal\0HeaderDigest=CRC32C,None\0";
        let text = Text::parse(wire).unwrap();
        assert_eq!(text.get("SessionType"), Some("Normal"));
        assert_eq!(text.get("HeaderDigest"), Some("CRC32C,None"));
        assert_eq!(text.get("Missing"), None);
        assert_eq!(&text.encode()[..], &wire[..]);
        assert_eq!(Text::parse(b"").unwrap(), Text::default());
        // A value may be empty or hold '='.
        let text = Text::parse(b"X-a=\0X-b=c=d\0\0").unwrap();
        assert_eq!(text.get("X-a"), Some(""));
        assert_eq!(text.get("X-b"), Some("c=d"));
    }

    #[test]
    fn malformed_text_is_refused_saying_why() {
        assert_eq!(Text::parse(b"A=b"), Err(TextError::Unterminated));
        assert_eq!(
            Text::parse(b"novalue\0"),
            Err(TextError::NoEquals("novalue".into()))
        );
        assert_eq!(Text::parse(b"=x\0"), Err(TextError::BadKey(String::new())));
        assert_eq!(
            Text::parse(b"Sp ace=x\0"),
            Err(TextError::BadKey("Sp ace".into()))
        );
        assert_eq!(
            Text::parse(b"lower=x\0"),
            Err(TextError::BadKey("lower".into()))
        );
        let long_key = format!("{}=x\0", "K".repeat(MAX_KEY_LEN + 1));
        assert!(matches!(
            Text::parse(long_key.as_bytes()),
            Err(TextError::BadKey(_))
        ));
        let long_value = format!("K={}\0", "v".repeat(MAX_VALUE_LEN + 1));
        assert_eq!(
            Text::parse(long_value.as_bytes()),
            Err(TextError::BadValue("K".into()))
        );
        assert_eq!(
            Text::parse(b"K=\xff\0"),
            Err(TextError::BadValue("K".into()))
        );
        assert_eq!(
            Text::parse(b"K=1\0K=2\0"),
            Err(TextError::Duplicate("K".into()))
        );
        assert_eq!(
            Text::parse(&vec![0; MAX_TEXT_LEN + 1]),
            Err(TextError::TooLong)
        );
    }
}
