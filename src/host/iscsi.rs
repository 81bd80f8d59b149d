//! The node's iSCSI initiator: open-iscsi's iscsiadm, run on the host (in
//! its namespaces, where iscsid and udev live), logs into a volume's target,
//! and the disk the kernel makes of the LUN is found by its stable by-path
//! name. Every value is validated before it reaches iscsiadm's argv.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::{Instant, sleep};
use tracing::{debug, info};

use super::{Host, HostError, Result};
use crate::frontend::iscsi::IQN_PREFIX;
use crate::frontend::iscsi::chap::ChapSecrets;

const ISCSIADM: &str = "iscsiadm";
/// Where udev names SCSI disks by how they are reached.
const BY_PATH_DIR: &str = "/dev/disk/by-path";
/// Present when the kernel has the iSCSI over TCP initiator loaded.
const TRANSPORT_MODULE: &str = "/sys/module/iscsi_tcp";
/// Login returns once the session is up; the SCSI scan and udev follow.
const DEVICE_WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);
/// RFC 7143 §4.2.7.1: an iSCSI name is at most 223 bytes.
const MAX_NAME_LEN: usize = 223;
/// udev spells LUNs below 256 as `lun-<n>` and larger ones otherwise.
const MAX_LUN: u16 = 255;

/// iscsiadm's exit statuses that are answers (open-iscsi's iscsi_err.h).
const ERR_SESS_EXISTS: i32 = 15;
const ERR_NO_OBJS_FOUND: i32 = 21;

/// The target name of a volume's iSCSI frontend.
pub fn target_name(volume: &str) -> String {
    format!("{IQN_PREFIX}{volume}")
}

/// Runs a host program and returns its output whatever its exit status.
/// A trait so that tests can script iscsiadm's answers.
pub trait HostCommands: Send + Sync {
    fn output<'a>(&'a self, program: &'a str, args: &'a [String]) -> BoxFuture<'a, Result<Output>>;
}

impl HostCommands for Host {
    fn output<'a>(&'a self, program: &'a str, args: &'a [String]) -> BoxFuture<'a, Result<Output>> {
        Box::pin(Host::output(self, program, args))
    }
}

impl<T: HostCommands + ?Sized> HostCommands for Arc<T> {
    fn output<'a>(&'a self, program: &'a str, args: &'a [String]) -> BoxFuture<'a, Result<Output>> {
        (**self).output(program, args)
    }
}

/// Attaches and detaches iSCSI targets on the host with iscsiadm.
pub struct Initiator<R> {
    runner: R,
    by_path_dir: PathBuf,
    transport_module: PathBuf,
    device_wait: Duration,
}

impl<R: HostCommands> Initiator<R> {
    pub fn new(runner: R) -> Self {
        Self {
            runner,
            by_path_dir: PathBuf::from(BY_PATH_DIR),
            transport_module: PathBuf::from(TRANSPORT_MODULE),
            device_wait: DEVICE_WAIT,
        }
    }

    pub fn with_by_path_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.by_path_dir = dir.into();
        self
    }

    pub fn with_transport_module(mut self, path: impl Into<PathBuf>) -> Self {
        self.transport_module = path.into();
        self
    }

    pub fn with_device_wait(mut self, wait: Duration) -> Self {
        self.device_wait = wait;
        self
    }

    /// Whether this host can attach over iSCSI; the reason when not.
    pub async fn available(&self) -> Result<(), String> {
        let version = ["--version".to_owned()];
        match self.runner.output(ISCSIADM, &version).await {
            Ok(output) if output.status.success() => {}
            Ok(output) => {
                return Err(format!(
                    "iscsiadm --version failed ({}): {}",
                    output.status,
                    message_of(&output)
                ));
            }
            Err(e @ HostError::MissingProgram { .. }) => {
                return Err(format!("{e}; install open-iscsi on the node"));
            }
            Err(e) => return Err(format!("iscsiadm cannot run: {e}")),
        }
        match self.transport_module.try_exists() {
            Ok(true) => Ok(()),
            Ok(false) => Err(format!(
                "the kernel has no iSCSI initiator: {} is missing (modprobe iscsi_tcp)",
                self.transport_module.display()
            )),
            Err(e) => Err(format!(
                "cannot check {}: {e}",
                self.transport_module.display()
            )),
        }
    }

    /// Logs into `iqn` at `portal` (reusing a session that exists), proving
    /// `chap`'s credentials if given, and returns the by-path name of the
    /// LUN's disk once it appears. If it does not, the session stays, so
    /// that a retry finds it.
    pub async fn attach(
        &self,
        portal: SocketAddr,
        iqn: &str,
        lun: u16,
        chap: Option<&ChapSecrets>,
    ) -> Result<PathBuf> {
        validate_iqn(iqn)?;
        validate_portal(portal)?;
        if lun > MAX_LUN {
            return Err(invalid(
                "LUN",
                lun.to_string(),
                "LUNs above 255 are not supported",
            ));
        }
        let portal_arg = portal.to_string();
        // Discovery creates the node record that login uses.
        let discovery = ["-m", "discovery", "-t", "sendtargets", "-p", &portal_arg];
        self.iscsiadm(&discovery, &[]).await?;
        self.set_authentication(&portal_arg, iqn, chap).await?;
        let login = ["-m", "node", "-T", iqn, "-p", &portal_arg, "--login"];
        match self.iscsiadm(&login, &[ERR_SESS_EXISTS]).await? {
            ERR_SESS_EXISTS => info!(iqn, %portal, "reusing the existing iSCSI session"),
            _ => info!(iqn, %portal, "logged in"),
        }
        self.wait_for_device(portal, iqn, lun).await
    }

    /// Sets how the node record's sessions authenticate: with `chap`'s
    /// credentials, or with none (also undoing an earlier CHAP setting).
    async fn set_authentication(
        &self,
        portal: &str,
        iqn: &str,
        chap: Option<&ChapSecrets>,
    ) -> Result<()> {
        let method = if chap.is_some() { "CHAP" } else { "None" };
        let mut settings = vec![("node.session.auth.authmethod", method)];
        if let Some(chap) = chap {
            let initiator = &chap.initiator;
            settings.push(("node.session.auth.username", &initiator.user));
            settings.push(("node.session.auth.password", &initiator.secret));
            if let Some(target) = &chap.target {
                settings.push(("node.session.auth.username_in", &target.user));
                settings.push(("node.session.auth.password_in", &target.secret));
            }
        }
        for (name, value) in settings {
            let update = [
                "-m", "node", "-T", iqn, "-p", portal, "-o", "update", "-n", name, "-v", value,
            ];
            self.iscsiadm(&update, &[]).await?;
        }
        Ok(())
    }

    /// Logs out of `iqn` and deletes its node record. Either may already be
    /// gone (an earlier call, or a crash between the two): that is success.
    pub async fn detach(&self, iqn: &str) -> Result<()> {
        validate_iqn(iqn)?;
        let logout = ["-m", "node", "-T", iqn, "--logout"];
        if self.iscsiadm(&logout, &[ERR_NO_OBJS_FOUND]).await? == ERR_NO_OBJS_FOUND {
            debug!(iqn, "no session to log out of");
        }
        // Without the record, a restarted iscsid cannot log in again on its own.
        let delete = ["-m", "node", "-T", iqn, "-o", "delete"];
        if self.iscsiadm(&delete, &[ERR_NO_OBJS_FOUND]).await? == ERR_NO_OBJS_FOUND {
            debug!(iqn, "no node record to delete");
        }
        info!(iqn, "iSCSI target detached");
        Ok(())
    }

    /// Has the kernel read the LUNs of `iqn`'s session again, so a grown
    /// volume shows its new size (the target also raises a capacity-changed
    /// unit attention, which not every kernel acts on).
    pub async fn rescan(&self, iqn: &str) -> Result<()> {
        validate_iqn(iqn)?;
        self.iscsiadm(&["-m", "node", "-T", iqn, "-R"], &[]).await?;
        info!(iqn, "iSCSI session rescanned");
        Ok(())
    }

    /// Whether `path` is a by-path name this initiator waits for, of `iqn`:
    /// how a device link made for an iSCSI disk is recognised later.
    pub fn is_disk_of(&self, path: &Path, iqn: &str) -> bool {
        path.parent() == Some(self.by_path_dir.as_path())
            && path
                .file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("ip-") && name_has_target(name, iqn))
    }

    /// Polls for the LUN's by-path name: udev makes it after the kernel's
    /// scan of the new session, which login does not wait for.
    async fn wait_for_device(&self, portal: SocketAddr, iqn: &str, lun: u16) -> Result<PathBuf> {
        let expected = self.by_path_dir.join(by_path_name(portal, iqn, lun));
        let deadline = Instant::now() + self.device_wait;
        loop {
            if let Some(found) = self.find_device(portal, &expected, iqn, lun) {
                debug!(iqn, device = %found.display(), "iSCSI disk found");
                return Ok(found);
            }
            if Instant::now() >= deadline {
                return Err(HostError::IscsiDeviceMissing {
                    iqn: iqn.to_owned(),
                    portal,
                    path: expected,
                    waited: self.device_wait,
                });
            }
            sleep(POLL).await;
        }
    }

    /// The disk's by-path name if it exists. The kernel's spelling of an
    /// IPv6 address is not ours, so for one any address with this port,
    /// target and LUN is taken (the target names one volume).
    fn find_device(
        &self,
        portal: SocketAddr,
        expected: &Path,
        iqn: &str,
        lun: u16,
    ) -> Option<PathBuf> {
        if expected.exists() {
            return Some(expected.to_path_buf());
        }
        if portal.is_ipv4() {
            return None;
        }
        let suffix = format!(":{}-iscsi-{iqn}-lun-{lun}", portal.port());
        std::fs::read_dir(&self.by_path_dir)
            .ok()?
            .filter_map(|entry| entry.ok())
            .map(|entry| entry.path())
            .find(|path| {
                path.file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.starts_with("ip-") && name.ends_with(&suffix))
                    && path.exists()
            })
    }

    /// Runs iscsiadm with `args`; returns its exit status if it is 0 or one
    /// of `answers`, else the error naming the status and iscsiadm's message.
    async fn iscsiadm(&self, args: &[&str], answers: &[i32]) -> Result<i32> {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let output = self.runner.output(ISCSIADM, &args).await?;
        match output.status.code() {
            Some(code) if code == 0 || answers.contains(&code) => Ok(code),
            code => Err(HostError::Iscsiadm {
                command: format!("{ISCSIADM} {}", super::command::shown(&args).join(" ")),
                status: output.status.to_string(),
                meaning: code.map_or("killed by a signal", meaning),
                stderr: message_of(&output),
            }),
        }
    }
}

/// udev's by-path name of a LUN reached over iSCSI (path_id's
/// `ip-<address>:<port>-iscsi-<target>-lun-<lun>`).
fn by_path_name(portal: SocketAddr, iqn: &str, lun: u16) -> String {
    format!("ip-{}:{}-iscsi-{iqn}-lun-{lun}", portal.ip(), portal.port())
}

/// Whether a by-path name is of `iqn` (any LUN): the iqn is followed by the
/// LUN, so a volume whose name extends another's is not taken for it.
fn name_has_target(name: &str, iqn: &str) -> bool {
    name.split_once(&format!("-iscsi-{iqn}-lun-"))
        .is_some_and(|(_, lun)| !lun.is_empty() && lun.bytes().all(|b| b.is_ascii_digit()))
}

fn validate_iqn(iqn: &str) -> Result<()> {
    let refuse = |reason| Err(invalid("target name", iqn.to_owned(), reason));
    let Some(volume) = iqn.strip_prefix(IQN_PREFIX) else {
        return refuse("not an oxhorn target (iqn.2026-01.io.oxhorn:<volume>)");
    };
    if volume.is_empty() {
        return refuse("the volume is missing after the prefix");
    }
    if iqn.len() > MAX_NAME_LEN {
        return refuse("longer than the 223 bytes an iSCSI name may have");
    }
    if !iqn
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b".:-".contains(&b))
    {
        return refuse("only a-z, 0-9, '.', ':' and '-' are allowed");
    }
    Ok(())
}

fn validate_portal(portal: SocketAddr) -> Result<()> {
    let reason = match portal.ip() {
        ip if ip.is_unspecified() => "the address is unspecified",
        IpAddr::V4(ip) if ip.is_broadcast() || ip.is_multicast() => "not a unicast address",
        IpAddr::V6(ip) if ip.is_multicast() => "not a unicast address",
        _ if portal.port() == 0 => "port 0",
        _ => return Ok(()),
    };
    Err(invalid("portal", portal.to_string(), reason))
}

fn invalid(what: &'static str, value: String, reason: &'static str) -> HostError {
    HostError::IscsiArgument {
        what,
        value,
        reason,
    }
}

/// iscsiadm reports errors on stderr; stdout if it said nothing there.
fn message_of(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    if stderr.is_empty() {
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    } else {
        stderr
    }
}

/// open-iscsi's name and meaning of an iscsiadm exit status.
fn meaning(code: i32) -> &'static str {
    match code {
        1 => "ISCSI_ERR: generic error",
        2 => "ISCSI_ERR_SESS_NOT_FOUND: no such session",
        3 => "ISCSI_ERR_NOMEM: out of memory",
        4 => "ISCSI_ERR_TRANS: transport error",
        5 => "ISCSI_ERR_LOGIN: login failed",
        6 => "ISCSI_ERR_IDBM: error in iscsiadm's record database",
        7 => "ISCSI_ERR_INVAL: invalid argument",
        8 => "ISCSI_ERR_TRANS_TIMEOUT: the connection to the target timed out",
        9 => "ISCSI_ERR_INTERNAL: iscsid internal error",
        10 => "ISCSI_ERR_LOGOUT: logout failed",
        11 => "ISCSI_ERR_PDU_TIMEOUT: the target did not answer in time",
        12 => "ISCSI_ERR_TRANS_NOT_FOUND: the iSCSI transport module is not loaded",
        13 => "ISCSI_ERR_ACCESS: permission denied",
        14 => "ISCSI_ERR_TRANS_CAPS: the transport does not support the operation",
        15 => "ISCSI_ERR_SESS_EXISTS: a session is already logged in",
        16 => "ISCSI_ERR_INVALID_MGMT_REQ: invalid request to iscsid",
        18 => "ISCSI_ERR_ISCSID_COMM_ERR: communication with iscsid failed",
        19 => "ISCSI_ERR_FATAL_LOGIN: the target refused the login",
        20 => "ISCSI_ERR_ISCSID_NOTCONN: iscsid is not running",
        21 => "ISCSI_ERR_NO_OBJS_FOUND: no matching records, targets or sessions",
        22 => "ISCSI_ERR_SYSFS_LOOKUP: sysfs lookup failed",
        23 => "ISCSI_ERR_HOST_NOT_FOUND: no such iSCSI host",
        24 => "ISCSI_ERR_LOGIN_AUTH_FAILED: login authentication failed",
        27 => "ISCSI_ERR_OP_NOT_SUPP: operation not supported",
        28 => "ISCSI_ERR_BUSY: device or resource busy",
        29 => "ISCSI_ERR_AGAIN: try again",
        _ => "see iscsiadm(8), EXIT STATUS",
    }
}

#[cfg(test)]
mod tests;
