//! `metrics/<pod>.txt`: each manager's `/metrics` (docs/monitoring.md) as
//! scraped when the bundle is made: what the objects do not hold, such as
//! volumes' I/O rates and latencies, rebuilds' progress, the
//! controllers' errors and the API server's latency as each manager sees
//! it. A pod serves them on its container port named `metrics`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::archive::Stopped;
use super::collect::{Collection, why};
use super::report::Outcome;

/// The container port a pod serves its metrics on.
const PORT_NAME: &str = "metrics";
/// How long one scrape may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of one scrape kept.
const SCRAPE_MAX: usize = 32 << 20;

/// How the managers' metrics are reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scrape {
    /// Through the API server's proxy to the pod (`get pods/proxy`), for
    /// a user outside the cluster's network: the CLI's way.
    ApiServer,
    /// At the pod's address: a manager's way, on the nodes' network.
    Direct,
}

/// The pod's address and its metrics port, if it serves them.
fn metrics_port(pod: &Pod) -> Option<(IpAddr, u16)> {
    let spec = pod.spec.as_ref()?;
    let port = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(PORT_NAME))?;
    let ip = pod.status.as_ref()?.pod_ip.as_ref()?.parse().ok()?;
    Some((ip, u16::try_from(port.container_port).ok()?))
}

impl Collection<'_> {
    pub(super) async fn metrics(&mut self, pods: &[Pod]) -> Result<(), Stopped> {
        let serving: Vec<(String, IpAddr, u16)> = pods
            .iter()
            .filter_map(|pod| metrics_port(pod).map(|(ip, port)| (pod.name_any(), ip, port)))
            .collect();
        if serving.is_empty() {
            let why = format!("no running pod of the namespace has a port named {PORT_NAME}");
            self.report.record("metrics/", Outcome::Skipped(why));
        }
        for (pod, ip, port) in serving {
            let path = format!("metrics/{pod}.txt");
            let scraped = match self.options.scrape {
                Scrape::ApiServer => self.through_api_server(&pod, port).await,
                Scrape::Direct => direct(SocketAddr::new(ip, port)).await,
            };
            match scraped {
                Ok(mut text) => {
                    text.truncate(SCRAPE_MAX);
                    let done = Outcome::Done(format!("{} bytes", text.len()));
                    self.sink.file(&path, text, 0).await?;
                    self.report.record(path, done);
                }
                Err(why) => self.report.record(path, Outcome::Failed(why)),
            }
        }
        Ok(())
    }

    async fn through_api_server(&self, pod: &str, port: u16) -> Result<Vec<u8>, String> {
        let ns = &self.options.namespace;
        let url = format!("/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy/metrics");
        let request = http::Request::get(url)
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        let text = tokio::time::timeout(SCRAPE_TIMEOUT, self.client.request_text(request));
        match text.await {
            Ok(Ok(text)) => Ok(text.into_bytes()),
            Ok(Err(error)) => Err(format!("through the API server's proxy: {}", why(&error))),
            Err(_) => Err(format!("no answer within {SCRAPE_TIMEOUT:?}")),
        }
    }
}

/// `/metrics` at `address`.
async fn direct(address: SocketAddr) -> Result<Vec<u8>, String> {
    // reqwest's TLS is rustls on ring, installed once per process.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .timeout(SCRAPE_TIMEOUT)
        .build()
        .map_err(|e| e.to_string())?;
    let failed = |e: reqwest::Error| format!("http://{address}/metrics: {e}");
    let response = client
        .get(format!("http://{address}/metrics"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(failed)?;
    Ok(response.bytes().await.map_err(failed)?.to_vec())
}
