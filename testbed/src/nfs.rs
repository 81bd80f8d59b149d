//! An NFS server on loopback for the backup tests: NFS-Ganesha (Debian's
//! `nfs-ganesha` and `nfs-ganesha-vfs`, installed by
//! hack/install-test-deps.sh) exporting a directory of the caller's over
//! NFSv3 as `/export`, on two free ports. It can be stopped and started
//! again on the same ports and export (an outage), and stops when dropped.
//!
//! Ganesha serving NFSv3 exits at start unless it can register with
//! rpcbind, so rpcbind runs while it starts and is stopped once it
//! answers: clients are given the ports and never ask the portmapper. An
//! rpcbind already listening on port 111 (the system's) is used and left
//! alone.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::process::Supervised;
use crate::{Error, Result};

/// How long Ganesha may take to answer after it starts (under 1 s here).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const PORTMAPPER_PORT: u16 = 111;
const NFS_PROGRAM: u32 = 100_003;
const MOUNT_PROGRAM: u32 = 100_005;
const PORTMAPPER_PROGRAM: u32 = 100_000;

/// One start at a time in this process; [`RPCBIND_LOCK`] across processes.
static STARTING: Mutex<()> = Mutex::new(());
const RPCBIND_LOCK: &str = "/tmp/oxhorn-testbed-rpcbind.lock";

/// A running (or stopped) NFS-Ganesha.
pub struct NfsServer {
    process: Option<Supervised>,
    /// The directory exported.
    export: PathBuf,
    /// Ganesha's config, logs and state.
    state: tempfile::TempDir,
    nfs_port: u16,
    mount_port: u16,
}

impl NfsServer {
    /// Exports `dir` (which must exist) as `/export` on two free loopback
    /// ports, answering once this returns.
    pub fn start(dir: &Path) -> Result<Self> {
        let export = dir.canonicalize().map_err(|e| Error::io(dir, e))?;
        let state = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let first = crate::controlplane::free_ports(2)?;
        let mut server = Self {
            process: None,
            export,
            state,
            nfs_port: first,
            mount_port: first + 1,
        };
        server.write_config()?;
        server.resume()?;
        Ok(server)
    }

    /// A target URL of directory `sub` of the export, with the ports.
    pub fn url(&self, sub: &str) -> String {
        format!(
            "nfs://127.0.0.1:/export/{sub}?nfsport={}&mountport={}",
            self.nfs_port, self.mount_port
        )
    }

    /// Stops the server: calls fail until [`resume`](Self::resume).
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut process) = self.process.take() {
            process.terminate(Duration::from_secs(20))?;
        }
        Ok(())
    }

    /// Starts the stopped server again, on the same ports and export.
    pub fn resume(&mut self) -> Result<()> {
        // Poisoned only by a panic while starting, which left nothing held.
        let _in_process = STARTING.lock().unwrap_or_else(|e| e.into_inner());
        let _across_processes = crate::process::lock_exclusive(Path::new(RPCBIND_LOCK))?;
        let rpcbind = start_rpcbind(self.state.path())?;
        let dir = self.state.path();
        let mut command = Command::new("ganesha.nfsd");
        command
            .arg("-F")
            .arg("-f")
            .arg(dir.join("ganesha.conf"))
            .arg("-L")
            .arg(dir.join("ganesha.log"))
            .arg("-p")
            .arg(dir.join("ganesha.pid"));
        let mut process = Supervised::spawn("ganesha", command, &dir.join("ganesha.out"))?;
        let ready = self.until_answers(&mut process);
        if let Some(mut rpcbind) = rpcbind {
            // Registered by now (or failed): no client needs rpcbind.
            let _ = rpcbind.terminate(Duration::from_secs(10));
        }
        match ready {
            Ok(()) => {
                self.process = Some(process);
                Ok(())
            }
            Err(error) => {
                let log = std::fs::read_to_string(dir.join("ganesha.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                Err(Error::Failed(format!(
                    "{error}; ganesha.log:\n{}",
                    tail.join("\n")
                )))
            }
        }
    }

    fn until_answers(&self, process: &mut Supervised) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            process.check_running()?;
            if rpc_null(self.nfs_port, NFS_PROGRAM, 3)
                && rpc_null(self.mount_port, MOUNT_PROGRAM, 3)
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Failed(format!(
                    "ganesha did not answer on ports {} and {} within {}s",
                    self.nfs_port,
                    self.mount_port,
                    READY_TIMEOUT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn write_config(&self) -> Result<()> {
        let dir = self.state.path();
        let recovery = dir.join("recovery");
        std::fs::create_dir_all(&recovery).map_err(|e| Error::io(&recovery, e))?;
        // NFSv3 alone, what oxhorn's client speaks; v4's recovery state, which
        // Ganesha keeps all the same, in the server's directory, not /var/lib.
        // Mount_Path_Pseudo: MOUNT takes /export, not the directory's path.
        let config = format!(
            "NFS_CORE_PARAM {{
    Bind_Addr = 127.0.0.1;
    NFS_Port = {nfs};
    MNT_Port = {mnt};
    Protocols = 3;
    Enable_NLM = false;
    Enable_RQUOTA = false;
    Enable_UDP = false;
    Mount_Path_Pseudo = true;
}}
NFSV4 {{
    Graceless = true;
    RecoveryBackend = fs;
    RecoveryRoot = {recovery};
}}
EXPORT {{
    Export_Id = 1;
    Path = {export};
    Pseudo = /export;
    Access_Type = RW;
    Squash = No_Root_Squash;
    SecType = sys, none;
    Protocols = 3;
    Transports = TCP;
    FSAL {{ Name = VFS; }}
}}
LOG {{ Default_Log_Level = EVENT; }}
",
            nfs = self.nfs_port,
            mnt = self.mount_port,
            recovery = recovery.display(),
            export = self.export.display(),
        );
        let path = dir.join("ganesha.conf");
        std::fs::write(&path, config).map_err(|e| Error::io(&path, e))
    }
}

impl Drop for NfsServer {
    fn drop(&mut self) {
        if let Err(error) = self.stop() {
            tracing::warn!(%error, "stopping ganesha");
        }
    }
}

/// Starts rpcbind, unless one answers on port 111 already (then None).
fn start_rpcbind(dir: &Path) -> Result<Option<Supervised>> {
    if rpc_null(PORTMAPPER_PORT, PORTMAPPER_PROGRAM, 2) {
        return Ok(None);
    }
    let mut command = Command::new("rpcbind");
    // Not `-h 127.0.0.1`: rpcbind 1.2.6 double-frees with it.
    command.args(["-f", "-w"]);
    let mut process = Supervised::spawn("rpcbind", command, &dir.join("rpcbind.log"))?;
    let deadline = Instant::now() + READY_TIMEOUT;
    while !rpc_null(PORTMAPPER_PORT, PORTMAPPER_PROGRAM, 2) {
        process.check_running()?;
        if Instant::now() > deadline {
            return Err(Error::Failed("rpcbind did not answer on port 111".into()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Some(process))
}

/// Whether `program` answers the NULL procedure of `version` on `port`
/// over TCP (ONC RPC, RFC 5531).
fn rpc_null(port: u16, program: u32, version: u32) -> bool {
    let call = || -> std::io::Result<bool> {
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let xid = 0x6f78_686e;
        // xid, CALL, RPC version 2, program, version, procedure 0, and
        // AUTH_NULL credential and verifier (flavor 0, no body).
        let words = [xid, 0, 2, program, version, 0, 0, 0, 0, 0];
        let mut message: Vec<u8> = (0x8000_0000u32 | 40).to_be_bytes().to_vec();
        message.extend(words.iter().flat_map(|w: &u32| w.to_be_bytes()));
        stream.write_all(&message)?;
        let mut head = [0; 4];
        stream.read_exact(&mut head)?;
        let len = u32::from_be_bytes(head) & 0x7fff_ffff;
        let mut reply = vec![0; len as usize];
        stream.read_exact(&mut reply)?;
        let word = |i: usize| {
            reply
                .get(i * 4..i * 4 + 4)
                .map(|b| [b[0], b[1], b[2], b[3]])
        };
        let word = |i| word(i).map(u32::from_be_bytes);
        // xid, REPLY, MSG_ACCEPTED, verifier (flavor, empty body), SUCCESS.
        Ok([word(0), word(1), word(2), word(5)] == [Some(xid), Some(1), Some(0), Some(0)])
    };
    call().unwrap_or(false)
}
