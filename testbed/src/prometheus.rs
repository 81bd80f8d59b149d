//! A real Prometheus server (Debian's `prometheus`, installed by
//! hack/install-test-deps.sh) on a loopback port, scraping the given
//! managers and evaluating the given rule files every second, with its data
//! in a directory of the caller's; it stops when dropped. Also the plain
//! GET that reads a manager's /metrics or Prometheus' API.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::controlplane::free_port;
use crate::objectstore::until_answers;
use crate::process::Supervised;
use crate::{Error, Result};

/// The scrape job of the managers, as a ServiceMonitor would name it.
pub const JOB: &str = "oxhorn-manager";

pub struct Prometheus {
    port: u16,
    _process: Supervised,
}

impl Prometheus {
    /// Starts Prometheus scraping `/metrics` of `targets` with the rules of
    /// `rule_files`, and waits until it is ready.
    pub fn start(dir: &Path, targets: &[SocketAddr], rule_files: &[&Path]) -> Result<Self> {
        let port = free_port()?;
        let config = dir.join("prometheus.yml");
        std::fs::write(&config, configuration(targets, rule_files))
            .map_err(|e| Error::io(&config, e))?;
        let mut command = Command::new("prometheus");
        command
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"));
        let process = Supervised::spawn("prometheus", command, &dir.join("prometheus.log"))?;
        until_answers(port, "GET /-/ready", "200")?;
        Ok(Self {
            port,
            _process: process,
        })
    }

    /// The body of its answer to `GET /api/v1/{path}` (path and query,
    /// the query URL-encoded).
    pub fn api(&self, path: &str) -> Result<String> {
        get(
            SocketAddr::from(([127, 0, 0, 1], self.port)),
            &format!("/api/v1/{path}"),
        )
    }
}

/// What the manager at `address` serves at /metrics.
pub fn scrape(address: SocketAddr) -> Result<String> {
    get(address, "/metrics")
}

/// The body of a 200 answer to `GET path` from `address`.
pub fn get(address: SocketAddr, path: &str) -> Result<String> {
    let io = |e| Error::io(format!("http://{address}{path}"), e);
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5)).map_err(io)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(io)?;
    // HTTP/1.0: the answer is the body whole, never chunked.
    let head = format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n");
    stream.write_all(head.as_bytes()).map_err(io)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).map_err(io)?;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.lines().next().unwrap_or_default();
    if status.split(' ').nth(1) != Some("200") {
        return Err(Error::Failed(format!(
            "GET http://{address}{path}: {status}"
        )));
    }
    Ok(body.to_owned())
}

fn configuration(targets: &[SocketAddr], rule_files: &[&Path]) -> String {
    let config = serde_json::json!({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": rule_files.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "scrape_configs": [{
            "job_name": JOB,
            "static_configs": [{
                "targets": targets.iter().map(ToString::to_string).collect::<Vec<_>>(),
            }],
        }],
    });
    // JSON is YAML.
    config.to_string()
}
