//! `oxhorn instance-manager`: holds a node's engine and replica processes
//! in a pod of its own, so that they outlive the manager's container (whose
//! restart kills every process in it). It supervises them as the embedded
//! instance manager does, and serves the manager over a unix socket
//! (proto/instance.proto). The cluster key comes from the file the manager
//! writes next to the instance records; the instance manager needs no
//! access to the Kubernetes API.

use std::path::PathBuf;

use tracing::{Instrument, info, info_span};

use crate::instance::{InstanceArgs, read_cluster_key, service};
use crate::{Result, csi};

/// The command line of `oxhorn instance-manager`.
#[derive(Clone, Debug, clap::Args)]
pub struct InstanceManagerArgs {
    /// The socket the manager asks on.
    #[arg(long, env = "INSTANCE_MANAGER_SOCKET")]
    pub socket: PathBuf,
    /// The node's disk, address, ports and directories: the same as its
    /// manager's.
    #[command(flatten)]
    pub node: InstanceArgs,
}

/// Runs the instance manager until `shutdown` completes; the processes keep
/// running for the next one to adopt.
pub async fn run(args: InstanceManagerArgs, shutdown: impl Future<Output = ()>) -> Result<()> {
    let span = info_span!("instance-manager", socket = %args.socket.display());
    async move {
        let key = read_cluster_key(&args.node.data_dir).await?;
        let config = args.node.config(key)?;
        let (listener, _socket) = csi::endpoint::bind(&args.socket)?;
        info!("serving the manager");
        service::serve(config, listener, shutdown).await?;
        info!("stopped; engines and replicas keep running");
        Ok(())
    }
    .instrument(span)
    .await
}
