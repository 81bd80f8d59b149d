//! `oxhorn instance-manager`: holds a node's engine and replica processes
//! in a pod of its own, so that they outlive the manager's container (whose
//! restart kills every process in it). It supervises them as the embedded
//! instance manager does, and serves the manager over a unix socket
//! (proto/instance.proto). The cluster key comes from the file the manager
//! writes next to the instance records; the instance manager needs no
//! access to the Kubernetes API.

use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::{Instrument, info, info_span};

use crate::instance::{InstanceManagerConfig, service};
use crate::manager::{instance_state_dir, parse_port_range};
use crate::protocol::Key;
use crate::{Error, Result, csi};

/// How often the instance manager looks for the cluster key while the
/// manager has not written it yet.
const KEY_POLL: Duration = Duration::from_millis(500);
/// The cluster key's file in the instance state directory.
const KEY_FILE: &str = "cluster.key";

/// The command line of `oxhorn instance-manager`.
#[derive(Clone, Debug, clap::Args)]
pub struct InstanceManagerArgs {
    /// The socket the manager asks on.
    #[arg(long, env = "INSTANCE_MANAGER_SOCKET")]
    pub socket: PathBuf,
    /// The node's default disk, shared with the manager: instance records
    /// and logs live in its `instance-manager` directory.
    #[arg(long, env = "OXHORN_DATA_DIR", default_value = "/var/lib/oxhorn")]
    pub data_dir: PathBuf,
    /// The address instances bind and advertise (the node's).
    #[arg(long, env = "POD_IP")]
    pub ip: IpAddr,
    /// Ports handed out to instances.
    #[arg(long, default_value = "10000-19999", value_parser = parse_port_range)]
    pub ports: RangeInclusive<u16>,
    /// Where engines mount their FUSE files.
    #[arg(long, default_value = "/var/run/oxhorn")]
    pub run_dir: PathBuf,
    /// Where engines publish /dev/oxhorn/<volume> links.
    #[arg(long, default_value = "/dev/oxhorn")]
    pub dev_dir: PathBuf,
}

/// Where the manager leaves the cluster key for the node's instance
/// manager.
pub fn key_file(data_dir: &Path) -> PathBuf {
    instance_state_dir(data_dir).join(KEY_FILE)
}

/// Writes the cluster key for the instance manager: readable by root only,
/// and in place at once (renamed), never half written.
pub fn write_key(data_dir: &Path, key: &Key) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = key_file(data_dir);
    let dir = instance_state_dir(data_dir);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let tmp = dir.join(format!(".{KEY_FILE}.{}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut file| file.write_all(key.to_hex().as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, &path));
    written.map_err(|e| Error::io(&path, e))
}

/// Waits until the manager has written the cluster key.
async fn read_key(data_dir: &Path) -> Result<Key> {
    let path = key_file(data_dir);
    let mut told = false;
    loop {
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                return Key::from_hex(&text)
                    .map_err(|e| Error::Config(format!("{}: {e}", path.display())));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if !told {
                    info!(path = %path.display(), "waiting for the manager to write the cluster key");
                    told = true;
                }
                tokio::time::sleep(KEY_POLL).await;
            }
            Err(e) => return Err(Error::io(&path, e)),
        }
    }
}

/// Runs the instance manager until `shutdown` completes; the processes keep
/// running for the next one to adopt.
pub async fn run(args: InstanceManagerArgs, shutdown: impl Future<Output = ()>) -> Result<()> {
    let span = info_span!("instance-manager", socket = %args.socket.display());
    async move {
        let key = read_key(&args.data_dir).await?;
        let binary = std::env::current_exe().map_err(|e| Error::io("/proc/self/exe", e))?;
        let config = InstanceManagerConfig {
            binary,
            state_dir: instance_state_dir(&args.data_dir),
            ip: args.ip,
            ports: args.ports.clone(),
            run_dir: args.run_dir.clone(),
            dev_dir: args.dev_dir.clone(),
            key,
        };
        let (listener, _socket) = csi::endpoint::bind(&args.socket)?;
        info!("serving the manager");
        service::serve(config, listener, shutdown).await?;
        info!("stopped; engines and replicas keep running");
        Ok(())
    }
    .instrument(span)
    .await
}
