//! Long lists, a page at a time: in name order, each page going on after
//! the name the one before it ended with, so a page is right however the
//! list changed in between (no snapshot of it is kept).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::ApiError;

/// The most one page holds, and how many it holds unless asked.
const PAGE_MAX: usize = 1000;
pub const PAGE_DEFAULT: usize = 100;

/// A page of a list.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Items matching the filters, on all pages.
    pub total: usize,
    /// Pass as `continue` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub r#continue: Option<String>,
}

/// The page size asked for, checked.
pub fn limit(asked: Option<usize>) -> Result<usize, ApiError> {
    let limit = asked.unwrap_or(PAGE_DEFAULT);
    if !(1..=PAGE_MAX).contains(&limit) {
        return Err(ApiError::Invalid(format!(
            "limit must be 1 to {PAGE_MAX}, not {limit}"
        )));
    }
    Ok(limit)
}

/// The page of `all` after the item named `after` (from the start: none),
/// of at most `limit`, in the order of `name`.
pub fn page<T>(
    mut all: Vec<T>,
    name: fn(&T) -> &str,
    after: Option<&str>,
    limit: usize,
) -> Page<T> {
    all.sort_by(|a, b| name(a).cmp(name(b)));
    let total = all.len();
    let start = after.map_or(0, |after| all.partition_point(|v| name(v) <= after));
    let items: Vec<T> = all.into_iter().skip(start).take(limit).collect();
    let more = start + items.len() < total;
    let r#continue = more
        .then(|| items.last().map(|v| name(v).to_owned()))
        .flatten();
    Page {
        items,
        total,
        r#continue,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(page: &Page<String>) -> Vec<&str> {
        page.items.iter().map(String::as_str).collect()
    }

    #[test]
    fn pages_follow_one_another_in_name_order_to_the_last() {
        let all = || ["c", "a", "e", "b", "d"].map(str::to_owned).to_vec();
        let name: fn(&String) -> &str = String::as_str;
        let first = page(all(), name, None, 2);
        assert_eq!((names(&first), first.total), (vec!["a", "b"], 5));
        let second = page(all(), name, first.r#continue.as_deref(), 2);
        assert_eq!(names(&second), ["c", "d"]);
        let last = page(all(), name, second.r#continue.as_deref(), 2);
        assert_eq!(
            (names(&last), last.r#continue.as_deref()),
            (vec!["e"], None)
        );
        // A page that ends with the last item says so.
        assert_eq!(page(all(), name, None, 5).r#continue, None);
        // A continue naming an item since deleted still goes on after it.
        assert_eq!(names(&page(all(), name, Some("bb"), 9)), ["c", "d", "e"]);
    }

    #[test]
    fn a_limit_is_one_to_a_thousand() {
        assert_eq!(limit(None).unwrap(), 100);
        assert_eq!(limit(Some(1000)).unwrap(), 1000);
        for refused in [0, 1001] {
            assert_eq!(limit(Some(refused)).unwrap_err().code(), "invalid");
        }
    }
}
