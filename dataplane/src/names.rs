//! Validation of names that become node ids, object names or path components.
//! Anything that reaches the filesystem or the API passes through here first.

/// Checks `value` is a DNS-1123 subdomain (what Kubernetes requires of object
/// and node names): 1-253 characters of `a-z`, `0-9`, `-` and `.`, starting and
/// ending with a letter or digit. `what` names the value in the error.
pub fn validate_dns_subdomain(what: &str, value: &str) -> Result<(), String> {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if value.is_empty() || value.len() > 253 {
        return Err(format!(
            "{what} must be 1 to 253 characters long, got {}",
            value.len()
        ));
    }
    if !value.chars().all(|c| alnum(c) || c == '-' || c == '.') {
        return Err(format!(
            "{what} {value:?} may contain only lowercase letters, digits, '-' and '.'"
        ));
    }
    let starts_and_ends_alnum = value.starts_with(alnum) && value.ends_with(alnum);
    if !starts_and_ends_alnum {
        return Err(format!(
            "{what} {value:?} must start and end with a letter or digit"
        ));
    }
    Ok(())
}

/// The object name for a name chosen elsewhere (a CSI volume or snapshot
/// name): the name itself when it is a lowercase DNS label of at most
/// `max_len` characters, else a readable prefix of it and a hash of the whole,
/// so that distinct names get distinct objects.
pub fn object_name(name: &str, max_len: usize) -> String {
    let label_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    let valid = validate_dns_subdomain("name", name).is_ok() && !name.contains('.');
    if valid && name.len() <= max_len {
        return name.to_owned();
    }
    let hash = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(name.as_bytes()));
    let prefix: String = name
        .to_ascii_lowercase()
        .chars()
        .map(|c| if label_char(c) { c } else { '-' })
        .take(max_len.saturating_sub(hash.len() + 1))
        .collect();
    let prefix = prefix.trim_matches('-');
    if prefix.is_empty() {
        hash
    } else {
        format!("{prefix}-{hash}")
    }
}

#[cfg(test)]
mod tests {
    use super::{object_name, validate_dns_subdomain};

    #[test]
    fn accepts_kubernetes_node_names() {
        for ok in ["node1", "worker-2.example.com", "a", &"x".repeat(253)] {
            assert_eq!(validate_dns_subdomain("node id", ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn rejects_what_could_escape_a_directory_or_the_api() {
        for bad in [
            "",
            "../etc",
            "a/b",
            "Node1",
            "-a",
            "a-",
            ".",
            "..",
            "a b",
            &"x".repeat(254),
        ] {
            let err = validate_dns_subdomain("node id", bad).expect_err(bad);
            assert!(err.starts_with("node id"), "{err}");
        }
    }

    #[test]
    fn object_names_keep_valid_names_and_hash_the_others() {
        assert_eq!(object_name("pvc-1234", 63), "pvc-1234");
        let upper = object_name("sanity-vol-7B3E0A1C-1F2E3D4C", 63);
        assert!(
            upper.starts_with("sanity-vol-7b3e0a1c-1f2e3d4c-"),
            "{upper}"
        );
        assert_ne!(upper, object_name("sanity-vol-7b3e0a1c-1f2e3d4c-x", 63));
        let long = object_name(&"a".repeat(100), 40);
        assert!(long.len() <= 40, "{long}");
        for name in [upper, long, object_name("..//", 63), object_name("A.B", 63)] {
            assert_eq!(validate_dns_subdomain("name", &name), Ok(()), "{name}");
            assert!(!name.contains('.'), "{name}");
        }
    }
}
