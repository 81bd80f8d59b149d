//! Manager liveness: each manager renews a coordination.k8s.io Lease named
//! for its node. Others treat an expired lease as "manager missing" and take
//! over what this node owned.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};
use tracing::{info, warn};

use crate::types::{MANAGER_LEASE_LABEL, lease_name};

/// Takes this node's lease, then returns the task that renews it every third
/// of `duration`, forever. Taking it before the controllers start keeps the
/// other managers from seeing this node as down meanwhile. Renewal failures
/// are logged and retried on the next tick: when they last longer than
/// `duration`, other managers rightly consider this one gone.
pub async fn hold_lease(
    client: Client,
    namespace: String,
    node: String,
    duration: Duration,
) -> Result<impl Future<Output = ()>, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client, &namespace);
    renew(&api, &node, duration).await?;
    info!(lease = %lease_name(&node), ?duration, "manager lease held");
    Ok(async move {
        let mut tick = tokio::time::interval(duration / 3);
        tick.tick().await;
        loop {
            tick.tick().await;
            if let Err(error) = renew(&api, &node, duration).await {
                warn!(%error, "renewing the manager lease");
            }
        }
    })
}

async fn renew(api: &Api<Lease>, node: &str, duration: Duration) -> Result<(), kube::Error> {
    let name = lease_name(node);
    let now = MicroTime(jiff::Timestamp::now());
    let seconds = i32::try_from(duration.as_secs()).unwrap_or(i32::MAX);
    match api.get_opt(&name).await? {
        Some(mut lease) => {
            let spec = lease.spec.get_or_insert_default();
            spec.holder_identity = Some(node.to_owned());
            spec.lease_duration_seconds = Some(seconds);
            spec.renew_time = Some(now);
            api.replace(&name, &PostParams::default(), &lease).await?;
        }
        None => {
            let (label, value) = MANAGER_LEASE_LABEL;
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name),
                    labels: Some([(label.to_owned(), value.to_owned())].into()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(node.to_owned()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    ..LeaseSpec::default()
                }),
            };
            api.create(&PostParams::default(), &lease).await?;
        }
    }
    Ok(())
}
