//! Login parameter negotiation, the target's side (RFC 7143 §6.2, §13): the
//! initiator offers key=value pairs, the target answers each, and both take
//! the same result by the key's rule (a list's first common value, the
//! smaller or larger number, a boolean's AND or OR). Declarations
//! (MaxRecvDataSegmentLength, names, SessionType) are taken as they are.
//!
//! What this target offers: both digests, immediate and unsolicited data,
//! ErrorRecoveryLevel 0 only, data in order, and the limits below.

use super::pdu::DEFAULT_MAX_RECV_DATA;
use super::text::Text;

/// The data segment the target receives: one PDU carries up to 256 KiB.
pub const TARGET_MAX_RECV_DATA: u32 = 256 << 10;
/// The longest sequence of data (one R2T's, or the unsolicited data) the
/// target takes at once, which bounds what it buffers per sequence.
const TARGET_MAX_BURST: u32 = 4 << 20;
/// The unsolicited data a write may bring: bounded low, because the
/// target takes it without asking (the window's 64 commands hold at most
/// 16 MiB of it), where solicited data waits for the write budget.
const TARGET_MAX_FIRST_BURST: u32 = 256 << 10;
/// The R2Ts the target keeps outstanding per task.
const TARGET_MAX_OUTSTANDING_R2T: u32 = 8;
/// RFC 7143 §13: the range of the length keys.
const LENGTH_RANGE: (u32, u32) = (512, (1 << 24) - 1);

/// What a session runs with: the negotiated values, from the RFC's
/// defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parameters {
    pub header_digest: bool,
    pub data_digest: bool,
    /// The initiator's MaxRecvDataSegmentLength: the longest data segment
    /// the target may send.
    pub initiator_max_recv_data: u32,
    pub max_burst: u32,
    pub first_burst: u32,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub max_outstanding_r2t: u32,
    pub default_time_to_wait: u32,
    pub default_time_to_retain: u32,
    pub max_connections: u32,
    pub session_type: SessionType,
    pub initiator_name: String,
    pub target_name: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionType {
    Normal,
    Discovery,
}

impl Default for Parameters {
    /// RFC 7143 §13's defaults.
    fn default() -> Self {
        Self {
            header_digest: false,
            data_digest: false,
            initiator_max_recv_data: DEFAULT_MAX_RECV_DATA,
            max_burst: 262_144,
            first_burst: 65_536,
            initial_r2t: true,
            immediate_data: true,
            max_outstanding_r2t: 1,
            default_time_to_wait: 2,
            default_time_to_retain: 20,
            max_connections: 1,
            session_type: SessionType::Normal,
            initiator_name: String::new(),
            target_name: String::new(),
        }
    }
}

/// Why a login cannot go on: the initiator's offer is not one the target
/// can answer.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NegotiationError {
    #[error("{key}={value}: {why}")]
    Invalid {
        key: String,
        value: String,
        why: &'static str,
    },
    #[error("FirstBurstLength {first} exceeds MaxBurstLength {max}")]
    FirstBurstOverMax { first: u32, max: u32 },
}

impl Parameters {
    /// Answers the operational and declarative keys of `offer`, taking
    /// the results. Keys the target does not know are answered
    /// NotUnderstood; security keys (AuthMethod, CHAP_*) are the login's.
    pub fn negotiate(&mut self, offer: &Text, answer: &mut Text) -> Result<(), NegotiationError> {
        for (key, value) in &offer.0 {
            let reply = self.answer(key, value)?;
            if let Some(reply) = reply {
                answer.push(key, reply);
            }
        }
        if self.first_burst > self.max_burst {
            return Err(NegotiationError::FirstBurstOverMax {
                first: self.first_burst,
                max: self.max_burst,
            });
        }
        Ok(())
    }

    /// The answer to one key, `None` for a declaration that needs none.
    fn answer(&mut self, key: &str, value: &str) -> Result<Option<String>, NegotiationError> {
        let invalid = |why| NegotiationError::Invalid {
            key: key.to_owned(),
            value: value.to_owned(),
            why,
        };
        let number = |range: (u32, u32)| -> Result<u32, NegotiationError> {
            parse_number(value)
                .filter(|n| (range.0..=range.1).contains(n))
                .ok_or_else(|| invalid("not a number in the key's range"))
        };
        let boolean = || match value {
            "Yes" => Ok(true),
            "No" => Ok(false),
            _ => Err(invalid("neither Yes nor No")),
        };
        let reply = match key {
            "HeaderDigest" => {
                self.header_digest =
                    digest_choice(value).ok_or_else(|| invalid("no known digest"))?;
                Some(digest_name(self.header_digest))
            }
            "DataDigest" => {
                self.data_digest =
                    digest_choice(value).ok_or_else(|| invalid("no known digest"))?;
                Some(digest_name(self.data_digest))
            }
            "MaxRecvDataSegmentLength" => {
                self.initiator_max_recv_data = number(LENGTH_RANGE)?;
                // A declaration, answered by the target's own.
                Some(TARGET_MAX_RECV_DATA.to_string())
            }
            "MaxBurstLength" => {
                self.max_burst = number(LENGTH_RANGE)?.min(TARGET_MAX_BURST);
                Some(self.max_burst.to_string())
            }
            "FirstBurstLength" => {
                self.first_burst = number(LENGTH_RANGE)?.min(TARGET_MAX_FIRST_BURST);
                Some(self.first_burst.to_string())
            }
            // OR: the target takes unsolicited data, so the initiator decides.
            "InitialR2T" => {
                self.initial_r2t = boolean()?;
                Some(yes_no(self.initial_r2t))
            }
            // AND: the target takes immediate data, so the initiator decides.
            "ImmediateData" => {
                self.immediate_data = boolean()?;
                Some(yes_no(self.immediate_data))
            }
            "MaxOutstandingR2T" => {
                self.max_outstanding_r2t = number((1, 65535))?.min(TARGET_MAX_OUTSTANDING_R2T);
                Some(self.max_outstanding_r2t.to_string())
            }
            // MAX and MIN with the target's 0 and 3600: the initiator's
            // value, which only it acts on (reconnecting after a drop).
            "DefaultTime2Wait" => {
                self.default_time_to_wait = number((0, 3600))?;
                Some(self.default_time_to_wait.to_string())
            }
            "DefaultTime2Retain" => {
                self.default_time_to_retain = number((0, 3600))?;
                Some(self.default_time_to_retain.to_string())
            }
            "MaxConnections" => {
                number((1, 65535))?;
                self.max_connections = 1;
                Some("1".to_owned())
            }
            // OR with the target's Yes: the target needs data in order.
            "DataPDUInOrder" | "DataSequenceInOrder" => {
                boolean()?;
                Some(yes_no(true))
            }
            // MIN with the target's 0: no recovery within a session.
            "ErrorRecoveryLevel" => {
                number((0, 2))?;
                Some("0".to_owned())
            }
            // RFC 3720's markers, AND with the target's No.
            "IFMarker" | "OFMarker" => {
                boolean()?;
                Some(yes_no(false))
            }
            // Their intervals, for markers never used (RFC 7143 §13.26).
            "IFMarkInt" | "OFMarkInt" => Some("Reject".to_owned()),
            "SessionType" => {
                self.session_type = match value {
                    "Normal" => SessionType::Normal,
                    "Discovery" => SessionType::Discovery,
                    _ => return Err(invalid("neither Normal nor Discovery")),
                };
                None
            }
            "InitiatorName" => {
                self.initiator_name = value.to_owned();
                None
            }
            "TargetName" => {
                self.target_name = value.to_owned();
                None
            }
            "InitiatorAlias" => None,
            _ => Some("NotUnderstood".to_owned()),
        };
        Ok(reply)
    }
}

/// RFC 7143 §6.1: a number in decimal, or hex with a 0x prefix.
fn parse_number(value: &str) -> Option<u32> {
    match value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
    {
        Some(hex) if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            u32::from_str_radix(hex, 16).ok()
        }
        Some(_) => None,
        None if value.bytes().all(|b| b.is_ascii_digit()) => value.parse().ok(),
        None => None,
    }
}

/// The first digest of the offered list the target knows: CRC32C or None.
fn digest_choice(list: &str) -> Option<bool> {
    list.split(',').find_map(|choice| match choice {
        "CRC32C" => Some(true),
        "None" => Some(false),
        _ => None,
    })
}

fn digest_name(crc: bool) -> String {
    if crc { "CRC32C" } else { "None" }.to_owned()
}

fn yes_no(value: bool) -> String {
    if value { "Yes" } else { "No" }.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(pairs: &[(&str, &str)]) -> Text {
        let mut text = Text::default();
        for (key, value) in pairs {
            text.push(key, *value);
        }
        text
    }

    fn negotiate(pairs: &[(&str, &str)]) -> (Parameters, Text) {
        let mut parameters = Parameters::default();
        let mut answer = Text::default();
        parameters.negotiate(&offer(pairs), &mut answer).unwrap();
        (parameters, answer)
    }

    #[test]
    fn unsolicited_data_is_held_to_256_kib_whatever_the_offer() {
        let (parameters, answer) = negotiate(&[
            ("MaxBurstLength", "0xFFFFFF"),
            ("FirstBurstLength", "0xFFFFFF"),
        ]);
        assert_eq!(parameters.first_burst, 256 << 10);
        assert_eq!(answer.get("FirstBurstLength"), Some("262144"));
    }

    #[test]
    fn a_linux_initiators_offer_gets_the_answers_and_results_of_the_rules() {
        // What open-iscsi sends in its operational stage.
        let (parameters, answer) = negotiate(&[
            ("HeaderDigest", "CRC32C,None"),
            ("DataDigest", "None,CRC32C"),
            ("MaxRecvDataSegmentLength", "262144"),
            ("MaxBurstLength", "0xFFFFFF"),
            ("FirstBurstLength", "65536"),
            ("InitialR2T", "No"),
            ("ImmediateData", "Yes"),
            ("MaxOutstandingR2T", "16"),
            ("DefaultTime2Wait", "2"),
            ("DefaultTime2Retain", "0"),
            ("MaxConnections", "1"),
            ("DataPDUInOrder", "Yes"),
            ("DataSequenceInOrder", "Yes"),
            ("ErrorRecoveryLevel", "0"),
            ("IFMarker", "No"),
            ("OFMarker", "No"),
            ("OFMarkInt", "2048~8192"),
            ("X-com.example.Vendor", "1"),
        ]);
        assert!(parameters.header_digest && !parameters.data_digest);
        assert_eq!(parameters.initiator_max_recv_data, 262_144);
        assert_eq!(parameters.max_burst, 4 << 20);
        assert_eq!(parameters.max_outstanding_r2t, 8);
        assert!(!parameters.initial_r2t && parameters.immediate_data);
        assert_eq!(parameters.default_time_to_retain, 0);
        assert_eq!(answer.get("HeaderDigest"), Some("CRC32C"));
        assert_eq!(answer.get("DataDigest"), Some("None"));
        assert_eq!(answer.get("MaxRecvDataSegmentLength"), Some("262144"));
        assert_eq!(answer.get("MaxBurstLength"), Some("4194304"));
        assert_eq!(answer.get("MaxOutstandingR2T"), Some("8"));
        assert_eq!(answer.get("ErrorRecoveryLevel"), Some("0"));
        assert_eq!(answer.get("IFMarker"), Some("No"));
        assert_eq!(answer.get("OFMarkInt"), Some("Reject"));
        assert_eq!(answer.get("X-com.example.Vendor"), Some("NotUnderstood"));
    }

    #[test]
    fn declarations_are_taken_and_not_answered() {
        let (parameters, answer) = negotiate(&[
            ("InitiatorName", "iqn.2026-01.io.test:host"),
            ("InitiatorAlias", "host"),
            ("SessionType", "Discovery"),
        ]);
        assert_eq!(parameters.initiator_name, "iqn.2026-01.io.test:host");
        assert_eq!(parameters.session_type, SessionType::Discovery);
        assert_eq!(answer, Text::default());
    }

    #[test]
    fn values_out_of_range_or_malformed_fail_the_login_naming_the_key() {
        for (key, value) in [
            ("MaxRecvDataSegmentLength", "511"),
            ("MaxBurstLength", "16777216"),
            ("MaxBurstLength", "0x"),
            ("FirstBurstLength", "-1"),
            ("ErrorRecoveryLevel", "3"),
            ("InitialR2T", "yes"),
            ("HeaderDigest", "MD5"),
            ("SessionType", "Other"),
        ] {
            let mut parameters = Parameters::default();
            let error = parameters
                .negotiate(&offer(&[(key, value)]), &mut Text::default())
                .unwrap_err();
            assert!(
                matches!(&error, NegotiationError::Invalid { key: k, .. } if k == key),
                "{key}={value}: {error}"
            );
        }
        let mut parameters = Parameters::default();
        let error = parameters
            .negotiate(
                &offer(&[("FirstBurstLength", "131072"), ("MaxBurstLength", "65536")]),
                &mut Text::default(),
            )
            .unwrap_err();
        assert_eq!(
            error,
            NegotiationError::FirstBurstOverMax {
                first: 131_072,
                max: 65_536
            }
        );
    }

    #[test]
    fn numbers_are_decimal_or_hex() {
        assert_eq!(parse_number("8192"), Some(8192));
        assert_eq!(parse_number("0x2000"), Some(8192));
        assert_eq!(parse_number("0X2000"), Some(8192));
        assert_eq!(parse_number(""), None);
        assert_eq!(parse_number("+5"), None);
        assert_eq!(parse_number("0x+200"), None);
        assert_eq!(parse_number("99999999999"), None);
    }
}
