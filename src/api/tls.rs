//! The API's listener over TLS, when the manager is given a certificate:
//! a directory holding `tls.crt` and `tls.key`, as a `kubernetes.io/tls`
//! Secret mounted as a volume does (the manifest mounts the optional
//! Secret `oxhorn-api-tls`). The pair is read again when its files
//! change, so a renewed certificate (cert-manager's, or one replaced by
//! hand: the kubelet swaps the volume's files) is served without a
//! restart; a renewal that cannot be read leaves the last good pair in
//! service. Handshakes run beside the accept loop, each bounded in time,
//! so a client that never finishes one holds up no other.

use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tracing::{debug, info, warn};

use crate::{Error, Result};

/// The certificate's file in a `kubernetes.io/tls` Secret.
pub const CERT_FILE: &str = "tls.crt";
/// The private key's file in a `kubernetes.io/tls` Secret.
pub const KEY_FILE: &str = "tls.key";

/// How long a client has to finish its handshake: a person's browser on
/// a slow link takes well under it, a client that stalls is let go.
const HANDSHAKE: Duration = Duration::from_secs(10);
/// Handshakes under way at once: more connections wait in the kernel's
/// backlog, so a flood of them holds a bounded number of tasks.
const HANDSHAKES: usize = 256;
/// Handshaken connections waiting for the server to take them; it takes
/// each at once, so a few are enough.
const WAITING: usize = 64;

/// The certificate's and the key's inode, modification time (seconds,
/// nanoseconds) and length.
type Stamp = [(u64, i64, i64, u64); 2];

/// A certificate and its key, as files.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    cert: PathBuf,
    key: PathBuf,
}

impl TlsFiles {
    /// The pair in `dir`; none while it holds nothing (a Secret's volume
    /// is mounted empty while the optional Secret does not exist). A
    /// directory holding other files but neither of the pair's (a Secret
    /// of another type, say) is an error: the API must not go plain while
    /// its operator means it to be TLS.
    pub fn in_dir(dir: &Path) -> Result<Option<Self>> {
        let files = Self {
            cert: dir.join(CERT_FILE),
            key: dir.join(KEY_FILE),
        };
        if files.cert.exists() || files.key.exists() {
            return Ok(Some(files));
        }
        let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
        // The kubelet's own entries in a Secret's volume start with "..".
        let other = entries
            .flatten()
            .find(|e| !e.file_name().to_string_lossy().starts_with(".."));
        match other {
            None => Ok(None),
            Some(entry) => Err(Error::io(
                dir,
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "holds {} but no {CERT_FILE} and {KEY_FILE} (a Secret of type kubernetes.io/tls has them)",
                        entry.file_name().to_string_lossy()
                    ),
                ),
            )),
        }
    }

    /// The files' identities: a new file, or one rewritten, differs.
    fn stamp(&self) -> Option<Stamp> {
        let of = |path: &Path| {
            std::fs::metadata(path)
                .ok()
                .map(|m| (m.ino(), m.mtime(), m.mtime_nsec(), m.len()))
        };
        Some([of(&self.cert)?, of(&self.key)?])
    }

    /// Reads and checks the pair: the key must be the certificate's. An
    /// error of kind `InvalidData` is the files' own; any other is of
    /// reading them, and may pass.
    fn load(&self) -> Result<Arc<CertifiedKey>> {
        let invalid = |path: &Path, what: String| {
            Error::io(path, io::Error::new(io::ErrorKind::InvalidData, what))
        };
        let cert_pem = std::fs::read(&self.cert).map_err(|e| Error::io(&self.cert, e))?;
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| invalid(&self.cert, format!("not a PEM certificate: {e}")))?;
        if chain.is_empty() {
            return Err(invalid(&self.cert, "holds no certificate".into()));
        }
        let key_pem = std::fs::read(&self.key).map_err(|e| Error::io(&self.key, e))?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| invalid(&self.key, format!("not a PEM private key: {e}")))?;
        let signer = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| invalid(&self.key, format!("an unsupported private key: {e}")))?;
        let certified = CertifiedKey::new(chain, signer);
        certified
            .keys_match()
            .map_err(|e| invalid(&self.key, format!("not the certificate's key: {e}")))?;
        Ok(Arc::new(certified))
    }
}

/// Serves the pair last read, reading it again when its files change.
#[derive(Debug)]
struct Reloading {
    files: TlsFiles,
    served: Mutex<(Option<Stamp>, Arc<CertifiedKey>)>,
}

impl Reloading {
    fn new(files: TlsFiles) -> Result<Self> {
        let stamp = files.stamp();
        let key = files.load()?;
        Ok(Self {
            files,
            served: Mutex::new((stamp, key)),
        })
    }

    /// The pair to serve: a renewal once it reads whole and good. A bad
    /// renewal is not read again until its files change; one that could
    /// not be read (out of file descriptors, say) is tried again at the
    /// next handshake.
    fn current(&self) -> Arc<CertifiedKey> {
        // A poisoned lock still holds a pair that was good when stored.
        let mut served = self.served.lock().unwrap_or_else(|p| p.into_inner());
        let stamp = self.files.stamp();
        if stamp.is_some() && stamp != served.0 {
            match self.files.load() {
                Ok(key) => {
                    info!(cert = %self.files.cert.display(), "serving the renewed certificate");
                    served.1 = key;
                    served.0 = stamp;
                }
                Err(error) => {
                    if error.io_kind() == Some(io::ErrorKind::InvalidData) {
                        served.0 = stamp;
                    }
                    warn!(%error, "the renewed certificate is not served");
                }
            }
        }
        Arc::clone(&served.1)
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The server's TLS configuration for `files`: TLS 1.3 only (every
/// client of a new API has it), HTTP/1.1.
pub fn config(files: TlsFiles) -> Result<Arc<ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| Error::io(&files.cert, io::Error::other(e)))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Reloading::new(files)?));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Connections accepted and handshaken, for `axum::serve`.
pub struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    accepting: JoinHandle<()>,
}

impl TlsListener {
    /// Accepts on `listener`, handshaking with `config` in the background.
    pub fn new(listener: TcpListener, config: Arc<ServerConfig>) -> io::Result<Self> {
        let local = listener.local_addr()?;
        let (sender, ready) = mpsc::channel(WAITING);
        let accepting = tokio::spawn(accept(listener, TlsAcceptor::from(config), sender));
        Ok(Self {
            local,
            ready,
            accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Accepts connections and handshakes each in a task of its own.
async fn accept(
    mut listener: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES));
    loop {
        let Ok(permit) = Arc::clone(&handshakes).acquire_owned().await else {
            return; // Never closed.
        };
        // axum's accept: it goes on past a connection's own errors and
        // waits a moment on the listener's (out of file descriptors).
        let (stream, peer) = axum::serve::Listener::accept(&mut listener).await;
        let (acceptor, ready) = (acceptor.clone(), ready.clone());
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = ready.send((tls, peer)).await;
                }
                Ok(Err(error)) => debug!(%peer, %error, "a TLS handshake failed"),
                Err(_) => debug!(%peer, "a TLS handshake took too long"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accepting task ends only when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use oxhorn_testbed::certs::{Ca, https_get};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server of `/ping` on a free loopback port, over TLS from `dir`.
    async fn serve(dir: &Path) -> SocketAddr {
        let files = TlsFiles::in_dir(dir).unwrap().expect("the pair is there");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tls = TlsListener::new(listener, config(files).unwrap()).unwrap();
        let address = tls.local;
        let routes = axum::Router::new().route("/ping", axum::routing::get(async || "pong"));
        tokio::spawn(async move { axum::serve(tls, routes).await });
        address
    }

    /// A pair from `ca` put in `dir` as the kubelet renews a Secret's
    /// files: new files moved into place.
    fn issue(ca: &Ca, dir: &Path) {
        let new = tempfile::tempdir_in(dir).unwrap();
        ca.serving("localhost", &["localhost", "127.0.0.1"])
            .unwrap()
            .write_to(new.path(), CERT_FILE, KEY_FILE)
            .unwrap();
        for file in [CERT_FILE, KEY_FILE] {
            std::fs::rename(new.path().join(file), dir.join(file)).unwrap();
        }
    }

    /// `GET /ping` over TLS, trusting `ca` only: the answer, or why not.
    async fn ping(address: SocketAddr, ca: &Ca) -> std::result::Result<String, String> {
        https_get(address, ca.pem(), "localhost", "/ping").await
    }

    #[test]
    fn an_empty_directory_means_plain_http_and_one_of_other_files_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("..data")).unwrap();
        assert!(TlsFiles::in_dir(dir.path()).unwrap().is_none());
        std::fs::write(dir.path().join("cert.pem"), "").unwrap();
        let error = TlsFiles::in_dir(dir.path()).unwrap_err().to_string();
        assert!(error.contains("holds cert.pem but no tls.crt"), "{error}");
    }

    #[test]
    fn a_key_not_the_certificates_is_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::generate().unwrap();
        issue(&ca, dir.path());
        let other = ca.serving("localhost", &["localhost"]).unwrap();
        std::fs::write(dir.path().join(KEY_FILE), other.key_pem).unwrap();
        let files = TlsFiles::in_dir(dir.path()).unwrap().unwrap();
        let error = config(files).unwrap_err().to_string();
        assert!(error.contains("not the certificate's key"), "{error}");
    }

    #[tokio::test]
    async fn the_api_answers_over_tls_and_a_renewed_certificate_is_served_without_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let first = Ca::generate().unwrap();
        issue(&first, dir.path());
        let address = serve(dir.path()).await;
        let answer = ping(address, &first).await.unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("pong"),
            "{answer}"
        );

        // Renewed by a CA a client of the first does not trust: the next
        // handshake shows which certificate is served.
        let second = Ca::generate().unwrap();
        issue(&second, dir.path());
        let answer = ping(address, &second).await.unwrap();
        assert!(answer.ends_with("pong"), "{answer}");
        assert!(ping(address, &first).await.is_err());

        // A renewal that cannot be read keeps the last good pair served.
        let torn = dir.path().join("torn");
        std::fs::write(&torn, "not a certificate").unwrap();
        std::fs::rename(torn, dir.path().join(CERT_FILE)).unwrap();
        let answer = ping(address, &second).await.unwrap();
        assert!(answer.ends_with("pong"), "{answer}");
    }

    #[tokio::test]
    async fn plain_http_to_the_tls_port_gets_no_answer_from_the_api() {
        let dir = tempfile::tempdir().unwrap();
        issue(&Ca::generate().unwrap(), dir.path());
        let address = serve(dir.path()).await;
        let mut tcp = TcpStream::connect(address).await.unwrap();
        tcp.write_all(b"GET /ping HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let _ = tcp.read_to_end(&mut answer).await;
        assert!(!String::from_utf8_lossy(&answer).contains("pong"));
    }
}
