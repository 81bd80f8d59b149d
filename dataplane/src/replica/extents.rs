//! A set of written block ranges.
//!
//! Memory grows with the number of extents, not with the volume size: a
//! 1 TiB replica with a handful of large writes needs a handful of map
//! entries, where a byte-per-block map (Longhorn's) would need 256 MiB.

use std::collections::BTreeMap;

/// Disjoint half-open block ranges `[start, end)`, keyed by start.
///
/// Invariant: ranges are non-empty, disjoint and never adjacent (touching
/// ranges are merged), so each maximal run of blocks is exactly one entry and
/// the entry count is the true extent count.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExtentSet {
    map: BTreeMap<u64, u64>,
}

impl ExtentSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds blocks `[start, end)`, merging with overlapping or adjacent ranges.
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut new_start, mut new_end) = (start, end);
        if let Some((&s, &e)) = self.map.range(..start).next_back()
            && e >= start
        {
            new_start = s;
            new_end = new_end.max(e);
        }
        // Absorb every range that starts inside or right after the new one;
        // none can start past `new_end` once absorbed, as they were disjoint.
        while let Some((&s, &e)) = self.map.range(new_start..=new_end).next() {
            self.map.remove(&s);
            new_end = new_end.max(e);
        }
        self.map.insert(new_start, new_end);
    }

    /// Removes blocks `[start, end)`, splitting ranges that straddle it.
    pub fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        if let Some((&s, &e)) = self.map.range(..start).next_back()
            && e > start
        {
            self.map.insert(s, start);
            if e > end {
                self.map.insert(end, e);
            }
        }
        while let Some((&s, &e)) = self.map.range(start..end).next() {
            self.map.remove(&s);
            if e > end {
                self.map.insert(end, e);
            }
        }
    }

    pub fn contains(&self, block: u64) -> bool {
        self.map
            .range(..=block)
            .next_back()
            .is_some_and(|(_, &e)| e > block)
    }

    /// All ranges in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.map.iter().map(|(&s, &e)| (s, e))
    }

    /// The parts of the set inside `[start, end)`, clipped to it, ascending.
    pub fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let straddling = self
            .map
            .range(..start)
            .next_back()
            .filter(|&(_, &e)| e > start);
        let inside = self.map.range(start..end.max(start));
        straddling
            .into_iter()
            .chain(inside)
            .map(move |(&s, &e)| (s.max(start), e.min(end)))
            .filter(|&(s, e)| s < e)
    }

    /// The runs of `[start, end)` not in the set, ascending.
    pub fn gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut gaps = Vec::new();
        let mut cursor = start;
        for (s, e) in self.overlapping(start, end) {
            if s > cursor {
                gaps.push((cursor, s));
            }
            cursor = e;
        }
        if cursor < end {
            gaps.push((cursor, end));
        }
        gaps
    }

    /// Blocks in `self` but not in `other`.
    pub fn difference(&self, other: &ExtentSet) -> ExtentSet {
        let mut out = ExtentSet::new();
        for (s, e) in self.iter() {
            for (gs, ge) in other.gaps(s, e) {
                out.insert(gs, ge);
            }
        }
        out
    }

    /// Number of ranges: what the memory use is proportional to.
    pub fn extent_count(&self) -> usize {
        self.map.len()
    }

    /// Number of blocks covered.
    pub fn block_count(&self) -> u64 {
        self.iter().map(|(s, e)| e - s).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    fn set(ranges: &[(u64, u64)]) -> ExtentSet {
        let mut s = ExtentSet::new();
        for &(a, b) in ranges {
            s.insert(a, b);
        }
        s
    }

    fn ranges(s: &ExtentSet) -> Vec<(u64, u64)> {
        s.iter().collect()
    }

    #[test]
    fn insert_merges_overlapping_and_adjacent() {
        let s = set(&[(10, 20), (30, 40), (20, 25), (28, 30)]);
        assert_eq!(ranges(&s), vec![(10, 25), (28, 40)]);
        let s = set(&[(10, 20), (30, 40), (50, 60), (15, 55)]);
        assert_eq!(ranges(&s), vec![(10, 60)]);
        let s = set(&[(10, 20), (5, 10)]);
        assert_eq!(ranges(&s), vec![(5, 20)]);
    }

    #[test]
    fn insert_inside_existing_is_a_no_op() {
        let s = set(&[(0, 100), (10, 20)]);
        assert_eq!(ranges(&s), vec![(0, 100)]);
    }

    #[test]
    fn empty_ranges_are_ignored() {
        let mut s = set(&[(5, 5), (7, 3)]);
        assert!(s.is_empty());
        s.insert(0, 10);
        s.remove(4, 4);
        s.remove(8, 2);
        assert_eq!(ranges(&s), vec![(0, 10)]);
    }

    #[test]
    fn remove_splits_and_trims() {
        let mut s = set(&[(0, 100)]);
        s.remove(10, 20);
        assert_eq!(ranges(&s), vec![(0, 10), (20, 100)]);
        s.remove(0, 5);
        s.remove(90, 200);
        assert_eq!(ranges(&s), vec![(5, 10), (20, 90)]);
        s.remove(8, 30);
        assert_eq!(ranges(&s), vec![(5, 8), (30, 90)]);
        s.remove(0, 1000);
        assert!(s.is_empty());
    }

    #[test]
    fn contains_respects_half_open_ends() {
        let s = set(&[(10, 20)]);
        assert!(!s.contains(9));
        assert!(s.contains(10));
        assert!(s.contains(19));
        assert!(!s.contains(20));
    }

    #[test]
    fn overlapping_clips_to_the_query() {
        let s = set(&[(0, 10), (20, 30), (40, 50)]);
        let got: Vec<_> = s.overlapping(5, 45).collect();
        assert_eq!(got, vec![(5, 10), (20, 30), (40, 45)]);
        assert_eq!(s.overlapping(10, 20).count(), 0);
        assert_eq!(s.overlapping(30, 10).count(), 0);
        assert_eq!(s.overlapping(5, 5).count(), 0, "empty query inside a range");
    }

    #[test]
    fn gaps_are_the_complement_in_range() {
        let s = set(&[(0, 10), (20, 30)]);
        assert_eq!(s.gaps(5, 25), vec![(10, 20)]);
        assert_eq!(s.gaps(0, 40), vec![(10, 20), (30, 40)]);
        assert_eq!(ExtentSet::new().gaps(3, 7), vec![(3, 7)]);
        assert!(s.gaps(0, 10).is_empty());
    }

    #[test]
    fn difference_and_counts() {
        let a = set(&[(0, 10), (20, 30)]);
        let b = set(&[(5, 25)]);
        assert_eq!(ranges(&a.difference(&b)), vec![(0, 5), (25, 30)]);
        assert_eq!(a.extent_count(), 2);
        assert_eq!(a.block_count(), 20);
    }

    /// Operations for the model test, over a small block range so that
    /// overlaps, adjacency and splits are frequent.
    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u64),
        Remove(u64, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let range = (0u64..128, 0u64..24).prop_map(|(s, l)| (s, s + l));
        prop_oneof![
            range.clone().prop_map(|(s, e)| Op::Insert(s, e)),
            range.prop_map(|(s, e)| Op::Remove(s, e)),
        ]
    }

    fn assert_matches_model(s: &ExtentSet, model: &BTreeSet<u64>) {
        let mut prev_end = None;
        for (a, b) in s.iter() {
            assert!(a < b, "empty range {a}..{b}");
            if let Some(p) = prev_end {
                assert!(a > p, "ranges touch or overlap at {a}");
            }
            prev_end = Some(b);
        }
        let blocks: BTreeSet<u64> = s.iter().flat_map(|(a, b)| a..b).collect();
        assert_eq!(&blocks, model);
        assert_eq!(s.block_count(), model.len() as u64);
        for b in 0..160 {
            assert_eq!(s.contains(b), model.contains(&b), "block {b}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn behaves_like_a_set_of_blocks(ops in prop::collection::vec(op(), 0..60),
                                        q in (0u64..160, 0u64..160)) {
            let mut s = ExtentSet::new();
            let mut model = BTreeSet::new();
            for op in ops {
                match op {
                    Op::Insert(a, b) => { s.insert(a, b); model.extend(a..b); }
                    Op::Remove(a, b) => { s.remove(a, b); for x in a..b { model.remove(&x); } }
                }
                assert_matches_model(&s, &model);
            }
            let (qs, qe) = (q.0.min(q.1), q.0.max(q.1));
            let inside: BTreeSet<u64> = s.overlapping(qs, qe).flat_map(|(a, b)| a..b).collect();
            let outside: BTreeSet<u64> = s.gaps(qs, qe).into_iter().flat_map(|(a, b)| a..b).collect();
            let want_in: BTreeSet<u64> = model.range(qs..qe).copied().collect();
            let want_out: BTreeSet<u64> = (qs..qe).filter(|b| !model.contains(b)).collect();
            prop_assert_eq!(inside, want_in);
            prop_assert_eq!(outside, want_out);
        }
    }
}
