//! `/metrics` on the manager's metrics port: what this manager owns, as
//! [`crate::metrics::Exporter`] renders it on each scrape. Anything else is
//! 404.

use std::net::SocketAddr;
use std::sync::Arc;

use ::http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};

use super::http;
use crate::Result;
use crate::metrics::{CONTENT_TYPE, Exporter};

/// Serves `/metrics` on `address` until the future is dropped.
pub async fn serve(address: SocketAddr, exporter: Arc<Exporter>) -> Result<()> {
    http::serve(address, "/metrics", move |request| {
        let exporter = Arc::clone(&exporter);
        async move { answer(&request, &exporter).await }
    })
    .await
}

async fn answer(request: &Request<Incoming>, exporter: &Exporter) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (request.method(), request.uri().path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => {
            (StatusCode::OK, CONTENT_TYPE, exporter.scrape().await)
        }
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: /metrics\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response
}
