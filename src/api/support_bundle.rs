//! `/v1/support-bundle`: the support bundle (`support_bundle`,
//! docs/support-bundle.md), streamed as it is made. The manager reads it
//! with its own account, so the caller must be allowed every read it
//! makes (`support_bundle::reads`), and is refused (403, naming the first
//! one missing) otherwise; the Secrets' names are listed only for a caller
//! who may list Secrets. One bundle at a time per manager.

use std::io::Write;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use futures::future::join_all;
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{Instrument, info, info_span, warn};
use utoipa::{IntoParams, ToSchema};

use super::ApiState;
use super::auth::{Access, Caller, Scope};
use super::error::{ApiError, ErrorBody};
use super::query::Query;
use crate::support_bundle::{self, Options, Read, Scrape, Where};

/// Chunks of the archive waiting to be sent.
const CHUNKS: usize = 8;
/// The size of the chunks the archive is sent in.
const CHUNK: usize = 64 << 10;

/// How the bundle is made.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct BundleQuery {
    /// How far back the containers' logs reach: `30m`, `24h` (the
    /// default), `7d`, ...
    pub since: Option<String>,
}

/// A tar.gz: `oxhorn-support-bundle-<time>/` with `summary.txt` first to
/// read.
#[derive(ToSchema)]
#[schema(value_type = String, format = Binary)]
pub struct BundleArchive(pub Vec<u8>);

/// A read of the bundle's, as the caller's access to check.
fn access(read: Read) -> Access {
    Access {
        verb: read.verb,
        group: read.group,
        resource: read.resource,
        subresource: read.subresource,
        name: None,
        scope: match read.scope {
            Where::Namespace => Scope::Oxhorn,
            Where::Cluster => Scope::Cluster,
        },
    }
}

/// The archive's bytes, sent on as the response's body.
struct Chunks(mpsc::Sender<Result<Bytes, std::io::Error>>);

impl Write for Chunks {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // Called on the archive's blocking thread.
        self.0
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the caller left"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A support bundle.
#[utoipa::path(
    get,
    path = "/v1/support-bundle",
    operation_id = "support_bundle",
    tag = "support",
    params(BundleQuery),
    responses(
        (status = 200, description = "The bundle, a tar.gz, streamed as it is made", content_type = "application/gzip", body = BundleArchive),
        (status = 400, description = "A bad since", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not make one of the bundle's reads (list on oxhorn.io's kinds, pods, nodes, PersistentVolumes and claims, events in every namespace, StorageClasses, CSIDrivers, CSINodes, VolumeAttachments, DaemonSets, Deployments and Leases; get pods/log)", body = ErrorBody),
        (status = 409, description = "This manager is making a bundle already", body = ErrorBody),
        (status = 503, description = "The API server did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Query(query): Query<BundleQuery>,
) -> Result<Response, ApiError> {
    let auth = &state.auth;
    let reads: Vec<Access> = support_bundle::reads().map(access).collect();
    // All at once; the first refused, in order, is the one named.
    let answers = join_all(reads.iter().map(|read| auth.authorize(&caller, read))).await;
    answers.into_iter().collect::<Result<Vec<()>, ApiError>>()?;
    let since = match query.since.as_deref() {
        Some(since) => support_bundle::parse_since(since).map_err(ApiError::Invalid)?,
        None => support_bundle::SINCE_DEFAULT,
    };
    let secret_names = auth
        .allows(&caller, &access(support_bundle::SECRET_NAMES))
        .await;
    let permit = Arc::clone(&state.bundles)
        .try_acquire_owned()
        .map_err(|_| {
            ApiError::Conflict(
                "this manager is making a support bundle already: try again once it is done".into(),
            )
        })?;
    let created = jiff::Timestamp::now();
    let name = support_bundle::name(created);
    let options = Options {
        namespace: state.ds.namespace.clone(),
        since,
        log_limit: support_bundle::LOG_LIMIT_DEFAULT,
        made_by: format!(
            "the REST API of oxhorn manager {}, for {}",
            env!("CARGO_PKG_VERSION"),
            caller.name()
        ),
        secret_names,
        scrape: Scrape::Direct,
        created,
    };
    let (sender, receiver) = mpsc::channel(CHUNKS);
    let out = std::io::BufWriter::with_capacity(CHUNK, Chunks(sender));
    let client = state.client.clone();
    let span = info_span!("support_bundle", user = caller.name(), bundle = name);
    tokio::spawn(
        async move {
            let _one_at_a_time = permit;
            info!("making a support bundle");
            match support_bundle::write(client, options, out).await {
                Ok(report) => info!(failed = report.failed(), "support bundle sent"),
                Err(error) => warn!(%error, "support bundle not sent whole"),
            }
        }
        .instrument(span),
    );
    let headers = [
        (CONTENT_TYPE, "application/gzip".to_owned()),
        (
            CONTENT_DISPOSITION,
            format!("attachment; filename=\"{name}.tar.gz\""),
        ),
    ];
    Ok((headers, Body::from_stream(ReceiverStream::new(receiver))).into_response())
}
