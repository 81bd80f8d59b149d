//! Handing out ports to instances: the lowest free run of ports in the
//! configured range.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::ops::RangeInclusive;

/// The first port of the lowest run of `width` consecutive ports in `range`
/// that no known instance holds (`held`) and that can be bound on `ip` now.
/// Binding is only a hint (another program may take the port before the
/// instance binds it: the instance then fails and is restarted), but it skips
/// ports some other program already listens on.
pub(super) fn allocate(
    ip: IpAddr,
    range: &RangeInclusive<u16>,
    width: u16,
    held: &HashSet<u16>,
) -> Option<u16> {
    let last_first = range.end().checked_sub(width.checked_sub(1)?)?;
    // Port 0 means "any port" to bind(2): never hand it out.
    let first = (*range.start()).max(1);
    (first..=last_first).find(|&port| (port..=port + (width - 1)).all(|p| is_free(ip, p, held)))
}

fn is_free(ip: IpAddr, port: u16, held: &HashSet<u16>) -> bool {
    !held.contains(&port) && TcpListener::bind(SocketAddr::new(ip, port)).is_ok()
}

/// Parses `FIRST-LAST`, a range of at least two ports (a replica takes
/// two), for the command lines that hand ports out.
pub fn parse_port_range(value: &str) -> Result<std::ops::RangeInclusive<u16>, String> {
    let (first, last) = value
        .split_once('-')
        .ok_or_else(|| format!("{value:?} is not FIRST-LAST"))?;
    let port = |p: &str| p.trim().parse::<u16>().map_err(|e| format!("{p:?}: {e}"));
    let (first, last) = (port(first)?, port(last)?);
    if first == 0 || last < first.saturating_add(1) {
        return Err(format!("{value:?} must hold at least two ports, from 1 up"));
    }
    Ok(first..=last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 213, 1));

    /// A range of ports nothing else on this address listens on.
    fn range() -> RangeInclusive<u16> {
        let first = 43000;
        first..=first + 9
    }

    #[test]
    fn skips_held_and_bound_ports_and_runs_out() {
        let range = range();
        let first = *range.start();
        let mut held = HashSet::new();
        assert_eq!(allocate(IP, &range, 2, &held), Some(first));
        held.insert(first + 1);
        assert_eq!(allocate(IP, &range, 2, &held), Some(first + 2));
        assert_eq!(allocate(IP, &range, 1, &held), Some(first));

        let _foreign = TcpListener::bind(SocketAddr::new(IP, first + 2)).expect("bind");
        assert_eq!(allocate(IP, &range, 2, &held), Some(first + 3));

        let all: HashSet<u16> = range.clone().collect();
        assert_eq!(allocate(IP, &range, 1, &all), None);
        assert_eq!(allocate(IP, &(first..=first), 2, &held), None);
        assert_eq!(allocate(IP, &range, 0, &held), None);
    }
}
