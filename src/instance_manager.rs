//! `oxhorn instance-manager`: holds a node's engine and replica processes
//! in a pod of its own, so that they outlive the manager's container (whose
//! restart kills every process in it). It supervises them as the embedded
//! instance manager does, and serves the manager over a unix socket
//! (proto/instance.proto). The cluster key comes from the file the manager
//! writes next to the instance records; the instance manager needs no
//! access to the Kubernetes API.

use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::path::PathBuf;

use tracing::{Instrument, info, info_span};

use crate::instance::{
    InstanceManagerConfig, parse_port_range, read_cluster_key, service, state_dir,
};
use crate::{Error, Result, csi};

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

/// Runs the instance manager until `shutdown` completes; the processes keep
/// running for the next one to adopt.
pub async fn run(args: InstanceManagerArgs, shutdown: impl Future<Output = ()>) -> Result<()> {
    let span = info_span!("instance-manager", socket = %args.socket.display());
    async move {
        let key = read_cluster_key(&args.data_dir).await?;
        let binary = std::env::current_exe().map_err(|e| Error::io("/proc/self/exe", e))?;
        let config = InstanceManagerConfig {
            binary,
            state_dir: state_dir(&args.data_dir),
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
