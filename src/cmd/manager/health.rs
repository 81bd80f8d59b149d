//! The manager's answers to the kubelet's probes, in place of the
//! livenessprobe sidecar: `/healthz` is 200 while the manager serves at all,
//! `/readyz` 200 once its caches have synced (what CSI Probe reports) and
//! 503 before. Anything else is 404. HTTP/1.1 on the node's address.

use std::net::SocketAddr;

use ::http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use tokio::sync::watch;

use super::http;
use crate::Result;

fn answer(request: &Request<Incoming>, ready: bool) -> Response<Full<Bytes>> {
    let (status, body) = match (request.method(), request.uri().path()) {
        (&Method::GET | &Method::HEAD, "/healthz") => (StatusCode::OK, "ok\n"),
        (&Method::GET | &Method::HEAD, "/readyz") if ready => (StatusCode::OK, "ok\n"),
        (&Method::GET | &Method::HEAD, "/readyz") => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the manager's caches have not synced yet\n",
        ),
        _ => (StatusCode::NOT_FOUND, "not found: /healthz or /readyz\n"),
    };
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response
}

/// Serves the probes on `address` until the future is dropped.
pub async fn serve(address: SocketAddr, ready: watch::Receiver<bool>) -> Result<()> {
    http::serve(address, "/healthz and /readyz", move |request| {
        let ready = *ready.borrow();
        async move { answer(&request, ready) }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Sends `request` on a new connection; the response's status line, or
    /// None if the connection closed without one.
    async fn ask(address: SocketAddr, request: &[u8]) -> Option<String> {
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut response = Vec::new();
        let _ = stream.read_to_end(&mut response).await;
        let text = String::from_utf8_lossy(&response);
        text.lines().next().map(str::to_string)
    }

    fn get(path: &str) -> Vec<u8> {
        format!("GET {path} HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n").into_bytes()
    }

    #[tokio::test]
    async fn liveness_always_readiness_once_synced() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let (synced, ready) = watch::channel(false);
        tokio::spawn(serve(address, ready));
        let status = |line: Option<String>| line.unwrap_or_default();
        let first = loop {
            if let Ok(stream) = tokio::net::TcpStream::connect(address).await {
                drop(stream);
                break ask(address, &get("/healthz")).await;
            }
            tokio::task::yield_now().await;
        };
        assert_eq!(status(first), "HTTP/1.1 200 OK");
        assert_eq!(
            status(ask(address, &get("/readyz")).await),
            "HTTP/1.1 503 Service Unavailable"
        );
        synced.send(true).unwrap();
        assert_eq!(
            status(ask(address, &get("/readyz")).await),
            "HTTP/1.1 200 OK"
        );
        assert_eq!(
            status(ask(address, &get("/metrics")).await),
            "HTTP/1.1 404 Not Found"
        );
        let garbage = ask(address, b"\x16\x03\x01 not http\r\n\r\n").await;
        assert!(
            garbage
                .as_deref()
                .is_none_or(|line| line.starts_with("HTTP/1.1 400")),
            "{garbage:?}"
        );
        assert_eq!(
            status(ask(address, &get("/healthz")).await),
            "HTTP/1.1 200 OK",
            "still serving after a malformed request"
        );
    }
}
