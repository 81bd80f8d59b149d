//! The engine's connection to one replica: requests are multiplexed by id,
//! written in batches by one task and matched to their answers by another.
//! A request without an answer in time, a failed keepalive, a malformed frame
//! or EOF closes the connection and fails everything in flight on it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::AbortHandle;
use tokio_util::codec::{FramedRead, FramedWrite};

use super::auth::{Access, Claim, Role};
use super::frame::{BATCH_BYTES, ClientCodec, Op, Request, Response, Status, decode_corrupt};
use super::handshake::{self, HandshakeError};

/// A replica that does not answer a request within this is failed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(8);
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// An idle connection is pinged this often; a ping must be answered within
/// [`PING_TIMEOUT`], so a dead peer is noticed within their sum.
pub const KEEPALIVE: Duration = Duration::from_secs(2);
pub const PING_TIMEOUT: Duration = Duration::from_secs(4);
/// Requests queued for the writer before callers wait.
const QUEUE: usize = 1024;

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConnectionError {
    #[error("connecting to {address}: {reason}")]
    Connect { address: String, reason: String },
    /// The replica refused the handshake: another volume's, a wrong key, or
    /// a newer engine generation (fenced).
    #[error("{address} refused the connection: {reason}")]
    Refused {
        address: String,
        reason: HandshakeError,
    },
    #[error("connection to {address} closed: {reason}")]
    Closed { address: String, reason: String },
    #[error("{address} answered {status:?}: {message}")]
    Remote {
        address: String,
        status: Status,
        message: String,
    },
    /// The replica's copy of these byte ranges (offset, length) fails its
    /// checksums; the rest of what was read, `data`, is good.
    #[error("{address}: the data at {ranges:?} (offset, length) does not match its checksums")]
    Corrupt {
        address: String,
        ranges: Vec<(u64, u64)>,
        data: Bytes,
    },
}

impl ConnectionError {
    /// The errno this error means to a block device user.
    pub fn errno(&self) -> i32 {
        match self {
            ConnectionError::Remote {
                status: Status::NoSpace,
                ..
            } => nix::libc::ENOSPC,
            _ => nix::libc::EIO,
        }
    }
}

impl From<ConnectionError> for std::io::Error {
    fn from(error: ConnectionError) -> Self {
        std::io::Error::from_raw_os_error(error.errno())
    }
}

type Result<T> = std::result::Result<T, ConnectionError>;

/// A connection to a replica's data port. Cheap to clone; closed when the last
/// clone is dropped.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<Inner>,
}

struct Inner {
    address: String,
    /// The replica is on this host: the kernel sends to an address of this
    /// host from that same address.
    local: bool,
    next_id: AtomicU64,
    pending: Mutex<HashMap<u64, oneshot::Sender<Response>>>,
    outgoing: mpsc::Sender<Request>,
    /// Why the connection closed; `None` while open.
    closed: watch::Sender<Option<String>>,
    tasks: Mutex<Vec<AbortHandle>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
    }
}

/// Locks a mutex whose data stays consistent even if a holder panicked (every
/// critical section here is a single map or vector operation).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Connection {
    /// Connects to `address` (host:port) as the engine of `access`, passes
    /// the handshake, and starts the writer, reader and keepalive tasks on
    /// the current runtime. From then on the replica refuses requests on
    /// the engine's older connections to it.
    pub async fn connect(address: &str, access: &Access) -> Result<Self> {
        Self::open(address, access, Role::Engine).await
    }

    async fn open(address: &str, access: &Access, role: Role) -> Result<Self> {
        let failed = |reason: String| ConnectionError::Connect {
            address: address.to_string(),
            reason,
        };
        let mut stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address))
            .await
            .map_err(|_| failed(format!("no answer within {CONNECT_TIMEOUT:?}")))?
            .map_err(|e| failed(e.to_string()))?;
        let claim = Claim {
            volume: access.volume.clone(),
            generation: access.generation,
            role,
        };
        handshake::introduce(&mut stream, &access.key, &claim)
            .await
            .map_err(|reason| ConnectionError::Refused {
                address: address.to_string(),
                reason,
            })?;
        stream
            .set_nodelay(true)
            .map_err(|e| failed(e.to_string()))?;
        // Closed, the connection resets and its unsent requests are dropped.
        // A graceful close would leave them to TCP, which retransmits them
        // once a partition heals: the replica would then apply writes the
        // engine failed long ago over newer ones it got since it rejoined.
        stream
            .set_zero_linger()
            .map_err(|e| failed(e.to_string()))?;
        let local = matches!(
            (stream.local_addr(), stream.peer_addr()),
            (Ok(ours), Ok(theirs)) if ours.ip() == theirs.ip()
        );
        let (read, write) = stream.into_split();
        let (outgoing, queue) = mpsc::channel(QUEUE);
        let inner = Arc::new(Inner {
            address: address.to_string(),
            local,
            next_id: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            outgoing,
            closed: watch::channel(None).0,
            tasks: Mutex::new(Vec::new()),
        });
        let tasks = [
            tokio::spawn(write_requests(Arc::downgrade(&inner), write, queue)).abort_handle(),
            tokio::spawn(read_responses(Arc::downgrade(&inner), read)).abort_handle(),
            tokio::spawn(keep_alive(Arc::downgrade(&inner))).abort_handle(),
        ];
        lock(&inner.tasks).extend(tasks);
        Ok(Self { inner })
    }

    /// Connects as a reader: reads only, and leaves the engine's
    /// connection in place (an engine's newer connection supersedes its
    /// older ones).
    pub async fn read_only(address: &str, access: &Access) -> Result<Self> {
        Self::open(address, access, Role::Reader).await
    }

    pub fn address(&self) -> &str {
        &self.inner.address
    }

    /// Whether the replica is on this host (its reads skip the network).
    pub fn is_local(&self) -> bool {
        self.inner.local
    }

    /// Reads `length` bytes at `offset`. An answer of another length, or a
    /// `Corrupt` one naming ranges outside the read, is malformed: it
    /// closes the connection, as a malformed frame does.
    pub async fn read(&self, offset: u64, length: u32) -> Result<Bytes> {
        let answer = self
            .call(Op::Read, offset, length, Bytes::new(), REQUEST_TIMEOUT)
            .await;
        let end = offset.saturating_add(u64::from(length));
        let outside = |&(at, len): &(u64, u64)| {
            len == 0 || at < offset || at.checked_add(len).is_none_or(|e| e > end)
        };
        let malformed = match &answer {
            Ok(response) => response.data.len() != length as usize,
            Err(ConnectionError::Corrupt { ranges, data, .. }) => {
                data.len() != length as usize || ranges.iter().any(outside)
            }
            Err(_) => false,
        };
        if malformed {
            let reason = format!("a read of {length} bytes at {offset} got a malformed answer");
            self.inner.close(&reason);
            return Err(self.inner.closed_error(reason));
        }
        answer.map(|response| response.data)
    }

    pub async fn write(&self, offset: u64, data: Bytes) -> Result<()> {
        let length = data.len() as u32;
        self.call(Op::Write, offset, length, data, REQUEST_TIMEOUT)
            .await
            .map(drop)
    }

    /// Restores blocks a read found rotten (see [`Op::Repair`]).
    pub async fn repair(&self, offset: u64, data: Bytes) -> Result<()> {
        let length = data.len() as u32;
        self.call(Op::Repair, offset, length, data, REQUEST_TIMEOUT)
            .await
            .map(drop)
    }

    pub async fn flush(&self) -> Result<()> {
        self.call(Op::Flush, 0, 0, Bytes::new(), REQUEST_TIMEOUT)
            .await
            .map(drop)
    }

    pub async fn unmap(&self, offset: u64, length: u32) -> Result<()> {
        self.call(Op::Unmap, offset, length, Bytes::new(), REQUEST_TIMEOUT)
            .await
            .map(drop)
    }

    /// Completes, with the reason, once the connection is closed.
    pub async fn closed(&self) -> String {
        let mut closed = self.inner.closed.subscribe();
        match closed.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            Err(_) => "connection dropped".into(),
        }
    }

    /// Closes the connection, failing everything in flight.
    pub fn close(&self, reason: &str) {
        self.inner.close(reason);
    }

    async fn call(
        &self,
        op: Op,
        offset: u64,
        length: u32,
        data: Bytes,
        timeout: Duration,
    ) -> Result<Response> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.inner.pending).insert(id, tx);
        // Checked after registering, so a concurrent close cannot miss us.
        if let Some(reason) = self.inner.closed_reason() {
            lock(&self.inner.pending).remove(&id);
            return Err(self.inner.closed_error(reason));
        }
        let request = Request {
            id,
            op,
            offset,
            length,
            data,
        };
        if self.inner.outgoing.send(request).await.is_err() {
            return Err(self.inner.closed_error("writer stopped".into()));
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(response)) => self.inner.check(response),
            Ok(Err(_)) => Err(self
                .inner
                .closed_error(self.inner.closed_reason().unwrap_or_default())),
            Err(_) => {
                let reason = format!("{op:?} not answered within {timeout:?}");
                self.inner.close(&reason);
                Err(self.inner.closed_error(reason))
            }
        }
    }
}

impl Inner {
    fn closed_reason(&self) -> Option<String> {
        self.closed.borrow().clone()
    }

    fn closed_error(&self, reason: String) -> ConnectionError {
        ConnectionError::Closed {
            address: self.address.clone(),
            reason,
        }
    }

    fn check(&self, response: Response) -> Result<Response> {
        if response.status == Status::Ok {
            return Ok(response);
        }
        if response.status == Status::Corrupt
            && let Some((ranges, data)) = decode_corrupt(response.data.clone())
        {
            return Err(ConnectionError::Corrupt {
                address: self.address.clone(),
                ranges,
                data,
            });
        }
        Err(ConnectionError::Remote {
            address: self.address.clone(),
            status: response.status,
            message: String::from_utf8_lossy(&response.data).into_owned(),
        })
    }

    fn close(&self, reason: &str) {
        let first = self.closed.send_if_modified(|closed| {
            let first = closed.is_none();
            if first {
                *closed = Some(reason.to_string());
            }
            first
        });
        if first {
            tracing::warn!(replica = %self.address, reason, "replica connection closed");
            // Dropping the senders fails every waiting call.
            lock(&self.pending).clear();
            for task in lock(&self.tasks).drain(..) {
                task.abort();
            }
        }
    }
}

async fn write_requests(
    inner: Weak<Inner>,
    write: OwnedWriteHalf,
    mut queue: mpsc::Receiver<Request>,
) {
    let mut sink = FramedWrite::new(write, ClientCodec);
    sink.set_backpressure_boundary(BATCH_BYTES);
    while let Some(request) = queue.recv().await {
        let mut sent = sink.feed(request).await;
        // Let the tasks ready to run queue their requests too (a queue
        // depth's worth comes in at once): one send for all of them rather
        // than one each.
        if queue.is_empty() {
            tokio::task::yield_now().await;
        }
        // Batch whatever else is queued into the same flush.
        while sent.is_ok() {
            match queue.try_recv() {
                Ok(request) => sent = sink.feed(request).await,
                Err(_) => break,
            }
        }
        if let Err(error) = sent.and(sink.flush().await) {
            if let Some(inner) = inner.upgrade() {
                inner.close(&format!("write failed: {error}"));
            }
            return;
        }
    }
}

async fn read_responses(inner: Weak<Inner>, read: OwnedReadHalf) {
    let mut responses = FramedRead::new(read, ClientCodec);
    let reason = loop {
        match responses.next().await {
            Some(Ok(response)) => {
                let Some(inner) = inner.upgrade() else { return };
                let waiter = lock(&inner.pending).remove(&response.id);
                if let Some(waiter) = waiter {
                    let _ = waiter.send(response);
                }
            }
            Some(Err(error)) => break format!("bad frame from replica: {error}"),
            None => break "replica closed the connection".to_string(),
        }
    };
    if let Some(inner) = inner.upgrade() {
        inner.close(&reason);
    }
}

async fn keep_alive(inner: Weak<Inner>) {
    let mut ticks = tokio::time::interval(KEEPALIVE);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let connection = Connection { inner };
        // A failed ping closes the connection inside call().
        if connection
            .call(Op::Ping, 0, 0, Bytes::new(), PING_TIMEOUT)
            .await
            .is_err()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::net::TcpListener;

    use super::*;
    use crate::protocol::frame::encode_corrupt;
    use crate::protocol::{Handler, Key, Peer, serve};

    /// A replica that answers reads as told: `Corrupt` naming `ranges`
    /// with `data_len` bytes of data.
    struct Liar {
        key: Key,
        ranges: Vec<(u64, u64)>,
        data_len: usize,
    }

    impl Handler for Liar {
        fn volume(&self) -> &str {
            "v"
        }

        fn key(&self) -> &Key {
            &self.key
        }

        async fn admit(&self, _: &Claim) -> std::result::Result<u64, String> {
            Ok(1)
        }

        async fn handle(&self, request: Request, _: Peer) -> Response {
            Response {
                id: request.id,
                status: Status::Corrupt,
                data: encode_corrupt(&self.ranges, &vec![0; self.data_len]),
            }
        }
    }

    async fn read_from(ranges: Vec<(u64, u64)>, data_len: usize) -> Result<Bytes> {
        let key = Key::generate().for_volume("v");
        let access = Access {
            volume: "v".into(),
            key: key.clone(),
            generation: 1,
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let liar = Arc::new(Liar {
            key,
            ranges,
            data_len,
        });
        tokio::spawn(serve(listener, liar));
        let connection = Connection::connect(&address, &access).await.unwrap();
        connection.read(8192, 8192).await
    }

    /// The engine indexes its buffer with what a `Corrupt` answer names:
    /// one naming bytes outside the read, or with data of another length,
    /// closes the connection rather than reach it.
    #[tokio::test]
    async fn a_corrupt_answer_outside_the_read_closes_the_connection() {
        let fine = read_from(vec![(12288, 4096)], 8192).await;
        assert!(
            matches!(&fine, Err(ConnectionError::Corrupt { ranges, data, .. }) if ranges == &[(12288, 4096)] && data.len() == 8192),
            "{fine:?}"
        );
        for (ranges, data_len) in [
            (vec![(0, 4096)], 8192),
            (vec![(12288, 8192)], 8192),
            (vec![(u64::MAX - 10, 4096)], 8192),
            (vec![(8192, 0)], 8192),
            (vec![(8192, 4096)], 4096),
        ] {
            let answer = read_from(ranges.clone(), data_len).await;
            assert!(
                matches!(answer, Err(ConnectionError::Closed { .. })),
                "{ranges:?}, {data_len} bytes: {answer:?}"
            );
        }
    }
}
