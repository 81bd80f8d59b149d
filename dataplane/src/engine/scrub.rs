//! Scrub: a paced background pass over every replica that finds rot before
//! a read does. Layer by layer (snapshots oldest first, then the head), in
//! 1 MiB chunks, every RW replica checks the blocks the layer holds against
//! their checksums; a rotten range is rewritten in that layer from another
//! replica whose copy of the chunk passed (`RepairLayer`). Then the
//! replicas' copies are compared: of a snapshot, first by a digest of what
//! the layer holds (taken by the same check, so the common case reads
//! nothing more), then, if those differ, by a digest of what the volume
//! read at the snapshot; of the head, by what the volume reads now. A
//! replica that differs from a majority takes the majority's copy (of a
//! snapshot's layer range, or through the `Repair` data op); with no
//! majority the chunk is only reported. Oldest first makes that sound: when
//! a snapshot's views differ, its older snapshots already agree there, so
//! the difference is in its own layer; where they could not be settled,
//! newer layers are compared and not replaced.
//!
//! A chunk of the head is checked holding its range, as a write does, so
//! no write is in flight there and the replicas must agree; every chunk
//! holds the gate shared, so no snapshot is taken or removed under it.
//! Progress and findings are in the engine's status (`ScrubStatus`).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering::Acquire;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use futures::future::join_all;
use tracing::{error, info, warn};

use super::member::{Member, Mode};
use super::repair::total;
use super::{Engine, EngineError};
use crate::pace::Pace;
use crate::protocol;
use crate::protocol::control::{
    DigestRangeRequest, LayerData, ReadLayerRequest, RepairLayerRequest, ReplicaStatusRequest,
    ScrubStatus, VerifyLayerRequest,
};
use crate::replica::VOLUME_HEAD;

/// The unit of a scrub's work.
const CHUNK: u64 = 1 << 20;

/// The scrub's status, shared with the status calls, and the turn of the
/// one scrub that runs at a time.
#[derive(Default)]
pub(super) struct Scrubs {
    status: Mutex<ScrubStatus>,
    one: Arc<tokio::sync::Mutex<()>>,
}

impl Scrubs {
    /// Counters only: a panic elsewhere while it was held leaves nothing
    /// half done.
    fn lock(&self) -> MutexGuard<'_, ScrubStatus> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

impl Engine {
    /// Starts a scrub in the background, reading at most `bytes_per_second`
    /// on each replica on average (0: no limit); false if one is running.
    pub fn start_scrub(&self, bytes_per_second: u64) -> bool {
        let Some(engine) = self.myself.upgrade() else {
            return false;
        };
        let Ok(turn) = self.scrubs.one.clone().try_lock_owned() else {
            return false;
        };
        // Running as the caller returns: the next status says so.
        self.begin_scrub();
        tokio::spawn(async move {
            let _turn = turn;
            let result = engine.scrub(bytes_per_second).await;
            engine.end_scrub(&result);
        });
        true
    }

    /// Runs a scrub to its end, after the one running if any.
    pub async fn run_scrub(&self, bytes_per_second: u64) -> Result<(), EngineError> {
        let _turn = self.scrubs.one.lock().await;
        self.begin_scrub();
        let result = self.scrub(bytes_per_second).await;
        self.end_scrub(&result);
        result
    }

    fn begin_scrub(&self) {
        *self.scrubs.lock() = ScrubStatus {
            running: true,
            started_unix: now(),
            ..ScrubStatus::default()
        };
    }

    fn end_scrub(&self, result: &Result<(), EngineError>) {
        let mut status = self.scrubs.lock();
        status.running = false;
        status.finished_unix = now();
        if let Err(e) = result {
            status.error = e.to_string();
        }
        info!(volume = %self.volume, status = ?*status, "scrub done");
    }

    /// The running or last scrub.
    pub fn scrub_status(&self) -> ScrubStatus {
        self.scrubs.lock().clone()
    }

    async fn scrub(&self, bytes_per_second: u64) -> Result<(), EngineError> {
        let pace = Pace::new(bytes_per_second);
        let mut layers = self.snapshot_names().await?;
        layers.push(VOLUME_HEAD.to_string());
        // Chunks whose copies an older snapshot left unsettled: there, which
        // replica is right is unknown, so newer layers are compared only.
        let mut unsettled = BTreeSet::new();
        for layer in &layers {
            let mut at = 0;
            while at < self.size.load(Acquire) {
                let len = CHUNK.min(self.size.load(Acquire) - at);
                pace.take(len).await;
                let may_replace = !unsettled.contains(&at);
                if !self.scrub_chunk(layer, at, len, may_replace).await {
                    unsettled.insert(at);
                }
                at += len;
            }
        }
        Ok(())
    }

    /// The snapshots, oldest first, as a RW replica has them.
    async fn snapshot_names(&self) -> Result<Vec<String>, EngineError> {
        let member = self
            .members_in(&[Mode::ReadWrite])
            .into_iter()
            .next()
            .ok_or(EngineError::NoHealthyReplica)?;
        let mut control = member.control.clone();
        let status = protocol::within_deadline(control.status(ReplicaStatusRequest {}))
            .await
            .map_err(|e| EngineError::Control(member.address.clone(), e))?;
        Ok(status
            .into_inner()
            .snapshots
            .into_iter()
            .map(|s| s.name)
            .collect())
    }

    /// Checks `layer`'s chunk on every RW replica and repairs what fails
    /// its checksums, then compares the replicas' copies; whether they
    /// agree in the end.
    async fn scrub_chunk(&self, layer: &str, at: u64, len: u64, may_replace: bool) -> bool {
        let _io = self.gate.read().await;
        let head = layer == VOLUME_HEAD;
        let _range = match head {
            true => Some(self.in_flight.lock(at, at + len).await),
            false => None,
        };
        let members = self.members_in(&[Mode::ReadWrite]);
        let checks = join_all(members.iter().map(|m| verify(m, layer, at, len))).await;
        let mut clean = Vec::new();
        let mut rotten = Vec::new();
        for (member, check) in members.iter().zip(checks) {
            match check {
                Ok(check) => {
                    let mut status = self.scrubs.lock();
                    status.checked_bytes += check.held_bytes;
                    status.rotten_bytes += total(&check.rotten);
                    drop(status);
                    match check.rotten.is_empty() {
                        true => clean.push((member.clone(), check.digest)),
                        false => rotten.push((member.clone(), check.rotten)),
                    }
                }
                // A snapshot this replica does not have: nothing to check.
                Err(status) if status.code() == tonic::Code::NotFound => {}
                Err(status) => {
                    warn!(volume = %self.volume, replica = %member.address, layer, at, %status, "scrub: check failed");
                }
            }
        }
        let donor = clean.first().map(|(member, _)| member);
        for (member, ranges) in rotten {
            self.repair_layer(&member, donor, layer, &ranges).await;
        }
        // Copies of a snapshot's layer that hold the same (the rotten ones
        // now hold the donor's): the snapshot reads alike everywhere. Heads
        // may hold differently and read alike (a rebuilt replica's).
        if !head && clean.windows(2).all(|pair| pair[0].1 == pair[1].1) {
            return true;
        }
        self.compare_chunk(&members, layer, at, len, may_replace)
            .await
    }

    /// Rewrites `ranges` of `layer` on `member` from `donor`'s copy.
    async fn repair_layer(
        &self,
        member: &Arc<Member>,
        donor: Option<&Arc<Member>>,
        layer: &str,
        ranges: &[(u64, u64)],
    ) {
        for &(offset, length) in ranges {
            let repaired = match donor {
                Some(donor) => copy_layer(donor, member, layer, offset, length).await,
                None => Err(tonic::Status::data_loss("no other replica's copy passes")),
            };
            let mut status = self.scrubs.lock();
            match repaired {
                Ok(()) => {
                    status.repaired_bytes += length;
                    info!(volume = %self.volume, replica = %member.address, layer, offset, length, "scrub repaired blocks that failed their checksums");
                }
                Err(e) => {
                    status.unrepaired_bytes += length;
                    error!(volume = %self.volume, replica = %member.address, layer, offset, length, error = %e, "scrub: rotten blocks left unrepaired");
                }
            }
        }
    }

    /// Compares what `[at, at + len)` reads on each of `members`, now (the
    /// head) or at snapshot `layer`; where a majority agrees, a replica
    /// that differs takes its copy, if `may_replace`. Whether the replicas
    /// agree in the end.
    async fn compare_chunk(
        &self,
        members: &[Arc<Member>],
        layer: &str,
        at: u64,
        len: u64,
        may_replace: bool,
    ) -> bool {
        let digests = join_all(members.iter().map(|m| digest(m, layer, at, len))).await;
        let mut groups: Vec<(u64, Vec<Arc<Member>>)> = Vec::new();
        for (member, digest) in members.iter().zip(digests) {
            // Rotten (repaired above, or reported), without the snapshot,
            // or unreachable: not a vote.
            let Ok(digest) = digest else { continue };
            match groups.iter_mut().find(|(d, _)| *d == digest) {
                Some((_, group)) => group.push(member.clone()),
                None => groups.push((digest, vec![member.clone()])),
            }
        }
        if groups.len() < 2 {
            return true;
        }
        let voters: usize = groups.iter().map(|(_, g)| g.len()).sum();
        self.scrubs.lock().mismatched_chunks += 1;
        if !may_replace {
            error!(volume = %self.volume, layer, at, len, "scrub: the replicas read this chunk differently, and an older snapshot's copies of it could not be settled; reported only");
            return false;
        }
        let Some(majority) = groups.iter().position(|(_, g)| g.len() * 2 > voters) else {
            error!(volume = %self.volume, layer, at, len, groups = groups.len(), "scrub: the replicas read this chunk differently and no majority agrees");
            return false;
        };
        let (_, agreed) = groups.swap_remove(majority);
        let minority = groups.into_iter().flat_map(|(_, g)| g).collect();
        let resolved = self
            .take_majority(&agreed[0], minority, layer, at, len)
            .await;
        if resolved {
            self.scrubs.lock().resolved_chunks += 1;
        }
        resolved
    }

    /// Gives each of `minority` `donor`'s copy of the chunk: of the head
    /// through the data path (the `Repair` op), of a snapshot's layer as
    /// the rotten blocks are. Whether all took it; one that could not
    /// leaves the I/O path.
    async fn take_majority(
        &self,
        donor: &Member,
        minority: Vec<Arc<Member>>,
        layer: &str,
        at: u64,
        len: u64,
    ) -> bool {
        let head = match layer == VOLUME_HEAD {
            true => match donor.data.read(at, len as u32).await {
                Ok(data) => Some(data),
                Err(e) => {
                    warn!(volume = %self.volume, at, error = %e, "scrub: reading the majority's copy failed");
                    return false;
                }
            },
            false => None,
        };
        let mut resolved = true;
        for member in minority {
            let taken = match &head {
                Some(data) => member
                    .data
                    .repair(at, data.clone())
                    .await
                    .map_err(|e| e.to_string()),
                None => copy_layer(donor, &member, layer, at, len)
                    .await
                    .map_err(|e| e.to_string()),
            };
            match taken {
                Ok(()) => {
                    warn!(volume = %self.volume, replica = %member.address, layer, at, len, "scrub: a replica read differently from the others; it took the majority's copy");
                }
                Err(e) => {
                    resolved = false;
                    self.fail(&member, &format!("scrub repair: {e}"));
                }
            }
        }
        resolved
    }
}

/// What `member`'s check of `layer`'s range found.
struct Check {
    held_bytes: u64,
    rotten: Vec<(u64, u64)>,
    digest: u64,
}

async fn verify(
    member: &Member,
    layer: &str,
    offset: u64,
    length: u64,
) -> Result<Check, tonic::Status> {
    let mut control = member.control.clone();
    let request = VerifyLayerRequest {
        layer: layer.to_string(),
        offset,
        length,
    };
    let check = protocol::within_deadline(control.verify_layer(request))
        .await?
        .into_inner();
    Ok(Check {
        held_bytes: check.held_bytes,
        rotten: check.rotten.iter().map(|r| (r.offset, r.length)).collect(),
        digest: check.digest,
    })
}

/// `member`'s digest of what the range reads at `view`.
async fn digest(
    member: &Member,
    view: &str,
    offset: u64,
    length: u64,
) -> Result<u64, tonic::Status> {
    let mut control = member.control.clone();
    let request = DigestRangeRequest {
        offset,
        length,
        view: view.to_string(),
    };
    Ok(protocol::within_deadline(control.digest_range(request))
        .await?
        .into_inner()
        .digest)
}

/// Replaces `[offset, offset + length)` of `layer` on `target` with
/// `donor`'s copy (the donor checks it on the way).
async fn copy_layer(
    donor: &Member,
    target: &Member,
    layer: &str,
    offset: u64,
    length: u64,
) -> Result<(), tonic::Status> {
    let mut source = donor.control.clone();
    let request = ReadLayerRequest {
        layer: layer.to_string(),
        offset,
        length,
    };
    let mut stream = source.read_layer(request).await?.into_inner();
    let mut runs: Vec<LayerData> = Vec::new();
    while let Some(run) = stream.next().await {
        runs.push(run?);
    }
    let mut control = target.control.clone();
    let request = RepairLayerRequest {
        layer: layer.to_string(),
        offset,
        length,
        runs,
    };
    protocol::within_deadline(control.repair_layer(request)).await?;
    Ok(())
}
