//! `/v1/nodes`: oxhorn's Nodes (a Kubernetes node's disks and scheduling
//! switches), and changes to them. Every change is a JSON Patch of the
//! Node's spec applied only while its generation is the one the manager's
//! cache holds, so a change made meanwhile by anyone else fails (409)
//! instead of being overwritten, while its manager's frequent status
//! writes do not get in the way. What a Node's manager measured (its
//! status) is read only.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tracing::info;
use utoipa::{IntoParams, ToSchema};

mod checks;

use checks::check_reserved;
pub use checks::{check_disk_name, check_disk_path, checked_tags};

use super::auth::{Access, Caller};
use super::body::Body;
use super::error::{ApiError, ErrorBody};
use super::page::{self, Page};
use super::query::Query;
use super::{ApiState, cached};
use crate::types::{Condition, DiskSpec, Node, same_path};

/// How many replicas a refusal names before counting the rest.
const NAMED_MAX: usize = 10;

/// One condition of a node or disk.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ConditionView {
    /// e.g. `Ready`, `Schedulable`.
    pub r#type: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// CamelCase, for programs.
    pub reason: String,
    /// For people.
    pub message: String,
}

/// Whether a node can present volumes with one frontend.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FrontendView {
    /// `fuse` or `iscsi`.
    pub frontend: String,
    pub supported: bool,
    /// What is missing, when not supported.
    pub reason: String,
}

/// One disk of a node: its configuration, and what its manager measured.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DiskView {
    /// Its key in the Node's spec.disks.
    pub name: String,
    /// The directory holding its replicas' data.
    pub path: String,
    /// Whether new replicas may be placed on it.
    pub allow_scheduling: bool,
    /// Bytes kept free for other uses.
    pub storage_reserved: i64,
    /// Tags a volume's diskSelector matches.
    pub tags: Vec<String>,
    /// Size of its filesystem, bytes; 0 until measured.
    pub storage_maximum: i64,
    /// Free bytes on its filesystem.
    pub storage_available: i64,
    /// Bytes promised to the replicas scheduled on it.
    pub storage_scheduled: i64,
    /// Its filesystem's id: the diskID of the replicas on it.
    pub fsid: String,
    /// Its Ready condition is True (mounted and readable).
    pub ready: bool,
    /// Its Schedulable condition is True (it takes new replicas).
    pub schedulable: bool,
    pub conditions: Vec<ConditionView>,
    /// Replicas whose data is on it.
    pub replicas: usize,
    /// Its replicas are moving off it, and none is placed there.
    pub eviction_requested: bool,
}

/// A node as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    pub name: String,
    /// Its Ready condition is True: the node and its manager are up.
    pub ready: bool,
    /// Its Schedulable condition is True: it takes new replicas.
    pub schedulable: bool,
    /// Whether new replicas may be placed on it (spec).
    pub allow_scheduling: bool,
    /// Its replicas are moving off it, and none is placed there.
    pub eviction_requested: bool,
    /// Replicas still to move off it: all of its own while it is evicting,
    /// else those on its evicting disks.
    pub replicas_to_evict: usize,
    /// Tags a volume's nodeSelector matches.
    pub tags: Vec<String>,
    /// From the Kubernetes node's topology labels; empty: none.
    pub zone: String,
    pub region: String,
    /// The frontends it can present volumes with.
    pub frontends: Vec<FrontendView>,
    /// Its disks, by name.
    pub disks: Vec<DiskView>,
    pub conditions: Vec<ConditionView>,
}

/// Which page of nodes (by name).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// At most this many (1 to 1000; default 100).
    pub limit: Option<usize>,
    /// From the page after the one that returned this.
    pub r#continue: Option<String>,
}

/// A change to a node; what is absent stays as it is.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeUpdate {
    pub allow_scheduling: Option<bool>,
    /// true: move every replica off the node (each once a replacement
    /// elsewhere serves) and place none there; false: stop.
    pub eviction_requested: Option<bool>,
    /// Replace its tags with these.
    pub tags: Option<Vec<String>>,
}

/// A disk to add to a node.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NewDisk {
    /// A DNS label (lowercase letters, digits, `-`; at most 63).
    pub name: String,
    /// An absolute path on the node, without `..`.
    pub path: String,
    /// Default: true.
    pub allow_scheduling: Option<bool>,
    /// Bytes kept free for other uses; default 0.
    pub storage_reserved: Option<i64>,
    pub tags: Option<Vec<String>>,
}

/// A change to a disk; what is absent stays as it is.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DiskUpdate {
    pub allow_scheduling: Option<bool>,
    /// true: move every replica off the disk (each once a replacement
    /// elsewhere serves) and place none there; false: stop.
    pub eviction_requested: Option<bool>,
    pub storage_reserved: Option<i64>,
    /// Replace its tags with these.
    pub tags: Option<Vec<String>>,
}

fn conditions(conditions: &[Condition]) -> Vec<ConditionView> {
    conditions
        .iter()
        .map(|c| ConditionView {
            r#type: c.type_.clone(),
            status: format!("{:?}", c.status),
            reason: c.reason.clone(),
            message: c.message.clone(),
        })
        .collect()
}

/// The replicas whose data is on `node`'s disk `disk`, by name.
fn replicas_on(state: &ApiState, node: &Node, disk: &str) -> Vec<String> {
    let mut names: Vec<String> = state
        .ds
        .replicas
        .store
        .state()
        .iter()
        .filter(|r| node.holds(r, disk))
        .map(|r| r.name_any())
        .collect();
    names.sort();
    names
}

/// How many replicas are still to move off `node`, by the cache: its
/// status's count may be half a minute old.
fn to_evict(state: &ApiState, node: &Node) -> usize {
    if !node.evicting() {
        return 0;
    }
    state
        .ds
        .replicas
        .store
        .state()
        .iter()
        .filter(|r| r.metadata.deletion_timestamp.is_none() && node.evicts(r))
        .count()
}

fn view(state: &ApiState, node: &Node) -> NodeView {
    let status = node.status.clone().unwrap_or_default();
    let disks = node
        .spec
        .disks
        .iter()
        .map(|(name, spec)| {
            let measured = status.disk_status.get(name).cloned().unwrap_or_default();
            DiskView {
                name: name.clone(),
                path: spec.path.clone(),
                allow_scheduling: spec.allow_scheduling,
                storage_reserved: spec.storage_reserved,
                tags: spec.tags.clone(),
                storage_maximum: measured.storage_maximum,
                storage_available: measured.storage_available,
                storage_scheduled: measured.storage_scheduled,
                ready: Condition::is_true(&measured.conditions, "Ready"),
                schedulable: Condition::is_true(&measured.conditions, "Schedulable"),
                conditions: conditions(&measured.conditions),
                replicas: replicas_on(state, node, name).len(),
                eviction_requested: spec.eviction_requested,
                fsid: measured.fsid,
            }
        })
        .collect();
    NodeView {
        name: node.name_any(),
        ready: Condition::is_true(&status.conditions, "Ready"),
        schedulable: Condition::is_true(&status.conditions, "Schedulable"),
        allow_scheduling: node.spec.allow_scheduling,
        eviction_requested: node.spec.eviction_requested,
        replicas_to_evict: to_evict(state, node),
        tags: node.spec.tags.clone(),
        zone: status.zone.clone(),
        region: status.region.clone(),
        frontends: status
            .frontends
            .iter()
            .map(|f| FrontendView {
                frontend: serde_json::to_value(f.frontend)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                supported: f.supported,
                reason: f.reason.clone(),
            })
            .collect(),
        disks,
        conditions: conditions(&status.conditions),
    }
}

/// Why disk `disk` of `node` may not be removed yet, as Longhorn has it:
/// scheduling on it must be off, or it evicting (so nothing lands there
/// meanwhile), and no replica may be left on it.
fn removal_refused(node: &str, disk: &str, spec: &DiskSpec, replicas: &[String]) -> Option<String> {
    if !replicas.is_empty() {
        let mut named = replicas
            .iter()
            .take(NAMED_MAX)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if replicas.len() > NAMED_MAX {
            named.push_str(&format!(" and {} more", replicas.len() - NAMED_MAX));
        }
        return Some(format!(
            "disk {disk} of node {node} still holds replicas ({named}): move them away first (evictionRequested true moves each once its replacement elsewhere serves)"
        ));
    }
    if spec.allow_scheduling && !spec.eviction_requested {
        return Some(format!(
            "disk {disk} of node {node} still takes replicas: disable scheduling on it (allowScheduling false) or evict it (evictionRequested true) first"
        ));
    }
    None
}

/// Applies `ops` to `node` while its spec is the one the cache holds
/// ([`at_generation`](super::at_generation)).
async fn patch_spec(state: &ApiState, node: &Node, ops: Vec<Value>) -> Result<Node, ApiError> {
    super::at_generation(state, node, "node", ops).await
}

/// `key` as one step of a JSON Pointer.
fn pointer(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The operation that sets disk `name` of `node` to `disk`.
fn set_disk(node: &Node, name: &str, disk: &DiskSpec) -> Value {
    if node.spec.disks.is_empty() {
        // The map itself may be absent.
        json!({"op": "add", "path": "/spec/disks", "value": {name: disk}})
    } else {
        json!({"op": "add", "path": format!("/spec/disks/{}", pointer(name)), "value": disk})
    }
}

fn node(state: &ApiState, name: &str) -> Result<Arc<Node>, ApiError> {
    cached(&state.ds.nodes, "node", name)
}

fn disk<'a>(node: &'a Node, name: &str) -> Result<&'a DiskSpec, ApiError> {
    node.spec.disks.get(name).ok_or_else(|| ApiError::NotFound {
        kind: "disk",
        name: format!("{name} of node {}", node.name_any()),
    })
}

async fn may_patch(state: &ApiState, caller: &Caller, name: &str) -> Result<(), ApiError> {
    state
        .auth
        .authorize(caller, &Access::oxhorn("patch", "nodes", Some(name)))
        .await
}

/// The nodes, by name, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/nodes",
    operation_id = "list_nodes",
    tag = "nodes",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of nodes", body = Page<NodeView>),
        (status = 400, description = "A bad query", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not list nodes", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Query(query): Query<ListQuery>,
) -> Result<Json<Page<NodeView>>, ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("list", "nodes", None))
        .await?;
    let limit = page::limit(query.limit)?;
    let name: fn(&NodeView) -> &str = |n| &n.name;
    Ok(Json(page::page(
        all(&state),
        name,
        query.r#continue.as_deref(),
        limit,
    )))
}

/// Every node, by name.
pub fn all(state: &ApiState) -> Vec<NodeView> {
    let mut nodes: Vec<_> = state
        .ds
        .nodes
        .store
        .state()
        .iter()
        .map(|n| view(state, n))
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    nodes
}

/// One node.
#[utoipa::path(
    get,
    path = "/v1/nodes/{name}",
    operation_id = "get_node",
    tag = "nodes",
    params(("name" = String, Path, description = "The node's name")),
    responses(
        (status = 200, description = "The node", body = NodeView),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not get it", body = ErrorBody),
        (status = 404, description = "No such node", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<NodeView>, ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("get", "nodes", Some(&name)))
        .await?;
    let node = node(&state, &name)?;
    Ok(Json(view(&state, &node)))
}

/// Turns scheduling on the node on or off, replaces its tags, or requests
/// (or withdraws) the eviction of its replicas. Scheduling off leaves the
/// replicas there; an eviction moves each of them elsewhere once its
/// replacement serves, and keeps one that cannot be moved (the volume's
/// Evicted condition and a Warning Event say why).
#[utoipa::path(
    patch,
    path = "/v1/nodes/{name}",
    operation_id = "update_node",
    tag = "nodes",
    params(("name" = String, Path, description = "The node's name")),
    request_body = NodeUpdate,
    responses(
        (status = 200, description = "The node, changed", body = NodeView),
        (status = 400, description = "A bad body or tag", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not patch it", body = ErrorBody),
        (status = 404, description = "No such node", body = ErrorBody),
        (status = 409, description = "The node changed meanwhile", body = ErrorBody),
        (status = 503, description = "The API server did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn update(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
    body: Body,
) -> Result<Json<NodeView>, ApiError> {
    may_patch(&state, &caller, &name).await?;
    let update: NodeUpdate = body.parse()?;
    let node = node(&state, &name)?;
    let mut ops = Vec::new();
    if let Some(allow) = update.allow_scheduling {
        ops.push(json!({"op": "add", "path": "/spec/allowScheduling", "value": allow}));
    }
    if let Some(evict) = update.eviction_requested {
        ops.push(json!({"op": "add", "path": "/spec/evictionRequested", "value": evict}));
    }
    if let Some(tags) = &update.tags {
        let tags = checked_tags(tags)?;
        ops.push(json!({"op": "add", "path": "/spec/tags", "value": tags}));
    }
    let patched = patch_spec(&state, &node, ops).await?;
    info!(user = caller.name(), node = name, change = ?update, "node changed through the API");
    Ok(Json(view(&state, &patched)))
}

/// Adds a disk to the node: a directory its manager then measures and,
/// once Ready, places replicas in.
#[utoipa::path(
    post,
    path = "/v1/nodes/{name}/disks",
    operation_id = "add_disk",
    tag = "nodes",
    params(("name" = String, Path, description = "The node's name")),
    request_body = NewDisk,
    responses(
        (status = 201, description = "The node, with the disk", body = NodeView),
        (status = 400, description = "A bad body, name, path or tag", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not patch the node", body = ErrorBody),
        (status = 404, description = "No such node", body = ErrorBody),
        (status = 409, description = "The node has a disk of that name or path, or changed meanwhile", body = ErrorBody),
        (status = 503, description = "The API server did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn add_disk(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
    body: Body,
) -> Result<(StatusCode, Json<NodeView>), ApiError> {
    may_patch(&state, &caller, &name).await?;
    let new: NewDisk = body.parse()?;
    check_disk_name(&new.name)?;
    check_disk_path(&new.path)?;
    check_reserved(new.storage_reserved)?;
    let tags = checked_tags(new.tags.as_deref().unwrap_or_default())?;
    let node = node(&state, &name)?;
    if node.spec.disks.contains_key(&new.name) {
        return Err(ApiError::Conflict(format!(
            "node {name} already has a disk named {}",
            new.name
        )));
    }
    if let Some((other, _)) = node
        .spec
        .disks
        .iter()
        .find(|(_, d)| same_path(&d.path, &new.path))
    {
        return Err(ApiError::Conflict(format!(
            "disk {other} of node {name} already has the path {}",
            new.path
        )));
    }
    let disk = DiskSpec {
        path: new.path.clone(),
        allow_scheduling: new.allow_scheduling.unwrap_or(true),
        storage_reserved: new.storage_reserved.unwrap_or(0),
        tags,
        eviction_requested: false,
    };
    let patched = patch_spec(&state, &node, vec![set_disk(&node, &new.name, &disk)]).await?;
    info!(
        user = caller.name(),
        node = name,
        disk = new.name,
        path = new.path,
        "disk added through the API"
    );
    Ok((StatusCode::CREATED, Json(view(&state, &patched))))
}

/// Changes a disk's scheduling switch, reserved space or tags, or requests
/// (or withdraws) the eviction of its replicas, as for a node.
#[utoipa::path(
    patch,
    path = "/v1/nodes/{name}/disks/{disk}",
    operation_id = "update_disk",
    tag = "nodes",
    params(
        ("name" = String, Path, description = "The node's name"),
        ("disk" = String, Path, description = "The disk's name"),
    ),
    request_body = DiskUpdate,
    responses(
        (status = 200, description = "The node, changed", body = NodeView),
        (status = 400, description = "A bad body or value", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not patch the node", body = ErrorBody),
        (status = 404, description = "No such node or disk", body = ErrorBody),
        (status = 409, description = "The node changed meanwhile", body = ErrorBody),
        (status = 503, description = "The API server did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn update_disk(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path((name, disk_name)): Path<(String, String)>,
    body: Body,
) -> Result<Json<NodeView>, ApiError> {
    may_patch(&state, &caller, &name).await?;
    let update: DiskUpdate = body.parse()?;
    check_reserved(update.storage_reserved)?;
    let node = node(&state, &name)?;
    let mut changed = disk(&node, &disk_name)?.clone();
    if let Some(allow) = update.allow_scheduling {
        changed.allow_scheduling = allow;
    }
    if let Some(evict) = update.eviction_requested {
        changed.eviction_requested = evict;
    }
    if let Some(bytes) = update.storage_reserved {
        changed.storage_reserved = bytes;
    }
    if let Some(tags) = &update.tags {
        changed.tags = checked_tags(tags)?;
    }
    let patched = patch_spec(&state, &node, vec![set_disk(&node, &disk_name, &changed)]).await?;
    info!(user = caller.name(), node = name, disk = disk_name, change = ?update, "disk changed through the API");
    Ok(Json(view(&state, &patched)))
}

/// Removes a disk from the node, once scheduling on it is off and no
/// replica is left on it. Its data directory stays on the node.
#[utoipa::path(
    delete,
    path = "/v1/nodes/{name}/disks/{disk}",
    operation_id = "remove_disk",
    tag = "nodes",
    params(
        ("name" = String, Path, description = "The node's name"),
        ("disk" = String, Path, description = "The disk's name"),
    ),
    responses(
        (status = 200, description = "The node, without the disk", body = NodeView),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not patch the node", body = ErrorBody),
        (status = 404, description = "No such node or disk", body = ErrorBody),
        (status = 409, description = "Scheduling on the disk is on, replicas are on it, or the node changed meanwhile", body = ErrorBody),
        (status = 503, description = "The API server did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn remove_disk(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path((name, disk_name)): Path<(String, String)>,
) -> Result<Json<NodeView>, ApiError> {
    may_patch(&state, &caller, &name).await?;
    let node = node(&state, &name)?;
    let spec = disk(&node, &disk_name)?;
    let replicas = replicas_on(&state, &node, &disk_name);
    if let Some(why) = removal_refused(&name, &disk_name, spec, &replicas) {
        return Err(ApiError::Conflict(why));
    }
    let remove = json!({"op": "remove", "path": format!("/spec/disks/{}", pointer(&disk_name))});
    let patched = patch_spec(&state, &node, vec![remove]).await?;
    info!(
        user = caller.name(),
        node = name,
        disk = disk_name,
        "disk removed through the API"
    );
    Ok(Json(view(&state, &patched)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ConditionStatus;

    #[test]
    fn a_disk_goes_only_once_unschedulable_and_empty() {
        let mut disk = DiskSpec {
            path: "/mnt/ssd".into(),
            allow_scheduling: true,
            storage_reserved: 0,
            tags: vec![],
            eviction_requested: false,
        };
        let why = removal_refused("n1", "ssd", &disk, &[]).unwrap();
        assert!(why.contains("allowScheduling false"), "{why}");
        disk.eviction_requested = true;
        assert_eq!(removal_refused("n1", "ssd", &disk, &[]), None, "evicting");
        disk.eviction_requested = false;
        disk.allow_scheduling = false;
        assert_eq!(removal_refused("n1", "ssd", &disk, &[]), None);
        let replicas: Vec<String> = (0..12).map(|i| format!("r{i:02}")).collect();
        let why = removal_refused("n1", "ssd", &disk, &replicas).unwrap();
        assert!(
            why.contains("r00, r01") && why.contains("and 2 more"),
            "{why}"
        );
        assert!(!why.contains("r11"), "{why}");
    }

    #[test]
    fn a_disk_is_set_by_its_pointer_or_with_the_map_when_there_is_none() {
        assert_eq!(pointer("a/b~c"), "a~1b~0c");
        let disk = DiskSpec {
            path: "/mnt/ssd".into(),
            allow_scheduling: true,
            storage_reserved: 0,
            tags: vec![],
            eviction_requested: false,
        };
        let mut node = Node::new("n1", serde_json::from_value(json!({})).unwrap());
        let op = set_disk(&node, "ssd", &disk);
        assert_eq!(
            (&op["path"], &op["value"]["ssd"]["path"]),
            (&json!("/spec/disks"), &json!("/mnt/ssd"))
        );
        node.spec.disks.insert("default-disk".into(), disk.clone());
        let op = set_disk(&node, "ssd", &disk);
        assert_eq!(
            (&op["op"], &op["path"]),
            (&json!("add"), &json!("/spec/disks/ssd"))
        );
    }

    #[test]
    fn a_condition_shows_its_status_as_kubernetes_writes_it() {
        let mut list = Vec::new();
        Condition::set(&mut list, "Ready", ConditionStatus::True, "NodeUp", "up");
        let shown = conditions(&list);
        assert_eq!(
            (shown[0].r#type.as_str(), shown[0].status.as_str()),
            ("Ready", "True")
        );
    }
}
