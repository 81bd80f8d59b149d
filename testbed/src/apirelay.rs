//! A TCP relay to the API server for managers in network namespaces: the
//! control plane listens on loopback in the root namespace, which a host
//! in a namespace cannot reach, so a relay listens on an address of a test
//! network (its gateway) and copies each connection to the API server.
//! Cutting a host off the relay's network then cuts it off the API server
//! and nothing else.

use std::net::{IpAddr, SocketAddr};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::{Error, Result};

/// Relays connections until dropped; dropping it closes every connection.
pub struct ApiRelay {
    address: SocketAddr,
    task: JoinHandle<()>,
}

impl ApiRelay {
    /// Listens on a free port of `listen` and relays to `target`, on the
    /// caller's tokio runtime.
    pub async fn start(listen: IpAddr, target: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind((listen, 0))
            .await
            .map_err(|e| Error::io(format!("relay on {listen}"), e))?;
        let address = listener
            .local_addr()
            .map_err(|e| Error::io(format!("relay on {listen}"), e))?;
        let task = tokio::spawn(async move {
            // Held here so that aborting the task closes every connection.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((client, _)) => {
                            connections.spawn(relay(client, target));
                        }
                        Err(error) => eprintln!("API relay {address}: accept: {error}"),
                    },
                    Some(_) = connections.join_next() => {}
                }
            }
        });
        Ok(Self { address, task })
    }

    /// Where managers reach the API server.
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for ApiRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(mut client: TcpStream, target: SocketAddr) {
    match TcpStream::connect(target).await {
        Ok(mut server) => {
            // Ends when either side closes or fails; nothing to report then.
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        }
        Err(error) => eprintln!("API relay: connecting to {target}: {error}"),
    }
}
