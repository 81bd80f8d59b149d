//! Object-store servers on loopback for the backup tests: MinIO (S3) and
//! Azurite (Azure Blob), both installed by hack/install-test-deps.sh. Each
//! keeps its data in a directory of the caller's, can be stopped and
//! started again on the same port (an outage), and stops when dropped.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::process::Supervised;
use crate::{Error, Result};

/// How long a server may take to answer after it starts.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Which server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectServerKind {
    /// MinIO, with one access key.
    Minio,
    /// Azurite's blob service, with its well-known development account.
    Azurite,
}

pub const MINIO_ACCESS_KEY: &str = "oxhorn-test";
pub const MINIO_SECRET_KEY: &str = "oxhorn-test-secret";
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
pub const AZURITE_ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// An account SAS of Azurite's development account (every permission,
/// until 2099), so that containers are made without signing each request.
const AZURITE_SAS: &str = "sv=2021-10-04&ss=b&srt=sco&sp=rwdlac&se=2099-01-01T00%3A00%3A00Z&spr=http&sig=BL%2BIJNiQhgR11fqbLis4d%2F2x28O7mQ8cMVvs6P7SMzg%3D";

/// A running (or stopped) object-store server.
pub struct ObjectServer {
    pub kind: ObjectServerKind,
    process: Option<Supervised>,
    dir: PathBuf,
    port: u16,
    /// The CA (PEM) of the certificate a MinIO started with TLS serves.
    ca_pem: Option<String>,
}

impl ObjectServer {
    /// Starts the server on a free loopback port with its data and log in
    /// `dir`, holding the (empty) `buckets` (containers, for Azurite).
    pub fn start(kind: ObjectServerKind, dir: &Path, buckets: &[&str]) -> Result<Self> {
        Self::start_with(kind, dir, buckets, None)
    }

    /// Starts MinIO serving HTTPS only, with a certificate for 127.0.0.1
    /// of a CA of its own ([`ca_pem`](Self::ca_pem)).
    pub fn start_tls(dir: &Path, buckets: &[&str]) -> Result<Self> {
        let ca = crate::certs::Ca::generate()?;
        ca.serving("minio", &["127.0.0.1", "localhost"])?.write_to(
            &dir.join("certs"),
            "public.crt",
            "private.key",
        )?;
        Self::start_with(
            ObjectServerKind::Minio,
            dir,
            buckets,
            Some(ca.pem().to_string()),
        )
    }

    /// The CA of the server's certificate, when it serves HTTPS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    fn start_with(
        kind: ObjectServerKind,
        dir: &Path,
        buckets: &[&str],
        ca_pem: Option<String>,
    ) -> Result<Self> {
        if kind == ObjectServerKind::Minio {
            // A directory in MinIO's single-drive data is a bucket.
            for bucket in buckets {
                let path = dir.join("data").join(bucket);
                std::fs::create_dir_all(&path).map_err(|e| Error::io(&path, e))?;
            }
        }
        let mut server = Self {
            kind,
            process: None,
            dir: dir.to_owned(),
            port: crate::controlplane::free_ports(1)?,
            ca_pem,
        };
        server.resume()?;
        if kind == ObjectServerKind::Azurite {
            for container in buckets {
                server.create_container(container)?;
            }
        }
        Ok(server)
    }

    /// The endpoint clients are given: MinIO's S3 endpoint, or the blob
    /// endpoint of Azurite's development account.
    pub fn endpoint(&self) -> String {
        match self.kind {
            ObjectServerKind::Minio if self.ca_pem.is_some() => {
                format!("https://127.0.0.1:{}", self.port)
            }
            ObjectServerKind::Minio => format!("http://127.0.0.1:{}", self.port),
            ObjectServerKind::Azurite => {
                format!("http://127.0.0.1:{}/{AZURITE_ACCOUNT}", self.port)
            }
        }
    }

    /// Freezes the server with SIGSTOP: it keeps its port, and requests
    /// hang unanswered until [`thaw`](Self::thaw) (a store that stalls).
    pub fn freeze(&self) -> Result<()> {
        self.signal(Signal::SIGSTOP)
    }

    /// Lets a frozen server answer again.
    pub fn thaw(&self) -> Result<()> {
        self.signal(Signal::SIGCONT)
    }

    fn signal(&self, signal: Signal) -> Result<()> {
        match &self.process {
            Some(process) => process.signal(signal),
            None => Err(Error::Failed(format!("{:?} is stopped", self.kind))),
        }
    }

    /// Stops the server: requests fail until [`resume`](Self::resume).
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut process) = self.process.take() {
            // A frozen server would not act on SIGTERM.
            process.signal(Signal::SIGCONT)?;
            process.terminate(Duration::from_secs(10))?;
        }
        Ok(())
    }

    /// Starts the stopped server again, on the same port and data.
    pub fn resume(&mut self) -> Result<()> {
        let (dir, port) = (&self.dir, self.port);
        let (name, command, ready) = match self.kind {
            ObjectServerKind::Minio => {
                let mut command = Command::new(crate::tools_dir().join("minio"));
                command
                    .args(["server", "--quiet", "--address"])
                    .arg(format!("127.0.0.1:{port}"))
                    .arg("--config-dir")
                    .arg(dir.join("config"))
                    .arg("--certs-dir")
                    .arg(dir.join("certs"))
                    .arg(dir.join("data"))
                    .env("MINIO_ROOT_USER", MINIO_ACCESS_KEY)
                    .env("MINIO_ROOT_PASSWORD", MINIO_SECRET_KEY)
                    // No console on a random port of every interface, no
                    // update checks over the network.
                    .env("MINIO_BROWSER", "off")
                    .env("MINIO_UPDATE", "off");
                // Over TLS, a plain request is refused once it listens.
                let answer = if self.ca_pem.is_some() { "400" } else { "200" };
                ("minio", command, ("GET /minio/health/ready", answer))
            }
            ObjectServerKind::Azurite => {
                let mut command = Command::new(crate::tools_dir().join("azurite-blob"));
                command
                    .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
                    .arg("--location")
                    .arg(dir.join("data"))
                    .args(["--skipApiVersionCheck", "--loose", "--silent"])
                    .arg("--disableTelemetry");
                // Any answer will do: an unsigned request is refused.
                ("azurite", command, ("GET /", "HTTP/1.1"))
            }
        };
        let log = dir.join(format!("{name}.log"));
        self.process = Some(Supervised::spawn(name, command, &log)?);
        until_answers(port, ready.0, ready.1)
    }

    fn create_container(&self, container: &str) -> Result<()> {
        let request = format!("PUT /{AZURITE_ACCOUNT}/{container}?restype=container&{AZURITE_SAS}");
        let status = http(self.port, &request)?;
        if status.contains("201") {
            Ok(())
        } else {
            Err(Error::Failed(format!(
                "creating container {container}: {status}"
            )))
        }
    }
}

/// Waits until `request` (method and path) to `port` gets a status line
/// holding `expected`.
pub(crate) fn until_answers(port: u16, request: &str, expected: &str) -> Result<()> {
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
    // The status line is all that is wanted; a timeout after it is fine.
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    Ok(text.lines().next().unwrap_or_default().to_owned())
}
