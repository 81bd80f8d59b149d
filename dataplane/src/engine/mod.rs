//! The engine: replicates a volume's I/O to its replicas.
//!
//! Every write goes to all replicas in RW or WO mode at once and is
//! acknowledged when each of them has acknowledged it or has been taken out
//! of the I/O path. Reads go to RW replicas only, spread over them and retried
//! on another one when one fails; blocks a replica finds rotten are read
//! from another and repaired (`repair.rs`). With no RW replica left, I/O
//! fails with EIO.
//! Snapshots, rebuild hand-offs and expansion happen at a quiesced point: I/O
//! holds the gate shared, those operations hold it exclusively. Overlapping
//! writes and discards are applied one after the other, in the order they
//! arrived, so that every replica applies them in the same order (see
//! `ranges.rs`).
//!
//! The engine acts for one generation, which the controller raises each time
//! it starts an engine for the volume: replicas refuse older ones, so an
//! engine left behind on an unreachable node cannot write once a newer one
//! has connected. Which replicas are in the I/O path is recorded on the
//! replicas (`io_path.rs`): an engine serves only from the newest I/O path.

mod control;
mod io_path;
mod io_stats;
mod member;
mod process;
mod ranges;
mod rebuild;
mod repair;
mod scrub;
mod status;

pub use control::EngineControlService;
pub use member::{Mode, control_address};
pub use process::{CHAP_MIN_SECRET, EngineConfig, FrontendKind, chap_env, run};

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, Weak};

use bytes::Bytes;
use futures::future::join_all;
use tracing::{info, warn};

use crate::frontend::{BlockDevice, FrontendError};
use crate::protocol::control::replica_control_client::ReplicaControlClient;
use crate::protocol::control::{ReplicaStatus, SnapshotRequest};
use crate::protocol::{self, Access, ConnectionError, MAX_PAYLOAD, Status, TokenChannel};
use io_stats::IoStats;
use member::Member;
use ranges::RangeLocks;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("no healthy (RW) replica is left")]
    NoHealthyReplica,
    #[error(
        "no replica holds a copy of the data at {0:?} (offset, length) that passes its checksums"
    )]
    NoGoodCopy(Vec<(u64, u64)>),
    #[error("invalid replica address {0:?}: {1}")]
    InvalidAddress(String, String),
    #[error(transparent)]
    Replica(#[from] ConnectionError),
    #[error("replica {0} control: {1}")]
    Control(String, tonic::Status),
    #[error("replica {0} is already in the volume")]
    AlreadyMember(String),
    #[error("replica {0} is not in the volume")]
    NotMember(String),
    #[error("cannot shrink the volume from {0} to {1} bytes")]
    CannotShrink(u64, u64),
    #[error(
        "replicas {missing:?} of the volume's newest I/O path (generation {generation}, \
         version {version}) cannot be reached: another replica may lack acknowledged writes, \
         so the volume waits for them (or an operator salvages it)"
    )]
    IoPathUnreachable {
        missing: Vec<String>,
        generation: u64,
        version: u64,
    },
    // The `oxhorn engine` process's own failures, which end it.
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("{address}: {source}")]
    Listen {
        address: SocketAddr,
        source: io::Error,
    },
    #[error("frontend: {0}")]
    Frontend(#[from] FrontendError),
    #[error("a task stopped unexpectedly: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("gRPC server: {0}")]
    Serve(#[from] tonic::transport::Error),
}

impl EngineError {
    /// A refusal caused by the request, not by the replica's health.
    fn is_callers_fault(&self) -> bool {
        match self {
            EngineError::Replica(ConnectionError::Remote { status, .. }) => {
                *status == Status::InvalidArgument
            }
            EngineError::Control(_, status) => matches!(
                status.code(),
                tonic::Code::InvalidArgument | tonic::Code::NotFound | tonic::Code::AlreadyExists
            ),
            _ => false,
        }
    }

    /// A replica refused to hand over data that fails its checksums.
    fn is_data_loss(&self) -> bool {
        matches!(self, EngineError::Control(_, status) if status.code() == tonic::Code::DataLoss)
    }

    fn is_no_space(&self) -> bool {
        match self {
            EngineError::Replica(ConnectionError::Remote { status, .. }) => {
                *status == Status::NoSpace
            }
            EngineError::Control(_, status) => status.code() == tonic::Code::ResourceExhausted,
            _ => false,
        }
    }
}

pub struct Engine {
    volume: String,
    /// The volume's key and this engine's generation.
    access: Access,
    /// What this engine last recorded as the I/O path.
    recorded: tokio::sync::Mutex<io_path::Recorded>,
    /// A replica left the I/O path since the last record.
    path_changed: AtomicBool,
    size: AtomicU64,
    members: RwLock<Vec<Arc<Member>>>,
    /// Replicas named at start that could not be reached, with why.
    absent: RwLock<Vec<(String, String)>>,
    gate: tokio::sync::RwLock<()>,
    /// Writes and discards in flight, by byte range.
    in_flight: RangeLocks,
    next_read: AtomicUsize,
    /// Tells the frontend the volume grew.
    resized: tokio::sync::watch::Sender<u64>,
    /// Bytes per second each rebuild started from now on may average (0:
    /// no limit); the controller sets it from its Setting.
    rebuild_limit: AtomicU64,
    /// The frontend's I/O: ops, bytes, errors, latencies.
    io_stats: IoStats,
    scrubs: scrub::Scrubs,
    myself: Weak<Engine>,
}

/// The rebuild bandwidth limit until the controller sets one: 100 MiB/s,
/// the default of its Setting, so a rebuild that starts with the engine is
/// limited too.
pub const DEFAULT_REBUILD_LIMIT: u64 = 100 << 20;

impl Engine {
    /// Connects to the replicas as `access.generation`, fencing older
    /// engines. Serves only if it reaches every replica of the newest I/O
    /// path recorded on those it reaches (see `io_path.rs`), unless
    /// `salvage`. Of those, the ones with the highest revision counter become
    /// RW; the others are rebuilt from them in the background.
    pub async fn start(
        access: &Access,
        size: u64,
        addresses: &[String],
        salvage: bool,
    ) -> Result<Arc<Self>, EngineError> {
        let engine = Arc::new_cyclic(|myself| Self {
            volume: access.volume.clone(),
            access: access.clone(),
            recorded: Default::default(),
            path_changed: AtomicBool::new(false),
            size: AtomicU64::new(size),
            members: RwLock::new(Vec::new()),
            absent: RwLock::new(Vec::new()),
            gate: tokio::sync::RwLock::new(()),
            in_flight: RangeLocks::default(),
            next_read: AtomicUsize::new(0),
            resized: tokio::sync::watch::Sender::new(size),
            rebuild_limit: AtomicU64::new(DEFAULT_REBUILD_LIMIT),
            io_stats: IoStats::default(),
            scrubs: Default::default(),
            myself: myself.clone(),
        });
        let connected = join_all(addresses.iter().map(|a| Member::connect(a, access))).await;
        let mut reachable = Vec::new();
        for (address, result) in addresses.iter().zip(connected) {
            match result {
                Ok((member, status)) if status.size == size => {
                    reachable.push((Arc::new(member), status))
                }
                Ok((_, status)) => engine.mark_absent(
                    address,
                    format!("replica size {} is not the volume's {size}", status.size),
                ),
                Err(error) => engine.mark_absent(address, error.to_string()),
            }
        }
        let newest = io_path::newest(reachable.iter().map(|(_, s)| s));
        if let Some(newest) = &newest {
            let missing = io_path::missing(newest, reachable.iter().map(|(_, s)| s));
            if !missing.is_empty() && !salvage {
                return Err(EngineError::IoPathUnreachable {
                    missing,
                    generation: newest.generation,
                    version: newest.version,
                });
            }
            if !missing.is_empty() {
                warn!(volume = %access.volume, ?missing, "salvage: serving without replicas of the newest I/O path");
            }
        }
        // A process of the same generation ran before (the instance manager
        // restarted a crashed engine): go on from its records.
        let seen = reachable
            .iter()
            .filter_map(|(_, s)| s.io_path.as_ref())
            .filter(|p| p.generation == access.generation)
            .map(|p| p.version)
            .max();
        engine.recorded.lock().await.resume_after(seen.unwrap_or(0));
        // Salvage trusts what it reaches; otherwise only the newest path.
        let members = newest.filter(|_| !salvage).map(|p| p.members);
        engine.place(reachable, members.as_deref());
        engine.record_io_path(None).await?;
        Ok(engine)
    }

    fn mark_absent(&self, address: &str, reason: String) {
        warn!(volume = %self.volume, replica = address, %reason, "replica not usable");
        write(&self.absent).push((address.to_string(), reason));
    }

    /// Makes the most up-to-date replicas RW, then rebuilds the rest from
    /// them. A replica marked as mid-rebuild is never trusted, whatever its
    /// counter says. After an unclean stop, replicas with the same counter
    /// may still differ where writes were in flight: then only one of them
    /// (a clean one if any) becomes RW and the others are rebuilt from it.
    /// Only members of the newest I/O path (`members`, when there is a
    /// record) are candidates: any other replica missed writes.
    /// Without a record (salvage), the replicas' own records of the I/O
    /// path rank them first: one that left the path keeps an older record
    /// than those that stayed and took more writes, and a counter alone
    /// may lag the last seconds' writes after a power loss (`revision.rs`).
    fn place(&self, mut reachable: Vec<(Arc<Member>, ReplicaStatus)>, members: Option<&[String]>) {
        let trusted = |s: &ReplicaStatus| {
            !s.rebuilding && members.is_none_or(|members| members.contains(&s.id))
        };
        let rank = |s: &ReplicaStatus| rank(s, members.is_none());
        let newest = reachable
            .iter()
            .filter(|(_, s)| trusted(s))
            .map(|(_, s)| rank(s))
            .max();
        let current = |s: &ReplicaStatus| trusted(s) && Some(rank(s)) == newest;
        let unclean = reachable.iter().any(|(_, s)| current(s) && s.dirty);
        // Clean replicas first: they are the ones to trust.
        reachable.sort_by_key(|(_, s)| s.dirty);
        let mut stale = Vec::new();
        for (member, status) in reachable {
            self.watch(&member);
            write(&self.members).push(member.clone());
            let have_rw = !self.members_in(&[Mode::ReadWrite]).is_empty();
            if current(&status) && !(unclean && have_rw) {
                member.set_mode(Mode::ReadWrite);
                info!(volume = %self.volume, replica = %member.address, revision = status.revision, "replica RW");
            } else {
                member.queue_rebuild(&format!(
                    "revision {} (newest {newest:?}, unclean stop: {unclean}) or rebuild unfinished",
                    status.revision
                ));
                stale.push(member);
            }
        }
        for member in stale {
            self.spawn_rebuild(member);
        }
    }

    /// Fails the member as soon as its connection closes, even when idle.
    fn watch(&self, member: &Arc<Member>) {
        let (engine, member) = (self.myself.clone(), member.clone());
        tokio::spawn(async move {
            let reason = member.data.closed().await;
            if let Some(engine) = engine.upgrade() {
                engine.fail(&member, &reason);
            }
        });
    }

    fn fail(&self, member: &Member, reason: &str) {
        // Before the member leaves: whoever sees it gone also sees this.
        self.path_changed.store(true, Ordering::Release);
        if member.fail(reason) {
            warn!(volume = %self.volume, replica = %member.address, reason, "replica ERR: out of the I/O path");
        }
    }

    pub fn volume(&self) -> &str {
        &self.volume
    }

    /// The volume's I/O counters and histograms, and what rebuilds and read
    /// repair did (`io_stats.rs`).
    pub fn metrics(&self) -> crate::protocol::control::EngineMetrics {
        self.io_stats.snapshot()
    }

    fn members_in(&self, modes: &[Mode]) -> Vec<Arc<Member>> {
        read(&self.members)
            .iter()
            .filter(|m| modes.contains(&m.mode()))
            .cloned()
            .collect()
    }

    /// Sends `op` to every RW and WO replica; succeeds when at least one RW
    /// replica did and every other either did or is now out of the I/O path
    /// (its data no longer matches the others'). A refusal that is the
    /// caller's fault (a bad offset, a snapshot that exists already) fails
    /// no replica and is the answer, but only once every replica that
    /// failed otherwise is out of the I/O path: a replica that answered
    /// "exists already" must not hide one that did not take the snapshot.
    /// A full disk that every replica reports fails none either.
    async fn to_all<F, Fut>(&self, what: &str, op: F) -> Result<(), EngineError>
    where
        F: Fn(Arc<Member>) -> Fut,
        Fut: Future<Output = Result<(), EngineError>>,
    {
        let targets = self.members_in(&[Mode::ReadWrite, Mode::WriteOnly]);
        let results = join_all(targets.iter().map(|m| op(m.clone()))).await;
        let mut healthy = 0;
        let mut refused = None;
        let mut failed = Vec::new();
        for (member, result) in targets.iter().zip(results) {
            match result {
                Ok(()) if member.mode() == Mode::ReadWrite => healthy += 1,
                Ok(()) => {}
                Err(error) if error.is_callers_fault() => refused = Some(error),
                Err(error) => failed.push((member, error)),
            }
        }
        // Every replica out of space: none diverged from the others, so all
        // stay in the I/O path and the caller learns the disk is full.
        if healthy == 0
            && refused.is_none()
            && failed.iter().all(|(_, e)| e.is_no_space())
            && let Some((_, error)) = failed.pop()
        {
            return Err(error);
        }
        for (member, error) in &failed {
            self.fail(member, &format!("{what}: {error}"));
        }
        if let Some(error) = refused {
            return Err(error);
        }
        if healthy == 0 {
            return Err(EngineError::NoHealthyReplica);
        }
        // A replica that left must be off the record before the success is
        // answered: it lacks what was just done.
        self.settle_io_path().await
    }

    /// Sends a data-protocol op to every RW and WO replica (see [`Self::to_all`]).
    async fn replicate<F, Fut>(&self, what: &str, op: F) -> Result<(), EngineError>
    where
        F: Fn(Arc<Member>) -> Fut,
        Fut: Future<Output = Result<(), ConnectionError>>,
    {
        self.to_all(what, |m| {
            let done = op(m);
            async move { done.await.map_err(EngineError::from) }
        })
        .await
    }

    /// Runs a control call on every RW and WO replica (see [`Self::to_all`]).
    async fn control_all<F, Fut>(&self, what: &str, call: F) -> Result<(), EngineError>
    where
        F: Fn(ReplicaControlClient<TokenChannel>) -> Fut,
        Fut: Future<Output = Result<(), tonic::Status>>,
    {
        self.to_all(what, |m| {
            let done = protocol::within_deadline(call(m.control.clone()));
            async move {
                done.await
                    .map_err(|status| EngineError::Control(m.address.clone(), status))
            }
        })
        .await
    }

    async fn read_from_one(&self, offset: u64, length: u32) -> Result<Bytes, EngineError> {
        loop {
            let mut readable = self.members_in(&[Mode::ReadWrite]);
            keep_nearest(&mut readable, |m| m.data.is_local());
            if readable.is_empty() {
                return Err(EngineError::NoHealthyReplica);
            }
            let member = &readable[self.next_read.fetch_add(1, Ordering::Relaxed) % readable.len()];
            match member.data.read(offset, length).await {
                Ok(data) => return Ok(data),
                Err(ConnectionError::Corrupt { ranges, data, .. }) => {
                    return self.repair_read(member, offset, ranges, data).await;
                }
                Err(error) => {
                    let error = EngineError::from(error);
                    if error.is_callers_fault() {
                        return Err(error);
                    }
                    self.fail(member, &format!("read: {error}"));
                }
            }
        }
    }

    /// Takes a snapshot named `name` on every RW and WO replica at one point:
    /// no I/O is in flight while it is taken.
    pub async fn snapshot(&self, name: &str, user_created: bool) -> Result<(), EngineError> {
        let _quiet = self.gate.write().await;
        self.snapshot_quiesced(name, user_created).await
    }

    async fn snapshot_quiesced(&self, name: &str, user_created: bool) -> Result<(), EngineError> {
        self.replicate("flush", |m| async move { m.data.flush().await })
            .await?;
        let request = SnapshotRequest {
            name: name.to_string(),
            user_created,
            labels: Default::default(),
        };
        self.control_all("snapshot", |mut m| {
            let request = request.clone();
            async move { m.snapshot(request).await.map(drop) }
        })
        .await
    }

    /// Removes a snapshot on every replica, merging its data into its child.
    pub async fn remove_snapshot(&self, name: &str) -> Result<(), EngineError> {
        let _quiet = self.gate.write().await;
        self.control_all("remove snapshot", |mut m| {
            let name = name.to_string();
            async move {
                m.remove_snapshot(crate::protocol::control::RemoveSnapshotRequest { name })
                    .await
                    .map(drop)
            }
        })
        .await
    }

    /// Grows the volume on every replica at a quiesced point.
    pub async fn expand(&self, size: u64) -> Result<(), EngineError> {
        let _quiet = self.gate.write().await;
        let current = self.size.load(Ordering::Acquire);
        if size < current {
            return Err(EngineError::CannotShrink(current, size));
        }
        self.control_all("expand", |mut m| async move {
            m.expand(crate::protocol::control::ExpandRequest { size })
                .await
                .map(drop)
        })
        .await?;
        self.size.store(size, Ordering::Release);
        self.resized.send_replace(size);
        Ok(())
    }

    /// Stops cleanly: waits for I/O in flight, flushes, and marks the RW
    /// replicas clean, so the next start trusts all of them without a rebuild.
    pub async fn shut_down(&self) -> Result<(), EngineError> {
        let _quiet = self.gate.write().await;
        self.replicate("flush", |m| async move { m.data.flush().await })
            .await?;
        self.control_all("mark clean", |mut m| async move {
            m.mark_clean(crate::protocol::control::MarkCleanRequest {})
                .await
                .map(drop)
        })
        .await
    }

    /// Changes each time the volume grows, to its new size.
    pub fn watch_size(&self) -> tokio::sync::watch::Receiver<u64> {
        self.resized.subscribe()
    }
}

impl Drop for Engine {
    /// Closes the replica connections, which also ends their watchers.
    fn drop(&mut self) {
        for member in read(&self.members).iter() {
            member.data.close("engine stopped");
        }
    }
}

/// The end of `[offset, offset + length)`; EINVAL past the largest offset.
fn end(offset: u64, length: u64) -> io::Result<u64> {
    offset
        .checked_add(length)
        .ok_or_else(|| io::Error::from_raw_os_error(nix::libc::EINVAL))
}

/// Keeps the replicas to read from: those on this node when there are any
/// (their reads skip the network, as Longhorn's data locality intends),
/// else all.
fn keep_nearest<T>(readable: &mut Vec<T>, local: impl Fn(&T) -> bool) {
    if readable.iter().any(&local) {
        readable.retain(local);
    }
}

/// Splits `[offset, offset + length)` into pieces one frame can carry.
fn pieces(offset: u64, length: u64) -> impl Iterator<Item = (u64, u64)> {
    let step = u64::from(MAX_PAYLOAD);
    (0..length.div_ceil(step)).map(move |i| (offset + i * step, step.min(length - i * step)))
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // Every write below is one push, remove or retain: never left torn.
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl From<EngineError> for io::Error {
    fn from(error: EngineError) -> Self {
        match error {
            EngineError::Replica(error) => error.into(),
            EngineError::CannotShrink(..) | EngineError::InvalidAddress(..) => {
                io::Error::from_raw_os_error(nix::libc::EINVAL)
            }
            _ => io::Error::from_raw_os_error(nix::libc::EIO),
        }
    }
}

/// How current a replica is, higher first: its revision counter, and in a
/// salvage first its own record of the I/O path (see [`Engine::place`]).
fn rank(status: &ReplicaStatus, salvage: bool) -> (Option<(u64, u64)>, u64) {
    let record = status.io_path.as_ref().filter(|_| salvage);
    (record.map(|p| (p.generation, p.version)), status.revision)
}

/// The frontend's I/O, measured by the [`BlockDevice`] methods below.
impl Engine {
    async fn read_volume(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        let _io = self.gate.read().await;
        if (1..=u64::from(MAX_PAYLOAD)).contains(&(len as u64)) {
            // One frame: its data as it came, without a copy.
            return Ok(self.read_from_one(offset, len as u32).await?);
        }
        let mut out = bytes::BytesMut::with_capacity(len);
        for (at, length) in pieces(offset, len as u64) {
            out.extend_from_slice(&self.read_from_one(at, length as u32).await?);
        }
        Ok(out.freeze())
    }

    async fn write_volume(&self, offset: u64, data: Bytes) -> io::Result<()> {
        let _io = self.gate.read().await;
        let _range = self
            .in_flight
            .lock(offset, end(offset, data.len() as u64)?)
            .await;
        for (at, length) in pieces(offset, data.len() as u64) {
            let start = (at - offset) as usize;
            let piece = data.slice(start..start + length as usize);
            self.replicate("write", |m| {
                let piece = piece.clone();
                async move { m.data.write(at, piece).await }
            })
            .await?;
        }
        Ok(())
    }

    async fn flush_volume(&self) -> io::Result<()> {
        let _io = self.gate.read().await;
        Ok(self
            .replicate("flush", |m| async move { m.data.flush().await })
            .await?)
    }

    async fn unmap_volume(&self, offset: u64, len: u64) -> io::Result<()> {
        let _io = self.gate.read().await;
        let _range = self.in_flight.lock(offset, end(offset, len)?).await;
        for (at, length) in pieces(offset, len) {
            self.replicate(
                "unmap",
                |m| async move { m.data.unmap(at, length as u32).await },
            )
            .await?;
        }
        Ok(())
    }
}

/// Each op's latency is the whole op as the frontend sees it: the wait for
/// the gate (behind a snapshot or an expansion) and for overlapping writes
/// and discards in flight is part of it, as it is of the application's.
impl BlockDevice for Engine {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    async fn read(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        let read = self.read_volume(offset, len);
        self.io_stats.read.measure(len as u64, read).await
    }

    async fn write(&self, offset: u64, data: Bytes) -> io::Result<()> {
        let bytes = data.len() as u64;
        let write = self.write_volume(offset, data);
        self.io_stats.write.measure(bytes, write).await
    }

    async fn flush(&self) -> io::Result<()> {
        self.io_stats.flush.measure(0, self.flush_volume()).await
    }

    async fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        let unmap = self.unmap_volume(offset, len);
        self.io_stats.unmap.measure(len, unmap).await
    }
}

#[cfg(test)]
mod tests {
    use super::{keep_nearest, pieces, rank};
    use crate::protocol::control::{IoPath, ReplicaStatus};

    /// A replica that left the I/O path at version 2 reports its exact
    /// counter; one that stayed lost power, and its counter file lags.
    #[test]
    fn a_salvage_ranks_who_stayed_in_the_io_path_above_a_higher_counter() {
        let status = |revision, version| ReplicaStatus {
            revision,
            io_path: Some(IoPath {
                generation: 3,
                version,
                members: Vec::new(),
            }),
            ..ReplicaStatus::default()
        };
        let (left, stayed) = (status(100, 1), status(90, 2));
        assert!(rank(&stayed, true) > rank(&left, true));
        assert!(
            rank(&stayed, false) < rank(&left, false),
            "members of one record compare counters"
        );
    }

    #[test]
    fn reads_go_to_replicas_on_this_node_when_there_are_any() {
        let local = |(_, here): &(&str, bool)| *here;
        let nearest = |mut readable: Vec<(&'static str, bool)>| {
            keep_nearest(&mut readable, local);
            readable
                .into_iter()
                .map(|(name, _)| name)
                .collect::<Vec<_>>()
        };
        let mixed = vec![("a", false), ("b", true), ("c", false), ("d", true)];
        assert_eq!(nearest(mixed), ["b", "d"]);
        assert_eq!(nearest(vec![("a", false), ("c", false)]), ["a", "c"]);
        assert!(nearest(Vec::new()).is_empty());
    }

    #[test]
    fn pieces_cover_the_range_in_frame_sized_steps() {
        let max = u64::from(super::MAX_PAYLOAD);
        assert_eq!(pieces(4096, 8192).collect::<Vec<_>>(), [(4096, 8192)]);
        assert_eq!(
            pieces(0, 2 * max + 4096).collect::<Vec<_>>(),
            [(0, max), (max, max), (2 * max, 4096)]
        );
        assert_eq!(pieces(0, 0).count(), 0);
    }
}
