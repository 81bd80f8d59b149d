//! The embedded controllers. Every manager runs all of them; for each object
//! exactly one manager acts (see [`ownership`]). A reconcile reads the shared
//! caches, works on a copy, and writes status once at the end, only when it
//! changed; a conflict means the cache was stale or another manager won, and
//! the object is looked at again when its newer version arrives.

pub mod backup;
mod claim_labels;
mod cluster_key;
mod context;
mod counters;
mod data_plane;
mod engine;
mod error;
mod expectations;
mod instance_status;
mod lease;
mod node;
pub mod ownership;
mod recurring;
mod replica;
mod retries;
pub mod settings;
mod snapshot;
mod system_backup;
mod volume;
mod watches;
mod writes;

pub use cluster_key::{KEY_SECRET, cluster_key};
pub use context::{Context, NodeConfig};
pub use counters::{BackupMetrics, ControllerMetrics, Counted, duration_histogram};
pub use engine::io_metrics;
pub use error::ControllerError;
pub use expectations::Expectations;
pub use lease::hold_lease;
pub use node::ensure_own_node;
pub use recurring::{JobClock, ON_SCHEDULE};
pub use replica::data_dir as replica_data_dir;
pub use writes::{delete, hold, patch_guarded, release, replace_status, update_status};

use std::convert::identity;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Instant;

use futures::{StreamExt, TryFuture, TryFutureExt};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;
use tracing::{debug, warn};

use crate::datastore::{Cache, changed_only};
use crate::types::{Backup, BackupVolume};
use watches::{
    Mapper, backup_concerns, backups_of, engine_volume, evicting_node, evictions_on, filled_from,
    instance_changes, jobs_of, liveness_changes, replica_volume, replicas_on, snapshot_concerns,
    sourcing_claims, standby_followers, turns_of, watch_liveness,
};

/// Runs every controller until the future is dropped. Call after the caches
/// have synced, so that no decision is made on a partial view.
pub async fn run(ctx: Arc<Context>) {
    let (ds, ns) = (&ctx.ds, &ctx.ds.namespace);
    let wiring = Wiring {
        liveness: watch_liveness(ctx.liveness.clone()),
        ctx: Arc::clone(&ctx),
    };
    let volumes = wiring.run(
        &ds.volumes,
        |c| {
            c.follows(&ds.replicas, replica_volume(ns))
                .follows(&ds.engines, engine_volume(ns))
                .follows(&ds.snapshots, snapshot_concerns(&ds.volumes))
                .follows(&ds.volumes, filled_from(&ds.snapshots, ns))
                .follows(&ds.backups, backup_concerns(&ds.volumes))
                .follows(
                    &ds.backups,
                    standby_followers(&ds.volumes, |b: &Backup| {
                        (&b.spec.backup_target_name, &b.spec.volume_name)
                    }),
                )
                .follows(
                    &ds.backup_volumes,
                    standby_followers(&ds.volumes, |b: &BackupVolume| {
                        (&b.spec.backup_target_name, &b.spec.volume_name)
                    }),
                )
                .follows(&ds.nodes, evictions_on(&ds.replicas, ns))
                .follows(&ds.recurring_jobs, turns_of(ns))
        },
        volume::reconcile,
    );
    let engines = wiring.run(
        &ds.engines,
        |c| c.reconcile_on(instance_changes(&ctx.instances, ns)),
        engine::reconcile,
    );
    let replicas = wiring.run(
        &ds.replicas,
        |c| {
            c.reconcile_on(instance_changes(&ctx.instances, ns))
                .follows(&ds.nodes, replicas_on(&ds.replicas))
        },
        replica::reconcile,
    );
    let nodes = wiring.run(
        &ds.nodes,
        |c| c.follows(&ds.replicas, evicting_node(&ds.nodes)),
        node::reconcile,
    );
    let settings = wiring.run(&ds.settings, identity, settings::reconcile);
    let snapshots = wiring.run(&ds.snapshots, identity, snapshot::reconcile);
    let backup_targets = wiring.run(&ds.backup_targets, identity, backup::reconcile_target);
    let backup_volumes = wiring.run(&ds.backup_volumes, identity, backup::reconcile_volume);
    let backups = wiring.run(
        &ds.backups,
        |c| c.follows(&ds.snapshots, backups_of(&ds.backups)),
        backup::reconcile_backup,
    );
    let default_backup_target = backup::run_default_target(Arc::clone(&ctx));
    let recurring_jobs = wiring.run(
        &ds.recurring_jobs,
        |c| c.follows(&ds.volumes, jobs_of(&ds.recurring_jobs)),
        recurring::reconcile,
    );
    let claims = wiring.run(
        &ds.claims,
        |c| c.follows(&ds.volumes, sourcing_claims(&ds.claims, &ctx.node.node_id)),
        claim_labels::reconcile,
    );
    let system_backups = wiring.run(
        &ds.system_backups,
        identity,
        system_backup::reconcile_backup,
    );
    let system_restores = wiring.run(
        &ds.system_restores,
        identity,
        system_backup::reconcile_restore,
    );

    futures::join!(
        volumes,
        engines,
        replicas,
        nodes,
        settings,
        snapshots,
        backup_targets,
        backup_volumes,
        backups,
        default_backup_target,
        recurring_jobs,
        claims,
        system_backups,
        system_restores
    );
}

/// What every controller shares: the context its reconciles get, and the
/// node availability changes that make it look at all its objects again
/// (their owner may have changed).
struct Wiring {
    ctx: Arc<Context>,
    liveness: broadcast::Sender<()>,
}

impl Wiring {
    /// The controller of `objects` running `reconcile`: on every change of
    /// an object, of node availability, and of what `watches` adds.
    fn run<K, W, R, Fut>(
        &self,
        objects: &Cache<K>,
        watches: W,
        reconcile: R,
    ) -> impl Future<Output = ()> + use<K, W, R, Fut>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        W: FnOnce(Controller<K>) -> Controller<K>,
        R: FnMut(Arc<K>, Arc<Context>) -> Fut,
        Fut: TryFuture<Ok = Action, Error = ControllerError> + Send + 'static,
    {
        let controller =
            Controller::for_shared_stream(changed_only(objects.subscribe()), objects.store.clone());
        let mut reconcile = reconcile;
        let reconcile_counted = move |object: Arc<K>, ctx: Arc<Context>| {
            let key = object_key(&*object);
            let started = Instant::now();
            let pass = TryFutureExt::into_future(reconcile(object, Arc::clone(&ctx)));
            async move {
                let result = pass.await;
                ctx.metrics
                    .reconciles
                    .reconciled(&K::kind(&()), started, result.is_err());
                if result.is_ok() {
                    ctx.retries.succeeded(&key);
                }
                result
            }
        };
        watches(controller)
            .reconcile_all_on(liveness_changes(&self.liveness))
            .run(reconcile_counted, error_policy, Arc::clone(&self.ctx))
            .for_each(|_| futures::future::ready(()))
    }
}

/// A controller's watch of another kind.
trait Follows<K: Resource<DynamicType = ()>> {
    /// Also looks at the objects `mapper` finds concerned by each change of
    /// an object in `others`.
    fn follows<O, I>(self, others: &Cache<O>, mapper: impl Mapper<O, I>) -> Self
    where
        O: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        I: IntoIterator<Item = ObjectRef<K>> + 'static,
        I::IntoIter: Send;
}

impl<K> Follows<K> for Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    fn follows<O, I>(self, others: &Cache<O>, mapper: impl Mapper<O, I>) -> Self
    where
        O: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        I: IntoIterator<Item = ObjectRef<K>> + 'static,
        I::IntoIter: Send,
    {
        self.watches_shared_stream(changed_only(others.subscribe()), mapper)
    }
}

/// "Kind/name": which object, for its retries.
fn object_key<K: Resource<DynamicType = ()>>(object: &K) -> String {
    format!("{}/{}", K::kind(&()), object.name_any())
}

/// Retries soon after a conflict, later after anything else, and later
/// still each time the same object fails again ([`retries`]).
fn error_policy<K>(object: Arc<K>, error: &ControllerError, ctx: Arc<Context>) -> Action
where
    K: Resource<DynamicType = ()>,
{
    if error.is_conflict() {
        debug!(name = %object.name_any(), "conflict; looking again");
        return Action::requeue(retries::CONFLICT_RETRY);
    }
    let retry = ctx.retries.failed(&object_key(&*object));
    warn!(name = %object.name_any(), %error, retry_in = ?retry, "reconcile failed");
    Action::requeue(retry)
}
