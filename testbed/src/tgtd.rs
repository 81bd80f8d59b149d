//! tgtd, the Linux SCSI target daemon (Debian `tgt`), serving plain files
//! over iSCSI on loopback: what the iSCSI conformance test and benchmark
//! compare oxhorn's own target with. Stopped, and its control socket
//! removed, when dropped.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::Supervised;
use crate::{Error, Result};

pub struct Tgtd {
    _process: Supervised,
    /// The control port number of `tgtadm -C`.
    control: String,
    /// The iSCSI portal, host:port.
    pub portal: String,
}

impl Tgtd {
    /// Starts tgtd in the foreground on a free loopback port, with its log
    /// in `dir`, and waits until it takes commands.
    pub fn start(dir: &Path) -> Result<Self> {
        let port = crate::controlplane::free_ports(1)?;
        let portal = format!("127.0.0.1:{port}");
        let control = port.to_string();
        let mut command = Command::new("tgtd");
        command.args(["-f", "-C", &control, "--iscsi", &format!("portal={portal}")]);
        let process = Supervised::spawn("tgtd", command, &dir.join("tgtd.log"))?;
        let tgtd = Self {
            _process: process,
            control,
            portal,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while tgtd.admin(&["--mode", "sys", "--op", "show"]).is_err() {
            if Instant::now() > deadline {
                return Err(Error::Failed("tgtd took no commands within 10 s".into()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(tgtd)
    }

    /// Serves `file` as LUN 1 of a new target `name` (target id `tid`) in
    /// blocks of `block_size` bytes, to any initiator; returns the LUN's
    /// URL.
    pub fn serve(&self, tid: u32, name: &str, file: &Path, block_size: u32) -> Result<String> {
        let tid = tid.to_string();
        let file = file.display().to_string();
        let block_size = block_size.to_string();
        let target = ["--lld", "iscsi", "--mode", "target", "--tid", &tid];
        self.admin(&[&target[..], &["--op", "new", "--targetname", name]].concat())?;
        self.admin(&[
            "--lld",
            "iscsi",
            "--mode",
            "logicalunit",
            "--op",
            "new",
            "--tid",
            &tid,
            "--lun",
            "1",
            "--backing-store",
            &file,
            "--blocksize",
            &block_size,
        ])?;
        self.admin(&[&target[..], &["--op", "bind", "--initiator-address", "ALL"]].concat())?;
        Ok(format!("iscsi://{}/{name}/1", self.portal))
    }

    fn admin(&self, args: &[&str]) -> Result<()> {
        let output = Command::new("tgtadm")
            .args(["-C", &self.control])
            .args(args)
            .output()
            .map_err(|e| Error::io("tgtadm", e))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(Error::Failed(format!(
                "tgtadm {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr)
            )))
        }
    }
}

impl Drop for Tgtd {
    fn drop(&mut self) {
        // The process goes with `_process`; its control socket stays.
        let socket = format!("/var/run/tgtd/socket.{}", self.control);
        let _ = std::fs::remove_file(format!("{socket}.lock"));
        let _ = std::fs::remove_file(socket);
    }
}
