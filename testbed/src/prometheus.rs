//! A real Prometheus server (Debian's `prometheus`, installed by
//! hack/install-test-deps.sh) on a loopback port, scraping the given
//! managers and evaluating the given rule files every second, with its data
//! in a directory of the caller's; it stops when dropped.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

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

    /// Its HTTP API's base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
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
