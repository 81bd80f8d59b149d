//! How every CSI call that changes or waits on something runs: in a
//! `csi{call, volume}` span, its outcome, code and time logged. The CO
//! retries quietly, so the log is where a stuck or failing call shows.
//! Calls the CO polls (listings, capacity, stats) are not logged.

use std::time::Instant;

use tonic::{Response, Status};
use tracing::{Instrument, info, info_span};

/// Runs `work` for `call` on `volume` and answers with its outcome, the
/// service's error turned into its status code.
pub async fn traced<T, E: Into<Status>>(
    call: &'static str,
    volume: &str,
    work: impl Future<Output = Result<T, E>>,
) -> Result<Response<T>, Status> {
    let span = info_span!("csi", call, volume = %volume);
    async move {
        let started = Instant::now();
        info!("call started");
        let result = work.await.map_err(Into::into);
        match &result {
            Ok(_) => info!(elapsed = ?started.elapsed(), "call succeeded"),
            Err(status) => info!(elapsed = ?started.elapsed(), code = ?status.code(), message = status.message(), "call failed"),
        }
        result.map(Response::new)
    }
    .instrument(span)
    .await
}
