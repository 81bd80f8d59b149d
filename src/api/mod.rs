//! The REST API under `/v1` (docs/api.md), served by every manager. It
//! answers from the manager's caches and acts by writing the custom
//! resources, once the caller is authorized: each request's bearer token is
//! authenticated and each call authorized, as its user, by the Kubernetes
//! API server (`auth.rs`); changes are logged with the user's name. The
//! custom resources stay the only contract and the API keeps no state of
//! its own. The OpenAPI document (`/v1/openapi.json`, and
//! docs/api/openapi.json) is generated from the handlers and types here.

pub mod auth;
pub mod backups;
mod body;
mod error;
pub(crate) mod page;
pub(crate) mod query;
pub mod replicas;
pub mod session;
pub mod snapshots;
pub mod support_bundle;
pub mod tls;
pub mod volumes;

// Nodes, settings, events and workloads.
pub mod events;
pub mod nodes;
pub mod settings;
pub mod workload;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::get;
use kube::Client;
use tokio::net::TcpListener;
use tracing::info;
use utoipa::openapi::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use error::{ApiError, ErrorBody};
pub use page::Page;

use crate::datastore::{Cache, Datastore};
use crate::{Error, Result};

/// The largest request body taken.
const BODY_LIMIT: usize = 64 << 10;

/// What the handlers share.
pub struct ApiState {
    pub ds: Arc<Datastore>,
    pub client: Client,
    pub auth: auth::Auth,
    /// Held while a replica is judged and deleted (`replicas.rs`).
    replica_deletes: tokio::sync::Mutex<()>,
    /// Held while a support bundle is made (`support_bundle.rs`).
    bundles: Arc<tokio::sync::Semaphore>,
}

impl ApiState {
    pub fn new(ds: Arc<Datastore>, client: Client) -> Self {
        let auth = auth::Auth::new(client.clone(), &ds.namespace);
        Self {
            ds,
            client,
            auth,
            replica_deletes: tokio::sync::Mutex::new(()),
            bundles: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }

    /// The API server's `K`s in the managers' namespace, to write them.
    pub fn api<K>(&self) -> kube::Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        kube::Api::namespaced(self.client.clone(), &self.ds.namespace)
    }
}

/// An enum as its JSON string (`Healthy` as `healthy`, say).
fn lower<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Deleting `object` only: not one made since under its name.
fn only(object: &impl kube::Resource) -> kube::api::DeleteParams {
    kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: object.meta().uid.clone(),
            resource_version: None,
        }),
        ..kube::api::DeleteParams::default()
    }
}

/// Applies `ops` (JSON Patch operations on the spec) to `object` (a
/// `kind`) only if its spec is still the one that was read: the patch
/// first tests the object's generation, which its spec alone moves. A
/// version newer only by its status (which its controllers write often)
/// is patched all the same; one whose spec changed fails with 409, to be
/// looked at again.
async fn at_generation<K>(
    state: &ApiState,
    object: &K,
    kind: &str,
    ops: Vec<serde_json::Value>,
) -> Result<K, ApiError>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    use kube::ResourceExt;
    let name = object.name_any();
    let generation = object.meta().generation;
    let mut patch = vec![serde_json::json!({
        "op": "test", "path": "/metadata/generation", "value": generation
    })];
    patch.extend(ops);
    let url = format!("{}/{name}", K::url_path(&(), Some(&state.ds.namespace)));
    let body = serde_json::to_vec(&patch)
        .map_err(|e| ApiError::Unavailable(format!("the patch could not be written: {e}")))?;
    let request = axum::http::Request::patch(url)
        .header(
            axum::http::header::CONTENT_TYPE,
            "application/json-patch+json",
        )
        .body(body)
        .map_err(|e| ApiError::Unavailable(format!("the patch could not be sent: {e}")))?;
    match state.client.request::<K>(request).await {
        Ok(patched) => Ok(patched),
        // A failed test is 422, as an invalid spec is: which one it was
        // is told by the generation now.
        Err(kube::Error::Api(status)) if matches!(status.code, 409 | 422) => {
            let now = state.api::<K>().get_opt(&name).await?;
            if now.is_some_and(|n| n.meta().generation != generation) {
                return Err(ApiError::Conflict(format!(
                    "{kind} {name} changed meanwhile: look at it again, then retry"
                )));
            }
            Err(kube::Error::Api(status).into())
        }
        Err(error) => Err(error.into()),
    }
}

/// The cached `kind` named `name`, or not found: for kinds users do not
/// make (nodes).
fn cached<K>(cache: &Cache<K>, kind: &'static str, name: &str) -> Result<Arc<K>, ApiError>
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    cache.get(name).ok_or_else(|| ApiError::NotFound {
        kind,
        name: name.to_owned(),
    })
}

/// The `kind` named `name`: as cached, or if the cache has not seen it yet
/// (it was just made), as the API server has it; else not found.
async fn found<K>(
    state: &ApiState,
    cache: &Cache<K>,
    kind: &'static str,
    name: &str,
) -> Result<Arc<K>, ApiError>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    if let Some(cached) = cache.get(name) {
        return Ok(cached);
    }
    match state.api::<K>().get_opt(name).await? {
        Some(object) => Ok(Arc::new(object)),
        None => Err(ApiError::NotFound {
            kind,
            name: name.to_owned(),
        }),
    }
}

fn routes() -> OpenApiRouter<Arc<ApiState>> {
    OpenApiRouter::new()
        .routes(routes!(volumes::list, volumes::create::create))
        .routes(routes!(
            volumes::get,
            volumes::delete,
            volumes::actions::update
        ))
        .routes(routes!(volumes::actions::attach))
        .routes(routes!(volumes::actions::detach))
        .routes(routes!(volumes::actions::expand))
        .routes(routes!(volumes::actions::salvage))
        .routes(routes!(volumes::standby::activate))
        .routes(routes!(volumes::revert::revert))
        .routes(routes!(volumes::create::clone))
        .routes(routes!(replicas::list))
        .routes(routes!(replicas::delete))
        .routes(routes!(snapshots::list, snapshots::create))
        .routes(routes!(snapshots::get, snapshots::delete))
        .routes(routes!(backups::targets))
        .routes(routes!(backups::sync))
        .routes(routes!(backups::volumes))
        .routes(routes!(backups::list))
        .routes(routes!(backups::create))
        .routes(routes!(backups::delete))
        // Nodes, settings, events and workloads.
        .routes(routes!(nodes::list))
        .routes(routes!(nodes::get, nodes::update))
        .routes(routes!(nodes::add_disk))
        .routes(routes!(nodes::update_disk, nodes::remove_disk))
        .routes(routes!(settings::list))
        .routes(routes!(settings::get, settings::put))
        .routes(routes!(events::list))
        .routes(routes!(workload::get))
        .routes(routes!(support_bundle::get))
}

/// The API's OpenAPI document.
pub fn openapi() -> OpenApi {
    let (_, mut api) = routes().split_for_parts();
    api.info.title = "Oxhorn".into();
    api.info.version = "v1".into();
    api.info.description = Some(
        "Oxhorn's volumes, replicas, snapshots, nodes and backups. Every request carries a Kubernetes bearer token; each call is authorized as its user, for the same verb on the same resource.".into(),
    );
    let bearer = HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build();
    api.components
        .get_or_insert_with(Default::default)
        .add_security_scheme("bearer", SecurityScheme::Http(bearer));
    api
}

/// The router: the API, and its document.
pub fn router(state: Arc<ApiState>) -> axum::Router {
    let (router, _) = routes().split_for_parts();
    // Written once: it never changes while the process runs.
    let document = serde_json::to_vec(&openapi()).unwrap_or_default();
    let document = axum::body::Bytes::from(document);
    router
        .route(
            "/v1/openapi.json",
            get(move || {
                let document = document.clone();
                async move {
                    let json = [(axum::http::header::CONTENT_TYPE, "application/json")];
                    (json, document)
                }
            }),
        )
        .fallback(|| async {
            ApiError::NotFound {
                kind: "path",
                name: "(see /v1/openapi.json)".into(),
            }
        })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

/// Serves `routes` (the API's, and the dashboard's) on `address`, over
/// TLS with `tls` (`tls.rs`), until the future is dropped.
pub async fn serve(
    address: SocketAddr,
    routes: axum::Router,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Result<()> {
    let failed = |e| Error::io(address.to_string(), e);
    let listener = TcpListener::bind(address).await.map_err(failed)?;
    match tls {
        Some(config) => {
            info!(%address, "serving the API over TLS");
            let listener = tls::TlsListener::new(listener, config).map_err(failed)?;
            axum::serve(listener, routes).await.map_err(failed)
        }
        None => {
            info!(%address, "serving the API");
            axum::serve(listener, routes).await.map_err(failed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/api/openapi.json is what the code describes:
    /// `cargo run -- docs openapi > docs/api/openapi.json` after a change.
    #[test]
    fn the_committed_openapi_document_is_current() {
        let generated = openapi().to_pretty_json().unwrap() + "\n";
        let committed = include_str!("../../docs/api/openapi.json");
        assert!(
            committed == generated,
            "docs/api/openapi.json is stale: run `cargo run -- docs openapi > docs/api/openapi.json`"
        );
    }

    #[test]
    fn every_operation_says_how_it_is_authorized_and_how_it_fails() {
        let document = serde_json::to_value(openapi()).unwrap();
        let paths = document["paths"].as_object().unwrap();
        for (path, item) in paths {
            for (method, operation) in item.as_object().unwrap() {
                assert!(operation["security"].is_array(), "{method} {path}");
                let responses = operation["responses"].as_object().unwrap();
                for status in ["401", "403"] {
                    assert!(responses.contains_key(status), "{method} {path}: {status}");
                }
            }
        }
    }
}
