//! What a job's retention deletes of what it made on one volume. Only what
//! completed counts: a snapshot or backup is never deleted for the sake of
//! a newer one that did not complete, and one still in progress is never
//! deleted. One that failed goes once a newer one completed.

use std::time::Duration;

use jiff::Timestamp;

use crate::types::RetentionPolicy;

/// One snapshot or backup a job made on a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub name: String,
    pub created: Timestamp,
    pub state: ItemState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemState {
    Complete,
    InProgress,
    Failed,
}

/// The names of `items` to delete: past the `retain` newest complete ones
/// (count-based), or complete ones older than `retain_age` but the newest
/// (age-based); and failed ones older than the newest complete one.
pub fn to_delete(
    items: &[Item],
    policy: RetentionPolicy,
    retain: usize,
    retain_age: Option<Duration>,
    now: Timestamp,
) -> Vec<String> {
    let mut items: Vec<&Item> = items.iter().collect();
    items.sort_by(|a, b| (b.created, &b.name).cmp(&(a.created, &a.name)));
    let complete: Vec<&Item> = items
        .iter()
        .copied()
        .filter(|i| i.state == ItemState::Complete)
        .collect();
    let Some(newest) = complete.first() else {
        return Vec::new();
    };
    let too_old = |item: &Item| {
        retain_age.is_some_and(|age| {
            Duration::try_from(now.duration_since(item.created)).is_ok_and(|since| since > age)
        })
    };
    let mut doomed: Vec<String> = match policy {
        RetentionPolicy::CountBased => complete
            .iter()
            .skip(retain.max(1))
            .map(|i| i.name.clone())
            .collect(),
        RetentionPolicy::AgeBased => complete
            .iter()
            .skip(1)
            .filter(|i| retain_age.is_some() && too_old(i))
            .map(|i| i.name.clone())
            .collect(),
    };
    doomed.extend(
        items
            .iter()
            .filter(|i| i.state == ItemState::Failed && i.created < newest.created)
            .map(|i| i.name.clone()),
    );
    doomed
}

/// `items` with `done` complete, made `now` if they lack it: the run that
/// made it found it complete, whatever an older view of it says (as in
/// progress, it would keep the one it replaces past the retention).
pub fn with_complete(mut items: Vec<Item>, done: &str, now: Timestamp) -> Vec<Item> {
    match items.iter_mut().find(|i| i.name == done) {
        Some(this_run) => this_run.state = ItemState::Complete,
        None => items.push(Item {
            name: done.to_owned(),
            created: now,
            state: ItemState::Complete,
        }),
    }
    items
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn item(name: &str, minute: i64, state: ItemState) -> Item {
        Item {
            name: name.into(),
            created: Timestamp::from_second(1_800_000_000 + minute * 60).unwrap(),
            state,
        }
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000 + 100 * 60).unwrap()
    }

    use ItemState::{Complete, Failed, InProgress};

    #[test]
    fn the_run_that_completed_replaces_the_one_before_whatever_a_stale_view_says() {
        let stale = vec![item("a", 1, Complete), item("b", 2, InProgress)];
        let policy = RetentionPolicy::CountBased;
        assert!(to_delete(&stale, policy, 1, None, now()).is_empty());
        let items = with_complete(stale, "b", now());
        assert_eq!(to_delete(&items, policy, 1, None, now()), ["a"]);
        let unseen = with_complete(vec![item("a", 1, Complete)], "b", now());
        assert_eq!(to_delete(&unseen, policy, 1, None, now()), ["a"]);
    }

    #[test]
    fn count_based_keeps_the_newest_complete_ones() {
        let items = [
            item("a", 1, Complete),
            item("b", 2, Complete),
            item("c", 3, Failed),
            item("d", 4, Complete),
            item("e", 5, InProgress),
        ];
        let mut doomed = to_delete(&items, RetentionPolicy::CountBased, 2, None, now());
        doomed.sort();
        assert_eq!(doomed, ["a", "c"], "c failed before d completed; e runs on");
        let doomed = to_delete(&items, RetentionPolicy::CountBased, 1, None, now());
        assert_eq!(doomed, ["b", "a", "c"]);
    }

    #[test]
    fn nothing_goes_until_something_completes() {
        let items = [
            item("a", 1, Failed),
            item("b", 2, InProgress),
            item("c", 3, Failed),
        ];
        assert!(to_delete(&items, RetentionPolicy::CountBased, 1, None, now()).is_empty());
    }

    #[test]
    fn age_based_keeps_the_young_and_always_the_newest() {
        let items = [
            item("a", 10, Complete),
            item("b", 50, Complete),
            item("c", 95, Complete),
        ];
        let age = Some(Duration::from_secs(30 * 60));
        assert_eq!(
            to_delete(&items, RetentionPolicy::AgeBased, 0, age, now()),
            ["b", "a"]
        );
        let old = [item("a", 10, Complete), item("b", 20, Complete)];
        assert_eq!(
            to_delete(&old, RetentionPolicy::AgeBased, 0, age, now()),
            ["a"]
        );
    }

    proptest! {
        /// Whatever is there, count-based retention never deletes anything
        /// in progress, never the newest complete one, and keeps exactly
        /// `retain` complete ones when there are that many.
        #[test]
        fn retention_keeps_what_it_must(
            states in proptest::collection::vec(0u8..3, 0..20),
            retain in 1usize..6,
        ) {
            let items: Vec<Item> = states.iter().enumerate().map(|(i, s)| {
                let state = [Complete, InProgress, Failed][usize::from(*s)];
                item(&format!("i{i}"), i64::try_from(i).unwrap(), state)
            }).collect();
            let doomed = to_delete(&items, RetentionPolicy::CountBased, retain, None, now());
            let kept_complete = items.iter()
                .filter(|i| i.state == Complete && !doomed.contains(&i.name)).count();
            let complete = items.iter().filter(|i| i.state == Complete).count();
            prop_assert_eq!(kept_complete, complete.min(retain));
            for item in &items {
                if doomed.contains(&item.name) {
                    prop_assert!(item.state != InProgress);
                }
            }
            if let Some(newest) = items.iter().rev().find(|i| i.state == Complete) {
                prop_assert!(!doomed.contains(&newest.name));
            }
        }
    }
}
