//! Test hosts in network namespaces, for partitions that are real: a
//! [`Network`] is a bridge in the root namespace with a private /24 out of
//! 10.250.0.0/16, and each [`Host`] a network namespace with a veth on that
//! bridge, an address of the /24 and loopback up; [`Network::connect`] puts
//! a host on more networks (`eth1`, ...), each cut off on its own. The test process, in the
//! root namespace, reaches every host over the bridge, and the hosts reach
//! each other; the hosts have no other route, and the /24 has a blackhole
//! route under the bridge's, so nothing sent to it ever leaves the machine,
//! even while a network is being taken down.
//!
//! [`Host::partition`] disables the host's port on the bridge (as a switch
//! port that stops forwarding): every frame to or from the host vanishes,
//! with no RST, no ICMP error and no change of link state on either side.
//! [`Host::heal`] lets the port forward again.
//!
//! Everything is made with iproute2's `ip` and named after the test process:
//! namespaces `oxp-<pid>-<n>`, links `oxp<pid>b<n>` (bridges) and
//! `oxp<pid>v<n>` (the root side of a host's veth; the host side is
//! `eth<i>` in its namespace), blackhole routes with metric `<pid>`. Dropping a
//! [`Host`] or the last handle on a [`Network`] removes what it made, also
//! while a failed test unwinds; a crashed process's leftovers (its pid no
//! longer running) are removed when the next network is created.

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::process::run;
use crate::{Error, Result};

/// Prefix of every name made here.
const PREFIX: &str = "oxp";
/// The /16 the networks' /24s come from.
const RANGE: [u8; 2] = [10, 250];
/// Held while sweeping leftovers and choosing a /24, so that two test
/// processes never pick the same one.
const LOCK: &str = "/run/oxhorn-testbed-netns.lock";
/// Linux's limit on interface names (IFNAMSIZ - 1).
const MAX_LINK_NAME: usize = 15;

/// A bridge with a private /24, in the root network namespace. Cheap to
/// clone; the bridge and its route go when the network and every host on it
/// are dropped.
#[derive(Clone)]
pub struct Network {
    inner: Arc<Inner>,
}

struct Inner {
    bridge: String,
    /// The third octet of 10.250.x.0/24.
    subnet: u8,
    /// Whether the blackhole route was added (it is removed last).
    guarded: bool,
    /// The last octet of the next host's address.
    next_host: AtomicU32,
}

impl Network {
    /// Creates a bridge on a free 10.250.x.0/24, with 10.250.x.1 for the
    /// root namespace. Removes first what crashed test processes left.
    pub fn create() -> Result<Self> {
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK)
            .map_err(|e| Error::io(LOCK, e))?;
        lock.lock().map_err(|e| Error::io(LOCK, e))?;
        sweep_stale()?;
        let subnet = free_subnet()?;
        let pid = std::process::id();
        let mut inner = Inner {
            bridge: link_name('b')?,
            subnet,
            guarded: false,
            next_host: AtomicU32::new(2),
        };
        let cidr = inner.cidr();
        ip(&[
            "route",
            "add",
            "blackhole",
            &cidr,
            "metric",
            &pid.to_string(),
        ])?;
        inner.guarded = true;
        let network = Self {
            inner: Arc::new(inner),
        };
        let bridge = &network.inner.bridge;
        ip(&["link", "add", bridge, "type", "bridge"])?;
        drop(lock);
        let gateway = format!("{}/24", network.gateway());
        ip(&["addr", "add", &gateway, "dev", bridge])?;
        ip(&["link", "set", bridge, "up"])?;
        network.check_route(network.gateway())?;
        Ok(network)
    }

    /// The root namespace's address on the bridge.
    pub fn gateway(&self) -> Ipv4Addr {
        self.inner.address(1)
    }

    pub fn bridge(&self) -> &str {
        &self.inner.bridge
    }

    /// Adds a host: a namespace with `eth0` on the bridge at the next free
    /// address of the /24, and loopback up.
    pub fn add_host(&self) -> Result<Host> {
        let namespace = format!("{PREFIX}-{}-{}", std::process::id(), next_id());
        ip(&["netns", "add", &namespace])?;
        let mut host = Host {
            namespace,
            ports: Vec::new(),
        };
        // From here on, dropping `host` removes what was made.
        self.connect(&mut host)?;
        ip(&["-n", host.namespace(), "link", "set", "lo", "up"])?;
        Ok(host)
    }

    /// Gives `host` one more interface, `eth<n>`, on this network's bridge,
    /// at the next free address of the /24: a second network (say, one to
    /// the API server alone) can then be cut off while the first still
    /// carries traffic.
    pub fn connect(&self, host: &mut Host) -> Result<Ipv4Addr> {
        let index = self.inner.next_host.fetch_add(1, Ordering::Relaxed);
        let index = u8::try_from(index)
            .ok()
            .filter(|&i| i < u8::MAX)
            .ok_or_else(|| Error::Failed("no address left on the test network".into()))?;
        let address = self.inner.address(index);
        let inside = format!("eth{}", host.ports.len());
        let port = Port {
            link: link_name('v')?,
            address,
            network: self.clone(),
        };
        let (ns, link) = (host.namespace.clone(), port.link.clone());
        host.ports.push(port);
        ip(&[
            "link", "add", &link, "type", "veth", "peer", "name", &inside, "netns", &ns,
        ])?;
        ip(&["link", "set", &link, "master", self.bridge(), "up"])?;
        let cidr = format!("{address}/24");
        ip(&["-n", &ns, "addr", "add", &cidr, "dev", &inside])?;
        ip(&["-n", &ns, "link", "set", &inside, "up"])?;
        self.check_route(address)?;
        Ok(address)
    }

    /// Fails unless the root namespace routes `address` to the bridge.
    fn check_route(&self, address: Ipv4Addr) -> Result<()> {
        let route = ip(&["route", "get", &address.to_string()])?;
        let device = format!(" dev {} ", self.bridge());
        let local = route.starts_with("local ");
        if !local && !route.contains(&device) {
            return Err(Error::Failed(format!(
                "{address} is not routed to {}: {route}",
                self.bridge()
            )));
        }
        Ok(())
    }
}

impl Inner {
    fn address(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(RANGE[0], RANGE[1], self.subnet, host)
    }

    fn cidr(&self) -> String {
        format!("{}/24", self.address(0))
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // While the bridge is there (if it could not be removed), so stays
        // the blackhole under its route.
        if remove_link(&self.bridge) && self.guarded {
            let metric = std::process::id().to_string();
            let cidr = self.cidr();
            if let Err(error) = ip(&["route", "del", "blackhole", &cidr, "metric", &metric]) {
                eprintln!("removing the blackhole route of {cidr}: {error}");
            }
        }
    }
}

/// A network namespace with an interface on one [`Network`]'s bridge, and
/// maybe on more (see [`Network::connect`]).
pub struct Host {
    namespace: String,
    /// Its ports, `eth0` first; each keeps its network's bridge.
    ports: Vec<Port>,
}

impl Host {
    /// The host's address on its first network.
    pub fn address(&self) -> Ipv4Addr {
        self.first().address
    }

    /// The namespace's name, for `ip netns exec` and `ip -n`.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The file that holds the namespace, for [`enter`].
    pub fn namespace_path(&self) -> PathBuf {
        namespace_path(&self.namespace)
    }

    /// The network the host was added to.
    pub fn network(&self) -> &Network {
        &self.first().network
    }

    /// Makes `command` run in this host's network namespace.
    pub fn enter(&self, command: &mut Command) -> Result<()> {
        enter(&self.namespace_path(), command)
    }

    /// Cuts the host off its first network: its bridge port stops
    /// forwarding, and every frame to or from it vanishes.
    pub fn partition(&self) -> Result<()> {
        self.first().set_state(PortState::Disabled)
    }

    /// Lets the host's port on its first network forward again.
    pub fn heal(&self) -> Result<()> {
        self.first().set_state(PortState::Forwarding)
    }

    /// Whether the host is cut off its first network now.
    pub fn is_partitioned(&self) -> Result<bool> {
        self.first().is_disabled()
    }

    /// Like [`Host::partition`], on `network` only.
    pub fn partition_from(&self, network: &Network) -> Result<()> {
        self.port_on(network)?.set_state(PortState::Disabled)
    }

    /// Like [`Host::heal`], on `network` only.
    pub fn heal_to(&self, network: &Network) -> Result<()> {
        self.port_on(network)?.set_state(PortState::Forwarding)
    }

    fn first(&self) -> &Port {
        // Invariant: `Network::add_host` returns a host only once its first
        // port is made.
        &self.ports[0]
    }

    fn port_on(&self, network: &Network) -> Result<&Port> {
        self.ports
            .iter()
            .find(|p| Arc::ptr_eq(&p.network.inner, &network.inner))
            .ok_or_else(|| Error::Failed(format!("host {} is not on that network", self.namespace)))
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // Deleting the veths cuts the host off at once, even while processes
        // still run in (and so keep) its namespace.
        for port in &self.ports {
            remove_link(&port.link);
        }
        if let Err(error) = ip(&["netns", "del", &self.namespace]) {
            eprintln!("removing network namespace {}: {error}", self.namespace);
        }
    }
}

/// A host's interface on a network: the root side of its veth is a port of
/// the network's bridge.
struct Port {
    link: String,
    address: Ipv4Addr,
    /// Keeps the bridge and its route while the host exists.
    network: Network,
}

impl Port {
    fn is_disabled(&self) -> Result<bool> {
        let details = ip(&["-d", "link", "show", "dev", &self.link])?;
        let forwarding = format!(" state {} ", PortState::Forwarding.name());
        Ok(!details.contains(&forwarding))
    }

    fn set_state(&self, state: PortState) -> Result<()> {
        let number = (state as u8).to_string();
        // `ip link set ... type bridge_slave state` is accepted and ignored
        // by some kernels; `bridge link set` is not, and the state is read
        // back to be sure.
        run(
            "bridge",
            &["link", "set", "dev", &self.link, "state", &number],
        )?;
        let details = ip(&["-d", "link", "show", "dev", &self.link])?;
        let expected = format!(" state {} ", state.name());
        if !details.contains(&expected) {
            return Err(Error::Failed(format!(
                "bridge port {} did not become {}: {details}",
                self.link,
                state.name()
            )));
        }
        Ok(())
    }
}

/// Bridge port states (the kernel's BR_STATE_*).
#[derive(Clone, Copy)]
enum PortState {
    Disabled = 0,
    Forwarding = 3,
}

impl PortState {
    /// As `ip -d link show` says it.
    fn name(self) -> &'static str {
        match self {
            PortState::Disabled => "disabled",
            PortState::Forwarding => "forwarding",
        }
    }
}

/// Makes `command` join the network namespace held by `path` (a file under
/// /run/netns) before it executes; the namespace is opened now.
pub fn enter(path: &Path, command: &mut Command) -> Result<()> {
    let namespace = File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: setns is a plain system call, async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            if nix::libc::setns(namespace.as_raw_fd(), nix::libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

fn namespace_path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

/// A number unique in this process, for names.
fn next_id() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// `oxp<pid><kind><n>`, a fresh link name.
fn link_name(kind: char) -> Result<String> {
    let name = format!("{PREFIX}{}{kind}{}", std::process::id(), next_id());
    if name.len() > MAX_LINK_NAME {
        return Err(Error::Failed(format!("link name {name} is too long")));
    }
    Ok(name)
}

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// Deletes link `name`, saying why if it is still there; true once it is gone.
fn remove_link(name: &str) -> bool {
    match ip(&["link", "del", name]) {
        Ok(_) => true,
        Err(_) if !link_exists(name) => true,
        Err(error) => {
            eprintln!("removing test link {name}: {error}");
            false
        }
    }
}

/// Runs `ip` with `args`; its output, or an error with what it said.
fn ip(args: &[&str]) -> Result<String> {
    run("ip", args)
}

/// The pid a name made here by another process carries, if the name is
/// one of ours: `oxp-<pid>-<n>` (namespaces) or `oxp<pid>b<n>` /
/// `oxp<pid>v<n>` (links).
fn owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let (pid, n) = match rest.strip_prefix('-') {
        Some(rest) => rest.split_once('-')?,
        None => {
            let at = rest.find(['b', 'v'])?;
            (&rest[..at], &rest[at + 1..])
        }
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if digits(pid) && digits(n) {
        pid.parse().ok()
    } else {
        None
    }
}

fn is_dead(pid: u32) -> bool {
    !Path::new("/proc").join(pid.to_string()).exists()
}

/// Removes the namespaces, links and blackhole routes of test processes
/// that are no longer running; what cannot be removed is reported and left.
fn sweep_stale() -> Result<()> {
    let stale = |name: &str| owner(name).is_some_and(is_dead);
    for line in ip(&["netns", "list"])?.lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        if stale(name) {
            eprintln!("removing network namespace {name} of a test process that is gone");
            if let Err(error) = ip(&["netns", "del", name]) {
                eprintln!("{error}");
            }
        }
    }
    for line in ip(&["-o", "link", "show"])?.lines() {
        // "6: oxp123v4@if2: <BROADCAST,..."
        let Some(name) = line.split_whitespace().nth(1) else {
            continue;
        };
        let name = name.trim_end_matches(':');
        let name = name.split('@').next().unwrap_or(name);
        // A veth may go with its namespace, removed just above.
        if stale(name) && link_exists(name) {
            eprintln!("removing link {name} of a test process that is gone");
            remove_link(name);
        }
    }
    for line in ip(&["-4", "route", "show", "type", "blackhole"])?.lines() {
        // "blackhole 10.250.7.0/24 metric 1234"
        let words: Vec<&str> = line.split_whitespace().collect();
        let (Some(cidr), Some(metric)) = (
            words.get(1),
            words
                .iter()
                .position(|w| *w == "metric")
                .and_then(|i| words.get(i + 1)),
        ) else {
            continue;
        };
        let ours =
            cidr.starts_with(&format!("{}.{}.", RANGE[0], RANGE[1])) && cidr.ends_with("/24");
        if let (true, Ok(pid)) = (ours, metric.parse::<u32>())
            && is_dead(pid)
        {
            eprintln!("removing blackhole route {cidr} of a test process that is gone");
            if let Err(error) = ip(&["route", "del", "blackhole", cidr, "metric", metric]) {
                eprintln!("{error}");
            }
        }
    }
    Ok(())
}

/// A /24 of 10.250.0.0/16 that no route of the machine overlaps, in any
/// table: starting from one derived from the pid, so that test processes
/// running at once rarely look at the same ones.
fn free_subnet() -> Result<u8> {
    let routes = ip(&["-4", "-o", "route", "show", "table", "all"])?;
    let taken: Vec<(u32, u32)> = routes.lines().filter_map(route_prefix).collect();
    let start = (std::process::id() % 256) as u8;
    (0..=255u8)
        .map(|i| start.wrapping_add(i))
        .find(|&subnet| {
            let ours = u32::from(Ipv4Addr::new(RANGE[0], RANGE[1], subnet, 0));
            let mask = u32::MAX << 8;
            taken.iter().all(|&(network, their_mask)| {
                // Two prefixes overlap when they agree under the shorter mask.
                let shorter = mask & their_mask;
                network & shorter != ours & shorter
            })
        })
        .ok_or_else(|| Error::Failed("no free /24 in 10.250.0.0/16".into()))
}

/// (network, mask) of a route's destination; `None` for the default route
/// (which covers everything and is not a conflict) and unparsable lines.
fn route_prefix(line: &str) -> Option<(u32, u32)> {
    const TYPES: [&str; 10] = [
        "unicast",
        "local",
        "broadcast",
        "multicast",
        "blackhole",
        "unreachable",
        "prohibit",
        "throw",
        "nat",
        "anycast",
    ];
    let mut words = line.split_whitespace();
    let mut destination = words.next()?;
    if TYPES.contains(&destination) {
        destination = words.next()?;
    }
    let (address, length) = match destination.split_once('/') {
        Some((address, length)) => (address, length.parse::<u32>().ok()?),
        None => (destination, 32),
    };
    let address: Ipv4Addr = address.parse().ok()?;
    let mask = u32::MAX.checked_shl(32 - length).unwrap_or(0);
    (length > 0).then_some((u32::from(address) & mask, mask))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_their_owner() {
        assert_eq!(owner("oxp-1234-7"), Some(1234));
        assert_eq!(owner("oxp1234b0"), Some(1234));
        assert_eq!(owner("oxp1234v12"), Some(1234));
        assert_eq!(owner("oxp1234x12"), None);
        assert_eq!(owner("oxp-12a-7"), None);
        assert_eq!(owner("eth0"), None);
        assert_eq!(owner("oxpv1"), None);
    }

    #[test]
    fn route_destinations_parse() {
        let ten = u32::from(Ipv4Addr::new(10, 0, 0, 0));
        assert_eq!(
            route_prefix("10.0.0.0/8 dev eth1 proto kernel"),
            Some((ten, 0xff00_0000))
        );
        assert_eq!(
            route_prefix("local 192.0.2.2 dev eth0 table local"),
            Some((u32::from(Ipv4Addr::new(192, 0, 2, 2)), u32::MAX))
        );
        assert_eq!(route_prefix("default via 192.0.2.1 dev eth0"), None);
    }
}
