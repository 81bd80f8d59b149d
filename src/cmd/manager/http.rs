//! The manager's small HTTP/1.1 servers (probes, metrics): each connection
//! on its own task, a client slow to send its headers dropped.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, Response};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::{debug, info};

use crate::{Error, Result};

/// A client that has not sent its request headers in this long is dropped.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// Answers each request on `address` with `handler` until the future is
/// dropped; `what` names what is served, for the log.
pub async fn serve<H, F>(address: SocketAddr, what: &str, handler: H) -> Result<()>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let listener = TcpListener::bind(address)
        .await
        .map_err(|e| Error::io(address.to_string(), e))?;
    info!(%address, "serving {what}");
    loop {
        let (stream, peer) = listener
            .accept()
            .await
            .map_err(|e| Error::io(address.to_string(), e))?;
        let handler = handler.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let answered = handler(request);
                async move { Ok::<_, Infallible>(answered.await) }
            });
            let served = http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(error) = served {
                debug!(%peer, %error, "connection closed");
            }
        });
    }
}
