//! Recurring jobs chosen on the claim: a PersistentVolumeClaim labelled
//! `recurring-job-source.oxhorn.io: enabled` says which jobs and groups
//! its volume joins, as Longhorn's PVC source does. The volume's
//! `recurring-job.oxhorn.io/*` and `recurring-job-group.oxhorn.io/*` labels
//! are made the claim's, added and removed as the claim's change, by the
//! manager owning the volume. A claim without that label (or once it is
//! taken off) leaves its volume's labels as they are.
//!
//! Only such claims are watched (by that label), so a cluster's other
//! claims cost the managers nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use tracing::{info, info_span};

use super::{Context, ControllerError, patch_guarded};
use crate::csi::DRIVER_NAME;
use crate::datastore::unless_gone;
use crate::types::{ENABLED, GROUP_LABEL_PREFIX, JOB_LABEL_PREFIX, SOURCE_LABEL, Volume};

pub async fn reconcile(
    claim: Arc<PersistentVolumeClaim>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    if claim.labels().get(SOURCE_LABEL).map(String::as_str) != Some(ENABLED) {
        return Ok(Action::await_change());
    }
    // Not bound yet: its binding is a change of the claim.
    let Some(bound_to) = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|name| !name.is_empty())
    else {
        return Ok(Action::await_change());
    };
    // Its owner writes it (a change of owner looks at every claim again):
    // the other managers skip a volume named after its PV without asking.
    let owned = |volume: &Volume| {
        volume
            .status
            .as_ref()
            .is_some_and(|s| s.owner_id == ctx.node.node_id)
    };
    if ctx.ds.volumes.get(bound_to).is_some_and(|v| !owned(&v)) {
        return Ok(Action::await_change());
    }
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let Some(volume) = unless_gone(pvs.get(bound_to).await)?
        .filter(|pv| bound_to_claim(pv, &claim))
        .as_ref()
        .and_then(handle_of)
        .and_then(|name| ctx.ds.volumes.get(&name))
        .filter(|volume| owned(volume))
    else {
        return Ok(Action::await_change());
    };
    let Some(labels) = label_patch(volume.labels(), claim.labels()) else {
        return Ok(Action::await_change());
    };
    let span = info_span!("claim_labels", volume = %volume.name_any(),
        claim = %format!("{}/{}", claim.namespace().unwrap_or_default(), claim.name_any()));
    span.in_scope(|| info!(?labels, "the volume's jobs follow its claim's"));
    let patch = json!({"metadata": {"labels": labels}});
    patch_guarded(&ctx.api::<Volume>(), &*volume, patch).await?;
    Ok(Action::await_change())
}

/// Whether `pv` is bound to `claim`: its claimRef names it (and its uid,
/// once the binder wrote one). A claim that merely names a PV it is not
/// bound to (another tenant's, or one a second claim names too) chooses
/// nothing.
fn bound_to_claim(pv: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    let Some(by) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return false;
    };
    by.namespace == claim.metadata.namespace
        && by.name == claim.metadata.name
        && (by.uid.is_none() || by.uid == claim.metadata.uid)
}

/// The volume name of an Oxhorn PersistentVolume.
fn handle_of(pv: &PersistentVolume) -> Option<String> {
    let csi = pv.spec.as_ref()?.csi.as_ref()?;
    (csi.driver == DRIVER_NAME).then(|| csi.volume_handle.clone())
}

/// Whether `key` names a job or a group.
fn is_job_label(key: &str) -> bool {
    key.starts_with(JOB_LABEL_PREFIX) || key.starts_with(GROUP_LABEL_PREFIX)
}

/// The labels of a merge patch making `volume`'s job and group labels
/// `claim`'s (null removes one); None when they are already.
pub fn label_patch(
    volume: &BTreeMap<String, String>,
    claim: &BTreeMap<String, String>,
) -> Option<serde_json::Map<String, Value>> {
    let wanted = |labels: &BTreeMap<String, String>| -> BTreeMap<String, String> {
        labels
            .iter()
            .filter(|(key, _)| is_job_label(key))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let (has, wants) = (wanted(volume), wanted(claim));
    let mut patch = serde_json::Map::new();
    for key in has.keys().filter(|key| !wants.contains_key(*key)) {
        patch.insert(key.clone(), Value::Null);
    }
    for (key, value) in wants.iter().filter(|(k, v)| has.get(*k) != Some(v)) {
        patch.insert(key.clone(), Value::String(value.clone()));
    }
    (!patch.is_empty()).then_some(patch)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_volume_takes_the_claims_job_and_group_labels_and_keeps_its_others() {
        let volume = labels(&[
            ("recurring-job.oxhorn.io/hourly", "enabled"),
            ("recurring-job-group.oxhorn.io/gold", "enabled"),
            ("team", "db"),
        ]);
        let claim = labels(&[
            ("recurring-job-source.oxhorn.io", "enabled"),
            ("recurring-job.oxhorn.io/daily", "enabled"),
            ("recurring-job-group.oxhorn.io/gold", "enabled"),
            ("app", "web"),
        ]);
        let patch = label_patch(&volume, &claim).unwrap();
        assert_eq!(
            Value::Object(patch),
            json!({"recurring-job.oxhorn.io/hourly": null,
                   "recurring-job.oxhorn.io/daily": "enabled"})
        );
    }

    #[test]
    fn a_volume_that_has_the_claims_labels_is_left_alone() {
        let both = labels(&[("recurring-job.oxhorn.io/daily", "enabled")]);
        let mut volume = both.clone();
        volume.insert("team".into(), "db".into());
        assert_eq!(label_patch(&volume, &both), None);
    }

    #[test]
    fn a_claim_with_no_job_label_takes_the_volumes_away() {
        let volume = labels(&[("recurring-job-group.oxhorn.io/gold", "enabled")]);
        let claim = labels(&[("recurring-job-source.oxhorn.io", "enabled")]);
        let patch = label_patch(&volume, &claim).unwrap();
        assert_eq!(
            Value::Object(patch),
            json!({"recurring-job-group.oxhorn.io/gold": null})
        );
    }

    #[test]
    fn only_the_claim_a_pv_is_bound_to_chooses() {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "app", "uid": "u1"},
            "spec": {"volumeName": "pv1"},
        }))
        .unwrap();
        let pv = |claim_ref: Value| -> PersistentVolume {
            serde_json::from_value(json!({"metadata": {"name": "pv1"},
                                          "spec": {"claimRef": claim_ref}}))
            .unwrap()
        };
        let bound = pv(json!({"namespace": "app", "name": "db", "uid": "u1"}));
        assert!(bound_to_claim(&bound, &claim));
        let named = pv(json!({"namespace": "app", "name": "db"}));
        assert!(bound_to_claim(&named, &claim), "prebound by name");
        for other in [
            json!({"namespace": "app", "name": "db", "uid": "u2"}),
            json!({"namespace": "other", "name": "db", "uid": "u1"}),
            json!({"namespace": "app", "name": "web"}),
            Value::Null,
        ] {
            assert!(!bound_to_claim(&pv(other.clone()), &claim), "{other}");
        }
    }

    #[test]
    fn a_changed_value_is_taken() {
        let volume = labels(&[("recurring-job.oxhorn.io/daily", "enabled")]);
        let claim = labels(&[("recurring-job.oxhorn.io/daily", "disabled")]);
        let patch = label_patch(&volume, &claim).unwrap();
        assert_eq!(
            Value::Object(patch),
            json!({"recurring-job.oxhorn.io/daily": "disabled"})
        );
    }
}
