//! SCSI commands over a connection (RFC 7143 §11.3-11.8): a command PDU
//! starts a task; a write's task gathers its data ([`super::data_out`])
//! before it runs; a running task is a future the connection polls; a
//! finished one is answered with its data in Data-In PDUs, the last of
//! which carries the status when it is GOOD, or with a SCSI Response
//! carrying sense data. Residual counts tell the initiator how the data it
//! expected differed from what the command moved.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::sync::OwnedSemaphorePermit;
use tracing::{debug, warn};

use super::connection::{
    Connection, Flow, IscsiConnectionError, RESERVED_TAG, Result, TTT, reject,
};
use super::data_out::{DataOutPdu, Gathering, ProtocolError, R2t};
use super::pdu::{Bhs, Opcode, Pdu};
use crate::frontend::BlockDevice;
use crate::frontend::scsi::disk::Completion;
use crate::frontend::scsi::sense::Sense;

/// Fields of the SCSI Command PDU.
const FLAGS: usize = 1;
const READ: u8 = 0x40;
const WRITE: u8 = 0x20;
const EDTL: usize = 20;
const CDB: std::ops::Range<usize> = 32..48;
/// Fields of the target's PDUs for a task.
const RESPONSE: usize = 2;
const STATUS: usize = 3;
const EXP_DATA_SN: usize = 36;
const DATA_SN: usize = 36;
const BUFFER_OFFSET: usize = 40;
const RESIDUAL: usize = 44;
const DESIRED_LENGTH: usize = 44;
/// Residual flags, in the SCSI Response and the final Data-In.
const OVERFLOW: u8 = 0x04;
const UNDERFLOW: u8 = 0x02;
const DATA_IN_STATUS: u8 = 0x01;

const GOOD: u8 = 0x00;
const CHECK_CONDITION: u8 = 0x02;

/// A task's command finishing: its tag and how it ended.
pub(super) type Running = Pin<Box<dyn Future<Output = (u32, Completion)> + Send>>;

/// A task from its command to its answer.
#[derive(Debug)]
pub(super) struct Task {
    pub(super) lun: u64,
    /// Whether it holds a place in the command window.
    immediate: bool,
    /// The Expected Data Transfer Length, and which way data moves.
    expected: u32,
    read: bool,
    /// The bytes a write's command takes, for its residual.
    wanted: u32,
    cdb: [u8; 16],
    /// A write's data while it arrives; `None` once the task runs.
    gathering: Option<Gathering>,
    /// R2Ts sent, for the response's ExpDataSN.
    r2ts: u32,
    /// The target's write memory the data a write solicits takes.
    budget: Budget,
}

/// A write's claim on the target's write memory ([`TargetConfig::write_budget`]):
/// taken whole before its first R2T, so a write that started soliciting
/// data always finishes, and given back when the task is answered.
///
/// [`TargetConfig::write_budget`]: super::target::TargetConfig::write_budget
#[derive(Debug)]
enum Budget {
    Unclaimed,
    /// Queued for the memory; the number tells this claim from a later
    /// task's with the same tag.
    Waiting(u64),
    Held {
        _memory: OwnedSemaphorePermit,
    },
}

/// A claim granted: the task's tag, the claim's number and the memory.
pub(super) type Grant = Pin<Box<dyn Future<Output = (u32, u64, OwnedSemaphorePermit)> + Send>>;

impl Task {
    pub(super) fn is_gathering(&self) -> bool {
        self.gathering.is_some()
    }
}

impl<D: BlockDevice, S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static>
    Connection<D, S>
{
    /// A SCSI Command PDU.
    pub(super) async fn scsi_command(&mut self, request: Pdu) -> Result<Flow> {
        let bhs = &request.bhs;
        let itt = bhs.initiator_task_tag();
        if self.tasks.contains_key(&itt) {
            self.reject(bhs, reject::TASK_IN_PROGRESS).await?;
            return Ok(Flow::Continue);
        }
        if bhs.immediate() && self.tasks.len() >= super::connection::MAX_TASKS {
            self.reject(bhs, reject::IMMEDIATE_COMMAND_REJECTED).await?;
            return Ok(Flow::Continue);
        }
        if !self.admit(bhs) {
            return Ok(Flow::Continue);
        }
        let flags = bhs.0[FLAGS];
        let mut cdb = [0; 16];
        cdb.copy_from_slice(&bhs.0[CDB]);
        let mut task = Task {
            lun: bhs.lun(),
            immediate: bhs.immediate(),
            expected: bhs.u32_at(EDTL),
            read: flags & READ != 0,
            wanted: 0,
            cdb,
            gathering: None,
            r2ts: 0,
            budget: Budget::Unclaimed,
        };
        if !task.immediate {
            self.queued += 1;
        }
        let write = flags & WRITE != 0;
        if !write && (!request.data.is_empty() || !bhs.final_bit()) {
            self.reject(bhs, reject::PROTOCOL_ERROR).await?;
            return Err(IscsiConnectionError::Protocol(
                "data with a command that is not a write".into(),
            ));
        }
        // Extended CDBs (an AHS) and bidirectional commands are not served.
        let refused = if !request.ahs.is_empty() || (write && task.read) {
            Some(Sense::INVALID_FIELD_IN_CDB)
        } else {
            None
        };
        let admitted = match refused {
            Some(sense) => Err(Completion::Check(sense)),
            None => self.admit_task(&task),
        };
        match admitted {
            Ok(wanted) if write => {
                task.wanted = wanted;
                let gathering = Gathering::new(
                    &self.parameters,
                    task.expected,
                    wanted,
                    request.data,
                    bhs.final_bit(),
                );
                match gathering {
                    Ok(gathering) => {
                        task.gathering = Some(gathering);
                        self.tasks.insert(itt, task);
                        return self.advance(itt).await;
                    }
                    Err(error) => {
                        self.tasks.insert(itt, task);
                        return self.fail_data_phase(itt, error).await;
                    }
                }
            }
            Ok(_) => {
                self.tasks.insert(itt, task);
                self.start(itt, Bytes::new());
            }
            Err(completion) => {
                self.tasks.insert(itt, task);
                self.finish(itt, completion).await?;
            }
        }
        Ok(Flow::Continue)
    }

    /// The bytes the task's command takes from the initiator, or the
    /// answer it gets without running: a pending unit attention, or a
    /// command refused from its CDB before any data moves.
    fn admit_task(&mut self, task: &Task) -> std::result::Result<u32, Completion> {
        let luns = &self.target.luns;
        if let Some(nexus) = self.nexus.as_mut()
            && let Some(completion) = luns.unit_attention(task.lun, &task.cdb, nexus)
        {
            return Err(completion);
        }
        luns.data_out_len(task.lun, &task.cdb, task.expected)
            .map_err(Completion::Check)
    }

    /// A Data-Out PDU: data for a write being gathered. One for a task
    /// no longer here (answered early, or aborted) is dropped.
    pub(super) async fn data_out(&mut self, request: Pdu) -> Result<Flow> {
        let bhs = &request.bhs;
        let itt = bhs.initiator_task_tag();
        let Some(gathering) = self
            .tasks
            .get_mut(&itt)
            .and_then(|task| task.gathering.as_mut())
        else {
            debug!(itt, "Data-Out for no task gathering data: dropped");
            return Ok(Flow::Continue);
        };
        let received = gathering.receive(DataOutPdu {
            ttt: bhs.u32_at(TTT),
            data_sn: bhs.u32_at(DATA_SN),
            offset: bhs.u32_at(BUFFER_OFFSET),
            final_bit: bhs.final_bit(),
            data: request.data,
        });
        match received {
            Ok(()) => self.advance(itt).await,
            Err(error) => self.fail_data_phase(itt, error).await,
        }
    }

    /// Ends a write whose data broke the rules with CHECK CONDITION,
    /// before anything of it is written; the session goes on, and data
    /// still coming for the task is dropped.
    async fn fail_data_phase(&mut self, itt: u32, error: ProtocolError) -> Result<Flow> {
        warn!(itt, %error, "a write's data refused");
        self.finish(itt, Completion::Check(Sense::DATA_PHASE_ERROR))
            .await?;
        Ok(Flow::Continue)
    }

    /// Sends the R2Ts a write's task needs next, or runs it once its data
    /// is all here.
    async fn advance(&mut self, itt: u32) -> Result<Flow> {
        let Some(task) = self.tasks.get_mut(&itt) else {
            return Ok(Flow::Continue);
        };
        let lun = task.lun;
        let Some(gathering) = task.gathering.as_mut() else {
            return Ok(Flow::Continue);
        };
        if gathering.complete() {
            task.r2ts = gathering.r2t_count();
            let data = task.gathering.take().map(Gathering::into_data);
            self.start(itt, data.unwrap_or_default());
            return Ok(Flow::Continue);
        }
        let to_solicit = gathering.to_solicit();
        if to_solicit > 0 && matches!(task.budget, Budget::Unclaimed) {
            let budget = &self.target.write_budget;
            // One write may take all of it, never more: it must fit.
            let bytes = to_solicit.min(self.target.config.write_budget);
            match Arc::clone(budget).try_acquire_many_owned(bytes) {
                Ok(permit) => task.budget = Budget::Held { _memory: permit },
                Err(_) => {
                    self.last_claim += 1;
                    let claim = self.last_claim;
                    task.budget = Budget::Waiting(claim);
                    debug!(itt, bytes, "a write waits for the target's write memory");
                    let acquire = Arc::clone(budget).acquire_many_owned(bytes);
                    self.grants.push(Box::pin(async move {
                        let permit = acquire.await.expect("the write budget is never closed");
                        (itt, claim, permit)
                    }));
                    return Ok(Flow::Continue);
                }
            }
        }
        let last_ttt = &mut self.last_ttt;
        let r2ts = gathering.r2ts(|| {
            *last_ttt = next_tag(*last_ttt);
            *last_ttt
        });
        for r2t in r2ts {
            let pdu = self.r2t(lun, itt, r2t);
            self.feed(pdu).await?;
        }
        self.flush().await?;
        Ok(Flow::Continue)
    }

    /// The write memory a write waited for: its R2Ts go out now. A claim
    /// of a task answered meanwhile gives the memory back at once.
    pub(super) async fn granted(
        &mut self,
        itt: u32,
        claim: u64,
        permit: OwnedSemaphorePermit,
    ) -> Result<Flow> {
        let Some(task) = self.tasks.get_mut(&itt) else {
            return Ok(Flow::Continue);
        };
        if !matches!(task.budget, Budget::Waiting(waiting) if waiting == claim) {
            return Ok(Flow::Continue);
        }
        task.budget = Budget::Held { _memory: permit };
        self.advance(itt).await
    }

    fn r2t(&mut self, lun: u64, itt: u32, r2t: R2t) -> Pdu {
        let mut bhs = Bhs::new(Opcode::ReadyToTransfer);
        bhs.set_final(true);
        bhs.set_lun(lun);
        bhs.set_initiator_task_tag(itt);
        bhs.set_u32_at(TTT, r2t.ttt);
        self.stamp(&mut bhs, false);
        bhs.set_u32_at(DATA_SN, r2t.r2t_sn);
        bhs.set_u32_at(BUFFER_OFFSET, r2t.offset);
        bhs.set_u32_at(DESIRED_LENGTH, r2t.length);
        Pdu::new(bhs, Bytes::new())
    }

    /// Runs a task's command with its data.
    fn start(&mut self, itt: u32, data: Bytes) {
        let Some(task) = self.tasks.get(&itt) else {
            return;
        };
        let target = Arc::clone(&self.target);
        let (lun, cdb) = (task.lun, task.cdb);
        self.running.push(Box::pin(async move {
            (itt, target.luns.execute(lun, &cdb, data).await)
        }));
    }

    /// Drops a task unanswered, freeing its place in the window.
    pub(super) fn forget(&mut self, itt: u32) -> Option<Task> {
        let task = self.tasks.remove(&itt)?;
        if !task.immediate {
            self.queued -= 1;
        }
        Some(task)
    }

    /// Answers a task whose command ended.
    pub(super) async fn finish(&mut self, itt: u32, completion: Completion) -> Result<()> {
        let Some(task) = self.forget(itt) else {
            return Ok(());
        };
        match completion {
            Completion::Good(data) if task.read && task.expected > 0 && !data.is_empty() => {
                self.data_in(itt, &task, data).await?
            }
            Completion::Good(data) if task.read => {
                let (flags, residual) = residual(&task, data.len());
                self.response(itt, &task, GOOD, flags, residual, Bytes::new())
                    .await?
            }
            Completion::Good(_) => {
                let (flags, residual) = residual(&task, 0);
                self.response(itt, &task, GOOD, flags, residual, Bytes::new())
                    .await?
            }
            Completion::Check(sense) => {
                debug!(itt, ?sense, cdb = ?task.cdb, "CHECK CONDITION");
                let sense_data = sense.fixed();
                let mut data = BytesMut::with_capacity(2 + sense_data.len());
                data.put_u16(sense_data.len() as u16);
                data.put_slice(&sense_data);
                let (flags, residual) = residual(&task, 0);
                self.response(itt, &task, CHECK_CONDITION, flags, residual, data.freeze())
                    .await?
            }
        }
        Ok(())
    }

    /// A read's data in PDUs no longer than the initiator receives, each
    /// burst of MaxBurstLength ending with the F bit, the last carrying
    /// the GOOD status (phase collapse).
    async fn data_in(&mut self, itt: u32, task: &Task, data: Bytes) -> Result<()> {
        let (flags, residual) = residual(task, data.len());
        let data = data.slice(..data.len().min(task.expected as usize));
        let segment = self.parameters.initiator_max_recv_data as usize;
        let burst = self.parameters.max_burst as usize;
        let mut offset = 0;
        let mut data_sn = 0;
        while offset < data.len() {
            // Never across a burst's end.
            let burst_end = (offset / burst + 1) * burst;
            let end = (offset + segment).min(data.len()).min(burst_end);
            let last = end == data.len();
            let mut bhs = Bhs::new(Opcode::DataIn);
            bhs.set_final(last || end == burst_end);
            bhs.set_lun(task.lun);
            bhs.set_initiator_task_tag(itt);
            bhs.set_u32_at(TTT, RESERVED_TAG);
            if last {
                bhs.0[1] |= DATA_IN_STATUS | flags;
                bhs.0[STATUS] = GOOD;
                bhs.set_u32_at(RESIDUAL, residual);
            }
            self.stamp(&mut bhs, last);
            bhs.set_u32_at(DATA_SN, data_sn);
            // Within EDTL, a u32.
            bhs.set_u32_at(BUFFER_OFFSET, offset as u32);
            self.feed(Pdu::new(bhs, data.slice(offset..end))).await?;
            offset = end;
            data_sn += 1;
        }
        self.flush().await
    }

    /// A SCSI Response: the status, residual and sense data.
    async fn response(
        &mut self,
        itt: u32,
        task: &Task,
        status: u8,
        flags: u8,
        residual: u32,
        sense: Bytes,
    ) -> Result<()> {
        let mut bhs = Bhs::new(Opcode::ScsiResponse);
        bhs.set_final(true);
        bhs.0[1] |= flags;
        // Command completed at target.
        bhs.0[RESPONSE] = 0;
        bhs.0[STATUS] = status;
        bhs.set_initiator_task_tag(itt);
        self.stamp(&mut bhs, true);
        bhs.set_u32_at(EXP_DATA_SN, task.r2ts);
        bhs.set_u32_at(RESIDUAL, residual);
        self.send(Pdu::new(bhs, sense)).await
    }
}

/// The residual flags and count of a task that moved `read` bytes to the
/// initiator: a read's against what it returned, a write's against what
/// its command takes.
fn residual(task: &Task, read: usize) -> (u8, u32) {
    let moved = if task.read {
        read as u64
    } else {
        u64::from(task.wanted)
    };
    let expected = u64::from(task.expected);
    // The difference of two counts of at most 32 bits each.
    match moved.cmp(&expected) {
        std::cmp::Ordering::Greater => (OVERFLOW, (moved - expected) as u32),
        std::cmp::Ordering::Less => (UNDERFLOW, (expected - moved) as u32),
        std::cmp::Ordering::Equal => (0, 0),
    }
}

/// The tag after `last`, skipping the reserved one.
pub(super) fn next_tag(last: u32) -> u32 {
    match last.wrapping_add(1) {
        RESERVED_TAG => 0,
        tag => tag,
    }
}
