//! The settings controller: tells users, in each Setting's status, whether
//! their value is in effect (the values themselves: `datastore::settings`).

use std::sync::Arc;

use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use tracing::info;

use super::{Context, ControllerError, replace_status};
use crate::datastore::settings::validate;
use crate::types::{Setting, SettingStatus};

/// Records in the Setting's status whether its value is in effect. One
/// manager does this (see `writes_for_settings`).
pub async fn reconcile(
    setting: Arc<Setting>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    if !writes_for_settings(&ctx) {
        return Ok(Action::await_change());
    }
    let status = match validate(&setting.name_any(), &setting.spec.value) {
        Ok(()) => SettingStatus {
            applied: true,
            message: String::new(),
        },
        Err(message) => SettingStatus {
            applied: false,
            message: format!("{message}; the default is in effect"),
        },
    };
    if setting.status.as_ref() != Some(&status) {
        info!(setting = %setting.name_any(), applied = status.applied, "setting checked");
        let mut updated = (*setting).clone();
        updated.status = Some(status);
        let api: Api<Setting> = Api::namespaced(ctx.client.clone(), &ctx.ds.namespace);
        replace_status(&api, &updated).await?;
    }
    Ok(Action::await_change())
}

/// Whether this manager writes what follows from the settings, which are
/// cluster-wide: one does, the first, by name, of the nodes that are up.
pub(super) fn writes_for_settings(ctx: &Context) -> bool {
    let writer = ctx.liveness.up_nodes().into_iter().next();
    writer.as_deref() == Some(ctx.node.node_id.as_str())
}
