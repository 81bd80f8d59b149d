//! The replica's side of the data protocol: each connection first passes the
//! handshake (the volume's key, an admitted generation and role), then
//! decodes requests and answers each in turn, except flushes, which wait
//! for the disk on a task of their own while later requests go on; answers
//! go back as they complete.
//! Connections, requests in flight and the bytes they hold are bounded.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::codec::{FramedRead, FramedWrite};
use tracing::{Instrument, debug, warn};

use super::auth::{Claim, Key, Role};
use super::frame::{BATCH_BYTES, MAX_PAYLOAD, Op, Request, Response, ServerCodec};
use super::handshake::{self, HandshakeError};

/// Requests one connection may have in flight; more wait to be read.
const MAX_IN_FLIGHT: usize = 256;
/// Payload bytes (read or written) one connection may have in flight, in
/// KiB: bounds what a connection makes the replica hold in memory.
const MAX_IN_FLIGHT_KIB: usize = 64 << 10;
/// Connections open at once, handshakes included; more are closed at once.
pub const MAX_CONNECTIONS: usize = 64;

/// Who an admitted connection speaks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub generation: u64,
    pub role: Role,
    /// The handler's number for the connection (see [`Handler::admit`]).
    pub session: u64,
}

/// Admits engines and readers and serves their requests. Pings never reach
/// it.
pub trait Handler: Send + Sync + 'static {
    /// The volume whose key connections must prove.
    fn volume(&self) -> &str;
    fn key(&self) -> &Key;
    /// Admits a connection that proved `claim` and numbers it, or says why
    /// it is fenced.
    fn admit(&self, claim: &Claim) -> impl Future<Output = Result<u64, String>> + Send;
    /// Serves a request of an admitted connection. Only a flush may wait
    /// (for the disk): the others are answered in the order they came, each
    /// before the next is read, so one that waits holds the connection up.
    fn handle(&self, request: Request, peer: Peer) -> impl Future<Output = Response> + Send;
}

/// Accepts connections on `listener` until the listener fails.
pub async fn serve<H: Handler>(listener: TcpListener, handler: Arc<H>) -> std::io::Result<()> {
    let open = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = listener.accept().await?;
        let Ok(slot) = open.clone().try_acquire_owned() else {
            warn!(%peer, "closing a connection: {MAX_CONNECTIONS} are open");
            continue;
        };
        let span = tracing::info_span!("data", %peer);
        let handler = handler.clone();
        tokio::spawn(
            async move {
                connection(stream, peer, handler).await;
                drop(slot);
            }
            .instrument(span),
        );
    }
}

/// Runs the handshake; who the connection speaks for once admitted.
async fn admit<H: Handler>(stream: &mut TcpStream, handler: &H) -> Result<Peer, HandshakeError> {
    let result = async {
        let claim = handshake::challenge(stream, handler.key()).await?;
        if claim.volume != handler.volume() {
            return Err(HandshakeError::Denied(format!(
                "this replica belongs to volume {:?}, not {:?}",
                handler.volume(),
                claim.volume
            )));
        }
        let session = handler
            .admit(&claim)
            .await
            .map_err(HandshakeError::Fenced)?;
        Ok(Peer {
            generation: claim.generation,
            role: claim.role,
            session,
        })
    }
    .await;
    match result {
        Ok(peer) => handshake::admit(stream).await.map(|()| peer),
        Err(error) => {
            handshake::refuse(stream, &error).await;
            Err(error)
        }
    }
}

/// The KiB of memory a request holds while in flight (its payload or the
/// data it reads), at least one.
fn kib(request: &Request) -> u32 {
    match request.op {
        Op::Read | Op::Write | Op::Repair => request.length.min(MAX_PAYLOAD).div_ceil(1024).max(1),
        _ => 1,
    }
}

async fn connection<H: Handler>(mut stream: TcpStream, peer: SocketAddr, handler: Arc<H>) {
    if let Err(error) = stream.set_nodelay(true) {
        warn!(%error, "set_nodelay");
    }
    let admitted = match admit(&mut stream, &*handler).await {
        Ok(admitted) => admitted,
        Err(error) => {
            warn!(%error, "connection refused");
            return;
        }
    };
    debug!(?admitted, "admitted");
    let (read, write) = stream.into_split();
    let mut requests = FramedRead::with_capacity(read, ServerCodec, BATCH_BYTES);
    let (answers, queue) = mpsc::channel(MAX_IN_FLIGHT);
    let writer = tokio::spawn(write_responses(write, queue));
    let limit = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let memory = Arc::new(Semaphore::new(MAX_IN_FLIGHT_KIB));
    while let Some(frame) = requests.next().await {
        let request = match frame {
            Ok(request) => request,
            // The engine resets connections it closes (see the client).
            Err(error) if error.kind() != std::io::ErrorKind::InvalidData => {
                debug!(%error, "connection ended");
                break;
            }
            Err(error) => {
                warn!(%error, "closing connection after a malformed frame");
                writer.abort();
                return;
            }
        };
        let (Ok(permit), Ok(bytes)) = (
            limit.clone().acquire_owned().await,
            memory.clone().acquire_many_owned(kib(&request)).await,
        ) else {
            break;
        };
        let held = (permit, bytes);
        if request.op == Op::Flush {
            let (handler, answers) = (handler.clone(), answers.clone());
            tokio::spawn(async move { answer(&*handler, request, admitted, &answers, held).await });
        } else {
            answer(&*handler, request, admitted, &answers, held).await;
        }
    }
    // The writer ends once every in-flight request has answered.
    drop(answers);
    let _ = writer.await;
    debug!(%peer, "disconnected");
}

/// Serves `request` and queues its answer; what it `held` is released then.
async fn answer<H: Handler>(
    handler: &H,
    request: Request,
    peer: Peer,
    answers: &mpsc::Sender<Response>,
    held: impl Send,
) {
    let response = match request.op {
        Op::Ping => Response::ok(request.id, bytes::Bytes::new()),
        _ => handler.handle(request, peer).await,
    };
    let _ = answers.send(response).await;
    drop(held);
}

async fn write_responses(
    write: tokio::net::tcp::OwnedWriteHalf,
    mut queue: mpsc::Receiver<Response>,
) {
    let mut sink = FramedWrite::new(write, ServerCodec);
    sink.set_backpressure_boundary(BATCH_BYTES);
    while let Some(response) = queue.recv().await {
        let mut sent = sink.feed(response).await;
        while sent.is_ok() {
            match queue.try_recv() {
                Ok(response) => sent = sink.feed(response).await,
                Err(_) => break,
            }
        }
        if let Err(error) = sent.and(sink.flush().await) {
            warn!(%error, "writing answers failed");
            return;
        }
    }
}
