//! The managers' coordination.k8s.io Leases: one per node, renewed by the
//! node's manager; an expired one makes that manager "missing".

/// The label every manager lease carries, and its value, so that the lease
/// cache holds only those.
pub const MANAGER_LEASE_LABEL: (&str, &str) = ("oxhorn.io/lease", "manager");

/// The label selector of the manager leases: [`MANAGER_LEASE_LABEL`].
pub const MANAGER_LEASE_SELECTOR: &str = "oxhorn.io/lease=manager";

/// The name of the lease a node's manager renews.
pub fn lease_name(node: &str) -> String {
    format!("oxhorn-manager-{node}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selector_selects_the_label() {
        let (key, value) = MANAGER_LEASE_LABEL;
        assert_eq!(MANAGER_LEASE_SELECTOR, format!("{key}={value}"));
    }
}
