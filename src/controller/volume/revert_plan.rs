//! The decisions of a revert, apart from their effects: whether the owner
//! takes a revert on, refuses it, waits or carries on with one under way;
//! and, from what the running replicas report, which of them to revert and
//! the I/O-path record that then names them alone.

use std::collections::BTreeSet;

use kube::ResourceExt;

use crate::protocol::control::{IoPath, ReplicaStatus};
use crate::types::{Snapshot, Volume};

/// What the owner does about the volume's revert in this pass.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// None asked, or every one answered.
    Idle,
    /// Refused, before anything changed: why.
    Refuse(String),
    /// Not yet: why.
    Wait(String),
    /// Take the revert on: from now on the volume attaches only once it is
    /// done.
    Begin,
    /// Carry on with the revert under way.
    Carry,
}

/// What the decision depends on besides the volume.
pub(super) struct Facts<'a> {
    /// The Snapshot asked for, if it exists.
    pub snapshot: Option<&'a Snapshot>,
    /// Whether no engine runs (or it runs on a node that is down, fenced by
    /// the next generation).
    pub engine_stopped: bool,
    /// Other work on the volume's chain that must end first (a snapshot
    /// being taken or removed, a clone or backup reading it).
    pub busy: Option<&'static str>,
}

/// The step for `volume`'s revert. One under way is always carried on,
/// whatever else is asked meanwhile: some replicas may be reverted already,
/// and the volume may serve only once all are. One asked of a volume that
/// is to attach is refused, never begun.
pub(super) fn decide(volume: &Volume, facts: &Facts) -> Step {
    if volume.revert_under_way().is_some() {
        return Step::Carry;
    }
    let Some(asked) = volume.revert_unanswered() else {
        return Step::Idle;
    };
    let name = volume.name_any();
    if !volume.spec.node_id.is_empty() {
        return Step::Refuse(format!(
            "volume {name} is to attach to node {}: a revert needs it detached",
            volume.spec.node_id
        ));
    }
    if volume.metadata.deletion_timestamp.is_some() {
        return Step::Refuse(format!("volume {name} is being deleted"));
    }
    if !volume.is_filled() {
        return Step::Refuse(format!(
            "volume {name} is still being filled from its data source"
        ));
    }
    let snapshot = match facts.snapshot {
        Some(s) if s.spec.volume == name => s,
        _ => {
            return Step::Refuse(format!("volume {name} has no snapshot {}", asked.snapshot));
        }
    };
    if snapshot.metadata.deletion_timestamp.is_some() {
        return Step::Refuse(format!("snapshot {} is being deleted", asked.snapshot));
    }
    if !snapshot.status.as_ref().is_some_and(|s| s.ready_to_use) {
        return Step::Refuse(format!("snapshot {} is not taken yet", asked.snapshot));
    }
    if let Some(busy) = facts.busy {
        return Step::Wait(busy.to_owned());
    }
    if !facts.engine_stopped {
        return Step::Wait("waiting for the engine to stop".to_owned());
    }
    Step::Begin
}

/// Which reached replicas to revert, and the record naming them.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Plan {
    /// Indexes into the statuses given.
    pub revert: Vec<usize>,
    pub record: IoPath,
}

/// Why there is no plan.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum NoPlan {
    /// Not now: a replica that may hold the volume's newest data cannot be
    /// reached, say.
    Wait(String),
    /// Never: no replica that may serve holds the snapshot. Nothing was
    /// reverted (a revert keeps the snapshot), so the request is refused.
    Impossible(String),
}

/// The plan for reverting to `snapshot` as engine `generation`, from the
/// statuses of the replicas reached (`reached`, every running one).
///
/// As an engine start would, it trusts only the newest I/O-path record
/// among them, and goes on only when it reaches every replica that record
/// names: one of them may hold writes the others lack, and one outside it
/// misses some. Those members that hold the snapshot (and are not mid-
/// rebuild) are reverted; then a record newer than any before, naming only
/// them, is written on each. Every other replica, reached or not, is
/// outside the newest record from then on: an engine rebuilds it from the
/// reverted ones, and never serves it. Retried after a crash, the plan is
/// the same (or names the same replicas in a newer record), and reverting a
/// replica again only discards what no one wrote since: the volume stayed
/// detached.
pub(super) fn plan(
    snapshot: &str,
    generation: u64,
    reached: &[ReplicaStatus],
) -> Result<Plan, NoPlan> {
    if let Some(ahead) = reached.iter().find(|s| s.generation > generation) {
        return Err(NoPlan::Wait(format!(
            "replica {} admitted engine generation {}, newer than the revert's {generation}",
            ahead.id, ahead.generation
        )));
    }
    let newest = reached
        .iter()
        .filter_map(|s| s.io_path.as_ref())
        .max_by_key(|p| (p.generation, p.version));
    if let Some(newest) = newest {
        let ids: BTreeSet<&str> = reached.iter().map(|s| s.id.as_str()).collect();
        let missing: Vec<&str> = newest
            .members
            .iter()
            .map(String::as_str)
            .filter(|m| !ids.contains(m))
            .collect();
        if !missing.is_empty() {
            return Err(NoPlan::Wait(format!(
                "replicas {missing:?} of the volume's I/O path cannot be reached"
            )));
        }
    }
    let member = |s: &ReplicaStatus| newest.is_none_or(|p| p.members.contains(&s.id));
    let revert: Vec<usize> = reached
        .iter()
        .enumerate()
        .filter(|(_, s)| {
            member(s) && !s.rebuilding && s.snapshots.iter().any(|l| l.name == snapshot)
        })
        .map(|(i, _)| i)
        .collect();
    if revert.is_empty() {
        return Err(NoPlan::Impossible(format!(
            "no replica in the volume's I/O path holds snapshot {snapshot}"
        )));
    }
    let version = match newest {
        Some(p) if p.generation == generation => p.version + 1,
        _ => 1,
    };
    let mut members: Vec<String> = revert.iter().map(|&i| reached[i].id.clone()).collect();
    members.sort();
    Ok(Plan {
        revert,
        record: IoPath {
            generation,
            version,
            members,
        },
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::protocol::control::Snapshot as Layer;
    use crate::types::{RevertPhase, RevertRequest, RevertStatus, SnapshotSpec, VolumeStatus};

    fn volume(node: &str, asked: bool, phase: Option<RevertPhase>) -> Volume {
        let mut volume = Volume::new("v", serde_json::from_value(json!({"size": 4096})).unwrap());
        volume.spec.node_id = node.into();
        volume.spec.revert = asked.then(|| RevertRequest {
            snapshot: "s".into(),
            request: "2".into(),
        });
        volume.status = Some(VolumeStatus {
            revert: phase.map(|phase| RevertStatus {
                request: "1".into(),
                snapshot: "s".into(),
                phase,
                ..RevertStatus::default()
            }),
            ..VolumeStatus::default()
        });
        volume
    }

    fn snapshot(of: &str, ready: bool) -> Snapshot {
        let mut snapshot = Snapshot::new("s", SnapshotSpec { volume: of.into() });
        snapshot.status = Some(crate::types::SnapshotStatus {
            ready_to_use: ready,
            ..Default::default()
        });
        snapshot
    }

    #[test]
    fn a_revert_begins_only_on_a_detached_volume_and_one_under_way_goes_on() {
        let ready = snapshot("v", true);
        let facts = |snapshot, engine_stopped, busy| Facts {
            snapshot,
            engine_stopped,
            busy,
        };
        let detached = volume("", true, None);
        assert_eq!(
            decide(&detached, &facts(Some(&ready), true, None)),
            Step::Begin
        );
        assert!(matches!(
            decide(&detached, &facts(Some(&ready), false, None)),
            Step::Wait(_)
        ));
        assert!(matches!(
            decide(&detached, &facts(Some(&ready), true, Some("busy"))),
            Step::Wait(_)
        ));
        // To attach: refused, whatever else.
        let attaching = volume("n1", true, None);
        assert!(matches!(
            decide(&attaching, &facts(Some(&ready), true, None)),
            Step::Refuse(m) if m.contains("n1")
        ));
        // Under way: carried on even if the volume is now to attach.
        let under_way = volume("n1", false, Some(RevertPhase::Reverting));
        assert_eq!(decide(&under_way, &facts(None, false, None)), Step::Carry);
        // Answered: idle until asked again.
        let done = volume("", false, Some(RevertPhase::Reverted));
        assert_eq!(decide(&done, &facts(None, true, None)), Step::Idle);
        let again = volume("", true, Some(RevertPhase::Reverted));
        assert_eq!(
            decide(&again, &facts(Some(&ready), true, None)),
            Step::Begin
        );
        // The snapshot must be this volume's, taken, and not going.
        let others = snapshot("w", true);
        let taking = snapshot("v", false);
        let mut going = snapshot("v", true);
        going.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        );
        for wrong in [None, Some(&others), Some(&taking), Some(&going)] {
            assert!(matches!(
                decide(&detached, &facts(wrong, true, None)),
                Step::Refuse(_)
            ));
        }
    }

    fn status(id: &str, record: Option<(u64, u64, &[&str])>, layers: &[&str]) -> ReplicaStatus {
        ReplicaStatus {
            id: id.into(),
            generation: 4,
            io_path: record.map(|(generation, version, members)| IoPath {
                generation,
                version,
                members: members.iter().map(|m| m.to_string()).collect(),
            }),
            snapshots: layers
                .iter()
                .map(|name| Layer {
                    name: name.to_string(),
                    ..Layer::default()
                })
                .collect(),
            ..ReplicaStatus::default()
        }
    }

    #[test]
    fn only_the_members_of_the_newest_record_are_reverted_and_named() {
        let abc: &[&str] = &["a", "b", "c"];
        let ab: &[&str] = &["a", "b"];
        // C left the I/O path (older record): it is not reverted, and the
        // new record leaves it out.
        let reached = [
            status("a", Some((3, 2, ab)), &["s", "t"]),
            status("c", Some((3, 1, abc)), &["s"]),
            status("b", Some((3, 2, ab)), &["s", "t"]),
        ];
        let plan = plan("s", 5, &reached).unwrap();
        assert_eq!(plan.revert, [0, 2]);
        assert_eq!(plan.record.members, ["a", "b"]);
        assert_eq!((plan.record.generation, plan.record.version), (5, 1));
        // Retried after writing the record on some: a newer one still.
        let retried = [
            status("a", Some((5, 1, ab)), &["s"]),
            status("b", Some((3, 2, ab)), &["s", "t"]),
        ];
        let again = super::plan("s", 5, &retried).unwrap();
        assert_eq!(again.record.members, ["a", "b"]);
        assert_eq!(again.record.version, 2);
        // A member out of reach: wait.
        assert!(matches!(
            super::plan("s", 5, &reached[..2]),
            Err(NoPlan::Wait(m)) if m.contains("\"b\"")
        ));
        // A member without the snapshot, or mid-rebuild, is left out.
        let mut rebuilding = status("b", Some((3, 2, ab)), &["s"]);
        rebuilding.rebuilding = true;
        let partial = [status("a", Some((3, 2, ab)), &["t"]), rebuilding];
        assert!(matches!(
            super::plan("s", 5, &partial),
            Err(NoPlan::Impossible(_))
        ));
        // Never attached: no record, every holder is reverted.
        let fresh = [status("a", None, &["s"]), status("b", None, &[])];
        let plan = super::plan("s", 5, &fresh).unwrap();
        assert_eq!(
            (plan.revert, plan.record.members),
            (vec![0], vec!["a".to_owned()])
        );
        // A replica that admitted a newer engine: wait.
        assert!(matches!(super::plan("s", 3, &fresh), Err(NoPlan::Wait(_))));
    }
}
