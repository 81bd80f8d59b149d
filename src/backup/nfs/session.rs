//! Sessions with an NFS server: a TCP connection to its NFSv3 service with
//! the export's root handle, made on first use, kept in a small pool and
//! made anew once one breaks.
//!
//! Every call is bounded by [`CALL_TIMEOUT`]; a call that times out or
//! fails in transport leaves its connection in an unknown state, so the
//! session is dropped, with every idle one (the server likely restarted).
//! No call is repeated: a LINK, CREATE or REMOVE the server did but whose
//! answer was lost would fail the second time for the wrong reason.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nfs3_client::nfs3_types::mount::{self, dirpath, mountstat3};
use nfs3_client::nfs3_types::nfs3::{
    self, COMMIT3args, CREATE3args, FSINFO3args, GETATTR3args, LINK3args, LOOKUP3args, MKDIR3args,
    Nfs3Option, Nfs3Result, READ3args, READDIRPLUS3args, REMOVE3args, RENAME3args, WRITE3args,
    cookieverf3, createhow3, diropargs3, fattr3, filename3, ftype3, nfs_fh3, sattr3, stable_how,
};
use nfs3_client::nfs3_types::portmap::IPPROTO_TCP;
use nfs3_client::nfs3_types::rpc::{auth_unix, opaque_auth};
use nfs3_client::nfs3_types::xdr_codec::Opaque;
use nfs3_client::{MountClient, MountError, Nfs3Client, PortmapperClient, RpcError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{Semaphore, SemaphorePermit};
use tracing::debug;

use super::error::NfsError;

/// Longest wait for a connection, and for the mount that follows.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest wait for one call's answer.
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections at once: a backup has 8 blocks in flight.
const SESSIONS: usize = 4;
/// A session idle this long is asked whether it is alive before use: the
/// server may have closed it, or restarted.
const IDLE_CHECK: Duration = Duration::from_secs(20);
const IDLE_CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest READ or WRITE, whatever the server allows: the client reads
/// each answer whole into memory.
const MAX_TRANSFER: u32 = 1 << 20;
/// Privileged source ports, which servers require by default (`secure`).
const PRIVILEGED_PORTS: std::ops::Range<u16> = 600..1024;
const PORTMAPPER_PORT: u16 = 111;

/// Where an NFS export is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    /// A host name or an IP address.
    pub host: String,
    /// The path to mount: an export or a directory in one.
    pub path: String,
    /// Ports given instead of asking the server's portmapper.
    pub nfs_port: Option<u16>,
    pub mount_port: Option<u16>,
}

/// A connection to the NFS service, a call at a time.
pub(super) struct Session {
    client: Nfs3Client<Stream>,
    host: String,
    /// The handle of the mounted export, and the directories under it
    /// that lead to the target's root (made when first written).
    pub root: nfs_fh3,
    pub prefix: Vec<String>,
    pub rtmax: u32,
    pub wtmax: u32,
    /// Whether the server makes hard links (FSINFO's FSF3_LINK).
    pub links: bool,
    broken: bool,
    last_used: Instant,
}

/// The sessions of one store.
pub(super) struct Pool {
    server: Server,
    idle: Mutex<Vec<Session>>,
    slots: Semaphore,
}

/// A session taken from the pool, given back when dropped unless broken.
pub(super) struct Lease<'a> {
    pool: &'a Pool,
    session: Option<Session>,
    _slot: SemaphorePermit<'a>,
}

impl Pool {
    pub fn new(server: Server) -> Self {
        Self {
            server,
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(SESSIONS),
        }
    }

    pub fn server(&self) -> &Server {
        &self.server
    }

    /// A session: an idle one still alive, or a new one.
    pub async fn lease(&self) -> Result<Lease<'_>, NfsError> {
        // Invariant: the semaphore is never closed.
        let slot = self.slots.acquire().await.expect("the pool's semaphore");
        loop {
            let Some(mut session) = self.idle_session() else {
                let session = Session::connect(&self.server).await?;
                return Ok(self.leased(session, slot));
            };
            if session.last_used.elapsed() < IDLE_CHECK || session.alive().await {
                return Ok(self.leased(session, slot));
            }
            debug!(host = %self.server.host, "an idle NFS connection is gone");
            // The others likely share its fate: connect afresh.
            self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }

    fn leased<'a>(&'a self, session: Session, slot: SemaphorePermit<'a>) -> Lease<'a> {
        Lease {
            pool: self,
            session: Some(session),
            _slot: slot,
        }
    }

    fn idle_session(&self) -> Option<Session> {
        // Poisoned only by a panic while pushing or popping.
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }
}

impl std::ops::Deref for Lease<'_> {
    type Target = Session;
    fn deref(&self) -> &Session {
        // Invariant: the session is taken only in drop.
        self.session.as_ref().expect("a leased session")
    }
}

impl std::ops::DerefMut for Lease<'_> {
    fn deref_mut(&mut self) -> &mut Session {
        // Invariant: the session is taken only in drop.
        self.session.as_mut().expect("a leased session")
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let Some(mut session) = self.session.take() else {
            return;
        };
        let mut idle = self.pool.idle.lock().unwrap_or_else(|e| e.into_inner());
        if session.broken {
            // The others likely share its fate (a restarted server).
            idle.clear();
        } else {
            session.last_used = Instant::now();
            idle.push(session);
        }
    }
}

/// An entry of a directory.
pub(super) struct Entry {
    pub name: String,
    pub handle: Option<nfs_fh3>,
    pub attributes: Option<fattr3>,
}

impl Session {
    /// Connects and mounts: the ports from the portmapper unless given,
    /// the export's root handle by MOUNT, the transfer sizes by FSINFO.
    async fn connect(server: &Server) -> Result<Self, NfsError> {
        let timeout = |procedure| NfsError::Timeout {
            host: server.host.clone(),
            procedure,
            seconds: CONNECT_TIMEOUT.as_secs(),
        };
        tokio::time::timeout(CONNECT_TIMEOUT, Self::connect_unbounded(server))
            .await
            .map_err(|_| timeout("MOUNT"))?
    }

    async fn connect_unbounded(server: &Server) -> Result<Self, NfsError> {
        let ip = resolve(&server.host).await?;
        let (mount_port, nfs_port) = ports(server, ip).await?;
        let (root, prefix) = mount(server, SocketAddr::new(ip, mount_port)).await?;
        let stream = dial(SocketAddr::new(ip, nfs_port)).await?;
        let (credential, verifier) = credential();
        let mut session = Self {
            client: Nfs3Client::new_with_auth(stream, credential, verifier),
            host: server.host.clone(),
            root,
            prefix,
            rtmax: MAX_TRANSFER,
            wtmax: MAX_TRANSFER,
            links: true,
            broken: false,
            last_used: Instant::now(),
        };
        let args = FSINFO3args {
            fsroot: session.root.clone(),
        };
        let (client, broken, host) = session.parts();
        let info = call(host, broken, "FSINFO", &server.path, client.fsinfo(&args)).await?;
        session.rtmax = transfer_size(info.rtmax);
        session.wtmax = transfer_size(info.wtmax);
        session.links = info.properties & nfs3::FSF3_LINK != 0;
        debug!(host = %server.host, path = %server.path, nfs_port, mount_port, "NFS export mounted");
        Ok(session)
    }

    /// Whether the server still answers on this connection.
    /// Whether an idle session still answers: a NULL call, bounded by
    /// [`IDLE_CHECK_TIMEOUT`] rather than a call's limit, so that a server
    /// gone silent costs seconds, not a call's limit per idle session.
    async fn alive(&mut self) -> bool {
        let (client, broken, _) = self.parts();
        *broken = true;
        let answered = tokio::time::timeout(IDLE_CHECK_TIMEOUT, client.null()).await;
        *broken = !matches!(answered, Ok(Ok(_)));
        !*broken
    }

    /// The client, its broken flag and the host, to make a call with.
    fn parts(&mut self) -> (&mut Nfs3Client<Stream>, &mut bool, &str) {
        (&mut self.client, &mut self.broken, &self.host)
    }

    pub fn is_broken(&self) -> bool {
        self.broken
    }

    pub async fn lookup(
        &mut self,
        dir: &nfs_fh3,
        name: &str,
        path: &str,
    ) -> Result<(nfs_fh3, Option<fattr3>), NfsError> {
        let args = LOOKUP3args {
            what: dir_op(dir, name),
        };
        let (client, broken, host) = self.parts();
        let found = call(host, broken, "LOOKUP", path, client.lookup(&args)).await?;
        Ok((found.object, attributes(found.obj_attributes)))
    }

    pub async fn getattr(&mut self, file: &nfs_fh3, path: &str) -> Result<fattr3, NfsError> {
        let args = GETATTR3args {
            object: file.clone(),
        };
        let (client, broken, host) = self.parts();
        Ok(call(host, broken, "GETATTR", path, client.getattr(&args))
            .await?
            .obj_attributes)
    }

    /// Makes directory `name` in `dir`; NFS3ERR_EXIST if it is there.
    pub async fn mkdir(&mut self, dir: &nfs_fh3, name: &str, path: &str) -> Result<(), NfsError> {
        let args = MKDIR3args {
            where_: dir_op(dir, name),
            attributes: mode(0o755),
        };
        let (client, broken, host) = self.parts();
        call(host, broken, "MKDIR", path, client.mkdir(&args))
            .await
            .map(drop)
    }

    /// Creates file `name` in `dir`, empty: truncating one that is there
    /// (`exclusive` false) or failing with NFS3ERR_EXIST.
    pub async fn create(
        &mut self,
        dir: &nfs_fh3,
        name: &str,
        exclusive: bool,
        path: &str,
    ) -> Result<nfs_fh3, NfsError> {
        let how = if exclusive {
            createhow3::GUARDED(mode(0o644))
        } else {
            createhow3::UNCHECKED(mode(0o644))
        };
        let args = CREATE3args {
            where_: dir_op(dir, name),
            how,
        };
        let (client, broken, host) = self.parts();
        let made = call(host, broken, "CREATE", path, client.create(&args)).await?;
        match made.obj {
            Nfs3Option::Some(handle) => Ok(handle),
            // The server may leave the handle out: ask for it.
            Nfs3Option::None => self.lookup(dir, name, path).await.map(|(h, _)| h),
        }
    }

    /// Writes `data` at `offset`, to stable storage unless the answer says
    /// otherwise; the bytes written (maybe fewer), whether they are stable,
    /// and the file's attributes after.
    pub async fn write(
        &mut self,
        file: &nfs_fh3,
        offset: u64,
        data: &[u8],
        path: &str,
    ) -> Result<(u32, bool, Option<fattr3>), NfsError> {
        // Invariant: callers pass at most wtmax (u32) bytes.
        let count = u32::try_from(data.len()).expect("a write of at most wtmax");
        let args = WRITE3args {
            file: file.clone(),
            offset,
            count,
            stable: stable_how::FILE_SYNC,
            data: Opaque::borrowed(data),
        };
        let (client, broken, host) = self.parts();
        let written = call(host, broken, "WRITE", path, client.write(&args)).await?;
        let stable = written.committed == stable_how::FILE_SYNC;
        Ok((written.count, stable, attributes(written.file_wcc.after)))
    }

    /// Commits writes the server kept unstable.
    pub async fn commit(&mut self, file: &nfs_fh3, path: &str) -> Result<(), NfsError> {
        let args = COMMIT3args {
            file: file.clone(),
            offset: 0,
            count: 0,
        };
        let (client, broken, host) = self.parts();
        call(host, broken, "COMMIT", path, client.commit(&args))
            .await
            .map(drop)
    }

    /// Up to `count` bytes at `offset`: fewer at the file's end.
    pub async fn read(
        &mut self,
        file: &nfs_fh3,
        offset: u64,
        count: u32,
        path: &str,
    ) -> Result<Vec<u8>, NfsError> {
        let args = READ3args {
            file: file.clone(),
            offset,
            count,
        };
        let (client, broken, host) = self.parts();
        let read = call(host, broken, "READ", path, client.read(&args)).await?;
        Ok(read.data.into_owned())
    }

    pub async fn rename(
        &mut self,
        dir: &nfs_fh3,
        from: &str,
        to: &str,
        path: &str,
    ) -> Result<(), NfsError> {
        let args = RENAME3args {
            from: dir_op(dir, from),
            to: dir_op(dir, to),
        };
        let (client, broken, host) = self.parts();
        call(host, broken, "RENAME", path, client.rename(&args))
            .await
            .map(drop)
    }

    /// Links `file` as `name` in `dir`; NFS3ERR_EXIST if that is taken.
    pub async fn link(
        &mut self,
        file: &nfs_fh3,
        dir: &nfs_fh3,
        name: &str,
        path: &str,
    ) -> Result<(), NfsError> {
        let args = LINK3args {
            file: file.clone(),
            link: dir_op(dir, name),
        };
        let (client, broken, host) = self.parts();
        call(host, broken, "LINK", path, client.link(&args))
            .await
            .map(drop)
    }

    pub async fn remove(&mut self, dir: &nfs_fh3, name: &str, path: &str) -> Result<(), NfsError> {
        let args = REMOVE3args {
            object: dir_op(dir, name),
        };
        let (client, broken, host) = self.parts();
        call(host, broken, "REMOVE", path, client.remove(&args))
            .await
            .map(drop)
    }

    /// Every entry of `dir` but `.` and `..`, page by page by cookie.
    pub async fn read_dir(&mut self, dir: &nfs_fh3, path: &str) -> Result<Vec<Entry>, NfsError> {
        let mut entries = Vec::new();
        let (mut cookie, mut verifier) = (0, cookieverf3::default());
        loop {
            let args = READDIRPLUS3args {
                dir: dir.clone(),
                cookie,
                cookieverf: verifier,
                dircount: 64 << 10,
                maxcount: 256 << 10,
            };
            let (client, broken, host) = self.parts();
            let page = call(host, broken, "READDIRPLUS", path, client.readdirplus(&args)).await?;
            verifier = page.cookieverf;
            let before = cookie;
            for entry in page.reply.entries.into_inner() {
                cookie = entry.cookie;
                let name = String::from_utf8_lossy(entry.name.as_ref()).into_owned();
                if name == "." || name == ".." {
                    continue;
                }
                entries.push(Entry {
                    name,
                    handle: match entry.name_handle {
                        Nfs3Option::Some(handle) => Some(handle),
                        Nfs3Option::None => None,
                    },
                    attributes: attributes(entry.name_attributes),
                });
            }
            if page.reply.eof {
                return Ok(entries);
            }
            // A page that leads nowhere would be asked for again forever.
            if cookie == before {
                return Err(NfsError::Listing {
                    path: path.to_owned(),
                });
            }
        }
    }
}

/// Runs one call of `path`, bounded, and returns its answer or the status
/// it failed with. A timeout or a transport failure breaks the session.
/// So does a call dropped before its answer (its caller was cancelled):
/// the session is marked broken until the answer is in, or the next call
/// on it would read this one's reply, or finish sending this one's request
/// with its own bytes.
async fn call<T, E>(
    host: &str,
    broken: &mut bool,
    procedure: &'static str,
    path: &str,
    call: impl Future<Output = Result<Nfs3Result<T, E>, RpcError>>,
) -> Result<T, NfsError> {
    *broken = true;
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(answer)) => {
            *broken = false;
            status(answer, procedure, path, broken)
        }
        Ok(Err(source)) => {
            // A reply to another call, or one that does not parse: the
            // stream is out of step, whatever the library thinks.
            *broken = !source.is_connection_reusable()
                || matches!(
                    source,
                    RpcError::UnexpectedXid | RpcError::Xdr(_) | RpcError::NotFullyParsed { .. }
                );
            Err(NfsError::Rpc {
                host: host.to_owned(),
                procedure,
                source,
            })
        }
        Err(_) => {
            *broken = true;
            Err(NfsError::Timeout {
                host: host.to_owned(),
                procedure,
                seconds: CALL_TIMEOUT.as_secs(),
            })
        }
    }
}

/// The answer of a call, or the status it failed with. A handle the
/// server no longer knows (the export re-created, or a server whose
/// handles do not outlive a restart) breaks the session, so that the next
/// one mounts the export again.
fn status<T, E>(
    answer: Nfs3Result<T, E>,
    procedure: &'static str,
    path: &str,
    broken: &mut bool,
) -> Result<T, NfsError> {
    match answer {
        Nfs3Result::Ok(ok) => Ok(ok),
        Nfs3Result::Err((status, _)) => Err({
            *broken |= matches!(
                status,
                nfs3::nfsstat3::NFS3ERR_STALE | nfs3::nfsstat3::NFS3ERR_BADHANDLE
            );
            NfsError::Status {
                procedure,
                path: path.to_owned(),
                status,
            }
        }),
    }
}

fn attributes(attributes: Nfs3Option<fattr3>) -> Option<fattr3> {
    match attributes {
        Nfs3Option::Some(attributes) => Some(attributes),
        Nfs3Option::None => None,
    }
}

pub(super) fn is_dir(attributes: &fattr3) -> bool {
    attributes.type_ == ftype3::NF3DIR
}

pub(super) fn is_file(attributes: &fattr3) -> bool {
    attributes.type_ == ftype3::NF3REG
}

fn dir_op<'a>(dir: &nfs_fh3, name: &'a str) -> diropargs3<'a> {
    diropargs3 {
        dir: dir.clone(),
        name: filename3::from(name.as_bytes()),
    }
}

fn mode(mode: u32) -> sattr3 {
    sattr3 {
        mode: Nfs3Option::Some(mode),
        ..sattr3::default()
    }
}

/// The server's largest transfer, within what this client reads whole.
fn transfer_size(server_max: u32) -> u32 {
    match server_max {
        0 => 64 << 10,
        max => max.min(MAX_TRANSFER),
    }
}

/// AUTH_UNIX as root: backups are written by the node's manager, as root,
/// and an export must let it (no_root_squash). AUTH_NULL is nobody.
fn credential() -> (opaque_auth<'static>, opaque_auth<'static>) {
    let root = auth_unix {
        stamp: 0,
        machinename: Opaque::owned(b"oxhorn".to_vec()),
        uid: 0,
        gid: 0,
        gids: Vec::new(),
    };
    (opaque_auth::auth_unix(&root), opaque_auth::default())
}

async fn resolve(host: &str) -> Result<IpAddr, NfsError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse() {
        return Ok(ip);
    }
    let error = |source| NfsError::Resolve {
        host: host.to_owned(),
        source,
    };
    let mut addresses = tokio::net::lookup_host((bare, 0)).await.map_err(error)?;
    addresses
        .next()
        .map(|a| a.ip())
        .ok_or_else(|| error(std::io::ErrorKind::NotFound.into()))
}

/// The MOUNT and NFS ports: those given, the others from the portmapper.
async fn ports(server: &Server, ip: IpAddr) -> Result<(u16, u16), NfsError> {
    if let (Some(mount), Some(nfs)) = (server.mount_port, server.nfs_port) {
        return Ok((mount, nfs));
    }
    let stream = dial(SocketAddr::new(ip, PORTMAPPER_PORT)).await?;
    let mut portmapper = PortmapperClient::new(stream);
    let mut port = async |given: Option<u16>, program, version, name| match given {
        Some(port) => Ok(port),
        None => portmapper
            .getport(program, version, IPPROTO_TCP)
            .await
            .map_err(|source| NfsError::Portmap {
                host: server.host.clone(),
                program: name,
                source,
            }),
    };
    let mount = port(server.mount_port, mount::PROGRAM, mount::VERSION, "MOUNT").await?;
    let nfs = port(server.nfs_port, nfs3::PROGRAM, nfs3::VERSION, "NFS").await?;
    Ok((mount, nfs))
}

/// The root handle of `server.path`, and the directories to walk under
/// it. Servers mount only what exists (Ganesha says ACCES otherwise), so
/// a target's directory not made yet is reached through the export
/// holding it, from the server's list of exports.
async fn mount(server: &Server, address: SocketAddr) -> Result<(nfs_fh3, Vec<String>), NfsError> {
    let (credential, verifier) = credential();
    let mut client = MountClient::new_with_auth(dial(address).await?, credential, verifier);
    let host = &server.host;
    let status = match mnt(&mut client, host, &server.path).await? {
        Ok(root) => return Ok((root, Vec::new())),
        Err(status) => status,
    };
    let exports = exports(&mut client, host).await?;
    let refused = || NfsError::Mount {
        host: host.clone(),
        path: server.path.clone(),
        status,
        exports: exports.clone(),
    };
    let (export, rest) = holding_export(&server.path, &exports).ok_or_else(refused)?;
    match mnt(&mut client, host, export).await? {
        Ok(root) => Ok((root, rest)),
        Err(_) => Err(refused()),
    }
}

async fn mnt(
    client: &mut MountClient<Stream>,
    host: &str,
    path: &str,
) -> Result<Result<nfs_fh3, mountstat3>, NfsError> {
    let dir = dirpath(Opaque::borrowed(path.as_bytes()));
    let rpc = |source| NfsError::Rpc {
        host: host.to_owned(),
        procedure: "MOUNT",
        source,
    };
    match client.mnt(dir).await {
        Ok(mounted) => Ok(Ok(nfs_fh3 {
            data: Opaque::owned(mounted.fhandle.0.into_owned()),
        })),
        Err(MountError::Denied(status)) => Ok(Err(status)),
        Err(MountError::Rpc(source)) => Err(rpc(source)),
    }
}

async fn exports(client: &mut MountClient<Stream>, host: &str) -> Result<Vec<String>, NfsError> {
    let listed = client.export().await.map_err(|source| NfsError::Rpc {
        host: host.to_owned(),
        procedure: "EXPORT",
        source,
    })?;
    Ok(listed
        .into_inner()
        .into_iter()
        .map(|node| String::from_utf8_lossy(&node.ex_dir.0).into_owned())
        .collect())
}

/// The longest of `exports` holding `path`, and the directories from it
/// to `path`.
pub(super) fn holding_export<'a>(
    path: &str,
    exports: &'a [String],
) -> Option<(&'a str, Vec<String>)> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    exports
        .iter()
        .filter_map(|export| {
            let export_parts: Vec<&str> = export.split('/').filter(|p| !p.is_empty()).collect();
            parts.starts_with(&export_parts).then(|| {
                let rest = parts[export_parts.len()..].iter().map(|p| (*p).to_owned());
                (export.as_str(), export_parts.len(), rest.collect())
            })
        })
        .max_by_key(|(_, depth, _)| *depth)
        .map(|(export, _, rest)| (export, rest))
}

/// A TCP connection from a privileged port when this process may bind
/// one (as root), else from any.
async fn dial(address: SocketAddr) -> Result<Stream, NfsError> {
    let error = |source| NfsError::Connect { address, source };
    let span = PRIVILEGED_PORTS.end - PRIVILEGED_PORTS.start;
    // From a random place, so that concurrent dials rarely collide.
    let random = crate::protocol::random();
    let first = u16::from_le_bytes([random[0], random[1]]) % span;
    for step in 0..span {
        let port = PRIVILEGED_PORTS.start + (first + step) % span;
        let socket = new_socket(address).map_err(error)?;
        match socket.bind(SocketAddr::new(unspecified(address), port)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => break,
            Err(e) => return Err(error(e)),
        }
        match connect(socket, address).await {
            Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => continue,
            result => return result.map_err(error),
        }
    }
    // Not root (or no privileged port free): any port, for servers that
    // allow it (`insecure`).
    connect(new_socket(address).map_err(error)?, address)
        .await
        .map_err(error)
}

fn new_socket(address: SocketAddr) -> std::io::Result<TcpSocket> {
    if address.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
}

fn unspecified(address: SocketAddr) -> IpAddr {
    if address.is_ipv4() {
        Ipv4Addr::UNSPECIFIED.into()
    } else {
        Ipv6Addr::UNSPECIFIED.into()
    }
}

async fn connect(socket: TcpSocket, address: SocketAddr) -> std::io::Result<Stream> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(address))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    stream.set_nodelay(true)?;
    Ok(Stream(stream))
}

/// A TCP stream for the RPC client, which reads until a buffer is full:
/// a closed connection must be an error there, not endless empty reads.
pub(super) struct Stream(TcpStream);

impl nfs3_client::io::AsyncRead for Stream {
    async fn async_read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self.0.read(buf).await? {
            0 if !buf.is_empty() => Err(std::io::ErrorKind::UnexpectedEof.into()),
            read => Ok(read),
        }
    }
}

impl nfs3_client::io::AsyncWrite for Stream {
    async fn async_write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.0.write(buf).await? {
            0 if !buf.is_empty() => Err(std::io::ErrorKind::WriteZero.into()),
            written => Ok(written),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_in_an_export_is_reached_through_the_longest_export() {
        let exports = ["/".to_owned(), "/export".to_owned(), "/export/a".to_owned()];
        assert_eq!(
            holding_export("/export/a/b/c", &exports),
            Some(("/export/a", vec!["b".to_owned(), "c".to_owned()]))
        );
        assert_eq!(
            holding_export("/export/ab", &exports),
            Some(("/export", vec!["ab".to_owned()]))
        );
        assert_eq!(holding_export("/other", &exports[1..]), None);
    }

    #[test]
    fn transfers_stay_within_what_is_read_whole() {
        assert_eq!(transfer_size(4 << 20), MAX_TRANSFER);
        assert_eq!(transfer_size(32 << 10), 32 << 10);
        assert_eq!(transfer_size(0), 64 << 10);
    }
}
