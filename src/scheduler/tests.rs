mod fixtures;
mod oracle;

use std::collections::BTreeMap;

use super::*;
use fixtures::*;

#[test]
fn schedulable_space_counts_promises_headroom_and_segments() {
    // node-a: 100 GiB, 10 GiB promised; node-b: 40 GiB free of 100; node-c down.
    let world = World::new([
        node("node-a").zone("z1"),
        node("node-b")
            .zone("z2")
            .disk_status("default", |d| d.storage_available = 40 * GIB),
        node("node-c").zone("z1"),
    ])
    .with_replica(replica("r1", "other", 10 * GIB, "node-a", "node-a-fs"))
    .down("node-c");
    let up = |node: &str| !world.down.iter().any(|d| d == node);
    let cluster = Cluster {
        nodes: &world.nodes,
        replicas: &world.replicas,
        node_up: &up,
    };
    let settings = SchedulerSettings::default();
    let vol = volume(GIB, 1);
    let mut all = schedulable_space(&cluster, &vol, &settings, &|_| true);
    all.sort();
    // node-b: 40 GiB free minus the 25 GiB that must stay free.
    assert_eq!(all, vec![15 * GIB, 75 * GIB]);
    let z1 = schedulable_space(&cluster, &vol, &settings, &|n| zone(n) == "z1");
    assert_eq!(z1, vec![75 * GIB], "node-c is down");
    let mut tagged = vol.clone();
    tagged.spec.disk_selector = strings(&["ssd"]);
    assert!(schedulable_space(&cluster, &tagged, &settings, &|_| true).is_empty());
}

#[test]
fn defaults_are_longhorns() {
    let s = SchedulerSettings::default();
    assert_eq!(s.over_provisioning_percentage, 100);
    assert_eq!(s.minimal_available_percentage, 25);
    assert!(!s.soft_node_anti_affinity);
    assert!(s.soft_zone_anti_affinity);
}

#[test]
fn three_replicas_over_four_nodes_land_on_three_distinct_nodes() {
    for seed in 0..50 {
        let mut world = four_nodes();
        let mut rng = fastrand::Rng::with_seed(seed);
        for _ in 0..3 {
            world
                .place(
                    &volume(10 * GIB, 3),
                    &SchedulerSettings::default(),
                    &mut rng,
                )
                .expect("placed");
        }
        assert_eq!(distinct(&world.volume_nodes()), 3, "seed {seed}");
    }
}

#[test]
fn placement_names_the_disk_by_fsid_and_path() {
    let world = World::new([node("node-a")]);
    let placement = world
        .schedule_seeded(&volume(GIB, 1), &SchedulerSettings::default(), 1)
        .expect("placed");
    assert_eq!(
        placement,
        Placement {
            node_id: "node-a".into(),
            disk_name: "default".into(),
            disk_id: "node-a-fs".into(),
            disk_path: "/var/lib/oxhorn/default".into(),
        }
    );
}

#[test]
fn fourth_replica_on_three_nodes_with_hard_anti_affinity_names_the_nodes() {
    let mut world = World::new(["node-a", "node-b", "node-c"].map(node));
    let mut rng = fastrand::Rng::with_seed(7);
    let vol = volume(10 * GIB, 4);
    let settings = SchedulerSettings::default();
    for _ in 0..3 {
        world.place(&vol, &settings, &mut rng).expect("placed");
    }
    let err = world
        .schedule(&vol, &settings, &mut rng)
        .expect_err("no fourth node");
    assert_eq!(err.reason, "ReplicaAntiAffinity");
    assert_eq!(
        err.message,
        "4 replicas need 4 nodes with hard node anti-affinity, but only 3 ready nodes allow \
         scheduling: node-a (has a replica), node-b (has a replica), node-c (has a replica)"
    );
    assert_eq!(err.to_string(), err.message);
}

#[test]
fn a_replacement_blocked_by_the_replica_it_replaces_says_so() {
    // A failed replica on node-c still counts as a sibling until it is removed.
    let world = World::new(["node-a", "node-b", "node-c"].map(node))
        .with_replica(replica("r1", VOLUME, GIB, "node-a", "node-a-fs"))
        .with_replica(replica("r2", VOLUME, GIB, "node-b", "node-b-fs"))
        .with_replica(replica("r3", VOLUME, GIB, "node-c", "node-c-fs"));
    let err = world
        .schedule_default(&volume(GIB, 3))
        .expect_err("every node has a replica");
    assert_eq!(
        err.message,
        "3 replicas need 3 nodes with hard node anti-affinity, and all 3 ready nodes that \
         allow scheduling are excluded: node-a (has a replica), node-b (has a replica), \
         node-c (has a replica)"
    );
    let world = World::new([node("node-a")]).with_replica(replica(
        "r1",
        VOLUME,
        GIB,
        "node-a",
        "node-a-fs",
    ));
    let err = world
        .schedule_default(&volume(GIB, 1))
        .expect_err("the only node has the replica");
    assert_eq!(
        err.message,
        "1 replica needs 1 node with hard node anti-affinity, and the only ready node that \
         allows scheduling is excluded: node-a (has a replica)"
    );
}

#[test]
fn anti_affinity_counts_only_nodes_that_could_take_the_replica() {
    let mut world = World::new(["node-a", "node-b", "node-c"].map(node))
        .with_replica(replica("r1", VOLUME, GIB, "node-a", "node-a-fs"))
        .with_replica(replica("r2", VOLUME, GIB, "node-b", "node-b-fs"))
        .down("node-c");
    let err = world
        .schedule_default(&volume(GIB, 3))
        .expect_err("node-c is down");
    assert_eq!(err.reason, "ReplicaAntiAffinity");
    assert_eq!(
        err.message,
        "3 replicas need 3 nodes with hard node anti-affinity, but only 2 ready nodes allow \
         scheduling: node-a (has a replica), node-b (has a replica)"
    );
    world.down.clear();
    let placed = world
        .schedule_default(&volume(GIB, 3))
        .expect("node-c is back");
    assert_eq!(placed.node_id, "node-c");
}

#[test]
fn siblings_without_a_node_are_ignored() {
    let world = World::new([node("node-a")]).with_replica(replica("r1", VOLUME, GIB, "", ""));
    let placed = world
        .schedule_default(&volume(GIB, 2))
        .expect("the unscheduled sibling takes no node");
    assert_eq!(placed.node_id, "node-a");
}

#[test]
fn soft_node_anti_affinity_shares_a_node_only_when_it_must() {
    for seed in 0..50 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut world = World::new(["node-a", "node-b", "node-c"].map(node));
        for _ in 0..3 {
            world
                .place(&volume(GIB, 3), &soft_node(), &mut rng)
                .expect("placed");
        }
        assert_eq!(distinct(&world.volume_nodes()), 3, "seed {seed}");

        let mut world = World::new(["node-a", "node-b"].map(node));
        for _ in 0..3 {
            world
                .place(&volume(GIB, 3), &soft_node(), &mut rng)
                .expect("placed");
        }
        let nodes = world.volume_nodes();
        assert_eq!(
            distinct(&nodes[..2]),
            2,
            "seed {seed}: shared before it had to"
        );
        assert_eq!(distinct(&nodes), 2);
    }
}

#[test]
fn down_disabled_and_not_ready_nodes_take_no_replica() {
    let world = World::new([
        node("node-a"),
        node("node-b").allow_scheduling(false),
        node("node-c").ready(ConditionStatus::False),
        node("node-d"),
    ])
    .down("node-a");
    let chosen = world.chosen_nodes(&volume(GIB, 1), &SchedulerSettings::default());
    assert_eq!(chosen, names(&["node-d"]));
}

#[test]
fn an_evicting_node_or_disk_takes_no_replica_and_says_so() {
    let world = World::new([
        node("node-a").evicting(true),
        node("node-b").disk_spec("default", |d| d.eviction_requested = true),
        node("node-c"),
    ]);
    let chosen = world.chosen_nodes(&volume(GIB, 1), &SchedulerSettings::default());
    assert_eq!(chosen, names(&["node-c"]));
    let world = World::new([node("node-a").evicting(true)]);
    let err = world
        .schedule_default(&volume(GIB, 1))
        .expect_err("evicting");
    assert_eq!(
        (err.reason, err.message.as_str()),
        (
            "NoSchedulableNode",
            "no node is up, ready and allowing scheduling: node-a (evicting)"
        )
    );
    let world = World::new([node("node-a")
        .disk_spec("default", |d| d.eviction_requested = true)
        .disk("second", "fs-2", 100 * GIB, 100 * GIB)]);
    let placed = world
        .schedule_default(&volume(GIB, 1))
        .expect("the second disk is fine");
    assert_eq!(placed.disk_name, "second");
    let world = World::new([node("node-a").disk_spec("default", |d| d.eviction_requested = true)]);
    let err = world
        .schedule_default(&volume(GIB, 1))
        .expect_err("evicting disk");
    assert_eq!(err.reason, "NoSchedulableDisk");
    assert!(
        err.message.ends_with("node-a/default (evicting)"),
        "{}",
        err.message
    );
}

#[test]
fn ready_unknown_is_not_ready_false() {
    let world = World::new([node("node-a").ready(ConditionStatus::Unknown)]);
    let placed = world.schedule_default(&volume(GIB, 1));
    assert_eq!(placed.expect("placed").node_id, "node-a");
}

#[test]
fn no_schedulable_node_says_why_for_each() {
    let world = World::new([
        node("node-a").ready(ConditionStatus::False),
        node("node-b").allow_scheduling(false),
        node("node-c"),
    ])
    .down("node-a")
    .down("node-c");
    let err = world
        .schedule_default(&volume(GIB, 1))
        .expect_err("nothing schedulable");
    assert_eq!(err.reason, "NoSchedulableNode");
    assert_eq!(
        err.message,
        "no node is up, ready and allowing scheduling: node-a (down and not ready), \
         node-b (scheduling disabled), node-c (down)"
    );
}

#[test]
fn an_empty_cluster_has_no_schedulable_node() {
    let err = World::default()
        .schedule_default(&volume(GIB, 1))
        .expect_err("no nodes");
    assert_eq!(err.reason, "NoSchedulableNode");
    assert_eq!(err.message, "no oxhorn node exists yet");
}

#[test]
fn long_lists_are_cut_short() {
    let names: Vec<String> = (0..25).map(|i| format!("node-{i:02}")).collect();
    let mut world = World::new(names.iter().map(|n| node(n)));
    world.down = names;
    let err = world
        .schedule_default(&volume(GIB, 1))
        .expect_err("all down");
    assert!(
        err.message.ends_with("node-09 (down), and 15 more"),
        "{}",
        err.message
    );
    assert!(!err.message.contains("node-10"));
}

#[test]
fn unusable_disks_take_no_replica() {
    let world = World::new([
        node("node-a").disk_spec("default", |d| d.allow_scheduling = false),
        node("node-b").disk_status("default", |d| d.fsid.clear()),
        node("node-c").disk_status("default", |d| {
            d.conditions = vec![condition("Ready", ConditionStatus::False)];
        }),
        node("node-d").disk_status("default", |d| {
            d.conditions = vec![condition("Schedulable", ConditionStatus::False)];
        }),
        node("node-e").disk_status("default", |d| d.storage_maximum = 0),
        bare_node("node-f"),
    ]);
    let err = world
        .schedule_default(&volume(GIB, 1))
        .expect_err("no usable disk");
    assert_eq!(err.reason, "NoSchedulableDisk");
    assert_eq!(
        err.message,
        "no disk is measured, ready and allowing scheduling on the nodes left for the \
         replica: node-a/default (scheduling disabled), node-b/default (not measured yet), \
         node-c/default (not ready), node-d/default (not schedulable), \
         node-e/default (not measured yet), node-f (no disks)"
    );
    let world = World::new([node("node-a")
        .disk_spec("default", |d| d.allow_scheduling = false)
        .disk("second", "fs-2", 100 * GIB, 100 * GIB)]);
    let placed = world
        .schedule_default(&volume(GIB, 1))
        .expect("the second disk is fine");
    assert_eq!(placed.disk_name, "second");
    assert_eq!(placed.disk_id, "fs-2");
}

#[test]
fn a_disk_without_status_is_not_measured_yet() {
    let mut builder = node("node-a");
    builder.status().disk_status.clear();
    let err = World::new([builder])
        .schedule_default(&volume(GIB, 1))
        .expect_err("unmeasured");
    assert_eq!(err.reason, "NoSchedulableDisk");
    assert!(
        err.message.contains("node-a/default (not measured yet)"),
        "{}",
        err.message
    );
}

#[test]
fn a_full_disk_reports_insufficient_storage_with_numbers() {
    // 25% of 8 GiB must stay free: 4 GiB available leaves 2 GiB for replicas.
    let world = World::new([bare_node("node-a").disk("default", "fs-a", 8 * GIB, 4 * GIB)]);
    let err = world
        .schedule_default(&volume(10 * GIB, 1))
        .expect_err("full");
    assert_eq!(err.reason, "InsufficientStorage");
    assert_eq!(
        err.message,
        "no disk has 10 GiB free for the replica: node-a/default: 2 GiB schedulable of 8 GiB \
         (25% must stay free)"
    );
}

#[test]
fn minimal_available_is_a_boundary_not_a_cliff() {
    // 100 GiB disk, 25% must stay free: with 35 GiB available a 10 GiB replica just fits.
    let world = World::new([bare_node("node-a").disk("default", "fs-a", 100 * GIB, 35 * GIB)]);
    let settings = SchedulerSettings::default();
    let mut rng = fastrand::Rng::with_seed(0);
    assert!(
        world
            .schedule(&volume(10 * GIB, 1), &settings, &mut rng)
            .is_ok()
    );
    let err = world
        .schedule(&volume(10 * GIB + 4096, 1), &settings, &mut rng)
        .expect_err("one block too many");
    assert_eq!(err.reason, "InsufficientStorage");
    let lenient = SchedulerSettings {
        minimal_available_percentage: 0,
        ..settings
    };
    assert!(
        world
            .schedule(&volume(35 * GIB, 1), &lenient, &mut rng)
            .is_ok()
    );
}

#[test]
fn over_provisioning_200_percent_promises_twice_the_disk() {
    // A thin 100 GiB disk with 100 GiB already promised to another volume.
    let world = World::new([node("node-a")]).with_replica(replica(
        "other-r",
        "other",
        100 * GIB,
        "node-a",
        "node-a-fs",
    ));
    let mut rng = fastrand::Rng::with_seed(0);
    let err = world
        .schedule(
            &volume(50 * GIB, 1),
            &SchedulerSettings::default(),
            &mut rng,
        )
        .expect_err("100% promised");
    assert_eq!(err.reason, "InsufficientStorage");
    assert_eq!(
        err.message,
        "no disk has 50 GiB free for the replica: node-a/default: 0 B schedulable of 100 GiB \
         (100 GiB already promised to replicas; 100% over-provisioning allows 100 GiB)"
    );
    let twice = SchedulerSettings {
        over_provisioning_percentage: 200,
        ..SchedulerSettings::default()
    };
    assert!(
        world
            .schedule(&volume(50 * GIB, 1), &twice, &mut rng)
            .is_ok()
    );
    assert!(
        world
            .schedule(&volume(75 * GIB, 1), &twice, &mut rng)
            .is_ok()
    );
    let world = world.with_replica(replica(
        "other-r2",
        "other",
        100 * GIB,
        "node-a",
        "node-a-fs",
    ));
    let err = world
        .schedule(&volume(4096, 1), &twice, &mut rng)
        .expect_err("200 GiB promised");
    assert_eq!(err.reason, "InsufficientStorage");
}

#[test]
fn reserved_space_is_never_promised() {
    let world =
        World::new([node("node-a").disk_spec("default", |d| d.storage_reserved = 60 * GIB)]);
    let settings = SchedulerSettings::default();
    let mut rng = fastrand::Rng::with_seed(0);
    assert!(
        world
            .schedule(&volume(40 * GIB, 1), &settings, &mut rng)
            .is_ok()
    );
    let err = world
        .schedule(&volume(50 * GIB, 1), &settings, &mut rng)
        .expect_err("only 40 GiB unreserved");
    assert_eq!(
        err.message,
        "no disk has 50 GiB free for the replica: node-a/default: 40 GiB schedulable of \
         100 GiB (0 B already promised to replicas; 100% over-provisioning with 60 GiB \
         reserved allows 40 GiB)"
    );
}

#[test]
fn promised_space_counts_every_volume_on_the_same_node_and_disk() {
    // A thin 100 GiB disk: 80 GiB promised to two other volumes leaves 20 GiB.
    // Its status still counts nothing as scheduled: that lags, and is ignored.
    let world = World::new([node("node-a")])
        .with_replica(replica("x", "other", 50 * GIB, "node-a", "node-a-fs"))
        .with_replica(replica("y", "third", 30 * GIB, "node-a", "node-a-fs"))
        // The same fsid on another node, and another disk of this node: neither counts.
        .with_replica(replica("z", "other", 90 * GIB, "node-b", "node-a-fs"))
        .with_replica(replica("w", "other", 90 * GIB, "node-a", "elsewhere"));
    assert!(world.schedule_default(&volume(20 * GIB, 1)).is_ok());
    let err = world
        .schedule_default(&volume(21 * GIB, 1))
        .expect_err("80 GiB promised");
    assert_eq!(
        err.message,
        "no disk has 21 GiB free for the replica: node-a/default: 20 GiB schedulable of \
         100 GiB (80 GiB already promised to replicas; 100% over-provisioning allows 100 GiB)"
    );
}

#[test]
fn node_selector_limits_nodes_and_explains_a_mismatch() {
    let world = World::new([
        node("node-a").tags(&["fast"]),
        node("node-b").tags(&["fast", "ssd"]),
        node("node-c"),
    ]);
    let mut vol = volume(GIB, 1);
    vol.spec.node_selector = strings(&["fast", "ssd"]);
    let chosen = world.chosen_nodes(&vol, &SchedulerSettings::default());
    assert_eq!(chosen, names(&["node-b"]));
    vol.spec.node_selector = strings(&["gpu"]);
    let err = world.schedule_default(&vol).expect_err("no gpu node");
    assert_eq!(err.reason, "NodeSelectorMismatch");
    assert_eq!(
        err.message,
        "no schedulable node carries every node selector tag (gpu): node-a (tags: fast), \
         node-b (tags: fast, ssd), node-c (no tags)"
    );
}

#[test]
fn disk_selector_limits_disks_and_explains_a_mismatch() {
    let world = World::new([
        node("node-a").disk_spec("default", |d| d.tags = strings(&["hdd"])),
        node("node-b")
            .disk("fast", "node-b-nvme", 100 * GIB, 100 * GIB)
            .disk_spec("fast", |d| d.tags = strings(&["ssd"])),
    ]);
    let mut vol = volume(GIB, 1);
    vol.spec.disk_selector = strings(&["ssd"]);
    for seed in 0..20 {
        let placed = world
            .schedule_seeded(&vol, &SchedulerSettings::default(), seed)
            .expect("node-b/fast matches");
        assert_eq!(
            (placed.node_id.as_str(), placed.disk_name.as_str()),
            ("node-b", "fast")
        );
    }
    vol.spec.disk_selector = strings(&["nvme"]);
    let err = world.schedule_default(&vol).expect_err("no nvme disk");
    assert_eq!(err.reason, "DiskSelectorMismatch");
    assert_eq!(
        err.message,
        "no usable disk carries every disk selector tag (nvme): node-a/default (tags: hdd), \
         node-b/default (no tags), node-b/fast (tags: ssd)"
    );
}

#[test]
fn failures_are_reported_in_order_of_how_fundamental_they_are() {
    // Both nodes hold a sibling and have a full disk: a selector mismatch is
    // reported before anti-affinity, anti-affinity before disks and space.
    let full = |b: NodeBuilder| b.disk_status("default", |d| d.storage_available = 0);
    let world = World::new([
        full(node("node-a").tags(&["t"])),
        full(node("node-b").tags(&["t"])),
    ])
    .with_replica(replica("r1", VOLUME, GIB, "node-a", "node-a-fs"))
    .with_replica(replica("r2", VOLUME, GIB, "node-b", "node-b-fs"));
    let mut vol = volume(GIB, 3);
    let mut rng = fastrand::Rng::with_seed(0);
    let settings = SchedulerSettings::default();
    vol.spec.node_selector = strings(&["other"]);
    assert_eq!(
        world
            .schedule(&vol, &settings, &mut rng)
            .map_err(|e| e.reason),
        Err("NodeSelectorMismatch")
    );
    vol.spec.node_selector = strings(&["t"]);
    let err = world
        .schedule(&vol, &settings, &mut rng)
        .expect_err("anti-affinity");
    assert_eq!(err.reason, "ReplicaAntiAffinity");
    assert!(
        err.message
            .contains("only 2 ready nodes allow scheduling and match the node selector"),
        "{}",
        err.message
    );
    assert_eq!(
        world
            .schedule(&vol, &soft_node(), &mut rng)
            .map_err(|e| e.reason),
        Err("InsufficientStorage")
    );
    vol.spec.disk_selector = strings(&["ssd"]);
    assert_eq!(
        world
            .schedule(&vol, &soft_node(), &mut rng)
            .map_err(|e| e.reason),
        Err("DiskSelectorMismatch")
    );
}

#[test]
fn hard_zone_anti_affinity_keeps_replicas_in_distinct_zones() {
    let world = World::new([
        node("node-a").zone("z1"),
        node("node-b").zone("z1"),
        node("node-c").zone("z2"),
    ])
    .with_replica(replica("r1", VOLUME, GIB, "node-a", "node-a-fs"));
    let soft_node_hard_zone = SchedulerSettings {
        soft_node_anti_affinity: true,
        ..hard_zone()
    };
    for settings in [hard_zone(), soft_node_hard_zone.clone()] {
        let chosen = world.chosen_nodes(&volume(GIB, 3), &settings);
        assert_eq!(chosen, names(&["node-c"]), "z2 is the only free zone");
    }
    let world = world.with_replica(replica("r2", VOLUME, GIB, "node-c", "node-c-fs"));
    let err = world
        .schedule_seeded(&volume(GIB, 3), &soft_node_hard_zone, 0)
        .expect_err("both zones taken");
    assert_eq!(err.reason, "ReplicaAntiAffinity");
    assert_eq!(
        err.message,
        "3 replicas need 3 zones with hard zone anti-affinity, and all 3 ready nodes that \
         allow scheduling are excluded: node-a (zone z1 has a replica), \
         node-b (zone z1 has a replica), node-c (zone z2 has a replica)"
    );
    let err = world
        .schedule_seeded(&volume(GIB, 3), &hard_zone(), 0)
        .expect_err("both zones taken");
    assert!(
        err.message.starts_with(
            "3 replicas need 3 nodes in distinct zones with hard node and zone anti-affinity"
        ) && err
            .message
            .contains("node-a (has a replica), node-b (zone z1 has a replica)"),
        "{}",
        err.message
    );
}

#[test]
fn hard_zone_anti_affinity_ignores_nodes_without_a_zone() {
    let world = World::new([node("node-a").zone("z1"), node("node-b"), node("node-c")])
        .with_replica(replica("r1", VOLUME, GIB, "node-a", "node-a-fs"))
        .with_replica(replica("r2", VOLUME, GIB, "node-b", "node-b-fs"));
    let placed = world
        .schedule_seeded(&volume(GIB, 3), &hard_zone(), 0)
        .expect("node-c has no zone to share");
    assert_eq!(placed.node_id, "node-c");
}

#[test]
fn soft_zone_anti_affinity_prefers_a_new_zone_but_shares_one_when_it_must() {
    let world = World::new([
        node("node-a").zone("z1"),
        node("node-b").zone("z1"),
        node("node-c").zone("z1"),
        node("node-d").zone("z2"),
    ])
    .with_replica(replica("r1", VOLUME, GIB, "node-a", "node-a-fs"));
    let settings = SchedulerSettings::default();
    let chosen = world.chosen_nodes(&volume(GIB, 3), &settings);
    assert_eq!(chosen, names(&["node-d"]));
    let world = world.with_replica(replica("r2", VOLUME, GIB, "node-d", "node-d-fs"));
    let chosen = world.chosen_nodes(&volume(GIB, 3), &settings);
    assert_eq!(
        chosen,
        names(&["node-b", "node-c"]),
        "a shared zone is allowed"
    );
}

#[test]
fn soft_node_prefers_a_free_node_in_a_used_zone_over_a_used_node_in_no_zone() {
    let world = World::new([
        node("node-a").zone("z1"),
        node("node-b").zone("z1"),
        node("node-c"),
    ])
    .with_replica(replica("r1", VOLUME, GIB, "node-a", "node-a-fs"))
    .with_replica(replica("r2", VOLUME, GIB, "node-c", "node-c-fs"));
    let chosen = world.chosen_nodes(&volume(GIB, 3), &soft_node());
    assert_eq!(chosen, names(&["node-b"]));
}

#[test]
fn ties_are_broken_at_random_over_every_equal_node() {
    let world = World::new(["node-a", "node-b", "node-c", "node-d", "node-e"].map(node));
    let vol = volume(GIB, 1);
    let settings = SchedulerSettings::default();
    let mut rng = fastrand::Rng::with_seed(42);
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..500 {
        let placed = world.schedule(&vol, &settings, &mut rng).expect("placed");
        *counts.entry(placed.node_id).or_default() += 1;
    }
    assert_eq!(counts.len(), 5, "{counts:?}");
    assert!(counts.values().all(|&n| n > 50), "{counts:?}");
    let draw = |seed| world.schedule_seeded(&vol, &settings, seed);
    assert_eq!(draw(3), draw(3), "a seeded rng decides the same way twice");
}

#[test]
fn huge_sizes_do_not_overflow() {
    let huge = |b: NodeBuilder| {
        b.disk_status("default", |d| {
            d.storage_maximum = i64::MAX;
            d.storage_available = i64::MAX;
        })
    };
    let world = World::new([
        huge(node("node-a")),
        huge(node("node-b")).disk_spec("default", |d| d.storage_reserved = i64::MIN),
    ])
    .with_replica(replica("x", "other", i64::MAX, "node-a", "node-a-fs"))
    .with_replica(replica("y", "other", i64::MAX, "node-a", "node-a-fs"))
    .with_replica(replica("z", "other", i64::MIN, "node-b", "node-b-fs"));
    let mut rng = fastrand::Rng::with_seed(0);
    for over in [0, 100, u64::MAX] {
        for minimal in [0, 100, u64::MAX] {
            let settings = SchedulerSettings {
                over_provisioning_percentage: over,
                minimal_available_percentage: minimal,
                soft_node_anti_affinity: true,
                ..SchedulerSettings::default()
            };
            for size in [i64::MIN, -1, 0, 4096, i64::MAX] {
                // Any answer will do, as long as there is one.
                let _ = world.schedule(&volume(size, 3), &settings, &mut rng);
            }
        }
    }
    let settings = SchedulerSettings {
        over_provisioning_percentage: u64::MAX,
        minimal_available_percentage: 0,
        ..SchedulerSettings::default()
    };
    let placed = world
        .schedule(&volume(i64::MAX, 1), &settings, &mut rng)
        .expect("room");
    assert_eq!(placed.node_id, "node-b");
}

#[test]
fn human_sizes() {
    assert_eq!(human(0), "0 B");
    assert_eq!(human(100), "100 B");
    assert_eq!(human(4096), "4 KiB");
    assert_eq!(human(512 << 20), "512 MiB");
    assert_eq!(human(10 * GIB), "10 GiB");
    assert_eq!(human(3 * GIB / 2), "1.5 GiB");
    assert_eq!(human(GIB - 1), "1023.9 MiB");
    assert_eq!(human(-2 * GIB), "-2 GiB");
    assert_eq!(human(i64::MAX), "7.9 EiB");
    assert_eq!(human(i64::MIN), "-8 EiB");
    assert_eq!(human_i128(i128::MAX), "7.9 EiB");
    assert_eq!(human_i128(i128::MIN), "-8 EiB");
}
