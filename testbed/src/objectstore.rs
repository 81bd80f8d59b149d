//! Object-store servers on loopback for the backup tests: MinIO (S3) and
//! Azurite (Azure Blob), both installed by hack/install-test-deps.sh. Each
//! keeps its data in a directory of the caller's, can be stopped and
//! started again on the same port (an outage), and stops when dropped.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::Supervised;
use crate::{Error, Result};

/// How long a server may take to answer after it starts.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A MinIO server with one access key.
pub struct Minio {
    process: Option<Supervised>,
    dir: PathBuf,
    port: u16,
}

impl Minio {
    pub const ACCESS_KEY: &str = "oxhorn-test";
    pub const SECRET_KEY: &str = "oxhorn-test-secret";

    /// Starts MinIO on a free loopback port with its data, config and log in
    /// `dir`, holding the (empty) `buckets`.
    pub fn start(dir: &Path, buckets: &[&str]) -> Result<Self> {
        for bucket in buckets {
            let path = dir.join("data").join(bucket);
            std::fs::create_dir_all(&path).map_err(|e| Error::io(&path, e))?;
        }
        let mut minio = Self {
            process: None,
            dir: dir.to_owned(),
            port: crate::controlplane::free_ports(1)?,
        };
        minio.resume()?;
        Ok(minio)
    }

    /// The S3 endpoint, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Stops the server: requests fail until [`resume`](Self::resume).
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut process) = self.process.take() {
            process.terminate(Duration::from_secs(10))?;
        }
        Ok(())
    }

    /// Starts the stopped server again, on the same port and data.
    pub fn resume(&mut self) -> Result<()> {
        let dir = &self.dir;
        let mut command = Command::new(crate::tools_dir().join("minio"));
        command
            .args(["server", "--quiet", "--address"])
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--config-dir")
            .arg(dir.join("config"))
            .arg("--certs-dir")
            .arg(dir.join("certs"))
            .arg(dir.join("data"))
            .env("MINIO_ROOT_USER", Self::ACCESS_KEY)
            .env("MINIO_ROOT_PASSWORD", Self::SECRET_KEY)
            // No console on a random port of every interface, no update
            // checks over the network.
            .env("MINIO_BROWSER", "off")
            .env("MINIO_UPDATE", "off");
        let process = Supervised::spawn("minio", command, &dir.join("minio.log"))?;
        self.process = Some(process);
        until_answers(self.port, "GET /minio/health/ready", "200")
    }
}

/// An Azurite blob service with its well-known development account.
pub struct Azurite {
    _process: Supervised,
    port: u16,
}

impl Azurite {
    pub const ACCOUNT: &str = "devstoreaccount1";
    pub const ACCOUNT_KEY: &str =
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
    /// An account SAS of the development account (every permission, until
    /// 2099), so that containers are made without signing each request.
    const SAS: &str = "sv=2021-10-04&ss=b&srt=sco&sp=rwdlac&se=2099-01-01T00%3A00%3A00Z&spr=http&sig=BL%2BIJNiQhgR11fqbLis4d%2F2x28O7mQ8cMVvs6P7SMzg%3D";

    /// Starts Azurite's blob service on a free loopback port with its data
    /// and log in `dir`, holding the (empty) `containers`.
    pub fn start(dir: &Path, containers: &[&str]) -> Result<Self> {
        let port = crate::controlplane::free_ports(1)?;
        let mut command = Command::new(crate::tools_dir().join("azurite-blob"));
        command
            .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
            .arg("--location")
            .arg(dir.join("data"))
            .args([
                "--skipApiVersionCheck",
                "--loose",
                "--silent",
                "--disableTelemetry",
            ]);
        let process = Supervised::spawn("azurite", command, &dir.join("azurite.log"))?;
        let azurite = Self {
            _process: process,
            port,
        };
        // Any answer will do: an unsigned request is refused.
        until_answers(port, "GET /", "HTTP/1.1")?;
        for container in containers {
            let request = format!(
                "PUT /{}/{container}?restype=container&{}",
                Self::ACCOUNT,
                Self::SAS
            );
            let status = http(port, &request)?;
            if !status.contains("201") {
                return Err(Error::Failed(format!(
                    "creating container {container}: {status}"
                )));
            }
        }
        Ok(azurite)
    }

    /// The development account's blob endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{}", self.port, Self::ACCOUNT)
    }
}

/// Waits until `request` (method and path) to `port` gets a status line
/// holding `expected`.
fn until_answers(port: u16, request: &str, expected: &str) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        match http(port, request) {
            Ok(status) if status.contains(expected) => return Ok(()),
            _ if Instant::now() > deadline => {
                return Err(Error::Failed(format!(
                    "nothing answered {request} on port {port} within {}s",
                    READY_TIMEOUT.as_secs()
                )));
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The status line of a bodiless HTTP/1.1 request.
fn http(port: u16, request: &str) -> Result<String> {
    let io = |e| Error::io("http", e);
    let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(io)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(io)?;
    let head = format!(
        "{request} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).map_err(io)?;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    Ok(text.lines().next().unwrap_or_default().to_owned())
}
