//! A connection end to end over an in-memory stream, for what libiscsi's
//! suite does not exercise: target pings of a silent initiator, a malformed
//! PDU, and a write solicited by R2Ts then read back.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::io::DuplexStream;
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;

use super::connection::Connection;
use super::pdu::{Bhs, Opcode, Pdu, PduCodec};
use super::target::{Target, TargetConfig};
use super::text::Text;
use crate::frontend::scsi::luns::lun_field;
use crate::frontend::scsi::memory::Memory;

const NO_TAG: u32 = 0xffff_ffff;

struct Initiator {
    framed: Framed<DuplexStream, PduCodec>,
    cmd_sn: u32,
}

fn target(ping: Duration) -> Arc<Target<Memory>> {
    let mut config = TargetConfig::new("vol");
    config.ping_interval = ping;
    config.ping_timeout = 2 * ping;
    Target::new(config, Memory::new(64))
}

impl Initiator {
    /// A connection to `target`, logged in with `keys` on top of the
    /// usual ones, as a session of its own (an ISID of its own).
    async fn connect(target: &Arc<Target<Memory>>, keys: &[(&str, &str)]) -> Self {
        static SESSIONS: AtomicU8 = AtomicU8::new(1);
        Self::connect_as(target, keys, SESSIONS.fetch_add(1, Ordering::Relaxed)).await
    }

    /// A connection logged in with an ISID ending in `isid`.
    async fn connect_as(target: &Arc<Target<Memory>>, keys: &[(&str, &str)], isid: u8) -> Self {
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let connection =
            Connection::over(Arc::clone(target), theirs, None, CancellationToken::new());
        tokio::spawn(connection.run());
        let codec = PduCodec {
            max_recv_data: 1 << 20,
            ..PduCodec::default()
        };
        let mut initiator = Self {
            framed: Framed::new(ours, codec),
            cmd_sn: 1,
        };
        let mut text = Text::default();
        text.push("InitiatorName", "iqn.2026-01.io.test:host");
        text.push("TargetName", "iqn.2026-01.io.oxhorn:vol");
        text.push("SessionType", "Normal");
        text.push("MaxRecvDataSegmentLength", "65536");
        for (key, value) in keys {
            text.push(key, *value);
        }
        let mut bhs = Bhs::new(Opcode::Login);
        bhs.set_immediate(true);
        // Transit from the operational stage to the full feature phase.
        bhs.0[1] = 0x80 | (1 << 2) | 3;
        bhs.0[8] = 0x80;
        bhs.0[13] = isid;
        bhs.set_u32_at(24, initiator.cmd_sn);
        initiator
            .framed
            .send(Pdu::new(bhs, text.encode()))
            .await
            .unwrap();
        let response = initiator.receive().await.expect("a login response");
        assert_eq!(response.bhs.opcode(), Some(Opcode::LoginResponse));
        assert_eq!(
            (response.bhs.0[36], response.bhs.0[37]),
            (0, 0),
            "login refused"
        );
        initiator
    }

    async fn receive(&mut self) -> Option<Pdu> {
        self.framed.next().await.map(|pdu| pdu.unwrap())
    }

    async fn send(&mut self, pdu: Pdu) {
        self.framed.send(pdu).await.unwrap();
    }

    /// A SCSI command to LUN 1, taking the next CmdSN.
    async fn command(&mut self, itt: u32, cdb: &[u8], flags: u8, edtl: u32, data: Bytes) {
        let mut bhs = Bhs::new(Opcode::ScsiCommand);
        bhs.0[1] = 0x80 | flags;
        bhs.set_lun(lun_field(1));
        bhs.set_initiator_task_tag(itt);
        bhs.set_u32_at(20, edtl);
        bhs.set_u32_at(24, self.cmd_sn);
        self.cmd_sn += 1;
        bhs.0[32..32 + cdb.len()].copy_from_slice(cdb);
        self.send(Pdu::new(bhs, data)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_silent_initiator_is_pinged_then_dropped_and_an_answering_one_kept() {
    let target = target(Duration::from_secs(1));
    let mut answering = Initiator::connect(&target, &[]).await;
    let mut silent = Initiator::connect(&target, &[]).await;
    for _ in 0..3 {
        let ping = answering.receive().await.expect("a ping");
        assert_eq!(ping.bhs.opcode(), Some(Opcode::NopIn));
        assert_eq!(ping.bhs.initiator_task_tag(), NO_TAG);
        let ttt = ping.bhs.u32_at(20);
        assert_ne!(ttt, NO_TAG, "a ping asks for an answer");
        let mut answer = Bhs::new(Opcode::NopOut);
        answer.set_immediate(true);
        answer.set_final(true);
        answer.set_initiator_task_tag(NO_TAG);
        answer.set_u32_at(20, ttt);
        answer.set_u32_at(24, answering.cmd_sn);
        answering.send(Pdu::new(answer, Bytes::new())).await;
    }
    let ping = silent.receive().await.expect("a ping");
    assert_eq!(ping.bhs.opcode(), Some(Opcode::NopIn));
    // Every ping of the silent one went unanswered: it is closed, while
    // the answering one has outlived it.
    let mut rest = Vec::new();
    while let Some(pdu) = silent.receive().await {
        rest.push(pdu.bhs.opcode());
    }
    assert!(rest.iter().all(|o| *o == Some(Opcode::NopIn)), "{rest:?}");
    assert_eq!(
        answering.receive().await.map(|p| p.bhs.opcode()),
        Some(Some(Opcode::NopIn))
    );
}

#[tokio::test]
async fn a_login_with_a_live_sessions_isid_replaces_that_session() {
    let target = target(Duration::from_secs(60));
    let mut old = Initiator::connect_as(&target, &[], 0).await;
    let mut new = Initiator::connect_as(&target, &[], 0).await;
    assert!(
        old.receive().await.is_none(),
        "the old connection is closed"
    );
    new.command(1, &[0; 6], 0, 0, Bytes::new()).await;
    let response = new.receive().await.unwrap();
    assert_eq!(response.bhs.opcode(), Some(Opcode::ScsiResponse));
}

#[tokio::test]
async fn a_full_command_window_closes_and_commands_past_it_are_dropped() {
    let target = target(Duration::from_secs(60));
    let keys = [("InitialR2T", "Yes"), ("ImmediateData", "No")];
    let mut initiator = Initiator::connect(&target, &keys).await;
    // Writes whose data never comes hold their places in the window.
    let write = [0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    let window = super::login::COMMAND_WINDOW;
    for itt in 0..window {
        initiator
            .command(itt, &write, 0x20, 4096, Bytes::new())
            .await;
        let r2t = initiator.receive().await.unwrap();
        assert_eq!(r2t.bhs.opcode(), Some(Opcode::ReadyToTransfer));
        let (exp_cmd_sn, max_cmd_sn) = (r2t.bhs.u32_at(28), r2t.bhs.u32_at(32));
        assert_eq!(exp_cmd_sn, initiator.cmd_sn);
        assert_eq!(
            max_cmd_sn,
            initiator.cmd_sn + window - itt - 2,
            "after {itt}"
        );
    }
    // Closed: MaxCmdSN is ExpCmdSN - 1. A command sent anyway is dropped;
    // an immediate ping is still answered, and is the next PDU.
    initiator.command(1000, &[0; 6], 0, 0, Bytes::new()).await;
    let mut ping = Bhs::new(Opcode::NopOut);
    ping.set_immediate(true);
    ping.set_final(true);
    ping.set_initiator_task_tag(2000);
    ping.set_u32_at(20, NO_TAG);
    ping.set_u32_at(24, initiator.cmd_sn);
    initiator.send(Pdu::new(ping, Bytes::new())).await;
    let next = initiator.receive().await.unwrap();
    assert_eq!(next.bhs.opcode(), Some(Opcode::NopIn));
    assert_eq!(next.bhs.initiator_task_tag(), 2000);
    assert_eq!(next.bhs.u32_at(32), next.bhs.u32_at(28).wrapping_sub(1));
}

#[tokio::test]
async fn a_malformed_pdu_is_rejected_and_ends_only_its_connection() {
    let target = target(Duration::from_secs(60));
    let mut first = Initiator::connect(&target, &[]).await;
    let mut bad = Bhs::new(Opcode::NopOut);
    bad.0[0] = 0x1e;
    first.send(Pdu::new(bad, Bytes::new())).await;
    let reject = first.receive().await.expect("a Reject");
    assert_eq!(reject.bhs.opcode(), Some(Opcode::Reject));
    assert_eq!(reject.bhs.0[2], 0x04, "protocol error");
    assert_eq!(reject.data[0], 0x1e, "the Reject quotes the header");
    assert!(first.receive().await.is_none(), "the connection is closed");
    // The target serves others as before.
    let mut second = Initiator::connect(&target, &[]).await;
    second.command(1, &[0; 6], 0, 0, Bytes::new()).await;
    let response = second.receive().await.unwrap();
    assert_eq!(response.bhs.opcode(), Some(Opcode::ScsiResponse));
    assert_eq!(response.bhs.0[3], 0, "TEST UNIT READY is GOOD");
}

#[tokio::test]
async fn a_write_solicited_by_r2ts_reads_back_in_data_in_with_its_status() {
    let target = target(Duration::from_secs(60));
    let keys = [
        ("InitialR2T", "Yes"),
        ("ImmediateData", "No"),
        ("MaxBurstLength", "8192"),
        ("FirstBurstLength", "8192"),
    ];
    let mut initiator = Initiator::connect(&target, &keys).await;
    let data: Vec<u8> = (0..16384u32).map(|i| (i % 251) as u8).collect();
    // WRITE (10) of 4 blocks at LBA 2: 0x20 is the W flag.
    let write = [0x2a, 0, 0, 0, 0, 2, 0, 0, 4, 0];
    initiator
        .command(5, &write, 0x20, 16384, Bytes::new())
        .await;
    let mut offsets = Vec::new();
    while offsets.len() < 2 {
        let r2t = initiator.receive().await.unwrap();
        assert_eq!(r2t.bhs.opcode(), Some(Opcode::ReadyToTransfer));
        let (ttt, offset, length) = (r2t.bhs.u32_at(20), r2t.bhs.u32_at(40), r2t.bhs.u32_at(44));
        assert_eq!(length, 8192, "one burst an R2T");
        offsets.push(offset);
        let mut out = Bhs::new(Opcode::DataOut);
        out.set_final(true);
        out.set_lun(lun_field(1));
        out.set_initiator_task_tag(5);
        out.set_u32_at(20, ttt);
        out.set_u32_at(40, offset);
        let chunk = Bytes::copy_from_slice(&data[offset as usize..(offset + length) as usize]);
        initiator.send(Pdu::new(out, chunk)).await;
    }
    assert_eq!(offsets, [0, 8192]);
    let response = initiator.receive().await.unwrap();
    assert_eq!(response.bhs.opcode(), Some(Opcode::ScsiResponse));
    assert_eq!(response.bhs.0[3], 0, "the write is GOOD");
    assert_eq!(response.bhs.u32_at(36), 2, "ExpDataSN counts the R2Ts");

    // READ (10) of the same blocks: 0x40 is the R flag.
    let read = [0x28, 0, 0, 0, 0, 2, 0, 0, 4, 0];
    initiator.command(6, &read, 0x40, 16384, Bytes::new()).await;
    let mut back = Vec::new();
    loop {
        let data_in = initiator.receive().await.unwrap();
        assert_eq!(data_in.bhs.opcode(), Some(Opcode::DataIn));
        assert_eq!(data_in.bhs.u32_at(40) as usize, back.len(), "in order");
        back.extend_from_slice(&data_in.data);
        if data_in.bhs.0[1] & 0x01 != 0 {
            assert_eq!(data_in.bhs.0[3], 0, "GOOD with the last Data-In");
            break;
        }
    }
    assert_eq!(back, data);
}

// Paused time: the wait for an R2T that must not come ends once the target
// has nothing left to do.
#[tokio::test(start_paused = true)]
async fn a_write_past_the_write_budget_gets_its_r2ts_once_earlier_writes_finish() {
    let mut config = TargetConfig::new("vol");
    config.write_budget = 16384;
    let target = Target::new(config, Memory::new(64));
    let keys = [("InitialR2T", "Yes"), ("ImmediateData", "No")];
    let mut first = Initiator::connect(&target, &keys).await;
    let mut second = Initiator::connect(&target, &keys).await;
    // WRITE (10) of 4 blocks, from two sessions: the budget holds one.
    let write = |lba: u8| [0x2a, 0, 0, 0, 0, lba, 0, 0, 4, 0];
    first.command(1, &write(0), 0x20, 16384, Bytes::new()).await;
    let r2t = first.receive().await.unwrap();
    assert_eq!(r2t.bhs.opcode(), Some(Opcode::ReadyToTransfer));
    second
        .command(2, &write(8), 0x20, 16384, Bytes::new())
        .await;
    let waiting = tokio::time::timeout(Duration::from_millis(300), second.receive()).await;
    assert!(waiting.is_err(), "an R2T past the budget: {waiting:?}");

    send_data(&mut first, 1, &r2t, 0xaa).await;
    let response = first.receive().await.unwrap();
    assert_eq!(response.bhs.opcode(), Some(Opcode::ScsiResponse));
    assert_eq!(response.bhs.0[3], 0, "the first write is GOOD");
    let r2t = second.receive().await.unwrap();
    assert_eq!(r2t.bhs.opcode(), Some(Opcode::ReadyToTransfer));
    assert_eq!(r2t.bhs.u32_at(44), 16384);
    send_data(&mut second, 2, &r2t, 0xbb).await;
    let response = second.receive().await.unwrap();
    assert_eq!(response.bhs.0[3], 0, "the second write is GOOD");
}

/// Answers an R2T with the data it asks for, every byte `fill`.
async fn send_data(initiator: &mut Initiator, itt: u32, r2t: &Pdu, fill: u8) {
    let mut out = Bhs::new(Opcode::DataOut);
    out.set_final(true);
    out.set_lun(lun_field(1));
    out.set_initiator_task_tag(itt);
    out.set_u32_at(20, r2t.bhs.u32_at(20));
    out.set_u32_at(40, r2t.bhs.u32_at(40));
    let data = Bytes::from(vec![fill; r2t.bhs.u32_at(44) as usize]);
    initiator.send(Pdu::new(out, data)).await;
}
