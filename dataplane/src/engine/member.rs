//! One replica as the engine sees it: its data connection, its control
//! client, and its place in the I/O path.

use std::sync::Mutex;

use super::EngineError;
use crate::protocol::control::replica_control_client::ReplicaControlClient;
use crate::protocol::control::{ReplicaStatus, ReplicaStatusRequest};
use crate::protocol::{self, Access, Connection, TokenChannel};

/// A replica's place in the I/O path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Serves reads and receives writes.
    ReadWrite,
    /// Receives writes while it is rebuilt; serves no reads.
    WriteOnly,
    /// Out of the I/O path.
    Error,
}

#[derive(Default)]
struct State {
    mode: Option<Mode>,
    io_errors: u64,
    last_error: String,
    rebuild: Option<(u64, u64)>,
    /// The data address of the replica a running rebuild copies from.
    rebuild_source: String,
    last_rebuild_copied: u64,
}

/// What the engine reports of a member.
pub struct Report {
    pub io_errors: u64,
    pub last_error: String,
    /// (bytes done, bytes total) while rebuilding.
    pub rebuild: Option<(u64, u64)>,
    pub rebuild_source: String,
    pub last_rebuild_copied: u64,
}

pub struct Member {
    /// Data address (host:port); control is on the next port.
    pub address: String,
    /// The replica's id, as I/O-path records name it.
    pub id: String,
    pub data: Connection,
    pub control: ReplicaControlClient<TokenChannel>,
    state: Mutex<State>,
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    // Every update is a plain field assignment: a panic cannot leave it torn.
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Member {
    /// Connects to the replica's data and control ports and reads its status.
    /// The member starts in [`Mode::Error`] until the engine places it.
    pub async fn connect(
        address: &str,
        access: &Access,
    ) -> Result<(Self, ReplicaStatus), EngineError> {
        let control_address = control_address(address)?;
        let data = Connection::connect(address, access).await?;
        let channel = protocol::control_channel(&control_address)
            .await
            .map_err(|e| {
                EngineError::Control(
                    address.to_string(),
                    tonic::Status::unavailable(e.to_string()),
                )
            })?;
        let mut control = ReplicaControlClient::new(protocol::with_token(channel, access));
        let status = protocol::within_deadline(control.status(ReplicaStatusRequest {}))
            .await
            .map_err(|e| EngineError::Control(address.to_string(), e))?
            .into_inner();
        let member = Self {
            address: address.to_string(),
            id: status.id.clone(),
            data,
            control,
            state: Mutex::new(State {
                mode: Some(Mode::Error),
                last_error: "not yet placed".into(),
                ..State::default()
            }),
        };
        Ok((member, status))
    }

    pub fn mode(&self) -> Mode {
        lock(&self.state).mode.unwrap_or(Mode::Error)
    }

    pub fn set_mode(&self, mode: Mode) {
        let mut state = lock(&self.state);
        state.mode = Some(mode);
        if mode != Mode::Error {
            state.last_error.clear();
        }
    }

    /// Takes the replica out of the I/O path; true if it was in it.
    pub fn fail(&self, reason: &str) -> bool {
        let was_healthy = {
            let mut state = lock(&self.state);
            let was_healthy = state.mode != Some(Mode::Error);
            state.mode = Some(Mode::Error);
            state.io_errors += 1;
            state.last_error = reason.to_string();
            state.rebuild = None;
            was_healthy
        };
        self.data.close(reason);
        was_healthy
    }

    /// Keeps the member out of the I/O path until its rebuild lets it in,
    /// without counting an I/O error. It reports as rebuilding meanwhile,
    /// not as failed: it is on its way in.
    pub fn queue_rebuild(&self, reason: &str) {
        let mut state = lock(&self.state);
        state.mode = Some(Mode::Error);
        state.last_error = reason.to_string();
        state.rebuild = Some((0, 0));
    }

    pub fn set_rebuild_progress(&self, progress: Option<(u64, u64)>) {
        lock(&self.state).rebuild = progress;
    }

    pub fn set_rebuild_source(&self, address: &str) {
        lock(&self.state).rebuild_source = address.to_owned();
    }

    pub fn set_rebuild_copied(&self, bytes: u64) {
        lock(&self.state).last_rebuild_copied = bytes;
    }

    pub fn report(&self) -> Report {
        let state = lock(&self.state);
        Report {
            io_errors: state.io_errors,
            last_error: state.last_error.clone(),
            rebuild: state.rebuild,
            // Only while rebuilding: a finished rebuild has no source.
            rebuild_source: match state.rebuild {
                Some(_) => state.rebuild_source.clone(),
                None => String::new(),
            },
            last_rebuild_copied: state.last_rebuild_copied,
        }
    }

    pub fn control_address(&self) -> String {
        // Validated in connect().
        control_address(&self.address).unwrap_or_default()
    }
}

/// host:(port+1) for a data address host:port.
pub fn control_address(address: &str) -> Result<String, EngineError> {
    let invalid = |why: &str| EngineError::InvalidAddress(address.to_string(), why.to_string());
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| invalid("expected host:port"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| invalid("the port is not a number"))?;
    let control =
        protocol::control_port(port).ok_or_else(|| invalid("no port after it for control"))?;
    if host.is_empty() {
        return Err(invalid("the host is empty"));
    }
    Ok(format!("{host}:{control}"))
}
