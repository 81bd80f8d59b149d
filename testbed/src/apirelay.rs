//! A TCP relay to the API server for managers in network namespaces: the
//! control plane listens on loopback in the root namespace, which a host
//! in a namespace cannot reach, so a relay listens on an address of a test
//! network (its gateway) and copies each connection to the API server.
//! Cutting a host off the relay's network then cuts it off the API server
//! and nothing else.
//!
//! The relay runs on a thread and runtime of its own: a test that blocks
//! its own runtime's workers (reading a whole device, say) must not delay
//! the managers' lease renewals.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use crate::{Error, Result};

/// After a failed accept (out of file descriptors, say), before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Relays connections until dropped; dropping it closes every connection.
pub struct ApiRelay {
    address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ApiRelay {
    /// Listens on a free port of `listen` and relays to `target`.
    pub fn start(listen: IpAddr, target: SocketAddr) -> Result<Self> {
        Self::start_at(SocketAddr::new(listen, 0), target)
    }

    /// Listens on `listen` (port 0: a free one) and relays to `target`.
    pub fn start_at(listen: SocketAddr, target: SocketAddr) -> Result<Self> {
        let what = format!("relay on {listen}");
        let listener = std::net::TcpListener::bind(listen).map_err(|e| Error::io(&what, e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io(&what, e))?;
        let address = listener.local_addr().map_err(|e| Error::io(&what, e))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::io(&what, e))?;
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("api-relay".into())
            .spawn(move || runtime.block_on(serve(listener, target, stopped)))
            .map_err(|e| Error::io(&what, e))?;
        Ok(Self {
            address,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Where managers reach the API server.
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for ApiRelay {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            eprintln!("API relay {}: its thread panicked", self.address);
        }
    }
}

/// Accepts and relays until `stopped`; returning drops every connection.
async fn serve(
    listener: std::net::TcpListener,
    target: SocketAddr,
    mut stopped: oneshot::Receiver<()>,
) {
    let address = listener.local_addr().ok();
    let listener = match TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("API relay {address:?}: {error}");
            return;
        }
    };
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    connections.spawn(relay(client, target));
                }
                Err(error) => {
                    eprintln!("API relay {address:?}: accept: {error}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            Some(_) = connections.join_next() => {}
        }
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
