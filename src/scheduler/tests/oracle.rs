//! The property test: every placement satisfies every hard rule, checked
//! against an oracle written from the rules rather than from the code.

use proptest::prelude::*;

use super::super::*;
use super::fixtures::*;

/// One generated disk: small GiB counts so boundaries are hit often.
#[derive(Clone, Debug)]
struct GenDisk {
    allow: bool,
    evicting: bool,
    /// Index into a few fsids (or none): disks sharing a filesystem are allowed.
    fsid: Option<u8>,
    maximum: i64,
    available: i64,
    reserved: i64,
    ssd: bool,
    ready: ConditionStatus,
    schedulable: ConditionStatus,
}

#[derive(Clone, Debug)]
struct GenNode {
    up: bool,
    allow: bool,
    evicting: bool,
    ready: ConditionStatus,
    fast: bool,
    zone: u8,
    disks: Vec<GenDisk>,
}

/// A replica of the test volume (sibling) or of another one, possibly unscheduled (node None).
#[derive(Clone, Debug)]
struct GenReplica {
    sibling: bool,
    node: Option<u8>,
    fsid: u8,
    size: i64,
}

#[derive(Clone, Debug)]
struct Scenario {
    nodes: Vec<GenNode>,
    replicas: Vec<GenReplica>,
    settings: SchedulerSettings,
    size: i64,
    replica_count: i32,
    node_selector: bool,
    disk_selector: bool,
    seed: u64,
}

fn condition_status() -> impl Strategy<Value = ConditionStatus> {
    prop_oneof![
        6 => Just(ConditionStatus::True),
        1 => Just(ConditionStatus::False),
        1 => Just(ConditionStatus::Unknown),
    ]
}

fn gen_disk() -> impl Strategy<Value = GenDisk> {
    (
        (prop::bool::weighted(0.9), prop::bool::weighted(0.15)),
        prop::option::weighted(0.9, 0..4u8),
        (0..12i64, 0..12i64, 0..4i64),
        prop::bool::ANY,
        condition_status(),
        condition_status(),
    )
        .prop_map(
            |((allow, evicting), fsid, (maximum, available, reserved), ssd, ready, schedulable)| {
                GenDisk {
                    allow,
                    evicting,
                    fsid,
                    maximum: maximum * GIB,
                    available: available * GIB,
                    reserved: reserved * GIB,
                    ssd,
                    ready,
                    schedulable,
                }
            },
        )
}

fn gen_node() -> impl Strategy<Value = GenNode> {
    (
        prop::bool::weighted(0.9),
        (prop::bool::weighted(0.9), prop::bool::weighted(0.15)),
        condition_status(),
        prop::bool::ANY,
        0..3u8,
        prop::collection::vec(gen_disk(), 0..3),
    )
        .prop_map(
            |(up, (allow, evicting), ready, fast, zone, disks)| GenNode {
                up,
                allow,
                evicting,
                ready,
                fast,
                zone,
                disks,
            },
        )
}

fn gen_replica() -> impl Strategy<Value = GenReplica> {
    (
        prop::bool::ANY,
        prop::option::weighted(0.9, 0..7u8),
        0..4u8,
        1..6i64,
    )
        .prop_map(|(sibling, node, fsid, size)| GenReplica {
            sibling,
            node,
            fsid,
            size: size * GIB,
        })
}

fn gen_scenario() -> impl Strategy<Value = Scenario> {
    (
        prop::collection::vec(gen_node(), 0..7),
        prop::collection::vec(gen_replica(), 0..8),
        (
            prop::sample::select(vec![50u64, 100, 200]),
            prop::sample::select(vec![0u64, 10, 25, 50]),
            prop::bool::ANY,
            prop::bool::ANY,
        ),
        (
            1..8i64,
            1..5i32,
            prop::bool::weighted(0.3),
            prop::bool::weighted(0.3),
        ),
        any::<u64>(),
    )
        .prop_map(
            |(
                nodes,
                replicas,
                (over, minimal, soft_node, soft_zone),
                (size, count, ns, ds),
                seed,
            )| {
                Scenario {
                    nodes,
                    replicas,
                    settings: SchedulerSettings {
                        over_provisioning_percentage: over,
                        minimal_available_percentage: minimal,
                        soft_node_anti_affinity: soft_node,
                        soft_zone_anti_affinity: soft_zone,
                    },
                    size: size * GIB,
                    replica_count: count,
                    node_selector: ns,
                    disk_selector: ds,
                    seed,
                }
            },
        )
}

const ZONES: [&str; 3] = ["", "z1", "z2"];

impl Scenario {
    fn world(&self) -> World {
        let mut world = World::default();
        for (i, g) in self.nodes.iter().enumerate() {
            let name = format!("n{i}");
            let mut b = bare_node(&name)
                .zone(ZONES[usize::from(g.zone)])
                .allow_scheduling(g.allow)
                .evicting(g.evicting)
                .ready(g.ready)
                .tags(if g.fast { &["fast"] } else { &[] });
            for (j, d) in g.disks.iter().enumerate() {
                let fsid = d.fsid.map(|f| format!("fs{f}")).unwrap_or_default();
                b = b
                    .disk(&format!("d{j}"), &fsid, d.maximum, d.available)
                    .disk_spec(&format!("d{j}"), |s| {
                        s.allow_scheduling = d.allow;
                        s.eviction_requested = d.evicting;
                        s.storage_reserved = d.reserved;
                        s.tags = if d.ssd { strings(&["ssd"]) } else { vec![] };
                    })
                    .disk_status(&format!("d{j}"), |s| {
                        s.conditions = vec![
                            condition("Ready", d.ready),
                            condition("Schedulable", d.schedulable),
                        ];
                    });
            }
            world.nodes.push(Arc::new(b.0));
            if !g.up {
                world.down.push(name);
            }
        }
        for (i, r) in self.replicas.iter().enumerate() {
            let node = r.node.map(|n| format!("n{n}")).unwrap_or_default();
            let vol = if r.sibling { VOLUME } else { "other" };
            let disk = format!("fs{}", r.fsid);
            world.replicas.push(Arc::new(replica(
                &format!("r{i}"),
                vol,
                r.size,
                &node,
                &disk,
            )));
        }
        world
    }

    fn volume(&self) -> Volume {
        let mut v = volume(self.size, self.replica_count);
        if self.node_selector {
            v.spec.node_selector = strings(&["fast"]);
        }
        if self.disk_selector {
            v.spec.disk_selector = strings(&["ssd"]);
        }
        v
    }
}

/// Every (node, disk) pair the hard rules allow, with its soft rank, written
/// straight from the rules rather than from the implementation.
fn oracle(
    world: &World,
    vol: &Volume,
    settings: &SchedulerSettings,
) -> Vec<(Placement, (bool, bool))> {
    let siblings: Vec<&Replica> = world
        .replicas
        .iter()
        .filter(|r| r.spec.instance.volume_name == VOLUME && !r.spec.instance.node_id.is_empty())
        .map(|r| &**r)
        .collect();
    let zone_of = |name: &str| {
        world
            .nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(name))
            .and_then(|n| n.status.as_ref())
            .map(|s| s.zone.clone())
            .unwrap_or_default()
    };
    let mut allowed = Vec::new();
    for n in &world.nodes {
        let name = n.metadata.name.clone().unwrap_or_default();
        let status = n.status.clone().unwrap_or_default();
        let node_ok = !world.down.contains(&name)
            && n.spec.allow_scheduling
            && !n.spec.eviction_requested
            && !status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == ConditionStatus::False)
            && vol
                .spec
                .node_selector
                .iter()
                .all(|t| n.spec.tags.contains(t));
        let on_node = siblings.iter().any(|r| r.spec.instance.node_id == name);
        let in_zone = !status.zone.is_empty()
            && siblings
                .iter()
                .any(|r| zone_of(&r.spec.instance.node_id) == status.zone);
        if !node_ok
            || (!settings.soft_node_anti_affinity && on_node)
            || (!settings.soft_zone_anti_affinity && in_zone)
        {
            continue;
        }
        for (disk_name, spec) in &n.spec.disks {
            let Some(ds) = status.disk_status.get(disk_name) else {
                continue;
            };
            let scheduled: i128 = world
                .replicas
                .iter()
                .filter(|r| r.spec.instance.node_id == name && r.spec.disk_id == ds.fsid)
                .map(|r| i128::from(r.spec.instance.volume_size))
                .sum();
            let size = i128::from(vol.spec.size);
            let max = i128::from(ds.storage_maximum);
            let disk_ok = spec.allow_scheduling
                && !spec.eviction_requested
                && !ds.fsid.is_empty()
                && ds.storage_maximum > 0
                && !ds.conditions.iter().any(|c| {
                    (c.type_ == "Ready" || c.type_ == "Schedulable")
                        && c.status == ConditionStatus::False
                })
                && vol.spec.disk_selector.iter().all(|t| spec.tags.contains(t))
                && scheduled + size
                    <= (max - i128::from(spec.storage_reserved))
                        * i128::from(settings.over_provisioning_percentage)
                        / 100
                && i128::from(ds.storage_available) - size
                    >= max * i128::from(settings.minimal_available_percentage) / 100;
            if disk_ok {
                let placement = Placement {
                    node_id: name.clone(),
                    disk_name: disk_name.clone(),
                    disk_id: ds.fsid.clone(),
                    disk_path: spec.path.clone(),
                };
                allowed.push((placement, (on_node, in_zone)));
            }
        }
    }
    allowed
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// A placement is returned exactly when the hard rules allow one, and it is
    /// one of the allowed pairs with the best soft rank.
    #[test]
    fn every_placement_satisfies_every_hard_rule(scenario in gen_scenario()) {
        let world = scenario.world();
        let vol = scenario.volume();
        let allowed = oracle(&world, &vol, &scenario.settings);
        let mut rng = fastrand::Rng::with_seed(scenario.seed);
        match world.schedule(&vol, &scenario.settings, &mut rng) {
            Ok(placement) => {
                let rank = allowed.iter().find(|(p, _)| *p == placement).map(|(_, r)| *r);
                prop_assert!(rank.is_some(), "{placement:?} breaks a hard rule; allowed: {allowed:?}");
                let best = allowed.iter().map(|(_, r)| *r).min();
                prop_assert_eq!(rank, best, "a better-ranked pair was passed over");
            }
            Err(e) => {
                prop_assert!(allowed.is_empty(), "{e:?} although {allowed:?} were allowed");
                prop_assert!(!e.message.is_empty());
                prop_assert!([
                    NO_SCHEDULABLE_NODE,
                    NODE_SELECTOR_MISMATCH,
                    REPLICA_ANTI_AFFINITY,
                    NO_SCHEDULABLE_DISK,
                    DISK_SELECTOR_MISMATCH,
                    INSUFFICIENT_STORAGE,
                ]
                .contains(&e.reason));
            }
        }
    }
}
