//! An engine's or replica's process as its status and Events report it:
//! what the engine and replica controllers share, since both run a process
//! through the instance manager and report it the same way.

use kube::runtime::events::EventType;

use super::Context;
use crate::instance::InstanceInfo;
use crate::types::{Condition, ConditionStatus, DELETION_HELD, InstanceState, InstanceStatus};

/// The instance status condition that says whether the process runs, and
/// when it failed, why.
pub const RUNNING: &str = "Running";

/// Whether the process never ran since it was last asked to stop: nothing
/// to stop or report.
pub fn never_ran(status: Option<&InstanceStatus>) -> bool {
    status.is_none_or(|s| s.current_state == InstanceState::Stopped && !s.started)
}

/// An Event when a process starts running or fails.
pub async fn announce<K>(ctx: &Context, object: &K, before: InstanceState, now: InstanceState)
where
    K: kube::Resource<DynamicType = ()>,
{
    if before == now {
        return;
    }
    let name = object.meta().name.clone().unwrap_or_default();
    let process = ctx.instances.get(&name);
    match now {
        InstanceState::Running => {
            let pid = process.and_then(|p| p.pid).unwrap_or_default();
            ctx.event(
                object,
                EventType::Normal,
                "Running",
                format!("process {pid} runs on {}", ctx.node.node_id),
            )
            .await;
        }
        InstanceState::Error => {
            let why = process.map(|p| p.message).unwrap_or_default();
            ctx.event(
                object,
                EventType::Warning,
                "ProcessFailed",
                format!("the process on {} failed: {why}", ctx.node.node_id),
            )
            .await;
        }
        _ => {}
    }
}

/// Copies what the instance manager knows of a process into status.
pub fn reflect(status: &mut InstanceStatus, info: &InstanceInfo) {
    let conditions = &mut status.conditions;
    if info.state == InstanceState::Running {
        Condition::set(conditions, RUNNING, ConditionStatus::True, "Running", "");
    } else if info.state == InstanceState::Error {
        let why = info.message.clone();
        Condition::set(
            conditions,
            RUNNING,
            ConditionStatus::False,
            "ProcessFailed",
            why,
        );
    }
    status.current_state = info.state;
    status.ip = info.ip.to_string();
    status.port = i32::from(info.port);
    status.started |= info.state == InstanceState::Running;
}

/// Says on an instance being deleted why it still runs: its volume is
/// attached (see [`crate::types::Volume::deletion_held`]).
pub fn hold_deletion(status: &mut InstanceStatus, volume: &str, node: &str) {
    Condition::set(
        &mut status.conditions,
        DELETION_HELD,
        ConditionStatus::True,
        "Attached",
        format!("deletion waits until volume {volume} is detached from node {node}"),
    );
}
