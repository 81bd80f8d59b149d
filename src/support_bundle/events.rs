//! `events.yaml`: the Events of oxhorn's namespace (its objects', its
//! pods'), and, from every namespace, those of Oxhorn's PersistentVolumes
//! and claims and those of pods that name one of its volumes (a failed
//! attach or mount), oldest first. Events live an hour by default: these
//! are the recent ones.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Event;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::archive::Stopped;
use super::collect::{Collection, list_all, values};
use super::resources::Kubernetes;

/// When an event last happened, whichever API wrote it: events.k8s.io's
/// (as oxhorn's managers write them) keep it in `series`, or `eventTime`;
/// core's in `lastTimestamp`.
pub fn last_happened(event: &Event) -> Option<jiff::Timestamp> {
    let series = event.series.as_ref();
    let observed = series.and_then(|s| s.last_observed_time.as_ref());
    observed
        .map(|t| t.0)
        .or(event.last_timestamp.as_ref().map(|t| t.0))
        .or(event.event_time.as_ref().map(|t| t.0))
}

/// When an event first happened.
pub fn first_happened(event: &Event) -> Option<jiff::Timestamp> {
    let first = event.first_timestamp.as_ref().map(|t| t.0);
    first.or(event.event_time.as_ref().map(|t| t.0))
}

impl Collection<'_> {
    pub(super) async fn events(&mut self, kubernetes: &Kubernetes) -> Result<(), Stopped> {
        let what = "events.yaml";
        let namespaced: Api<Event> = Api::namespaced(self.client.clone(), &self.options.namespace);
        let mut events = Vec::new();
        let mut capped = false;
        if let Some((listed, more)) = self
            .attempt(
                "events.yaml: the namespace's",
                list_all(&namespaced, ListParams::default()),
            )
            .await
        {
            events.extend(listed);
            capped |= more;
        }
        let volumes: BTreeSet<String> = kubernetes.volumes.iter().map(|v| v.name_any()).collect();
        let claims: BTreeSet<(String, String)> = kubernetes
            .claims
            .iter()
            .map(|c| (c.namespace().unwrap_or_default(), c.name_any()))
            .collect();
        let everywhere: Api<Event> = Api::all(self.client.clone());
        for kind in ["PersistentVolume", "PersistentVolumeClaim", "Pod"] {
            let about = format!("events.yaml: those of {kind}s in every namespace");
            let params = ListParams::default().fields(&format!("involvedObject.kind={kind}"));
            let Some((listed, more)) = self.attempt(&about, list_all(&everywhere, params)).await
            else {
                continue;
            };
            capped |= more;
            let ours = |event: &Event| {
                let object = &event.involved_object;
                let name = object.name.clone().unwrap_or_default();
                match kind {
                    "PersistentVolume" => volumes.contains(&name),
                    "PersistentVolumeClaim" => {
                        claims.contains(&(object.namespace.clone().unwrap_or_default(), name))
                    }
                    // The namespace's own pods are in already.
                    _ => {
                        let message = event.message.as_deref().unwrap_or_default();
                        event.namespace().as_deref() != Some(&self.options.namespace)
                            && volumes.iter().any(|v| message.contains(v.as_str()))
                    }
                }
            };
            events.extend(listed.into_iter().filter(ours));
        }
        let mut seen = BTreeSet::new();
        events.retain(|e| seen.insert(e.uid()));
        events.sort_by_key(|e| (last_happened(e), first_happened(e)));
        self.objects(what, what, values(&events), capped).await
    }
}
