//! One connection, which is one session (MaxConnections=1): its login,
//! then the full feature phase (RFC 7143 §4.2) until the initiator logs
//! out, the connection breaks or goes silent, or the target stops. PDUs are
//! read, and responses of finished commands sent, by this one task; the
//! commands themselves run concurrently ([`super::scsi_task`]). Whatever
//! ends the connection, its commands in flight finish before it is gone,
//! so a write the initiator gave up on never lands after its retry.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::codec::{FramedRead, FramedWrite};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::login::{COMMAND_WINDOW, Login, Step, TargetIdentity};
use super::negotiate::{Parameters, SessionType, TARGET_MAX_RECV_DATA};
use super::pdu::{Bhs, Opcode, Pdu, PduCodec, PduError};
use super::scsi_task::{Grant, Running, Task, next_tag};
use super::target::{self, Target};
use super::text::{MAX_TEXT_LEN, Text};
use crate::frontend::BlockDevice;
use crate::frontend::scsi::luns::Nexus;

/// Fields every target PDU of the full feature phase carries.
pub(super) const STAT_SN: usize = 24;
const EXP_CMD_SN: usize = 28;
const MAX_CMD_SN: usize = 32;
/// Fields of the initiator's requests.
pub(super) const CMD_SN: usize = 24;
pub(super) const TTT: usize = 20;
/// The tag of "no task" and "no transfer".
pub(super) const RESERVED_TAG: u32 = 0xffff_ffff;

/// Commands in flight beyond which immediate ones are refused: the window
/// bounds the others.
pub(super) const MAX_TASKS: usize = 2 * COMMAND_WINDOW as usize;

/// Reasons of a Reject PDU (RFC 7143 §11.17.1).
pub(super) mod reject {
    pub const PROTOCOL_ERROR: u8 = 0x04;
    pub const COMMAND_NOT_SUPPORTED: u8 = 0x05;
    pub const IMMEDIATE_COMMAND_REJECTED: u8 = 0x06;
    pub const TASK_IN_PROGRESS: u8 = 0x07;
    pub const INVALID_PDU_FIELD: u8 = 0x09;
}

/// Why a connection ended other than by logout or the initiator closing.
#[derive(Debug, thiserror::Error)]
pub(super) enum IscsiConnectionError {
    #[error(transparent)]
    Pdu(#[from] PduError),
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("login failed: {0}")]
    Login(String),
    #[error("the login did not complete within {0:?}")]
    LoginTimeout(Duration),
    #[error("the initiator did not answer a NOP-In within {0:?}")]
    Silent(Duration),
}

pub(super) type Result<T> = std::result::Result<T, IscsiConnectionError>;

/// Whether the connection goes on after a PDU.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Flow {
    Continue,
    Close,
}

/// An outstanding NOP-In ping.
struct Ping {
    ttt: u32,
    sent: Instant,
}

pub(super) struct Connection<D, S = TcpStream> {
    pub(super) target: Arc<Target<D>>,
    reader: FramedRead<tokio::io::ReadHalf<S>, PduCodec>,
    writer: FramedWrite<tokio::io::WriteHalf<S>, PduCodec>,
    local: Option<SocketAddr>,
    stop: CancellationToken,
    pub(super) parameters: Parameters,
    pub(super) nexus: Option<Nexus>,
    stat_sn: u32,
    exp_cmd_sn: u32,
    /// Non-immediate commands accepted and not yet answered: they hold
    /// places in the command window.
    pub(super) queued: u32,
    /// Every task not yet answered, by Initiator Task Tag.
    pub(super) tasks: HashMap<u32, Task>,
    pub(super) running: FuturesUnordered<Running>,
    /// Writes waiting for the target's write memory, as it is granted.
    pub(super) grants: FuturesUnordered<Grant>,
    pub(super) last_claim: u64,
    pub(super) last_ttt: u32,
    last_heard: Instant,
    ping: Option<Ping>,
}

impl<D: BlockDevice> Connection<D> {
    pub(super) fn new(target: Arc<Target<D>>, socket: TcpStream, stop: CancellationToken) -> Self {
        let local = socket.local_addr().ok();
        Self::over(target, socket, local, stop)
    }
}

impl<D: BlockDevice, S: AsyncRead + AsyncWrite + Send + 'static> Connection<D, S> {
    /// A connection over any byte stream; `local` is the portal it reached.
    pub(super) fn over(
        target: Arc<Target<D>>,
        stream: S,
        local: Option<SocketAddr>,
        stop: CancellationToken,
    ) -> Self {
        let (read, write) = tokio::io::split(stream);
        Self {
            target,
            reader: FramedRead::new(read, PduCodec::default()),
            writer: FramedWrite::new(write, PduCodec::default()),
            local,
            stop,
            parameters: Parameters::default(),
            nexus: None,
            stat_sn: 0,
            exp_cmd_sn: 0,
            queued: 0,
            tasks: HashMap::new(),
            running: FuturesUnordered::new(),
            grants: FuturesUnordered::new(),
            last_claim: 0,
            last_ttt: 0,
            last_heard: Instant::now(),
            ping: None,
        }
    }

    /// Logs in, serves, and ends with a log line saying why.
    pub(super) async fn run(mut self) {
        let login_timeout = self.target.config.login_timeout;
        let session = match tokio::time::timeout(login_timeout, self.login()).await {
            Ok(Ok(Some(session))) => session,
            Ok(Ok(None)) => return,
            Ok(Err(error)) => return warn!(%error, "iSCSI login ended the connection"),
            Err(_) => {
                let error = IscsiConnectionError::LoginTimeout(login_timeout);
                return warn!(%error, "iSCSI login ended the connection");
            }
        };
        let gone = CancellationToken::new();
        let _gone = gone.clone().drop_guard();
        let key = (self.parameters.initiator_name.clone(), session.isid);
        if self.parameters.session_type == SessionType::Normal {
            self.target
                .register(key.clone(), session.tsih, self.stop.clone(), gone)
                .await;
        }
        let sent = self.writer.send(session.response).await;
        let outcome = match sent {
            Ok(()) => self.serve().await,
            Err(error) => Err(error.into()),
        };
        match &outcome {
            Ok(()) => info!(initiator = %key.0, "iSCSI connection closed"),
            Err(error) => warn!(initiator = %key.0, %error, "iSCSI connection ended"),
        }
        self.drain().await;
        self.target.unregister(&key, session.tsih);
    }

    /// The login phase: `None` if the initiator went away.
    async fn login(&mut self) -> Result<Option<LoggedIn>> {
        let tsih = self.target.next_tsih();
        let identity = TargetIdentity {
            name: self.target.config.target_name(),
            chap: self.target.config.chap.clone(),
        };
        let mut login = Login::new(identity, tsih, 0);
        while let Some(request) = self.reader.next().await {
            match login.step(&request?) {
                Step::Continue(response) => self.writer.send(response).await?,
                Step::Fail(response, why) => {
                    self.writer.send(response).await?;
                    return Err(IscsiConnectionError::Login(why));
                }
                Step::Complete {
                    response,
                    parameters,
                    next_stat_sn,
                } => {
                    return Ok(Some(self.enter_full_feature(
                        response,
                        *parameters,
                        next_stat_sn,
                    )));
                }
            }
        }
        Ok(None)
    }

    /// Takes the negotiated values: digests and data limits from the next
    /// PDU on, and the sequence numbers the final response carries.
    fn enter_full_feature(
        &mut self,
        response: Pdu,
        parameters: Parameters,
        next_stat_sn: u32,
    ) -> LoggedIn {
        let mut isid = [0; 6];
        isid.copy_from_slice(&response.bhs.0[8..14]);
        let tsih = u16::from_be_bytes([response.bhs.0[14], response.bhs.0[15]]);
        self.exp_cmd_sn = response.bhs.u32_at(EXP_CMD_SN);
        self.stat_sn = next_stat_sn;
        let decoder = self.reader.decoder_mut();
        decoder.max_recv_data = TARGET_MAX_RECV_DATA;
        decoder.header_digest = parameters.header_digest;
        decoder.data_digest = parameters.data_digest;
        let encoder = self.writer.encoder_mut();
        encoder.header_digest = parameters.header_digest;
        encoder.data_digest = parameters.data_digest;
        self.parameters = parameters;
        if self.parameters.session_type == SessionType::Normal {
            self.nexus = Some(self.target.luns.nexus());
        }
        LoggedIn {
            response,
            isid,
            tsih,
        }
    }

    /// The full feature phase.
    async fn serve(&mut self) -> Result<()> {
        let interval = self.target.config.ping_interval;
        let mut ticks = tokio::time::interval_at(Instant::now() + interval, interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => return Ok(()),
                Some((itt, completion)) = self.running.next(), if !self.running.is_empty() => {
                    self.finish(itt, completion).await?;
                }
                Some((itt, claim, memory)) = self.grants.next(), if !self.grants.is_empty() => {
                    self.granted(itt, claim, memory).await?;
                }
                request = self.reader.next() => {
                    let Some(request) = request else { return Ok(()) };
                    self.last_heard = Instant::now();
                    if self.receive(request?).await? == Flow::Close {
                        return Ok(());
                    }
                }
                _ = ticks.tick() => self.ping().await?,
            }
        }
    }

    /// One PDU of the full feature phase.
    async fn receive(&mut self, request: Pdu) -> Result<Flow> {
        let opcode = request.bhs.opcode();
        let discovery = self.parameters.session_type == SessionType::Discovery;
        match opcode {
            Some(Opcode::NopOut) => self.nop_out(request).await,
            Some(Opcode::Text) => self.text(request).await,
            Some(Opcode::Logout) => self.logout(request).await,
            Some(Opcode::ScsiCommand) if !discovery => self.scsi_command(request).await,
            Some(Opcode::DataOut) if !discovery => self.data_out(request).await,
            Some(Opcode::TaskManagement) if !discovery => self.task_management(request).await,
            // ErrorRecoveryLevel 0: nothing is retransmitted.
            Some(Opcode::Snack) => {
                self.reject(&request.bhs, reject::COMMAND_NOT_SUPPORTED)
                    .await?;
                Ok(Flow::Continue)
            }
            _ => {
                self.reject(&request.bhs, reject::PROTOCOL_ERROR).await?;
                Err(IscsiConnectionError::Protocol(format!(
                    "opcode {:#04x} in a {:?} session's full feature phase",
                    request.bhs.raw_opcode(),
                    self.parameters.session_type
                )))
            }
        }
    }

    /// Admits a request by its CmdSN (RFC 7143 §4.2.2.1): an immediate one
    /// at once, a non-immediate one only as the next expected, taking its
    /// place in the window; anything else is dropped unanswered.
    pub(super) fn admit(&mut self, bhs: &Bhs) -> bool {
        let cmd_sn = bhs.u32_at(CMD_SN);
        if bhs.immediate() {
            return true;
        }
        // A full queue closes the window: an initiator sending past it
        // would otherwise make the target hold any number of commands.
        if cmd_sn != self.exp_cmd_sn || self.queued >= COMMAND_WINDOW {
            debug!(
                cmd_sn,
                exp_cmd_sn = self.exp_cmd_sn,
                queued = self.queued,
                "a command out of its turn or outside the window: dropped"
            );
            return false;
        }
        self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
        true
    }

    /// The window the initiator may send into: ExpCmdSN and the places
    /// the queued commands leave; ExpCmdSN - 1 when none is left (RFC 7143
    /// §4.2.2.1: a closed window).
    fn max_cmd_sn(&self) -> u32 {
        let free = COMMAND_WINDOW.saturating_sub(self.queued);
        self.exp_cmd_sn.wrapping_add(free).wrapping_sub(1)
    }

    /// Sets a response's StatSN (taking it when the response is a status),
    /// ExpCmdSN and MaxCmdSN.
    pub(super) fn stamp(&mut self, bhs: &mut Bhs, status: bool) {
        bhs.set_u32_at(STAT_SN, self.stat_sn);
        if status {
            self.stat_sn = self.stat_sn.wrapping_add(1);
        }
        bhs.set_u32_at(EXP_CMD_SN, self.exp_cmd_sn);
        bhs.set_u32_at(MAX_CMD_SN, self.max_cmd_sn());
    }

    /// A fresh Target Transfer Tag, never the reserved one.
    fn next_ttt(&mut self) -> u32 {
        self.last_ttt = next_tag(self.last_ttt);
        self.last_ttt
    }

    /// Queues a PDU to send with the next flush.
    pub(super) async fn feed(&mut self, pdu: Pdu) -> Result<()> {
        Ok(self.writer.feed(pdu).await?)
    }

    pub(super) async fn flush(&mut self) -> Result<()> {
        Ok(SinkExt::<Pdu>::flush(&mut self.writer).await?)
    }

    pub(super) async fn send(&mut self, pdu: Pdu) -> Result<()> {
        Ok(self.writer.send(pdu).await?)
    }

    /// Rejects a PDU, quoting its header.
    pub(super) async fn reject(&mut self, rejected: &Bhs, reason: u8) -> Result<()> {
        warn!(?rejected, reason, "iSCSI PDU rejected");
        let mut bhs = Bhs::new(Opcode::Reject);
        bhs.set_final(true);
        bhs.0[2] = reason;
        bhs.set_initiator_task_tag(RESERVED_TAG);
        self.stamp(&mut bhs, true);
        self.send(Pdu::new(bhs, Bytes::copy_from_slice(&rejected.0)))
            .await
    }

    /// NOP-Out: a ping to answer with its data, or the answer to ours.
    async fn nop_out(&mut self, request: Pdu) -> Result<Flow> {
        let itt = request.bhs.initiator_task_tag();
        if !self.admit(&request.bhs) {
            return Ok(Flow::Continue);
        }
        if itt == RESERVED_TAG {
            let ttt = request.bhs.u32_at(TTT);
            if self.ping.as_ref().is_some_and(|ping| ping.ttt == ttt) {
                self.ping = None;
            }
            return Ok(Flow::Continue);
        }
        let mut bhs = Bhs::new(Opcode::NopIn);
        bhs.set_final(true);
        bhs.set_lun(request.bhs.lun());
        bhs.set_initiator_task_tag(itt);
        bhs.set_u32_at(TTT, RESERVED_TAG);
        self.stamp(&mut bhs, true);
        let limit = self.parameters.initiator_max_recv_data as usize;
        let data = request.data.slice(..request.data.len().min(limit));
        self.send(Pdu::new(bhs, data)).await?;
        Ok(Flow::Continue)
    }

    /// Pings a silent initiator, and gives up on one that stays silent.
    async fn ping(&mut self) -> Result<()> {
        let config = &self.target.config;
        if let Some(ping) = &self.ping {
            if self.last_heard < ping.sent && ping.sent.elapsed() >= config.ping_timeout {
                return Err(IscsiConnectionError::Silent(config.ping_timeout));
            }
            if self.last_heard >= ping.sent {
                self.ping = None;
            }
            return Ok(());
        }
        if self.last_heard.elapsed() < config.ping_interval {
            return Ok(());
        }
        let ttt = self.next_ttt();
        let mut bhs = Bhs::new(Opcode::NopIn);
        bhs.set_final(true);
        bhs.set_initiator_task_tag(RESERVED_TAG);
        bhs.set_u32_at(TTT, ttt);
        // A ping is not a status: StatSN is the next one, not taken.
        self.stamp(&mut bhs, false);
        self.send(Pdu::new(bhs, Bytes::new())).await?;
        self.ping = Some(Ping {
            ttt,
            sent: Instant::now(),
        });
        Ok(())
    }

    /// A Text Request: SendTargets, answered with this target and the
    /// portal the connection reached. Other keys are not understood.
    async fn text(&mut self, request: Pdu) -> Result<Flow> {
        if !self.admit(&request.bhs) {
            return Ok(Flow::Continue);
        }
        // The C bit: this target's requests are short, so a continued one
        // is refused rather than gathered.
        if request.bhs.0[1] & 0x40 != 0 || request.data.len() > MAX_TEXT_LEN {
            self.reject(&request.bhs, reject::INVALID_PDU_FIELD).await?;
            return Ok(Flow::Continue);
        }
        let Ok(offer) = Text::parse(&request.data) else {
            self.reject(&request.bhs, reject::INVALID_PDU_FIELD).await?;
            return Ok(Flow::Continue);
        };
        let name = self.target.config.target_name();
        let mut answer = Text::default();
        for (key, value) in &offer.0 {
            if key != "SendTargets" {
                answer.push(key, "NotUnderstood");
                continue;
            }
            let all = value == "All" && self.parameters.session_type == SessionType::Discovery;
            if all || value.is_empty() || *value == name {
                answer.push("TargetName", name.clone());
                if let Some(local) = self.local {
                    answer.push("TargetAddress", target::portal(local));
                }
            }
        }
        let mut bhs = Bhs::new(Opcode::TextResponse);
        bhs.set_final(true);
        bhs.set_initiator_task_tag(request.bhs.initiator_task_tag());
        bhs.set_u32_at(TTT, RESERVED_TAG);
        self.stamp(&mut bhs, true);
        self.send(Pdu::new(bhs, answer.encode())).await?;
        Ok(Flow::Continue)
    }

    /// Logout: the commands in flight finish and are answered, then the
    /// response, then the connection closes.
    async fn logout(&mut self, request: Pdu) -> Result<Flow> {
        if !self.admit(&request.bhs) {
            return Ok(Flow::Continue);
        }
        self.finish_running().await?;
        let reason = request.bhs.0[1] & 0x7f;
        let mut bhs = Bhs::new(Opcode::LogoutResponse);
        bhs.set_final(true);
        // Closing the session or the connection succeeds; removing a
        // connection for recovery needs ErrorRecoveryLevel 2.
        bhs.0[2] = if reason <= 1 { 0 } else { 2 };
        bhs.set_initiator_task_tag(request.bhs.initiator_task_tag());
        self.stamp(&mut bhs, true);
        self.send(Pdu::new(bhs, Bytes::new())).await?;
        Ok(Flow::Close)
    }

    /// Runs every command in flight to its end, answering each.
    async fn finish_running(&mut self) -> Result<()> {
        while let Some((itt, completion)) = self.running.next().await {
            self.finish(itt, completion).await?;
        }
        Ok(())
    }

    /// Waits for the commands in flight of a connection that has ended:
    /// nobody is left to answer.
    async fn drain(&mut self) {
        let in_flight = self.running.len();
        if in_flight > 0 {
            info!(in_flight, "waiting for the commands of a closed connection");
        }
        while self.running.next().await.is_some() {}
    }
}

/// What a completed login leaves the connection with.
struct LoggedIn {
    /// The final Login Response, sent once the session is registered.
    response: Pdu,
    isid: [u8; 6],
    tsih: u16,
}
