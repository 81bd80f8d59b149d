//! The I/O of the engines of the volumes a manager owns, read over each
//! engine's control API at scrape time (no engine serves HTTP of its own).

use futures::future::join_all;
use tracing::debug;

use super::view::View;
use crate::controller::{Context, io_metrics};

/// Fills in the I/O figures of each volume in `view` whose engine runs on
/// this node, asking all engines at once; an engine that does not answer
/// leaves its volume without them this scrape.
pub async fn read(ctx: &Context, view: &mut View) {
    let asked = view.volumes.iter().map(|volume| async move {
        let engine = volume.engine.as_ref()?;
        let name = &volume.labels.volume;
        io_metrics(ctx, engine)
            .await
            .inspect_err(|error| debug!(volume = %name, %error, "engine metrics not read"))
            .ok()
            .flatten()
    });
    let answers = join_all(asked).await;
    for (volume, io) in view.volumes.iter_mut().zip(answers) {
        volume.io = io;
    }
}
