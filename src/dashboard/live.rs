//! Live pages: a server-sent event stream telling an open page that what
//! it shows may have changed, so its script renders it again. It says
//! only that: what the page then shows is authorized as any page is.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::FutureExt;
use futures::stream::{BoxStream, Stream, StreamExt, select_all};

use kube::ResourceExt;

use super::Viewer;
use crate::api::ApiState;
use crate::types::Node;

/// Changes closer together than this are told as one...
const BURST: Duration = Duration::from_millis(300);
/// ...up to this long after the first, however often they come.
const BURST_MAX: Duration = Duration::from_secs(2);

/// Every change of what the pages show. Of a Node, only a change of its
/// spec or conditions: its manager writes its status as often as a disk's
/// free space moves.
fn changes(state: &ApiState) -> BoxStream<'static, ()> {
    let ds = &state.ds;
    let nodes = ds
        .nodes
        .subscribe()
        .scan(HashMap::new(), |seen, node| {
            let key = (node.metadata.generation, conditions(&node));
            let changed = seen.insert(node.name_any(), key.clone()) != Some(key);
            futures::future::ready(Some(changed))
        })
        .filter(|changed| futures::future::ready(*changed))
        .map(|_| ());
    select_all([
        nodes.boxed(),
        ds.volumes.subscribe().map(|_| ()).boxed(),
        ds.engines.subscribe().map(|_| ()).boxed(),
        ds.replicas.subscribe().map(|_| ()).boxed(),
        ds.snapshots.subscribe().map(|_| ()).boxed(),
        ds.backups.subscribe().map(|_| ()).boxed(),
        ds.backup_targets.subscribe().map(|_| ()).boxed(),
        ds.settings.subscribe().map(|_| ()).boxed(),
    ])
    .boxed()
}

/// A node's conditions and its disks', as the pages show them.
fn conditions(node: &Node) -> Vec<(String, String)> {
    let Some(status) = node.status.as_ref() else {
        return Vec::new();
    };
    let disks = status.disk_status.values().flat_map(|d| &d.conditions);
    status
        .conditions
        .iter()
        .chain(disks)
        .map(|c| (c.type_.clone(), format!("{:?}", c.status)))
        .collect()
}

/// Waits out a burst of changes: until none came for [`BURST`], or for
/// [`BURST_MAX`] in all.
async fn settle(changes: &mut BoxStream<'static, ()>) -> Option<()> {
    let end = tokio::time::Instant::now() + BURST_MAX;
    loop {
        let wait = BURST.min(end.saturating_duration_since(tokio::time::Instant::now()));
        match tokio::time::timeout(wait, changes.next()).await {
            Ok(Some(())) => continue,
            Ok(None) => return None,
            Err(_) => return Some(()),
        }
    }
}

pub async fn stream(
    State(state): State<Arc<ApiState>>,
    _viewer: Viewer,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut changes = changes(&state);
    // A subscription starts with every object there is, at once: the page
    // shows those already.
    while let Some(Some(())) = changes.next().now_or_never() {}
    let told = futures::stream::unfold(changes, |mut changes| async move {
        changes.next().await?;
        settle(&mut changes).await?;
        // Browsers drop an event without data.
        let event = Event::default().event("changed").data("1");
        Some((Ok(event), changes))
    });
    Sse::new(told).keep_alive(KeepAlive::default())
}
