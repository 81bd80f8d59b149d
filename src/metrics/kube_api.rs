//! The Kubernetes API server's answer times per verb, as the manager's
//! client sees them: a tower layer.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Method, Request};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use tower::{Layer, Service};

use crate::controller::duration_histogram;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiLabels {
    verb: &'static str,
}

/// The Kubernetes API server's answer times per verb (get, which includes
/// list, watch, create, update, patch, delete), until the response's
/// headers: a tower layer on the manager's client.
#[derive(Clone)]
pub struct KubeApiLatency {
    durations: Family<ApiLabels, Histogram, fn() -> Histogram>,
}

impl Default for KubeApiLatency {
    fn default() -> Self {
        Self {
            durations: Family::new_with_constructor(duration_histogram),
        }
    }
}

impl KubeApiLatency {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register_with_unit(
            "kube_api_request_duration",
            "Time until the Kubernetes API server answered, per verb",
            Unit::Seconds,
            self.durations.clone(),
        );
    }
}

/// The verb of an API request, as Kubernetes names it.
fn verb<B>(request: &Request<B>) -> &'static str {
    let query = request.uri().query().unwrap_or_default();
    let watch = query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1");
    match *request.method() {
        Method::GET if watch => "watch",
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "other",
    }
}

impl<S> Layer<S> for KubeApiLatency {
    type Service = Timed<S>;

    fn layer(&self, inner: S) -> Timed<S> {
        Timed {
            inner,
            durations: self.durations.clone(),
        }
    }
}

/// A service that times its calls into [`KubeApiLatency`].
#[derive(Clone)]
pub struct Timed<S> {
    inner: S,
    durations: Family<ApiLabels, Histogram, fn() -> Histogram>,
}

impl<S, B> Service<Request<B>> for Timed<S>
where
    S: Service<Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let labels = ApiLabels {
            verb: verb(&request),
        };
        let histogram = self.durations.get_or_create(&labels).clone();
        let started = Instant::now();
        let answered = self.inner.call(request);
        Box::pin(async move {
            let answer = answered.await;
            histogram.observe(started.elapsed().as_secs_f64());
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, uri: &str) -> Request<()> {
        Request::builder().method(method).uri(uri).body(()).unwrap()
    }

    #[test]
    fn names_requests_by_kubernetes_verb() {
        let path = "/apis/oxhorn.io/v1beta1/namespaces/oxhorn-system/volumes";
        assert_eq!(verb(&request(Method::GET, path)), "get");
        let watch = format!("{path}?resourceVersion=7&watch=true");
        assert_eq!(verb(&request(Method::GET, &watch)), "watch");
        assert_eq!(verb(&request(Method::POST, path)), "create");
        assert_eq!(verb(&request(Method::PUT, path)), "update");
        assert_eq!(verb(&request(Method::PATCH, path)), "patch");
        assert_eq!(verb(&request(Method::DELETE, path)), "delete");
    }
}
