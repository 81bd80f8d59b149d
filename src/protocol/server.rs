//! The replica's side of the data protocol: each connection decodes requests
//! and runs them concurrently; answers go back as they complete.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::codec::{FramedRead, FramedWrite};
use tracing::{Instrument, debug, warn};

use super::frame::{Op, Request, Response, ServerCodec};

/// Requests one connection may have in flight; more wait to be read.
const MAX_IN_FLIGHT: usize = 256;

/// Serves one request. Pings never reach it.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, request: Request) -> impl Future<Output = Response> + Send;
}

/// Accepts connections on `listener` until the listener fails.
pub async fn serve<H: Handler>(listener: TcpListener, handler: Arc<H>) -> std::io::Result<()> {
    loop {
        let (stream, peer) = listener.accept().await?;
        let span = tracing::info_span!("data", %peer);
        tokio::spawn(connection(stream, peer, handler.clone()).instrument(span));
    }
}

async fn connection<H: Handler>(stream: TcpStream, peer: SocketAddr, handler: Arc<H>) {
    if let Err(error) = stream.set_nodelay(true) {
        warn!(%error, "set_nodelay");
    }
    let (read, write) = stream.into_split();
    let mut requests = FramedRead::new(read, ServerCodec);
    let (answers, queue) = mpsc::channel(MAX_IN_FLIGHT);
    let writer = tokio::spawn(write_responses(write, queue));
    let limit = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    debug!("connected");
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
        let Ok(permit) = limit.clone().acquire_owned().await else {
            break;
        };
        let (handler, answers) = (handler.clone(), answers.clone());
        tokio::spawn(async move {
            let response = match request.op {
                Op::Ping => Response::ok(request.id, bytes::Bytes::new()),
                _ => handler.handle(request).await,
            };
            let _ = answers.send(response).await;
            drop(permit);
        });
    }
    // The writer ends once every in-flight request has answered.
    drop(answers);
    let _ = writer.await;
    debug!(%peer, "disconnected");
}

async fn write_responses(
    write: tokio::net::tcp::OwnedWriteHalf,
    mut queue: mpsc::Receiver<Response>,
) {
    let mut sink = FramedWrite::new(write, ServerCodec);
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
