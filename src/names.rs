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

#[cfg(test)]
mod tests {
    use super::validate_dns_subdomain;

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
}
