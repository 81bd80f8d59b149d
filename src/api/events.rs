//! `/v1/events`: the Kubernetes Events of one of oxhorn's objects, newest
//! first. Events are not cached (they are many, and short-lived): each
//! call reads them from the API server, selected by the object's kind and
//! name, at most `FETCH_MAX` (500) of them. The dashboard reads them with
//! [`read`] and [`newest_first`] too.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use k8s_openapi::api::core::v1::Event;
use kube::api::ListParams;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::ApiState;
use super::auth::{Access, Caller, Scope};
use super::error::{ApiError, ErrorBody};
use super::query::Query;
use crate::datastore::{Cache, Datastore};
use crate::support_bundle::events::first_happened;
pub use crate::support_bundle::events::last_happened;

/// The most events one call reads from the API server; the newest of them
/// are answered.
const FETCH_MAX: u32 = 500;
/// Events are read this many at a time.
const FETCH_PAGE: u32 = 250;
/// How many are answered unless asked, and the most.
const LIMIT_DEFAULT: usize = 100;
const LIMIT_MAX: usize = 500;

/// oxhorn's kinds, and their resources as RBAC names them.
const KINDS: &[(&str, &str)] = &[
    ("Volume", "volumes"),
    ("Engine", "engines"),
    ("Replica", "replicas"),
    ("Node", "nodes"),
    ("Snapshot", "snapshots"),
    ("Backup", "backups"),
    ("BackupTarget", "backuptargets"),
    ("BackupVolume", "backupvolumes"),
    ("Setting", "settings"),
    ("RecurringJob", "recurringjobs"),
    ("SystemBackup", "systembackups"),
    ("SystemRestore", "systemrestores"),
];

/// Whose events.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventQuery {
    /// The object's kind: Volume, Engine, Replica, Node, Snapshot, Backup,
    /// BackupTarget, BackupVolume, Setting, RecurringJob, SystemBackup or
    /// SystemRestore.
    pub kind: Option<String>,
    /// The object's name.
    pub name: Option<String>,
    /// At most this many, the newest (1 to 500; default 100).
    pub limit: Option<usize>,
}

/// One event of an object.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EventView {
    /// `Normal` or `Warning`.
    pub r#type: String,
    /// CamelCase, for programs.
    pub reason: String,
    /// For people.
    pub message: String,
    /// How many times it happened (Kubernetes folds repeats into one).
    pub count: i32,
    /// When it first happened, RFC 3339.
    pub first: Option<String>,
    /// When it last happened, RFC 3339.
    pub last: Option<String>,
    /// The component that reported it (e.g. `oxhorn-manager`).
    pub source: String,
}

/// An object's events, newest first.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventList {
    pub items: Vec<EventView>,
}

/// The resource of `kind`, if oxhorn has that kind.
fn resource_of(kind: &str) -> Option<&'static str> {
    KINDS.iter().find(|(k, _)| *k == kind).map(|(_, r)| *r)
}

/// Whether the manager's cache holds the `kind` named `name`.
fn exists(ds: &Datastore, kind: &str, name: &str) -> bool {
    fn has<K>(cache: &Cache<K>, name: &str) -> bool
    where
        K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        cache.get(name).is_some()
    }
    match kind {
        "Volume" => has(&ds.volumes, name),
        "Engine" => has(&ds.engines, name),
        "Replica" => has(&ds.replicas, name),
        "Node" => has(&ds.nodes, name),
        "Snapshot" => has(&ds.snapshots, name),
        "Backup" => has(&ds.backups, name),
        "BackupTarget" => has(&ds.backup_targets, name),
        "BackupVolume" => has(&ds.backup_volumes, name),
        "Setting" => has(&ds.settings, name),
        _ => false,
    }
}

fn required<'a>(value: &'a Option<String>, what: &str) -> Result<&'a str, ApiError> {
    match value.as_deref() {
        Some(value) if !value.is_empty() => Ok(value),
        _ => Err(ApiError::Invalid(format!("the query must name the {what}"))),
    }
}

/// An event as the API shows it, whichever API wrote it: events.k8s.io's
/// keep their count in `series`; core's in `count`.
fn view(event: Event) -> EventView {
    let first = first_happened(&event).map(|t| t.to_string());
    let last = last_happened(&event).map(|t| t.to_string());
    let series = event.series.as_ref();
    let count = series
        .and_then(|s| s.count)
        .or(event.count)
        .unwrap_or(1)
        .max(1);
    let source = event
        .reporting_component
        .filter(|c| !c.is_empty())
        .or(event.source.and_then(|s| s.component))
        .unwrap_or_default();
    EventView {
        r#type: event.type_.unwrap_or_default(),
        reason: event.reason.unwrap_or_default(),
        message: event.message.unwrap_or_default(),
        count,
        first,
        last,
        source,
    }
}

/// Newest first, by when they last happened, then first happened.
pub fn newest_first(events: &mut [Event]) {
    events.sort_by_key(|e| std::cmp::Reverse((last_happened(e), first_happened(e))));
}

/// The Events of oxhorn's namespace that `fields` selects, read a page at
/// a time, at most `most` of them, in the order the API server lists them
/// (by name, not by time).
pub async fn read(state: &ApiState, fields: &str, most: u32) -> kube::Result<Vec<Event>> {
    let events = state.api::<Event>();
    let mut all = Vec::new();
    let mut params = ListParams::default().fields(fields);
    loop {
        let left = most.saturating_sub(u32::try_from(all.len()).unwrap_or(u32::MAX));
        params = params.limit(left.min(FETCH_PAGE));
        let page = events.list(&params).await?;
        all.extend(page.items);
        match page.metadata.continue_ {
            Some(next) if !next.is_empty() && all.len() < most as usize => {
                params = params.continue_token(&next);
            }
            _ => return Ok(all),
        }
    }
}

/// The events of one of oxhorn's objects, newest first.
#[utoipa::path(
    get,
    path = "/v1/events",
    operation_id = "list_events",
    tag = "events",
    params(EventQuery),
    responses(
        (status = 200, description = "The object's events, newest first", body = EventList),
        (status = 400, description = "No kind or name, an unknown kind, a bad limit", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not list events, or get the object", body = ErrorBody),
        (status = 404, description = "No such object", body = ErrorBody),
        (status = 503, description = "The API server did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Query(query): Query<EventQuery>,
) -> Result<Json<EventList>, ApiError> {
    let auth = &state.auth;
    auth.authorize(
        &caller,
        &Access::core("list", "events", Scope::Oxhorn, None),
    )
    .await?;
    let kind = required(&query.kind, "object's kind (kind=Volume, …)")?;
    let name = required(&query.name, "object's name (name=…)")?;
    let Some(resource) = resource_of(kind) else {
        let known: Vec<&str> = KINDS.iter().map(|(k, _)| *k).collect();
        return Err(ApiError::Invalid(format!(
            "kind must be one of {}, not {kind:?}",
            known.join(", ")
        )));
    };
    let limit = query.limit.unwrap_or(LIMIT_DEFAULT);
    if !(1..=LIMIT_MAX).contains(&limit) {
        return Err(ApiError::Invalid(format!(
            "limit must be 1 to {LIMIT_MAX}, not {limit}"
        )));
    }
    auth.authorize(&caller, &Access::oxhorn("get", resource, Some(name)))
        .await?;
    if !exists(&state.ds, kind, name) {
        return Err(ApiError::NotFound {
            kind: resource.trim_end_matches('s'),
            name: name.to_owned(),
        });
    }
    let api_version = <crate::types::Volume as kube::Resource>::api_version(&());
    let selector = format!(
        "involvedObject.apiVersion={api_version},involvedObject.kind={kind},involvedObject.name={name}"
    );
    let mut events = read(&state, &selector, FETCH_MAX).await?;
    newest_first(&mut events);
    events.truncate(limit);
    let items = events.into_iter().map(view).collect();
    Ok(Json(EventList { items }))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{EventSeries, EventSource};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};

    use super::*;

    fn at(text: &str) -> jiff::Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn events_of_either_api_show_their_times_count_and_source() {
        // As events.k8s.io writes one repeated: eventTime, a series.
        let recorded = Event {
            type_: Some("Warning".into()),
            reason: Some("Degraded".into()),
            message: Some("1 of 2 replicas".into()),
            event_time: Some(MicroTime(at("2026-01-01T00:00:00Z"))),
            series: Some(EventSeries {
                count: Some(3),
                last_observed_time: Some(MicroTime(at("2026-01-01T00:05:00Z"))),
            }),
            reporting_component: Some("oxhorn-manager".into()),
            ..Event::default()
        };
        let shown = view(recorded);
        assert_eq!((shown.count, shown.source.as_str()), (3, "oxhorn-manager"));
        assert_eq!(shown.first.as_deref(), Some("2026-01-01T00:00:00Z"));
        assert_eq!(shown.last.as_deref(), Some("2026-01-01T00:05:00Z"));
        // As core/v1 writes one.
        let core = Event {
            first_timestamp: Some(Time(at("2026-01-01T00:00:00Z"))),
            last_timestamp: Some(Time(at("2026-01-02T00:00:00Z"))),
            count: Some(2),
            source: Some(EventSource {
                component: Some("kubelet".into()),
                host: None,
            }),
            ..Event::default()
        };
        let shown = view(core);
        assert_eq!((shown.count, shown.source.as_str()), (2, "kubelet"));
        assert_eq!(shown.last.as_deref(), Some("2026-01-02T00:00:00Z"));
    }

    #[test]
    fn the_newest_come_first() {
        let event = |last: &str| Event {
            type_: Some("Normal".into()),
            reason: Some(last.into()),
            last_timestamp: Some(Time(at(last))),
            ..Event::default()
        };
        let mut events = vec![
            event("2026-01-01T00:00:00Z"),
            event("2026-03-01T00:00:00Z"),
            event("2026-02-01T00:00:00Z"),
        ];
        newest_first(&mut events);
        let order: Vec<&str> = events.iter().filter_map(|e| e.reason.as_deref()).collect();
        assert_eq!(
            order,
            [
                "2026-03-01T00:00:00Z",
                "2026-02-01T00:00:00Z",
                "2026-01-01T00:00:00Z"
            ]
        );
    }

    #[test]
    fn every_oxhorn_kind_has_its_resource() {
        for crd in crate::types::crds() {
            let kind = crd.spec.names.kind.as_str();
            assert_eq!(
                resource_of(kind),
                Some(crd.spec.names.plural.as_str()),
                "{kind}"
            );
        }
        assert_eq!(resource_of("Pod"), None);
    }
}
