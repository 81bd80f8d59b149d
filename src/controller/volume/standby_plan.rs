//! A standby volume's decisions, apart from any I/O: which backup it
//! restores next, and which blocks each replica needs for it.
//!
//! Backups are ordered by when they were completed. The caches hold that
//! to the second only (`status.backupCreatedAt`); where two backups share
//! a second, the store's configs, which hold it to the nanosecond, decide.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use jiff::Timestamp;

use crate::backup::{BLOCK_SIZE, BackupConfig};

/// A completed backup of the volume followed, as the caches show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    /// When it was completed, to the second; None if not known.
    pub completed: Option<Timestamp>,
}

/// The backup a standby holds, and when it was completed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub name: String,
    pub completed: Timestamp,
}

/// The candidates whose exact completion time must be read from the store
/// to order them against `held` and each other: those completed in the
/// same second as `held`, those sharing the newest second, and those of
/// unknown time.
pub fn to_read(candidates: &[Candidate], held: Option<&Held>) -> BTreeSet<String> {
    let floor = held.map(|h| second(h.completed));
    let others = candidates
        .iter()
        .filter(|c| held.is_none_or(|h| h.name != c.name));
    let relevant: Vec<&Candidate> = others
        .filter(|c| match (c.completed, floor) {
            (Some(at), Some(floor)) => second(at) >= floor,
            _ => true,
        })
        .collect();
    let top = relevant
        .iter()
        .filter_map(|c| c.completed)
        .map(second)
        .max();
    let tied = relevant
        .iter()
        .filter(|c| c.completed.map(second) == top)
        .count()
        > 1;
    relevant
        .iter()
        .filter(|c| match c.completed.map(second) {
            None => true,
            Some(at) => Some(at) == floor || (tied && Some(at) == top),
        })
        .map(|c| c.name.clone())
        .collect()
}

/// The candidates completed after `held` (all of them without one),
/// oldest first, each with its completion time: the exact one where
/// `exact` has it (read from the store), else the cache's. A candidate
/// [`to_read`] named and `exact` lacks is gone from the store and left out.
pub fn newer(
    candidates: &[Candidate],
    held: Option<&Held>,
    exact: &BTreeMap<String, Timestamp>,
) -> Vec<(String, Timestamp)> {
    let needed = to_read(candidates, held);
    let mut newer: Vec<(String, Timestamp)> = candidates
        .iter()
        .filter(|c| held.is_none_or(|h| h.name != c.name))
        .filter_map(|c| {
            let at = match exact.get(&c.name) {
                Some(at) => *at,
                None if needed.contains(&c.name) => return None,
                None => c.completed?,
            };
            held.is_none_or(|h| at > h.completed)
                .then(|| (c.name.clone(), at))
        })
        .collect();
    newer.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
    newer
}

fn second(at: Timestamp) -> i64 {
    at.as_second()
}

/// What one replica needs written to hold a backup: the offsets of the
/// backup's blocks to write, and the byte ranges to make zeros.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub writes: BTreeSet<u64>,
    pub zeros: Vec<Range<u64>>,
}

/// The plan for a replica holding exactly `base` to hold `target`: the
/// target's blocks that differ from the base's, and zeros where the base
/// held a block the target does not.
pub fn diff(base: &BackupConfig, target: &BackupConfig, volume_size: u64) -> Plan {
    let before: BTreeMap<u64, &str> = base
        .blocks
        .iter()
        .map(|b| (b.offset, b.checksum.as_str()))
        .collect();
    let after: BTreeMap<u64, &str> = target
        .blocks
        .iter()
        .map(|b| (b.offset, b.checksum.as_str()))
        .collect();
    let writes = after
        .iter()
        .filter(|(offset, sum)| before.get(offset) != Some(sum))
        .map(|(offset, _)| *offset)
        .collect();
    let zeros = before
        .keys()
        .filter(|offset| !after.contains_key(offset))
        .filter_map(|offset| block_range(*offset, volume_size))
        .collect();
    Plan { writes, zeros }
}

/// How many bytes of the block at `offset` the backup covers: its last
/// block may be short.
pub fn covered(target: &BackupConfig, offset: u64) -> Option<u64> {
    (offset < target.size).then(|| BLOCK_SIZE.min(target.size - offset))
}

/// The plan for a replica whose data is unknown, from what it holds: for
/// each block it holds data in (by offset), the checksum of its bytes the
/// target covers (None if those are zeros or the target covers none).
/// Blocks it does not hold read as zeros. What it holds beyond the
/// target's size is made zeros too.
pub fn compare(
    held: &BTreeMap<u64, Option<String>>,
    target: &BackupConfig,
    volume_size: u64,
) -> Plan {
    let wanted: BTreeMap<u64, &str> = target
        .blocks
        .iter()
        .map(|b| (b.offset, b.checksum.as_str()))
        .collect();
    let writes = wanted
        .iter()
        .filter(|(offset, sum)| held.get(offset).and_then(Option::as_deref) != Some(**sum))
        .map(|(offset, _)| *offset)
        .collect();
    let mut zeros = Vec::new();
    for (offset, sum) in held {
        if sum.is_some() && !wanted.contains_key(offset) {
            zeros.extend(block_range(*offset, volume_size));
            continue;
        }
        // The part of the block past the target's end, if any.
        let end = (offset + BLOCK_SIZE).min(volume_size);
        let from = (*offset).max(target.size);
        if from < end {
            zeros.push(from..end);
        }
    }
    Plan { writes, zeros }
}

/// The block at `offset` within a volume of `size` bytes.
fn block_range(offset: u64, size: u64) -> Option<Range<u64>> {
    (offset < size).then(|| offset..(offset + BLOCK_SIZE).min(size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::BlockRef;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn candidate(name: &str, completed: Option<&str>) -> Candidate {
        Candidate {
            name: name.into(),
            completed: completed.map(at),
        }
    }

    #[test]
    fn backups_in_the_held_ones_second_or_tied_for_newest_are_read_exactly() {
        let held = Held {
            name: "b1".into(),
            completed: at("2026-01-01T00:00:00.300Z"),
        };
        let candidates = [
            candidate("b0", Some("2025-12-31T23:59:59Z")),
            candidate("b1", Some("2026-01-01T00:00:00Z")),
            candidate("b2", Some("2026-01-01T00:00:00Z")),
            candidate("b3", Some("2026-01-01T00:00:05Z")),
            candidate("b4", Some("2026-01-01T00:00:05Z")),
            candidate("b5", None),
        ];
        let read = to_read(&candidates, Some(&held));
        assert_eq!(
            read,
            ["b2", "b3", "b4", "b5"].map(String::from).into(),
            "b0 is older, b1 held"
        );
        let exact = BTreeMap::from([
            ("b2".to_owned(), at("2026-01-01T00:00:00.200Z")),
            ("b3".to_owned(), at("2026-01-01T00:00:05.900Z")),
            ("b4".to_owned(), at("2026-01-01T00:00:05.100Z")),
        ]);
        let newer: Vec<String> = newer(&candidates, Some(&held), &exact)
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        // b2 is older than b1 within their second; b5 is gone from the store.
        assert_eq!(newer, ["b4", "b3"]);
    }

    #[test]
    fn without_a_held_backup_only_ties_for_newest_are_read() {
        let candidates = [
            candidate("a", Some("2026-01-01T00:00:01Z")),
            candidate("b", Some("2026-01-01T00:00:02Z")),
        ];
        assert!(to_read(&candidates, None).is_empty());
        let newer = newer(&candidates, None, &BTreeMap::new());
        assert_eq!(newer.last().unwrap().0, "b");
        assert_eq!(newer.len(), 2);
    }

    #[test]
    fn nothing_older_than_the_held_backup_is_ever_newer() {
        let held = Held {
            name: "gone".into(),
            completed: at("2026-01-01T00:00:10Z"),
        };
        let candidates = [candidate("older", Some("2026-01-01T00:00:03Z"))];
        assert!(newer(&candidates, Some(&held), &BTreeMap::new()).is_empty());
    }

    const B: u64 = BLOCK_SIZE;

    fn config(size: u64, blocks: &[(u64, &str)]) -> BackupConfig {
        BackupConfig {
            name: "x".into(),
            volume: "v".into(),
            snapshot: "s".into(),
            created: String::new(),
            size,
            block_size: B,
            compression: "lz4".into(),
            blocks: blocks
                .iter()
                .map(|(i, sum)| BlockRef {
                    offset: i * B,
                    checksum: (*sum).into(),
                })
                .collect(),
            labels: Default::default(),
        }
    }

    #[test]
    fn a_diff_writes_changed_and_new_blocks_and_zeros_removed_ones() {
        let base = config(8 * B, &[(0, "a"), (1, "b"), (2, "c")]);
        let target = config(8 * B, &[(0, "a"), (1, "B"), (5, "e")]);
        let plan = diff(&base, &target, 8 * B);
        assert_eq!(plan.writes, [B, 5 * B].into());
        assert_eq!(plan.zeros, vec![(2 * B)..(3 * B)]);
        assert_eq!(diff(&target, &target, 8 * B), Plan::default());
    }

    #[test]
    fn a_comparison_writes_what_differs_and_zeros_what_the_target_lacks() {
        let target = config(8 * B, &[(0, "a"), (1, "b"), (3, "d")]);
        let held = BTreeMap::from([
            (0, Some("a".to_owned())),
            (B, Some("old".to_owned())),
            (2 * B, Some("stray".to_owned())),
            (4 * B, None),
        ]);
        let plan = compare(&held, &target, 8 * B);
        assert_eq!(plan.writes, [B, 3 * B].into(), "1 differs, 3 is missing");
        assert_eq!(plan.zeros, vec![(2 * B)..(3 * B)]);
        let fresh = compare(&BTreeMap::new(), &target, 8 * B);
        assert_eq!(fresh.writes, [0, B, 3 * B].into());
        assert!(fresh.zeros.is_empty());
    }

    #[test]
    fn a_comparison_zeros_what_a_replica_holds_past_the_targets_end() {
        // A 3.5-block backup on a 6-block volume.
        let size = 3 * B + B / 2;
        let target = config(size, &[(3, "d")]);
        assert_eq!(covered(&target, 3 * B), Some(B / 2));
        assert_eq!(covered(&target, 4 * B), None);
        let held = BTreeMap::from([(3 * B, Some("d".to_owned())), (5 * B, None)]);
        let plan = compare(&held, &target, 6 * B);
        assert!(plan.writes.is_empty());
        assert_eq!(plan.zeros, [size..4 * B, 5 * B..6 * B]);
    }
}
