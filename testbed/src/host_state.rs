//! What a real kubelet and containerd change on the host outside the
//! directories they are given, put back when the last node of this process
//! stops, and at the next start if a crashed run could not.
//!
//! The kubelet sets three sysctls (`kernel.panic`, `kernel.panic_on_oops`,
//! `vm.overcommit_memory`) and creates fixed paths (its device-plugin socket
//! under `/var/lib/kubelet`, `/var/log/containers`); containerd's shims keep
//! their sockets under `/run/containerd`. Their original values, and which
//! paths did not exist, are written to a record before the first node starts;
//! the record is removed once everything is restored.
//!
//! The nodes' pods reach the API server as in a real cluster, at the
//! `kubernetes` Service's address: that address is put on the loopback
//! device while nodes run (a relay of the nodes' listens there, see
//! [`crate::KubeletNode`]), and the pods' network gets a route to it only.
//! The pods' bridge is made here, before any node starts, with the pods'
//! gateway address and IPv4 forwarding off on it: what arrives from a pod is
//! delivered to the host or dropped, never forwarded, whatever
//! `net.ipv4.ip_forward` is (only writing it would reset the bridge's own
//! switch, and nothing here does), so nothing a pod sends can leave the
//! machine, even with the Service's address gone. CNI's bridge plugin then
//! only attaches pods (it is no gateway, so it leaves `ip_forward` alone).
//! The bridge goes before that address does, and the pods' address
//! reservations with it.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::controlplane::KUBERNETES_SERVICE;
use crate::process::run;
use crate::{Error, Result};

const SYSCTLS: [&str; 3] = [
    "kernel.panic",
    "kernel.panic_on_oops",
    "vm.overcommit_memory",
];
const FIXED_PATHS: [&str; 3] = ["/var/lib/kubelet", "/var/log/containers", "/run/containerd"];
const RECORD: &str = "/run/oxhorn-testbed/host-state";
/// The bridge of the pods' CNI network; its name is the test bed's own.
pub(crate) const POD_BRIDGE: &str = "oxt-cni0";
/// The pods' network, and the bridge's address in it: the gateway of the
/// pods' one route.
pub(crate) const POD_SUBNET: &str = "10.251.0.0/24";
pub(crate) const POD_GATEWAY: &str = "10.251.0.1";
const POD_GATEWAY_PREFIX: &str = "10.251.0.1/24";
/// Where the nodes' CNI keeps its pods' addresses: one directory for all
/// nodes, which share the bridge, so that no two pods get one address.
pub(crate) const POD_IPAM_DIR: &str = "/run/oxhorn-testbed/cni-ipam";
/// The device that carries the kubernetes Service's address.
const SERVICE_DEVICE: &str = "lo";

/// Nodes of this process running now.
static RUNNING: Mutex<usize> = Mutex::new(0);

fn sysctl_path(name: &str) -> PathBuf {
    Path::new("/proc/sys").join(name.replace('.', "/"))
}

/// The record of what to put back: `sysctl NAME VALUE` and `created PATH`
/// lines.
fn write_record() -> Result<()> {
    let mut text = String::new();
    for name in SYSCTLS {
        let path = sysctl_path(name);
        let value = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        text.push_str(&format!("sysctl {name} {}\n", value.trim()));
    }
    for path in FIXED_PATHS {
        if !Path::new(path).exists() {
            text.push_str(&format!("created {path}\n"));
        }
    }
    if !has_service_address()? {
        text.push_str(&format!("address {}\n", service_address()));
    }
    let record = Path::new(RECORD);
    if let Some(dir) = record.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    std::fs::write(record, text).map_err(|e| Error::io(record, e))
}

/// Puts back what the record says and removes it. Best effort, never
/// panics: also runs while unwinding.
fn restore() {
    let Ok(text) = std::fs::read_to_string(RECORD) else {
        return;
    };
    // First the bridge: while the Service's address is on the host, what a
    // pod still sends to it is delivered there, not routed on.
    let _ = run("ip", &["link", "del", POD_BRIDGE]);
    let _ = std::fs::remove_dir_all(POD_IPAM_DIR);
    for line in text.lines() {
        let mut words = line.splitn(3, ' ');
        match (words.next(), words.next(), words.next()) {
            (Some("sysctl"), Some(name), Some(value)) if SYSCTLS.contains(&name) => {
                let _ = std::fs::write(sysctl_path(name), value);
            }
            (Some("created"), Some(path), None) if FIXED_PATHS.contains(&path) => {
                let _ = std::fs::remove_dir_all(path);
            }
            (Some("address"), Some(address), None) if address == service_address() => {
                let _ = run("ip", &["addr", "del", address, "dev", SERVICE_DEVICE]);
            }
            _ => tracing::warn!(line, "unknown line in {RECORD}"),
        }
    }
    let _ = std::fs::remove_file(RECORD);
}

/// The kubernetes Service's address, as a host address.
fn service_address() -> String {
    format!("{}/32", KUBERNETES_SERVICE.ip())
}

/// Whether `device` has the IPv4 `address` (with its prefix length).
fn has_address(device: &str, address: &str) -> Result<bool> {
    let shown = run("ip", &["-o", "-4", "addr", "show", "dev", device])?;
    Ok(shown.contains(&format!(" {address} ")))
}

fn has_service_address() -> Result<bool> {
    has_address(SERVICE_DEVICE, &service_address())
}

/// Puts the kubernetes Service's address on the host, if not there yet.
fn add_service_address() -> Result<()> {
    if !has_service_address()? {
        run(
            "ip",
            &["addr", "add", &service_address(), "dev", SERVICE_DEVICE],
        )?;
    }
    Ok(())
}

/// Makes the pods' bridge, if not there yet, with the gateway address and
/// forwarding off (before it is up, and before any pod is on it): packets
/// that come in on it are only ever delivered locally.
fn add_pod_bridge() -> Result<()> {
    let device = Path::new("/sys/class/net").join(POD_BRIDGE);
    if !device.exists() {
        run("ip", &["link", "add", POD_BRIDGE, "type", "bridge"])?;
    } else if !device.join("bridge").exists() {
        return Err(Error::Failed(format!(
            "{POD_BRIDGE} exists and is no bridge"
        )));
    }
    if !has_address(POD_BRIDGE, POD_GATEWAY_PREFIX)? {
        run(
            "ip",
            &["addr", "add", POD_GATEWAY_PREFIX, "dev", POD_BRIDGE],
        )?;
    }
    let forwarding = Path::new("/proc/sys/net/ipv4/conf")
        .join(POD_BRIDGE)
        .join("forwarding");
    std::fs::write(&forwarding, "0").map_err(|e| Error::io(&forwarding, e))?;
    run("ip", &["link", "set", POD_BRIDGE, "up"])?;
    Ok(())
}

/// Held by each running node; the last one dropped restores the host.
pub(crate) struct HostChanges {
    first: bool,
}

impl HostChanges {
    /// Before a node starts: the first node of this process restores what
    /// a crashed run left (its record holds the true originals) and
    /// records the host as it is.
    pub(crate) fn begin() -> Result<Self> {
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        let first = *running == 0;
        if first {
            restore();
            // Half made: put back now, not at the next start.
            let made = write_record()
                .and_then(|()| add_service_address())
                .and_then(|()| add_pod_bridge());
            if let Err(e) = made {
                restore();
                return Err(e);
            }
        }
        *running += 1;
        Ok(Self { first })
    }

    /// Whether no other node of this process runs: the time to sweep what
    /// a crashed run left.
    pub(crate) fn first(&self) -> bool {
        self.first
    }
}

impl Drop for HostChanges {
    fn drop(&mut self) {
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        *running -= 1;
        if *running == 0 {
            restore();
        }
    }
}
