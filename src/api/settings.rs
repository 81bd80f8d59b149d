//! `/v1/settings`: every cluster-wide setting (defined in
//! `datastore::settings`), with its value: the Setting object's, or the
//! default when there is none; and setting one, checked as the managers
//! check it, so a value they would not apply is refused at once.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use kube::api::{Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::info;
use utoipa::ToSchema;

use super::ApiState;
use super::auth::{Access, Caller};
use super::body::Body;
use super::error::{ApiError, ErrorBody};
use crate::datastore::settings::{self, Described};
use crate::types::{Setting, SettingSpec};

/// A setting as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SettingView {
    /// Its key, the Setting object's name.
    pub key: String,
    /// The value: the Setting object's, or the default when it has none.
    pub value: String,
    /// Whether a Setting object holds the value (else it is the default).
    pub set: bool,
    /// Whether the value is in effect, as the managers last said; absent
    /// until they checked a value just set. An invalid value leaves the
    /// default in effect.
    pub applied: Option<bool>,
    /// Why the value is not in effect, when it is not.
    pub message: String,
    /// `integer`, `boolean`, `choice` or `text`.
    pub kind: String,
    /// What the value may be, in words.
    pub allowed: String,
    /// An integer's smallest value.
    pub minimum: Option<i64>,
    /// An integer's largest value.
    pub maximum: Option<i64>,
    /// The words a choice (or boolean) takes; empty for other kinds.
    pub choices: Vec<String>,
    pub default: String,
    /// What it does.
    pub description: String,
}

/// Every setting, in the order docs/settings.md lists them.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SettingList {
    pub items: Vec<SettingView>,
}

/// A setting's new value.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SettingValue {
    pub value: String,
}

fn view(described: Described, setting: Option<&Setting>) -> SettingView {
    let (value, applied, message) = match setting {
        Some(setting) => {
            let status = setting.status.as_ref();
            (
                setting.spec.value.clone(),
                status.map(|s| s.applied),
                status.map(|s| s.message.clone()).unwrap_or_default(),
            )
        }
        None => (described.default.to_owned(), Some(true), String::new()),
    };
    let (minimum, maximum) = described.range.unzip();
    SettingView {
        key: described.key.to_owned(),
        value,
        set: setting.is_some(),
        applied,
        message,
        kind: described.kind.to_owned(),
        allowed: described.allowed,
        minimum,
        maximum,
        choices: described.choices.iter().map(|c| (*c).to_owned()).collect(),
        default: described.default.to_owned(),
        description: described.description.to_owned(),
    }
}

fn described(key: &str) -> Result<Described, ApiError> {
    settings::describe(key).ok_or_else(|| ApiError::NotFound {
        kind: "setting",
        name: key.to_owned(),
    })
}

/// Every setting and its value.
#[utoipa::path(
    get,
    path = "/v1/settings",
    operation_id = "list_settings",
    tag = "settings",
    responses(
        (status = 200, description = "Every setting", body = SettingList),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not list settings", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
) -> Result<Json<SettingList>, ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("list", "settings", None))
        .await?;
    Ok(Json(SettingList { items: all(&state) }))
}

/// Every setting, in the order docs/settings.md lists them.
pub fn all(state: &ApiState) -> Vec<SettingView> {
    settings::described()
        .map(|d| {
            let setting = state.ds.settings.get(d.key);
            view(d, setting.as_deref())
        })
        .collect()
}

/// One setting and its value.
#[utoipa::path(
    get,
    path = "/v1/settings/{key}",
    operation_id = "get_setting",
    tag = "settings",
    params(("key" = String, Path, description = "The setting's key")),
    responses(
        (status = 200, description = "The setting", body = SettingView),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not get it", body = ErrorBody),
        (status = 404, description = "No such setting", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(key): Path<String>,
) -> Result<Json<SettingView>, ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("get", "settings", Some(&key)))
        .await?;
    let described = described(&key)?;
    let setting = state.ds.settings.get(&key);
    Ok(Json(view(described, setting.as_deref())))
}

/// Sets a setting: its Setting object is created, or its value changed.
/// It applies on the managers' next reconcile, without a restart. Needs
/// `update` on the setting, and `create` too when it has no object yet.
#[utoipa::path(
    put,
    path = "/v1/settings/{key}",
    operation_id = "put_setting",
    tag = "settings",
    params(("key" = String, Path, description = "The setting's key")),
    request_body = SettingValue,
    responses(
        (status = 200, description = "The setting, with its new value", body = SettingView),
        (status = 400, description = "A bad body, or a value the setting does not take", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not update (or create) it", body = ErrorBody),
        (status = 404, description = "No such setting", body = ErrorBody),
        (status = 409, description = "The API server refused (created meanwhile)", body = ErrorBody),
        (status = 503, description = "The API server did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn put(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(key): Path<String>,
    body: Body,
) -> Result<Json<SettingView>, ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("update", "settings", Some(&key)))
        .await?;
    let new: SettingValue = body.parse()?;
    let described = described(&key)?;
    settings::validate(&key, &new.value).map_err(ApiError::Invalid)?;
    let api = state.api::<Setting>();
    let written = if state.ds.settings.get(&key).is_some() {
        let patch = json!({"spec": {"value": new.value}});
        api.patch(&key, &PatchParams::default(), &Patch::Merge(&patch))
            .await?
    } else {
        state
            .auth
            .authorize(&caller, &Access::oxhorn("create", "settings", Some(&key)))
            .await?;
        let setting = Setting::new(
            &key,
            SettingSpec {
                value: new.value.clone(),
            },
        );
        api.create(&PostParams::default(), &setting).await?
    };
    info!(
        user = caller.name(),
        setting = key,
        value = new.value,
        "setting set through the API"
    );
    let mut shown = view(described, Some(&written));
    // What the status says is of the value before.
    shown.applied = None;
    shown.message = String::new();
    Ok(Json(shown))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::SettingStatus;

    #[test]
    fn a_setting_without_an_object_has_its_default_in_effect() {
        let count = settings::describe("default-replica-count").unwrap();
        let shown = view(count.clone(), None);
        assert_eq!(
            (shown.value.as_str(), shown.set, shown.applied),
            ("3", false, Some(true))
        );
        assert_eq!((shown.minimum, shown.maximum), (Some(1), Some(20)));
        let mut setting = Setting::new("default-replica-count", SettingSpec { value: "0".into() });
        assert_eq!(view(count.clone(), Some(&setting)).applied, None);
        setting.status = Some(SettingStatus {
            applied: false,
            message: "too few".into(),
        });
        let shown = view(count, Some(&setting));
        assert_eq!(
            (shown.value.as_str(), shown.set, shown.applied),
            ("0", true, Some(false))
        );
        assert_eq!(shown.message, "too few");
    }

    #[test]
    fn every_setting_is_listed_once() {
        let keys: Vec<String> = settings::described().map(|d| view(d, None).key).collect();
        let mut unique = keys.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), keys.len());
        assert!(keys.iter().any(|k| k == "backup-compression-method"));
    }
}
