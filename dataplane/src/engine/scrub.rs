//! Scrub: a paced background pass over every replica that finds rot before
//! a read does. Layer by layer (snapshots oldest first, then the head), in
//! 1 MiB chunks, every RW replica checks the blocks the layer holds against
//! their checksums; a rotten range is rewritten from another replica whose
//! copy passed (of a snapshot, in its layer: `RepairLayer`; of the head,
//! with what the volume reads there: the `Repair` data op). Then the
//! replicas' copies are compared: of a snapshot, first by a digest of what
//! the layer holds (taken by the same check, so the common case reads
//! nothing more), then, if those differ, by a digest of what the volume
//! read at the snapshot; of the head, by what the volume reads now. A
//! replica that differs from a majority takes the majority's copy; just
//! repaired ones follow and do not vote; with no majority the chunk is only
//! reported.
//!
//! Oldest first makes replacing a snapshot's layer range sound on a replica
//! whose copies of every older snapshot agreed there ([`Trust`]): the
//! difference is then in that layer. On others it is only reported.
//!
//! A chunk of the head is checked holding its range, as a write does, so
//! no write is in flight there and the replicas must agree; every chunk
//! holds the gate shared, so no snapshot is taken or removed under it.
//! Progress and findings are in the engine's status (`ScrubStatus`).

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

/// The layer digest of a replica too old to compute one.
const NO_DIGEST: u64 = 0;

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
        let mut trust = Trust::default();
        for (depth, layer) in layers.iter().enumerate() {
            let mut at = 0;
            while at < self.size.load(Acquire) {
                let len = CHUNK.min(self.size.load(Acquire) - at);
                pace.take(len).await;
                let chunk = at / CHUNK;
                let trusted = |member: &Member| depth == 0 || trust.holds(chunk, &member.address);
                let agreed = self.scrub_chunk(layer, at, len, &trusted).await;
                trust.record(chunk, depth == 0, &agreed);
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
    /// its checksums, then compares the replicas' copies and settles those
    /// that differ from a majority's. Of a snapshot, only replicas
    /// `trusted` at the chunk have their layer range replaced. Returns the
    /// replicas whose copies agree in the end.
    async fn scrub_chunk(
        &self,
        layer: &str,
        at: u64,
        len: u64,
        trusted: &(dyn Fn(&Member) -> bool + Sync),
    ) -> Vec<String> {
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
                        false => rotten.push((member.clone(), check.rotten, check.digest)),
                    }
                }
                // A snapshot this replica does not have: nothing to check.
                Err(status) if status.code() == tonic::Code::NotFound => {}
                Err(status) => {
                    warn!(volume = %self.volume, replica = %member.address, layer, at, %status, "scrub: check failed");
                }
            }
        }
        // An older replica (no layer digest) cannot compare snapshots.
        let compared = |digest: u64| head || digest != NO_DIGEST;
        let agree = rotten.is_empty()
            && clean.iter().all(|(_, d)| compared(*d) && *d == clean[0].1)
            && !head;
        if agree {
            return clean.iter().map(|(m, _)| m.address.clone()).collect();
        }
        let donors: Vec<Arc<Member>> = clean.iter().map(|(m, _)| m.clone()).collect();
        let mut voters: Vec<Arc<Member>> = clean
            .into_iter()
            .filter(|(_, d)| compared(*d))
            .map(|(m, _)| m)
            .collect();
        let mut followers = Vec::new();
        for (member, ranges, digest) in rotten {
            let allowed = head || trusted(&member);
            let repaired = self.repair_rot(&member, &donors, layer, &ranges, allowed);
            match repaired.await {
                // Too old to digest a snapshot: repaired, and no more.
                _ if !compared(digest) => {}
                // Given what every clean replica holds: its vote is its own.
                Repaired::Unanimous => voters.push(member),
                // Given a copy some clean replica does not hold: it
                // follows, lest the repair make the majority.
                Repaired::FromOne => followers.push(member),
                Repaired::Not => {}
            }
        }
        self.compare_chunk(voters, followers, layer, at, len, trusted)
            .await
    }

    /// Rewrites `ranges` of `layer` on `member` from the copy most of
    /// `donors` hold, if `allowed`; and how.
    async fn repair_rot(
        &self,
        member: &Arc<Member>,
        donors: &[Arc<Member>],
        layer: &str,
        ranges: &[(u64, u64)],
        allowed: bool,
    ) -> Repaired {
        let mut result = Repaired::Unanimous;
        for &(offset, length) in ranges {
            let repaired = match allowed {
                false => Err("its older snapshots' copies here are unsettled".to_string()),
                true => {
                    self.copy_agreed(donors, member, layer, offset, length)
                        .await
                }
            };
            let mut status = self.scrubs.lock();
            match repaired {
                Ok(unanimous) => {
                    status.repaired_bytes += length;
                    if !unanimous && result == Repaired::Unanimous {
                        result = Repaired::FromOne;
                    }
                    info!(volume = %self.volume, replica = %member.address, layer, offset, length, unanimous, "scrub repaired blocks that failed their checksums");
                }
                Err(e) => {
                    result = Repaired::Not;
                    status.unrepaired_bytes += length;
                    error!(volume = %self.volume, replica = %member.address, layer, offset, length, error = %e, "scrub: rotten blocks left unrepaired");
                }
            }
        }
        result
    }

    /// Gives `target` the copy of the range most of `donors` (clean
    /// replicas) hold, compared by what it reads, now or at the snapshot;
    /// whether all of them hold it. With no majority, nothing: which copy
    /// is right is unknown, and a rotten block is better left known bad.
    async fn copy_agreed(
        &self,
        donors: &[Arc<Member>],
        target: &Member,
        layer: &str,
        offset: u64,
        length: u64,
    ) -> Result<bool, String> {
        let prints = join_all(donors.iter().map(|d| digest(d, layer, offset, length))).await;
        let mut groups: Vec<(u64, &Arc<Member>, usize)> = Vec::new();
        for (donor, print) in donors.iter().zip(&prints) {
            let Ok(print) = print else { continue };
            match groups.iter_mut().find(|(p, _, _)| p == print) {
                Some((_, _, count)) => *count += 1,
                None => groups.push((*print, donor, 1)),
            }
        }
        let answered: usize = groups.iter().map(|(_, _, n)| n).sum();
        let Some(&(_, donor, count)) = groups.iter().find(|(_, _, n)| n * 2 > answered) else {
            return Err(format!(
                "the other replicas' copies differ ({} copies among {answered})",
                groups.len()
            ));
        };
        let copy = Copy::read(donor, layer, offset, length).await?;
        copy.write(target).await?;
        Ok(count == donors.len())
    }

    /// Compares what `[at, at + len)` reads, now (the head) or at snapshot
    /// `layer`, on `voters` and `followers` (replicas just repaired, which
    /// do not vote). Where a majority of voters agrees, those that differ
    /// take its copy (of a snapshot, only the `trusted`); with none, the
    /// chunk is only reported. Returns the replicas that agree in the end.
    async fn compare_chunk(
        &self,
        voters: Vec<Arc<Member>>,
        followers: Vec<Arc<Member>>,
        layer: &str,
        at: u64,
        len: u64,
        trusted: &(dyn Fn(&Member) -> bool + Sync),
    ) -> Vec<String> {
        let head = layer == VOLUME_HEAD;
        let everyone: Vec<_> = voters.iter().chain(&followers).cloned().collect();
        let digests = join_all(everyone.iter().map(|m| digest(m, layer, at, len))).await;
        // Unreachable, rotten (reported above) or without the snapshot: no
        // vote, and not among those that agree.
        let answered: Vec<(Arc<Member>, u64, bool)> = everyone
            .into_iter()
            .zip(digests)
            .enumerate()
            .filter_map(|(i, (m, d))| Some((m, d.ok()?, i < voters.len())))
            .collect();
        let mut groups: Vec<(u64, usize)> = Vec::new();
        for (_, digest, _) in answered.iter().filter(|(_, _, votes)| *votes) {
            match groups.iter_mut().find(|(d, _)| d == digest) {
                Some((_, count)) => *count += 1,
                None => groups.push((*digest, 1)),
            }
        }
        let votes: usize = groups.iter().map(|(_, n)| n).sum();
        let Some(&(agreed, _)) = groups.iter().find(|(_, n)| n * 2 > votes) else {
            if !groups.is_empty() {
                self.scrubs.lock().mismatched_chunks += 1;
                error!(volume = %self.volume, layer, at, len, groups = groups.len(), "scrub: the replicas read this chunk differently and no majority agrees");
            }
            return Vec::new();
        };
        let (same, differ): (Vec<_>, Vec<_>) =
            answered.into_iter().partition(|(_, d, _)| *d == agreed);
        let mut agreeing: Vec<String> = same.iter().map(|(m, _, _)| m.address.clone()).collect();
        if differ.is_empty() {
            return agreeing;
        }
        self.scrubs.lock().mismatched_chunks += 1;
        let (allowed, refused): (Vec<_>, Vec<_>) = differ
            .into_iter()
            .map(|(m, _, _)| m)
            .partition(|m| head || trusted(m));
        for member in &refused {
            error!(volume = %self.volume, replica = %member.address, layer, at, len, "scrub: a replica reads this snapshot differently, and its older snapshots' copies here are unsettled; reported only");
        }
        let donor = same.iter().find(|(_, _, votes)| *votes).map(|(m, _, _)| m);
        let taken = match donor {
            Some(donor) => self.take_majority(donor, &allowed, layer, at, len).await,
            None => Vec::new(),
        };
        if refused.is_empty() && taken.len() == allowed.len() {
            self.scrubs.lock().resolved_chunks += 1;
        }
        agreeing.extend(taken);
        agreeing
    }

    /// Gives each of `minority` `donor`'s copy of the chunk; returns those
    /// that took it. One that could not leaves the I/O path.
    async fn take_majority(
        &self,
        donor: &Member,
        minority: &[Arc<Member>],
        layer: &str,
        at: u64,
        len: u64,
    ) -> Vec<String> {
        let copy = match Copy::read(donor, layer, at, len).await {
            Ok(copy) => copy,
            Err(e) => {
                warn!(volume = %self.volume, replica = %donor.address, layer, at, error = %e, "scrub: reading the majority's copy failed");
                return Vec::new();
            }
        };
        let mut taken = Vec::new();
        for member in minority {
            match copy.write(member).await {
                Ok(()) => {
                    warn!(volume = %self.volume, replica = %member.address, layer, at, len, "scrub: a replica read differently from the others; it took the majority's copy");
                    taken.push(member.address.clone());
                }
                Err(e) => self.fail(member, &format!("scrub repair: {e}")),
            }
        }
        taken
    }
}

/// Per chunk, which replicas' copies agreed at every snapshot scrubbed so
/// far: the only ones a newer snapshot's layer range may be replaced on.
/// Replicas are numbered as the scrub meets them; past 64, none is trusted.
#[derive(Default)]
struct Trust {
    roster: Vec<String>,
    /// A bit per roster entry, per chunk.
    agreed: Vec<u64>,
}

impl Trust {
    /// The bit of the replica at `address`, numbering it if new; 0 past 64.
    fn bit(&mut self, address: &str) -> u64 {
        if !self.roster.iter().any(|a| a == address) {
            self.roster.push(address.to_string());
        }
        self.known_bit(address)
    }

    /// The bit of a replica already numbered; 0 for others, and past 64.
    fn known_bit(&self, address: &str) -> u64 {
        self.roster
            .iter()
            .position(|a| a == address)
            .and_then(|index| u32::try_from(index).ok())
            .and_then(|index| 1u64.checked_shl(index))
            .unwrap_or(0)
    }

    fn holds(&self, chunk: u64, address: &str) -> bool {
        let mask = usize::try_from(chunk)
            .ok()
            .and_then(|c| self.agreed.get(c))
            .copied()
            .unwrap_or(0);
        mask & self.known_bit(address) != 0
    }

    /// Records who agreed at `chunk` of a layer: from scratch at the
    /// oldest, else those that also agreed at every older one.
    fn record(&mut self, chunk: u64, oldest: bool, agreed: &[String]) {
        let mask = agreed.iter().fold(0, |mask, a| mask | self.bit(a));
        let Ok(chunk) = usize::try_from(chunk) else {
            return;
        };
        if self.agreed.len() <= chunk {
            self.agreed.resize(chunk + 1, 0);
        }
        self.agreed[chunk] = match oldest {
            true => mask,
            false => self.agreed[chunk] & mask,
        };
    }
}

/// How a rotten replica's ranges were rewritten.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Repaired {
    /// With the copy every clean replica holds.
    Unanimous,
    /// With the copy most clean replicas hold, not all.
    FromOne,
    /// Not all of them.
    Not,
}

/// A replica's copy of a range: of the head, what the volume reads there;
/// of a snapshot, the runs its layer holds.
enum Copy<'a> {
    Head(u64, bytes::Bytes),
    Layer(&'a str, u64, u64, Vec<LayerData>),
}

impl<'a> Copy<'a> {
    async fn read(
        donor: &Member,
        layer: &'a str,
        offset: u64,
        length: u64,
    ) -> Result<Copy<'a>, String> {
        if layer == VOLUME_HEAD {
            let length = u32::try_from(length).map_err(|e| e.to_string())?;
            let data = donor
                .data
                .read(offset, length)
                .await
                .map_err(|e| e.to_string())?;
            return Ok(Copy::Head(offset, data));
        }
        let mut source = donor.control.clone();
        let request = ReadLayerRequest {
            layer: layer.to_string(),
            offset,
            length,
        };
        let read = async {
            let mut stream = source.read_layer(request).await?.into_inner();
            let mut runs = Vec::new();
            while let Some(run) = stream.next().await {
                runs.push(run?);
            }
            Ok::<_, tonic::Status>(runs)
        };
        let runs = read.await.map_err(|e| e.to_string())?;
        Ok(Copy::Layer(layer, offset, length, runs))
    }

    async fn write(&self, target: &Member) -> Result<(), String> {
        match self {
            Copy::Head(offset, data) => target
                .data
                .repair(*offset, data.clone())
                .await
                .map_err(|e| e.to_string()),
            Copy::Layer(layer, offset, length, runs) => {
                let mut control = target.control.clone();
                let request = RepairLayerRequest {
                    layer: (*layer).to_string(),
                    offset: *offset,
                    length: *length,
                    runs: runs.clone(),
                };
                protocol::within_deadline(control.repair_layer(request))
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn agreed(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_string()).collect()
    }

    /// A replica is trusted at a chunk only if it agreed there at every
    /// older layer; one first met at a newer layer never is.
    #[test]
    fn trust_is_what_every_older_layer_agreed() {
        let mut trust = Trust::default();
        trust.record(0, true, &agreed(&["a", "b", "c"]));
        trust.record(1, true, &agreed(&["a", "b"]));
        trust.record(0, false, &agreed(&["a", "c", "d"]));
        assert!(trust.holds(0, "a") && trust.holds(0, "c"));
        assert!(!trust.holds(0, "b"), "b did not agree at the second layer");
        assert!(!trust.holds(0, "d"), "d missed the first layer");
        assert!(trust.holds(1, "b") && !trust.holds(1, "c"));
        assert!(!trust.holds(7, "a"), "a chunk no layer recorded");
        assert!(!trust.holds(0, "e"));
    }
}
