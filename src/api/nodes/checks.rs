//! What a node's or disk's change may hold: checked before it is sent,
//! with messages for people (the CRD's validation applies too).

use crate::api::ApiError;

/// The most tags a node or disk takes, and the longest tag.
const TAGS_MAX: usize = 32;
const TAG_LEN_MAX: usize = 63;
/// The longest disk path taken (Linux's PATH_MAX).
const PATH_MAX: usize = 4096;

/// A disk's name: a DNS label, as the object names it becomes part of.
pub fn check_disk_name(name: &str) -> Result<(), ApiError> {
    crate::names::validate_dns_subdomain("the disk's name", name).map_err(ApiError::Invalid)?;
    if name.len() > 63 || name.contains('.') {
        return Err(ApiError::Invalid(format!(
            "the disk's name {name:?} must be a DNS label: at most 63 lowercase letters, digits and '-'"
        )));
    }
    Ok(())
}

/// A disk's path: absolute, without `..` or NUL, which the manager would
/// otherwise create directories under.
pub fn check_disk_path(path: &str) -> Result<(), ApiError> {
    let bad = |why: &str| Err(ApiError::Invalid(format!("the disk's path {path:?} {why}")));
    if !path.starts_with('/') {
        return bad("must be absolute");
    }
    if path.contains('\0') {
        return bad("may not hold a NUL");
    }
    if path.split('/').any(|part| part == "..") {
        return bad("may not hold `..`");
    }
    if path.len() > PATH_MAX {
        return bad(&format!("is longer than {PATH_MAX} bytes"));
    }
    Ok(())
}

/// Tags as stored: each 1 to 63 letters, digits, `-`, `_` or `.`, sorted,
/// without repeats.
pub fn checked_tags(tags: &[String]) -> Result<Vec<String>, ApiError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if tags.len() > TAGS_MAX {
        return Err(ApiError::Invalid(format!(
            "at most {TAGS_MAX} tags, not {}",
            tags.len()
        )));
    }
    for tag in tags {
        if tag.is_empty() || tag.len() > TAG_LEN_MAX || !tag.chars().all(allowed) {
            return Err(ApiError::Invalid(format!(
                "the tag {tag:?} must be 1 to {TAG_LEN_MAX} letters, digits, '-', '_' or '.'"
            )));
        }
    }
    let mut tags = tags.to_vec();
    tags.sort();
    tags.dedup();
    Ok(tags)
}

pub(super) fn check_reserved(bytes: Option<i64>) -> Result<(), ApiError> {
    match bytes {
        Some(bytes) if bytes < 0 => Err(ApiError::Invalid(format!(
            "storageReserved must be 0 or more bytes, not {bytes}"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_names_are_dns_labels() {
        for ok in ["default-disk", "ssd1", "a", &"x".repeat(63)] {
            assert!(check_disk_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Disk", "ssd.1", "-a", "a/b", "..", &"x".repeat(64)] {
            assert_eq!(check_disk_name(bad).unwrap_err().code(), "invalid", "{bad}");
        }
    }

    #[test]
    fn disk_paths_are_absolute_and_stay_where_they_say() {
        for ok in ["/var/lib/oxhorn", "/mnt/ssd1/", "/mnt/a..b"] {
            assert!(check_disk_path(ok).is_ok(), "{ok}");
        }
        let long = format!("/{}", "x".repeat(PATH_MAX));
        for bad in ["relative", "", "/mnt/../etc", "/mnt/..", "/mnt/a\0b", &long] {
            assert_eq!(check_disk_path(bad).unwrap_err().code(), "invalid", "{bad}");
        }
    }

    #[test]
    fn tags_are_sorted_without_repeats_and_checked() {
        let tags = |t: &[&str]| t.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            checked_tags(&tags(&["ssd", "fast", "ssd"])).unwrap(),
            tags(&["fast", "ssd"])
        );
        for bad in [
            tags(&[""]),
            tags(&["a b"]),
            tags(&["x/y"]),
            vec!["t".repeat(64)],
        ] {
            assert!(checked_tags(&bad).is_err(), "{bad:?}");
        }
        let many: Vec<String> = (0..=TAGS_MAX).map(|i| format!("t{i}")).collect();
        assert!(checked_tags(&many).is_err());
    }
}
