//! [`Context`]: what every reconcile is given: the API client, the shared
//! caches, this node, the instance manager, and how to claim an object.

use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::NamespaceResourceScope;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{debug, info};

use super::counters::Counted;
use super::data_plane::EngineChannels;
use super::node::FrontendProbe;
use super::ownership::Owned;
use super::retries::Retries;
use super::{ControllerError, Expectations, replace_status};
use crate::datastore::{Datastore, Liveness, Settings};
use crate::instance::InstanceManager;
use crate::protocol::{Access, Key};

/// What this node's manager is and where its pieces are.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub node_id: String,
    /// Directory of the node's default disk.
    pub data_dir: PathBuf,
    /// The node's host, where its frontends' programs run.
    pub host: crate::host::Host,
    /// Where the engines publish volumes' block devices on this node.
    pub dev_dir: PathBuf,
    /// The clock recurring jobs' schedules are read on.
    pub job_clock: super::recurring::JobClock,
}

/// Everything a reconcile needs.
pub struct Context {
    pub client: Client,
    pub ds: Arc<Datastore>,
    pub node: NodeConfig,
    pub liveness: Liveness,
    pub instances: Arc<InstanceManager>,
    /// The cluster's data-plane key: volumes' keys derive from it.
    key: Key,
    /// Objects this manager created that its caches may not show yet.
    pub expected: Expectations,
    /// Connections to the engines this node runs, kept between polls.
    pub engine_channels: EngineChannels,
    /// What this node's frontends need, as last probed.
    pub frontends: FrontendProbe,
    /// Failures in a row per object, for how long the next retry waits.
    pub retries: Retries,
    /// What the controllers count for /metrics.
    pub metrics: Counted,
    recorder: Recorder,
}

impl Context {
    pub fn new(
        client: Client,
        ds: Arc<Datastore>,
        node: NodeConfig,
        instances: Arc<InstanceManager>,
        key: Key,
        metrics: Counted,
    ) -> Arc<Self> {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "oxhorn-manager".into(),
                instance: Some(node.node_id.clone()),
            },
        );
        Arc::new(Self {
            liveness: Liveness::new(&ds),
            client,
            ds,
            node,
            instances,
            key,
            expected: Expectations::default(),
            engine_channels: EngineChannels::default(),
            frontends: FrontendProbe::default(),
            retries: Retries::default(),
            metrics,
            recorder,
        })
    }

    /// How to reach `volume`'s data plane as its engine generation
    /// `generation` does.
    pub fn access(&self, volume: &str, generation: u64) -> Access {
        Access {
            volume: volume.to_string(),
            key: self.key.for_volume(volume),
            generation,
        }
    }

    /// The settings in effect now.
    pub fn settings(&self) -> Settings {
        Settings::read(&self.ds.settings)
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.ds.namespace)
    }

    /// Publishes a Kubernetes Event about `object`. Events are best effort:
    /// failing to record one never fails a reconcile.
    pub async fn event<K>(&self, object: &K, type_: EventType, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: reason.into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &object.object_ref(&())).await {
            debug!(%error, reason, "event not recorded");
        }
    }

    /// Claims `object` for this manager when it is responsible for it: returns
    /// the object as it is after the claim, or `None` when another manager
    /// acts on it (including when another claimed it first).
    pub(super) async fn claim<K>(&self, object: &K) -> Result<Option<K>, ControllerError>
    where
        K: Owned
            + Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + Serialize
            + DeserializeOwned
            + Debug,
    {
        self.claim_preferring(object, object.preferred_owner())
            .await
    }

    /// [`claim`](Self::claim), with `preferred` as the preferred owner.
    pub(super) async fn claim_preferring<K>(
        &self,
        object: &K,
        preferred: &str,
    ) -> Result<Option<K>, ControllerError>
    where
        K: Owned
            + Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + Serialize
            + DeserializeOwned
            + Debug,
    {
        let current = object.current_owner();
        if !self
            .liveness
            .is_responsible_for(&self.node.node_id, preferred, current)
        {
            return Ok(None);
        }
        if current == self.node.node_id {
            return Ok(Some(object.clone()));
        }
        let mut claimed = object.clone();
        claimed.set_owner(&self.node.node_id);
        match replace_status(&self.api::<K>(), &claimed).await {
            Ok(written) => {
                info!(kind = %K::kind(&()), name = %object.name_any(), from = current, "took ownership");
                Ok(Some(written))
            }
            Err(error) if error.is_conflict() => {
                debug!(name = %object.name_any(), "another manager claimed it first");
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }
}
