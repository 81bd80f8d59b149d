//! Which volumes the table shows: filtered by name and health, sorted by
//! a column, a page at a time. All of it is in the query string, so a
//! link, Back, or a live refresh shows the same page; each link keeps
//! what it does not change.

use std::cmp::Ordering;

use serde::Deserialize;

use super::super::overview::Health;
use crate::api::page::{PAGE_DEFAULT, limit};
use crate::api::volumes::VolumeView;

/// A column the table sorts by, named in the query string as in
/// [`COLUMNS`].
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Column {
    #[default]
    Name,
    Claim,
    Size,
    Used,
    Replicas,
    Node,
    Frontend,
    State,
    Health,
}

impl Column {
    fn word(self) -> &'static str {
        COLUMNS
            .iter()
            .find(|(column, ..)| *column == self)
            .map_or("name", |(_, word, ..)| word)
    }
}

/// The table's columns: in the query string, heading, and whether its
/// values are numbers.
pub const COLUMNS: [(Column, &str, &str, bool); 9] = [
    (Column::Name, "name", "Name", false),
    (Column::Claim, "claim", "Claim", false),
    (Column::Size, "size", "Size", true),
    (Column::Used, "used", "Used", true),
    (Column::Replicas, "replicas", "Replicas", true),
    (Column::Node, "node", "Node", false),
    (Column::Frontend, "frontend", "Frontend", false),
    (Column::State, "state", "State", false),
    (Column::Health, "health", "Health", false),
];

/// What the query string asks for; left out, the defaults (all volumes
/// by name, the first page of [`PAGE_DEFAULT`]).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct Listing {
    /// Only names holding this.
    pub name: String,
    /// Only this health.
    pub health: String,
    pub sort: Column,
    pub desc: bool,
    /// From 1.
    pub page: Option<usize>,
    /// Rows a page, 1 to 1000 as the API's lists take.
    pub limit: Option<usize>,
}

impl Listing {
    pub fn filtered(&self) -> bool {
        !self.name.is_empty() || !self.health.is_empty()
    }

    /// Rows a page; one out of range is the default.
    pub fn rows(&self) -> usize {
        limit(self.limit).unwrap_or(PAGE_DEFAULT)
    }

    /// The query string's pairs, defaults left out.
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let text = |key, value: &str| (!value.is_empty()).then(|| (key, value.to_owned()));
        let number = |key, value: Option<usize>| value.map(|n| (key, n.to_string()));
        [
            text("name", &self.name),
            text("health", &self.health),
            (self.sort != Column::Name).then(|| ("sort", self.sort.word().to_owned())),
            self.desc.then(|| ("desc", "true".to_owned())),
            number("page", self.page),
            number("limit", self.limit),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// The volumes page showing this.
    pub fn href(&self) -> String {
        let query: Vec<String> = self
            .pairs()
            .iter()
            .map(|(key, value)| format!("{key}={}", encoded(value)))
            .collect();
        match query.is_empty() {
            true => "/ui/volumes".to_owned(),
            false => format!("/ui/volumes?{}", query.join("&")),
        }
    }

    /// What a new filter keeps: the sort and page size, as query pairs.
    pub fn kept(&self) -> Vec<(&'static str, String)> {
        let mut kept = self.pairs();
        kept.retain(|(key, _)| !["name", "health", "page"].contains(key));
        kept
    }

    /// This listing's page `page`.
    pub fn at(&self, page: usize) -> Self {
        let page = (page > 1).then_some(page);
        Self {
            page,
            ..self.clone()
        }
    }

    /// Sorted by `column`: the other way if it already is; from page 1.
    pub fn sorted_by(&self, column: Column) -> Self {
        Self {
            sort: column,
            desc: column == self.sort && !self.desc,
            page: None,
            ..self.clone()
        }
    }

    /// `rows` sorted as asked, ties by name.
    pub fn sort(&self, rows: &mut [(VolumeView, Health)]) {
        rows.sort_by(|(a, ha), (b, hb)| {
            let order = compare(self.sort, a, b, ha.word(), hb.word());
            let order = if self.desc { order.reverse() } else { order };
            order.then_with(|| a.name.cmp(&b.name))
        });
    }
}

fn compare(column: Column, a: &VolumeView, b: &VolumeView, ha: &str, hb: &str) -> Ordering {
    match column {
        Column::Name => a.name.cmp(&b.name),
        Column::Claim => a.pvc.cmp(&b.pvc),
        Column::Size => a.size.cmp(&b.size),
        Column::Used => a.actual_size.cmp(&b.actual_size),
        Column::Replicas => {
            (a.replicas_healthy, a.replicas_wanted).cmp(&(b.replicas_healthy, b.replicas_wanted))
        }
        Column::Node => a.node.cmp(&b.node),
        Column::Frontend => a.frontend.cmp(&b.frontend),
        Column::State => a.state.cmp(&b.state),
        Column::Health => ha.cmp(hb),
    }
}

/// `value` as a query string's value: every byte but the unreserved
/// characters percent-encoded.
fn encoded(value: &str) -> String {
    value
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(byte).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// One page of a sorted list.
pub struct Paged<T> {
    pub rows: Vec<T>,
    /// Rows on all pages.
    pub total: usize,
    /// This page's number, from 1; and how many there are (at least 1).
    pub page: usize,
    pub pages: usize,
    /// The position of the page's first row in all of them, from 1.
    pub first: usize,
}

/// Page `page` (from 1; past the last: the last) of `all`, `size` rows a
/// page.
pub fn paged<T>(all: Vec<T>, page: usize, size: usize) -> Paged<T> {
    let total = all.len();
    let size = size.max(1);
    let pages = total.div_ceil(size).max(1);
    let page = page.clamp(1, pages);
    let skip = (page - 1) * size;
    let rows: Vec<T> = all.into_iter().skip(skip).take(size).collect();
    Paged {
        rows,
        total,
        page,
        pages,
        first: skip + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(query: &str) -> Result<Listing, String> {
        let uri: axum::http::Uri = format!("/ui/volumes?{query}").parse().unwrap();
        axum::extract::Query::try_from_uri(&uri)
            .map(|q| q.0)
            .map_err(|e| e.body_text())
    }

    fn listing(query: &str) -> Listing {
        parsed(query).unwrap()
    }

    #[test]
    fn a_link_keeps_the_filters_sort_and_size_and_leaves_out_defaults() {
        assert_eq!(Listing::default().href(), "/ui/volumes");
        let asked = listing("name=pg+a%26b&health=degraded&sort=size&desc=true&page=3&limit=50");
        assert_eq!(asked.name, "pg a&b");
        assert_eq!(
            asked.href(),
            "/ui/volumes?name=pg%20a%26b&health=degraded&sort=size&desc=true&page=3&limit=50"
        );
        assert_eq!(listing(asked.href().split_once('?').unwrap().1), asked);
        assert_eq!(
            asked.at(1).href(),
            "/ui/volumes?name=pg%20a%26b&health=degraded&sort=size&desc=true&limit=50"
        );
        // Sorting again by the same column flips it, and starts over.
        let flipped = asked.sorted_by(Column::Size);
        assert_eq!((flipped.desc, flipped.page), (false, None));
        let by_node = listing("sort=size").sorted_by(Column::Node);
        assert_eq!((by_node.sort, by_node.desc), (Column::Node, false));
        assert_eq!(
            listing("sort=node").sorted_by(Column::Node).href(),
            "/ui/volumes?sort=node&desc=true"
        );
        assert!(parsed("sort=colour").is_err());
        let kept: Vec<_> = asked.kept().into_iter().map(|(k, _)| k).collect();
        assert_eq!(kept, ["sort", "desc", "limit"]);
        // Each column is sorted by the word its links name it by.
        for (column, word, ..) in COLUMNS {
            assert_eq!(listing(&format!("sort={word}")).sort, column);
        }
    }

    #[test]
    fn a_page_size_out_of_range_is_the_default() {
        assert_eq!(listing("limit=20").rows(), 20);
        assert_eq!(listing("limit=0").rows(), PAGE_DEFAULT);
        assert_eq!(listing("limit=5000").rows(), PAGE_DEFAULT);
        assert_eq!(listing("").rows(), PAGE_DEFAULT);
    }

    #[test]
    fn pages_are_counted_from_one_and_the_last_is_shown_for_one_past_it() {
        let all: Vec<u32> = (1..=1000).collect();
        let second = paged(all.clone(), 2, 100);
        assert_eq!((second.first, second.total, second.pages), (101, 1000, 10));
        assert_eq!((second.rows[0], second.rows.len()), (101, 100));
        let past = paged(all.clone(), 99, 100);
        assert_eq!((past.page, past.rows[0]), (10, 901));
        assert_eq!(paged(all, 0, 100).page, 1);
        let none = paged(Vec::<u32>::new(), 1, 100);
        assert_eq!((none.page, none.pages, none.rows.len()), (1, 1, 0));
    }

    #[test]
    fn volumes_sort_by_a_column_either_way_ties_by_name() {
        let volume = |name: &str, size: i64| VolumeView {
            name: name.into(),
            size,
            actual_size: 0,
            replicas_wanted: 1,
            replicas_healthy: 0,
            frontend: String::new(),
            node: String::new(),
            state: String::new(),
            robustness: String::new(),
            pvc: None,
            created: None,
            revert: None,
            standby: None,
        };
        let mut rows = vec![
            (volume("b", 2), Health::Healthy),
            (volume("c", 1), Health::Degraded),
            (volume("a", 2), Health::Faulted),
        ];
        let names = |rows: &[(VolumeView, Health)]| -> Vec<String> {
            rows.iter().map(|(v, _)| v.name.clone()).collect()
        };
        listing("sort=size").sort(&mut rows);
        assert_eq!(names(&rows), ["c", "a", "b"]);
        listing("sort=size&desc=true").sort(&mut rows);
        assert_eq!(names(&rows), ["a", "b", "c"]);
        listing("sort=health").sort(&mut rows);
        assert_eq!(names(&rows), ["c", "a", "b"]);
    }
}
