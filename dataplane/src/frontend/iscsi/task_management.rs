//! Task management functions (RFC 7143 §11.5, SAM-5 §7): aborting one
//! task, the tasks of a LUN, or all of the session's. A task still
//! gathering its data is dropped at once; a running one cannot be called
//! back from the replicas, so the function waits for it to end and drops
//! its answer: the response comes only once no aborted command can still
//! change the volume, which is what the initiator relies on before it
//! retries.

use std::collections::HashSet;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tracing::info;

use super::connection::{Connection, Flow, Result};
use super::pdu::{Bhs, Opcode, Pdu};
use crate::frontend::BlockDevice;
use crate::frontend::scsi::luns::{DISK_LUN, lun_number};

const REFERENCED_TASK_TAG: usize = 20;

/// The functions (RFC 7143 §11.5.1).
const ABORT_TASK: u8 = 1;
const ABORT_TASK_SET: u8 = 2;
const CLEAR_TASK_SET: u8 = 4;
const LOGICAL_UNIT_RESET: u8 = 5;
const TARGET_WARM_RESET: u8 = 6;
const TARGET_COLD_RESET: u8 = 7;
const TASK_REASSIGN: u8 = 8;

/// The responses (RFC 7143 §11.6.1).
const FUNCTION_COMPLETE: u8 = 0;
const TASK_DOES_NOT_EXIST: u8 = 1;
const LUN_DOES_NOT_EXIST: u8 = 2;
const REASSIGNMENT_NOT_SUPPORTED: u8 = 4;
const NOT_SUPPORTED: u8 = 5;

impl<D: BlockDevice, S: AsyncRead + AsyncWrite + Send + 'static> Connection<D, S> {
    /// A Task Management Function Request.
    pub(super) async fn task_management(&mut self, request: Pdu) -> Result<Flow> {
        let bhs = &request.bhs;
        if !self.admit(bhs) {
            return Ok(Flow::Continue);
        }
        let function = bhs.0[1] & 0x7f;
        let lun = bhs.lun();
        let served = matches!(lun_number(lun), Some(number) if number <= DISK_LUN);
        let (response, victims) = match function {
            ABORT_TASK => {
                let referenced = bhs.u32_at(REFERENCED_TASK_TAG);
                if self.tasks.contains_key(&referenced) {
                    (FUNCTION_COMPLETE, vec![referenced])
                } else {
                    (TASK_DOES_NOT_EXIST, Vec::new())
                }
            }
            ABORT_TASK_SET | CLEAR_TASK_SET | LOGICAL_UNIT_RESET if !served => {
                (LUN_DOES_NOT_EXIST, Vec::new())
            }
            ABORT_TASK_SET | CLEAR_TASK_SET | LOGICAL_UNIT_RESET => (
                FUNCTION_COMPLETE,
                self.tasks_where(|task_lun| task_lun == lun),
            ),
            TARGET_WARM_RESET | TARGET_COLD_RESET => {
                (FUNCTION_COMPLETE, self.tasks_where(|_| true))
            }
            TASK_REASSIGN => (REASSIGNMENT_NOT_SUPPORTED, Vec::new()),
            _ => (NOT_SUPPORTED, Vec::new()),
        };
        info!(
            function,
            lun,
            response,
            aborted = victims.len(),
            "task management"
        );
        self.abort(victims).await?;
        let mut answer = Bhs::new(Opcode::TaskManagementResponse);
        answer.set_final(true);
        answer.0[2] = response;
        answer.set_initiator_task_tag(bhs.initiator_task_tag());
        self.stamp(&mut answer, true);
        self.send(Pdu::new(answer, Bytes::new())).await?;
        // A cold reset ends the initiator's connections (SAM-5 §7.8).
        Ok(if function == TARGET_COLD_RESET {
            Flow::Close
        } else {
            Flow::Continue
        })
    }

    fn tasks_where(&self, on_lun: impl Fn(u64) -> bool) -> Vec<u32> {
        self.tasks
            .iter()
            .filter(|(_, task)| on_lun(task.lun))
            .map(|(itt, _)| *itt)
            .collect()
    }

    /// Ends the tasks tagged `victims` without answering them: those
    /// gathering data at once, those running once they have run. Other
    /// tasks that finish meanwhile are answered as usual.
    async fn abort(&mut self, victims: Vec<u32>) -> Result<()> {
        let mut running = HashSet::new();
        for itt in victims {
            if self.tasks.get(&itt).is_some_and(|task| task.is_gathering()) {
                self.forget(itt);
            } else {
                running.insert(itt);
            }
        }
        while !running.is_empty() {
            let Some((itt, completion)) = futures::StreamExt::next(&mut self.running).await else {
                break;
            };
            if running.remove(&itt) {
                self.forget(itt);
            } else {
                self.finish(itt, completion).await?;
            }
        }
        Ok(())
    }
}
