//! The login phase of one connection, the target's side (RFC 7143 §6.3,
//! §11.12-11.13): Login Requests in, Login Responses out, until the
//! connection enters the full feature phase or the login fails with a
//! status saying why. Pure: the connection feeds it PDUs and sends what it
//! answers, so every branch is tested without a socket.

use std::collections::BTreeSet;

use bytes::Bytes;

use super::chap::{Chap, ChapSecrets};
use super::negotiate::{Parameters, SessionType};
use super::pdu::{Bhs, DEFAULT_MAX_RECV_DATA, Opcode, Pdu};
use super::text::{MAX_TEXT_LEN, Text};

/// The stages a login moves through (RFC 7143 §11.12.3).
const SECURITY: u8 = 0;
const OPERATIONAL: u8 = 1;
const FULL_FEATURE: u8 = 3;

/// Byte offsets of the Login PDUs' fields (RFC 7143 §11.12, §11.13).
const FLAGS: usize = 1;
/// Version-min in a request, Version-active in a response.
const VERSION_MIN: usize = 3;
const ISID: usize = 8;
const TSIH: usize = 14;
const CMD_SN: usize = 24;
const STAT_SN: usize = 24;
const EXP_CMD_SN: usize = 28;
const MAX_CMD_SN: usize = 32;
const STATUS_CLASS: usize = 36;
const STATUS_DETAIL: usize = 37;

const TRANSIT: u8 = 0x80;
const CONTINUE: u8 = 0x40;

/// Keys only the leading login request may carry (RFC 7143 §13: "LO").
const LEADING_ONLY: [&str; 3] = ["InitiatorName", "TargetName", "SessionType"];

/// Commands the target queues per session: ExpCmdSN..=MaxCmdSN.
pub const COMMAND_WINDOW: u32 = 64;
/// The target's one portal group.
pub const PORTAL_GROUP_TAG: u16 = 1;

/// Why a login failed, as its Login Response's status (RFC 7143
/// §11.13.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    InitiatorError = 0x0200,
    AuthenticationFailed = 0x0201,
    NotFound = 0x0203,
    UnsupportedVersion = 0x0205,
    MissingParameter = 0x0207,
    SessionDoesNotExist = 0x020a,
    InvalidDuringLogin = 0x020b,
}

type Refusal = (Status, String);

fn initiator_error(why: impl Into<String>) -> Refusal {
    (Status::InitiatorError, why.into())
}

/// What the target serves: the name it answers to, and the CHAP secrets
/// an initiator must prove, if any.
#[derive(Clone, Debug)]
pub struct TargetIdentity {
    /// `iqn.2026-01.io.oxhorn:<volume>`.
    pub name: String,
    pub chap: Option<ChapSecrets>,
}

/// The outcome of one Login Request.
#[derive(Debug)]
pub enum Step {
    /// Send this and read the next request.
    Continue(Pdu),
    /// Send this; the connection is in the full feature phase with these
    /// parameters (digests start with the next PDU) and this next StatSN.
    Complete {
        response: Pdu,
        parameters: Box<Parameters>,
        next_stat_sn: u32,
    },
    /// Send this and close the connection.
    Fail(Pdu, String),
}

/// The fields of the first request that every later one must repeat.
#[derive(Debug, PartialEq, Eq)]
struct Leading {
    isid: [u8; 6],
    tsih: u16,
    itt: u32,
}

impl Leading {
    fn of(bhs: &Bhs) -> Self {
        let mut isid = [0; 6];
        isid.copy_from_slice(&bhs.0[ISID..ISID + 6]);
        Self {
            isid,
            tsih: u16::from_be_bytes([bhs.0[TSIH], bhs.0[TSIH + 1]]),
            itt: bhs.initiator_task_tag(),
        }
    }
}

/// One connection's login in progress.
#[derive(Debug)]
pub struct Login {
    target: TargetIdentity,
    parameters: Parameters,
    /// The text of a request continued over several PDUs (C bit).
    pending: Vec<u8>,
    /// The first request's identity, once seen.
    leading: Option<Leading>,
    /// The stage the last response left the login in, which the next
    /// request must be in; none before the first whole request.
    stage: Option<u8>,
    /// Every key offered so far: each may be negotiated once per login.
    offered: BTreeSet<String>,
    /// The StatSN of the next response.
    stat_sn: u32,
    /// The session's TSIH, handed out when the login completes.
    tsih: u16,
    /// The CHAP exchange, once AuthMethod=CHAP is agreed.
    chap: Option<Chap>,
}

impl Login {
    /// A login on a new connection; `tsih` is the session's handle should
    /// it complete, and `stat_sn` the connection's first StatSN.
    pub fn new(target: TargetIdentity, tsih: u16, stat_sn: u32) -> Self {
        Self {
            target,
            parameters: Parameters::default(),
            pending: Vec::new(),
            leading: None,
            stage: None,
            offered: BTreeSet::new(),
            stat_sn,
            tsih,
            chap: None,
        }
    }

    /// Answers one PDU of the login phase.
    pub fn step(&mut self, request: &Pdu) -> Step {
        match self.answer(request) {
            Ok(step) => step,
            Err((status, why)) => self.fail(&request.bhs, status, why),
        }
    }

    fn answer(&mut self, request: &Pdu) -> Result<Step, Refusal> {
        let bhs = &request.bhs;
        self.check_header(bhs)?;
        let flags = bhs.0[FLAGS];
        let (csg, nsg, transit) = ((flags >> 2) & 3, flags & 3, flags & TRANSIT != 0);
        if self.pending.len() + request.data.len() > MAX_TEXT_LEN {
            return Err(initiator_error("login text too long"));
        }
        self.pending.extend_from_slice(&request.data);
        if flags & CONTINUE != 0 {
            if transit {
                return Err(initiator_error("both T and C set"));
            }
            // More text follows: an empty response asks for it.
            return Ok(Step::Continue(self.respond(bhs, csg, None, Bytes::new())));
        }
        let text = Text::parse(&std::mem::take(&mut self.pending))
            .map_err(|e| initiator_error(e.to_string()))?;
        self.check_keys(&text)?;
        let mut answer = Text::default();
        if self.stage.is_none() {
            self.take_leading(&text, &mut answer)?;
        }
        match csg {
            SECURITY => self.security(&text, &mut answer)?,
            _ => self.operational(&text, &mut answer)?,
        }
        if transit && (nsg <= csg || nsg == 2) {
            return Err(initiator_error(format!(
                "no transition from stage {csg} to {nsg}"
            )));
        }
        // The target holds the login in the security stage until CHAP is
        // done (a response without T asks for more, RFC 7143 §6.3).
        let transit = transit && (csg != SECURITY || self.authenticated());
        if csg != SECURITY && !self.authenticated() {
            let why = "this target requires CHAP, which happens in the security stage";
            return Err((Status::AuthenticationFailed, why.into()));
        }
        let data = answer.encode();
        // The initiator takes 8192 bytes until the login completes.
        if data.len() > DEFAULT_MAX_RECV_DATA as usize {
            return Err(initiator_error(
                "the answer to the keys offered exceeds 8192 bytes",
            ));
        }
        let next = if transit { nsg } else { csg };
        self.stage = Some(next);
        let response = self.respond(bhs, csg, transit.then_some(nsg), data);
        if next != FULL_FEATURE {
            return Ok(Step::Continue(response));
        }
        Ok(Step::Complete {
            response,
            parameters: Box::new(self.parameters.clone()),
            next_stat_sn: self.stat_sn,
        })
    }

    /// The opcode, version, identity and stage every request must have.
    fn check_header(&mut self, bhs: &Bhs) -> Result<(), Refusal> {
        if bhs.opcode() != Some(Opcode::Login) {
            let why = "only Login Requests before login completes";
            return Err((Status::InvalidDuringLogin, why.into()));
        }
        if bhs.0[VERSION_MIN] > 0 {
            let why = format!("iSCSI version {} and above", bhs.0[VERSION_MIN]);
            return Err((Status::UnsupportedVersion, why));
        }
        let identity = Leading::of(bhs);
        match &self.leading {
            None if identity.tsih != 0 => {
                let why = format!(
                    "no session with TSIH {} to add a connection to",
                    identity.tsih
                );
                return Err((Status::SessionDoesNotExist, why));
            }
            None => self.leading = Some(identity),
            Some(first) if *first != identity => {
                return Err(initiator_error(
                    "ISID, TSIH or ITT changed during the login",
                ));
            }
            Some(_) => {}
        }
        let csg = (bhs.0[FLAGS] >> 2) & 3;
        let expected = match self.stage {
            Some(stage) => csg == stage,
            None => csg == SECURITY || csg == OPERATIONAL,
        };
        if !expected {
            return Err(initiator_error(format!(
                "a request in stage {csg} out of turn"
            )));
        }
        Ok(())
    }

    /// Each key once per login, and the leading-only keys in the leading
    /// request only (RFC 7143 §6.2).
    fn check_keys(&mut self, text: &Text) -> Result<(), Refusal> {
        for (key, _) in &text.0 {
            if self.stage.is_some() && LEADING_ONLY.contains(&key.as_str()) {
                return Err(initiator_error(format!(
                    "{key} after the leading login request"
                )));
            }
            if !self.offered.insert(key.clone()) {
                return Err(initiator_error(format!("{key} offered twice")));
            }
        }
        Ok(())
    }

    /// The leading request's keys: who logs in, and to what.
    fn take_leading(&mut self, text: &Text, answer: &mut Text) -> Result<(), Refusal> {
        let missing = |key: &str| {
            let why = format!("no {key} in the first login request");
            (Status::MissingParameter, why)
        };
        let initiator = text
            .get("InitiatorName")
            .ok_or_else(|| missing("InitiatorName"))?;
        self.parameters.initiator_name = initiator.to_owned();
        if text.get("SessionType") == Some("Discovery") {
            self.parameters.session_type = SessionType::Discovery;
            return Ok(());
        }
        let target = text
            .get("TargetName")
            .ok_or_else(|| missing("TargetName"))?;
        if target != self.target.name {
            return Err((Status::NotFound, format!("no target {target} here")));
        }
        self.parameters.target_name = target.to_owned();
        // RFC 7143 §13.9: in the first response of a normal session.
        answer.push("TargetPortalGroupTag", PORTAL_GROUP_TAG.to_string());
        Ok(())
    }

    /// Whether the initiator may go past the security stage: it proved
    /// its CHAP secret, or needs to prove none.
    fn authenticated(&self) -> bool {
        match &self.chap {
            Some(chap) => chap.authenticated(),
            None => !self.chap_required(),
        }
    }

    /// A target with secrets asks for them in normal sessions. Discovery
    /// only names the target, which the volume's name gives away anyway, so
    /// it needs CHAP only if the initiator offers nothing else (LIO's and
    /// SPDK's default too): initiators set up with session CHAP alone
    /// discover as they would without.
    fn chap_required(&self) -> bool {
        self.target.chap.is_some() && self.parameters.session_type != SessionType::Discovery
    }

    /// The security stage: AuthMethod agreed (CHAP when the target asks for
    /// it, else None if offered), then the CHAP exchange. Any other key is
    /// operational, taken as there.
    fn security(&mut self, text: &Text, answer: &mut Text) -> Result<(), Refusal> {
        if let Some(methods) = text.get("AuthMethod") {
            let offered = |method: &str| methods.split(',').any(|m| m == method);
            let has_secrets = self.target.chap.is_some();
            let method = if self.chap_required() {
                offered("CHAP").then_some("CHAP")
            } else if offered("None") {
                Some("None")
            } else {
                (has_secrets && offered("CHAP")).then_some("CHAP")
            };
            let Some(method) = method else {
                let wanted = if has_secrets { "CHAP" } else { "None" };
                let why = format!("AuthMethod {methods}: this target authenticates with {wanted}");
                return Err((Status::AuthenticationFailed, why));
            };
            answer.push("AuthMethod", method);
            self.chap = match method {
                "CHAP" => self.target.chap.clone().map(Chap::new),
                _ => None,
            };
        }
        if let Some(chap) = &mut self.chap {
            chap.step(text, answer)
                .map_err(|e| (Status::AuthenticationFailed, e.to_string()))?;
        }
        let rest = text
            .0
            .iter()
            .filter(|(key, _)| key != "AuthMethod" && !key.starts_with("CHAP_"));
        self.operational(&Text(rest.cloned().collect()), answer)
    }

    fn operational(&mut self, text: &Text, answer: &mut Text) -> Result<(), Refusal> {
        self.parameters
            .negotiate(text, answer)
            .map_err(|e| initiator_error(e.to_string()))
    }

    /// A Login Response to `request` in stage `csg`, moving to `next` if
    /// given; each takes the next StatSN.
    fn respond(&mut self, request: &Bhs, csg: u8, next: Option<u8>, data: Bytes) -> Pdu {
        let mut bhs = Bhs::new(Opcode::LoginResponse);
        bhs.0[FLAGS] = (csg << 2) | next.map_or(0, |nsg| TRANSIT | nsg);
        bhs.0[ISID..ISID + 8].copy_from_slice(&request.0[ISID..ISID + 8]);
        if next == Some(FULL_FEATURE) {
            bhs.0[TSIH..TSIH + 2].copy_from_slice(&self.tsih.to_be_bytes());
        }
        bhs.set_initiator_task_tag(request.initiator_task_tag());
        bhs.set_u32_at(STAT_SN, self.stat_sn);
        self.stat_sn = self.stat_sn.wrapping_add(1);
        // A Login Request is immediate: it does not advance CmdSN.
        let cmd_sn = request.u32_at(CMD_SN);
        bhs.set_u32_at(EXP_CMD_SN, cmd_sn);
        bhs.set_u32_at(MAX_CMD_SN, cmd_sn.wrapping_add(COMMAND_WINDOW - 1));
        Pdu::new(bhs, data)
    }

    fn fail(&mut self, request: &Bhs, status: Status, why: String) -> Step {
        let mut response = self.respond(request, 0, None, Bytes::new());
        let [class, detail] = (status as u16).to_be_bytes();
        response.bhs.0[STATUS_CLASS] = class;
        response.bhs.0[STATUS_DETAIL] = detail;
        Step::Fail(response, why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontend::iscsi::chap::Credential;

    const TARGET: &str = "iqn.2026-01.io.oxhorn:vol";

    fn login() -> Login {
        let target = TargetIdentity {
            name: TARGET.into(),
            chap: None,
        };
        Login::new(target, 7, 100)
    }

    fn request(csg: u8, nsg: u8, transit: bool, pairs: &[(&str, &str)]) -> Pdu {
        let mut bhs = Bhs::new(Opcode::Login);
        bhs.set_immediate(true);
        bhs.0[FLAGS] = (csg << 2) | if transit { TRANSIT | nsg } else { 0 };
        bhs.0[ISID..ISID + 6].copy_from_slice(&[0x80, 0, 0, 0x12, 0x34, 0]);
        bhs.set_initiator_task_tag(9);
        bhs.set_u32_at(CMD_SN, 5);
        let mut text = Text::default();
        for (key, value) in pairs {
            text.push(key, *value);
        }
        Pdu::new(bhs, text.encode())
    }

    fn status(pdu: &Pdu) -> u16 {
        u16::from_be_bytes([pdu.bhs.0[STATUS_CLASS], pdu.bhs.0[STATUS_DETAIL]])
    }

    fn answer(pdu: &Pdu) -> Text {
        Text::parse(&pdu.data).unwrap()
    }

    fn chap_login() -> Login {
        let secrets = ChapSecrets {
            initiator: Credential {
                user: "node".into(),
                secret: "initiator-secret".into(),
            },
            target: None,
        };
        let target = TargetIdentity {
            name: TARGET.into(),
            chap: Some(secrets),
        };
        Login::new(target, 7, 100)
    }

    const LEADING: [(&str, &str); 3] = [
        ("InitiatorName", "iqn.2026-01.io.test:host"),
        ("SessionType", "Normal"),
        ("TargetName", TARGET),
    ];

    #[test]
    fn a_target_with_chap_holds_the_login_in_security_until_the_secret_is_proven() {
        let mut login = chap_login();
        let first = [&LEADING[..], &[("AuthMethod", "CHAP,None")]].concat();
        let Step::Continue(response) = login.step(&request(SECURITY, OPERATIONAL, true, &first))
        else {
            panic!("the first request failed");
        };
        assert_eq!(answer(&response).get("AuthMethod"), Some("CHAP"));
        assert_eq!(response.bhs.0[FLAGS], 0, "no transit before CHAP");
        let Step::Continue(response) =
            login.step(&request(SECURITY, OPERATIONAL, true, &[("CHAP_A", "5")]))
        else {
            panic!("CHAP_A failed");
        };
        let challenge = answer(&response);
        assert_eq!(response.bhs.0[FLAGS], 0, "no transit before CHAP");
        let id: u8 = challenge.get("CHAP_I").unwrap().parse().unwrap();
        let bytes = challenge.get("CHAP_C").unwrap().strip_prefix("0x").unwrap();
        let bytes: Vec<u8> = (0..bytes.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&bytes[i..i + 2], 16).unwrap())
            .collect();
        let mut md5 = <md5::Md5 as md5::Digest>::new();
        md5::Digest::update(&mut md5, [id]);
        md5::Digest::update(&mut md5, b"initiator-secret");
        md5::Digest::update(&mut md5, &bytes);
        let proof: String = md5::Digest::finalize(md5)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let reply = [("CHAP_N", "node"), ("CHAP_R", &format!("0x{proof}"))];
        let Step::Continue(response) = login.step(&request(SECURITY, OPERATIONAL, true, &reply))
        else {
            panic!("the right response failed");
        };
        assert_eq!(response.bhs.0[FLAGS], TRANSIT | OPERATIONAL);
        let last = request(OPERATIONAL, FULL_FEATURE, true, &[("HeaderDigest", "None")]);
        assert!(matches!(login.step(&last), Step::Complete { .. }));
    }

    #[test]
    fn a_target_with_chap_refuses_none_a_wrong_secret_and_skipping_security() {
        let none_only = [&LEADING[..], &[("AuthMethod", "None")]].concat();
        let Step::Fail(response, _) =
            chap_login().step(&request(SECURITY, OPERATIONAL, true, &none_only))
        else {
            panic!("AuthMethod=None was taken");
        };
        assert_eq!(status(&response), Status::AuthenticationFailed as u16);
        let Step::Fail(response, _) =
            chap_login().step(&request(OPERATIONAL, FULL_FEATURE, true, &LEADING))
        else {
            panic!("the security stage was skipped");
        };
        assert_eq!(status(&response), Status::AuthenticationFailed as u16);
        let mut login = chap_login();
        let first = [&LEADING[..], &[("AuthMethod", "CHAP")]].concat();
        login.step(&request(SECURITY, OPERATIONAL, false, &first));
        login.step(&request(SECURITY, OPERATIONAL, false, &[("CHAP_A", "5")]));
        let guess = [
            ("CHAP_N", "node"),
            ("CHAP_R", "0x00112233445566778899aabbccddeeff"),
        ];
        let Step::Fail(response, why) = login.step(&request(SECURITY, OPERATIONAL, true, &guess))
        else {
            panic!("a wrong response was taken");
        };
        assert_eq!(status(&response), Status::AuthenticationFailed as u16);
        assert!(why.contains("CHAP_R"), "{why}");
    }

    #[test]
    fn a_normal_login_goes_through_security_and_operational_stages() {
        let mut login = login();
        let first = request(
            SECURITY,
            OPERATIONAL,
            true,
            &[
                ("InitiatorName", "iqn.2026-01.io.test:host"),
                ("SessionType", "Normal"),
                ("TargetName", TARGET),
                ("AuthMethod", "CHAP,None"),
            ],
        );
        let Step::Continue(response) = login.step(&first) else {
            panic!("the security stage failed");
        };
        assert_eq!(status(&response), 0);
        assert_eq!(response.bhs.0[FLAGS], TRANSIT | OPERATIONAL);
        assert_eq!(answer(&response).get("AuthMethod"), Some("None"));
        assert_eq!(answer(&response).get("TargetPortalGroupTag"), Some("1"));
        assert_eq!(
            &response.bhs.0[ISID..ISID + 6],
            &first.bhs.0[ISID..ISID + 6]
        );
        assert_eq!(response.bhs.initiator_task_tag(), 9);
        assert_eq!(response.bhs.u32_at(STAT_SN), 100);
        assert_eq!(response.bhs.u32_at(EXP_CMD_SN), 5);
        assert_eq!(response.bhs.u32_at(MAX_CMD_SN), 5 + COMMAND_WINDOW - 1);
        assert_eq!(
            u16::from_be_bytes([response.bhs.0[TSIH], response.bhs.0[TSIH + 1]]),
            0
        );

        let second = request(
            OPERATIONAL,
            FULL_FEATURE,
            true,
            &[
                ("HeaderDigest", "CRC32C,None"),
                ("MaxRecvDataSegmentLength", "65536"),
            ],
        );
        let Step::Complete {
            response,
            parameters,
            next_stat_sn,
        } = login.step(&second)
        else {
            panic!("the operational stage did not complete");
        };
        assert_eq!(response.bhs.u32_at(STAT_SN), 101);
        assert_eq!(next_stat_sn, 102);
        assert_eq!(
            response.bhs.0[FLAGS],
            (OPERATIONAL << 2) | TRANSIT | FULL_FEATURE
        );
        assert_eq!(
            u16::from_be_bytes([response.bhs.0[TSIH], response.bhs.0[TSIH + 1]]),
            7
        );
        assert!(parameters.header_digest);
        assert_eq!(parameters.initiator_max_recv_data, 65536);
        assert_eq!(parameters.target_name, TARGET);
        assert_eq!(parameters.session_type, SessionType::Normal);
    }

    #[test]
    fn a_discovery_login_straight_to_full_feature_needs_no_target_name() {
        let mut login = login();
        let only = request(
            OPERATIONAL,
            FULL_FEATURE,
            true,
            &[
                ("InitiatorName", "iqn.x:host"),
                ("SessionType", "Discovery"),
            ],
        );
        let Step::Complete { parameters, .. } = login.step(&only) else {
            panic!("discovery login failed");
        };
        assert_eq!(parameters.session_type, SessionType::Discovery);
    }

    #[test]
    fn a_target_with_chap_lets_discovery_go_without_it_unless_chap_is_all_offered() {
        let discovery = [
            ("InitiatorName", "iqn.x:host"),
            ("SessionType", "Discovery"),
        ];
        let skipping = chap_login().step(&request(OPERATIONAL, FULL_FEATURE, true, &discovery));
        assert!(matches!(skipping, Step::Complete { .. }));
        let either = [&discovery[..], &[("AuthMethod", "CHAP,None")]].concat();
        let mut login = chap_login();
        let Step::Continue(response) = login.step(&request(SECURITY, OPERATIONAL, true, &either))
        else {
            panic!("discovery with AuthMethod=CHAP,None failed");
        };
        assert_eq!(answer(&response).get("AuthMethod"), Some("None"));
        let chap_only = [&discovery[..], &[("AuthMethod", "CHAP")]].concat();
        let mut login = chap_login();
        login.step(&request(SECURITY, OPERATIONAL, false, &chap_only));
        // Held in the security stage: the operational stage is out of turn.
        let skipped = login.step(&request(OPERATIONAL, FULL_FEATURE, true, &[]));
        assert!(
            matches!(skipped, Step::Fail(..)),
            "a discovery that chose CHAP left security unproven"
        );
    }

    #[test]
    fn a_text_continued_over_pdus_is_answered_once_whole() {
        let mut login = login();
        let whole = request(
            OPERATIONAL,
            FULL_FEATURE,
            true,
            &[("InitiatorName", "iqn.x:host"), ("TargetName", TARGET)],
        );
        let mut part = whole.clone();
        part.bhs.0[FLAGS] = (OPERATIONAL << 2) | CONTINUE;
        part.data = whole.data.slice(..10);
        let Step::Continue(asked) = login.step(&part) else {
            panic!("a continued request failed");
        };
        assert!(asked.data.is_empty());
        assert_eq!(asked.bhs.0[FLAGS] & TRANSIT, 0);
        let mut rest = whole.clone();
        rest.data = whole.data.slice(10..);
        assert!(matches!(login.step(&rest), Step::Complete { .. }));
    }

    #[test]
    fn failed_logins_say_why_with_the_rfcs_status() {
        let cases: [(&[(&str, &str)], u16); 5] = [
            (&[("TargetName", TARGET)], 0x0207),
            (&[("InitiatorName", "iqn.x:host")], 0x0207),
            (
                &[
                    ("InitiatorName", "iqn.x:host"),
                    ("TargetName", "iqn.other:vol"),
                ],
                0x0203,
            ),
            (
                &[
                    ("InitiatorName", "iqn.x:host"),
                    ("TargetName", TARGET),
                    ("AuthMethod", "CHAP"),
                ],
                0x0201,
            ),
            (
                &[
                    ("InitiatorName", "iqn.x:host"),
                    ("TargetName", TARGET),
                    ("MaxBurstLength", "1"),
                ],
                0x0200,
            ),
        ];
        for (pairs, expected) in cases {
            let Step::Fail(response, why) =
                login().step(&request(SECURITY, OPERATIONAL, true, pairs))
            else {
                panic!("{pairs:?} logged in");
            };
            assert_eq!(status(&response), expected, "{pairs:?}: {why}");
            assert_eq!(response.bhs.opcode(), Some(Opcode::LoginResponse));
        }
        let mut newer = request(
            SECURITY,
            OPERATIONAL,
            true,
            &[("InitiatorName", "iqn.x:host")],
        );
        newer.bhs.0[VERSION_MIN] = 1;
        let Step::Fail(response, _) = login().step(&newer) else {
            panic!("an unknown version logged in");
        };
        assert_eq!(status(&response), 0x0205);
        let backwards = request(
            OPERATIONAL,
            SECURITY,
            true,
            &[("InitiatorName", "iqn.x:host"), ("TargetName", TARGET)],
        );
        assert!(matches!(login().step(&backwards), Step::Fail(..)));
        let nop = Pdu::new(Bhs::new(Opcode::NopOut), Bytes::new());
        let Step::Fail(response, _) = login().step(&nop) else {
            panic!("a NOP-Out was taken during login");
        };
        assert_eq!(status(&response), 0x020b);
    }

    /// Takes a normal login through its security stage.
    fn secured() -> Login {
        let mut login = login();
        let first = request(
            SECURITY,
            OPERATIONAL,
            true,
            &[("InitiatorName", "iqn.x:host"), ("TargetName", TARGET)],
        );
        assert!(matches!(login.step(&first), Step::Continue(_)));
        login
    }

    #[test]
    fn a_login_keeps_to_its_stages_keys_and_identity() {
        // Back to the security stage once past it.
        let again = request(SECURITY, OPERATIONAL, true, &[]);
        assert!(matches!(secured().step(&again), Step::Fail(..)));
        // A leading-only key after the leading request: no switching a
        // normal session to discovery.
        let switch = request(
            OPERATIONAL,
            FULL_FEATURE,
            true,
            &[("SessionType", "Discovery")],
        );
        let Step::Fail(response, why) = secured().step(&switch) else {
            panic!("SessionType was taken after the leading request");
        };
        assert_eq!(status(&response), 0x0200, "{why}");
        // A key negotiated twice.
        let mut negotiating = secured();
        let once = request(
            OPERATIONAL,
            OPERATIONAL,
            false,
            &[("MaxBurstLength", "65536")],
        );
        assert!(matches!(negotiating.step(&once), Step::Continue(_)));
        let twice = request(
            OPERATIONAL,
            FULL_FEATURE,
            true,
            &[("MaxBurstLength", "8192")],
        );
        assert!(matches!(negotiating.step(&twice), Step::Fail(..)));
        // Another ITT mid-login.
        let mut other = request(OPERATIONAL, FULL_FEATURE, true, &[]);
        other.bhs.set_initiator_task_tag(10);
        assert!(matches!(secured().step(&other), Step::Fail(..)));
        // A TSIH naming a session to join: none exists.
        let mut join = request(
            SECURITY,
            OPERATIONAL,
            true,
            &[("InitiatorName", "iqn.x:host")],
        );
        join.bhs.0[TSIH + 1] = 5;
        let Step::Fail(response, _) = login().step(&join) else {
            panic!("a connection joined a session that does not exist");
        };
        assert_eq!(status(&response), 0x020a);
    }

    #[test]
    fn an_answer_longer_than_the_initiator_takes_fails_the_login() {
        let names: Vec<String> = (0..600).map(|i| format!("X-unknown-key-{i}")).collect();
        let mut pairs = vec![("InitiatorName", "iqn.x:host"), ("TargetName", TARGET)];
        pairs.extend(names.iter().map(|n| (n.as_str(), "1")));
        let Step::Fail(response, why) =
            login().step(&request(OPERATIONAL, FULL_FEATURE, true, &pairs))
        else {
            panic!("an oversized answer was sent");
        };
        assert_eq!(status(&response), 0x0200, "{why}");
        assert!(why.contains("8192"), "{why}");
    }
}
