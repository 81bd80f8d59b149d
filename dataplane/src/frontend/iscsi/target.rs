//! The target: accepts connections on the engine's iSCSI address, runs
//! each one's login and full feature phase (`connection`), and
//! keeps the table of live sessions, so that an initiator logging in again
//! with the same ISID replaces its old session (RFC 7143 §6.3.5) only once
//! that session's commands in flight have finished.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

use super::chap::ChapSecrets;
use super::connection::Connection;
use crate::frontend::BlockDevice;
use crate::frontend::scsi::disk::Disk;
use crate::frontend::scsi::luns::Luns;

/// The prefix of every oxhorn target's name; the volume's name follows.
pub const IQN_PREFIX: &str = "iqn.2026-01.io.oxhorn:";

/// How a target behaves.
#[derive(Clone, Debug)]
pub struct TargetConfig {
    /// The volume served: the target is `iqn.2026-01.io.oxhorn:<volume>`.
    pub volume: String,
    /// A connection silent this long is pinged with a NOP-In...
    pub ping_interval: Duration,
    /// ...and closed if it stays silent this much longer.
    pub ping_timeout: Duration,
    /// A login must complete within this.
    pub login_timeout: Duration,
    /// Connections served at once; more are closed on arrival.
    pub max_connections: usize,
    /// The CHAP secrets initiators must prove; none asks for no
    /// authentication.
    pub chap: Option<ChapSecrets>,
    /// Bytes of write data the target solicits with R2Ts at once, across
    /// its connections; a write past it waits for earlier ones to finish
    /// before its R2Ts go out. With the window and FirstBurstLength, this
    /// bounds the memory initiators can make the target hold.
    pub write_budget: u32,
}

impl TargetConfig {
    pub fn new(volume: &str) -> Self {
        Self {
            volume: volume.to_owned(),
            ping_interval: Duration::from_secs(5),
            ping_timeout: Duration::from_secs(10),
            login_timeout: Duration::from_secs(15),
            max_connections: 16,
            chap: None,
            write_budget: 64 << 20,
        }
    }

    pub fn target_name(&self) -> String {
        format!("{IQN_PREFIX}{}", self.volume)
    }
}

/// A session's identity among the target's (RFC 7143 §4.4.1: the
/// initiator's name and the ISID it chose).
type SessionKey = (String, [u8; 6]);

/// A live session's connection: how to stop it, and how to know it is
/// gone.
struct Live {
    tsih: u16,
    stop: CancellationToken,
    gone: CancellationToken,
}

#[derive(Default)]
struct Sessions {
    last_tsih: u16,
    live: HashMap<SessionKey, Live>,
}

/// What every connection of a target shares.
pub struct Target<D> {
    pub(super) config: TargetConfig,
    pub(super) luns: Luns<D>,
    /// What is left of `config.write_budget`, in bytes.
    pub(super) write_budget: Arc<Semaphore>,
    sessions: Mutex<Sessions>,
}

impl<D: BlockDevice> Target<D> {
    pub fn new(config: TargetConfig, device: Arc<D>) -> Arc<Self> {
        let disk = Disk::new(device, &config.volume);
        Arc::new(Self {
            luns: Luns::new(disk, &config.volume),
            write_budget: Arc::new(Semaphore::new(config.write_budget as usize)),
            config,
            sessions: Mutex::default(),
        })
    }

    /// Serves connections from `listener` until `stop`, then stops every
    /// connection and waits for their commands in flight to finish.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, stop: CancellationToken) {
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                accepted = listener.accept() => match accepted {
                    Ok((socket, peer)) if connections.len() < self.config.max_connections => {
                        let _ = socket.set_nodelay(true);
                        let span = info_span!("iscsi", volume = %self.config.volume, %peer);
                        let connection = Connection::new(Arc::clone(&self), socket, stop.child_token());
                        connections.spawn(connection.run().instrument(span));
                    }
                    Ok((_, peer)) => warn!(%peer, "iSCSI connection refused: {} connections already", self.config.max_connections),
                    Err(error) => warn!(%error, "accepting an iSCSI connection"),
                },
            }
        }
        while connections.join_next().await.is_some() {}
        info!(volume = %self.config.volume, "iSCSI target stopped");
    }

    /// A TSIH for a new session: never 0, never one in use.
    pub(super) fn next_tsih(&self) -> u16 {
        let mut sessions = lock(&self.sessions);
        loop {
            sessions.last_tsih = sessions.last_tsih.wrapping_add(1);
            let tsih = sessions.last_tsih;
            if tsih != 0 && sessions.live.values().all(|live| live.tsih != tsih) {
                return tsih;
            }
        }
    }

    /// Enters a session that completed its login, replacing any with the
    /// same key once that one's connection is gone.
    pub(super) async fn register(
        &self,
        key: SessionKey,
        tsih: u16,
        stop: CancellationToken,
        gone: CancellationToken,
    ) {
        let old = lock(&self.sessions)
            .live
            .insert(key, Live { tsih, stop, gone });
        if let Some(old) = old {
            info!(
                tsih = old.tsih,
                "reinstating the session: closing its old connection"
            );
            old.stop.cancel();
            old.gone.cancelled().await;
        }
    }

    /// Leaves the table, unless another session has replaced this one.
    pub(super) fn unregister(&self, key: &SessionKey, tsih: u16) {
        let mut sessions = lock(&self.sessions);
        if sessions.live.get(key).is_some_and(|live| live.tsih == tsih) {
            sessions.live.remove(key);
        }
    }
}

/// `ip:port,tag` of the portal a connection reached, for SendTargets.
pub(super) fn portal(local: SocketAddr) -> String {
    format!("{local},{}", super::login::PORTAL_GROUP_TAG)
}

/// The session table's lock: a panic while holding it leaves the table
/// whole (each change is one insert or remove), so a poisoned lock is
/// taken as it is.
fn lock(sessions: &Mutex<Sessions>) -> std::sync::MutexGuard<'_, Sessions> {
    sessions
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
