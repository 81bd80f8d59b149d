//! The main job, `hack/local-cluster.sh --hold`, as a user runs it
//! from a terminal: Ctrl-C goes to the whole foreground process group, and
//! the cluster must still come down in order (the claim deleted, and its
//! PV, volume and replicas gone, before the managers stop) and exit 0.

use std::io::{BufRead, BufReader};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tempfile::TempDir;

use crate::common::{OXHORN, require_root};

/// The example binary cargo builds beside this test binary.
fn local_cluster() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let example = profile.join("examples/local-cluster");
    assert!(
        example.exists(),
        "{} not built: run the tests with cargo test",
        example.display()
    );
    example
}

/// What the example leaves if it fails part way, released when the test
/// ends however it ends: its process group, the engine and replica
/// processes its managers started (in sessions of their own), and the
/// mounts and loop devices under its temp dir.
struct Leftovers {
    group: Pid,
    dir: TempDir,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        let _ = killpg(self.group, Signal::SIGKILL);
        kill_processes_naming(self.dir.path());
        oxhorn_testbed::release_under(self.dir.path());
    }
}

/// SIGKILLs every process whose command line names `dir`.
fn kill_processes_naming(dir: &Path) {
    let needle = dir.as_os_str().as_bytes();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if cmdline.windows(needle.len()).any(|w| w == needle) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

#[test]
fn ctrl_c_on_a_held_local_cluster_tears_it_down_in_order() {
    require_root();
    // Its temp dirs (nodes, kubelet) go under one the test removes.
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(local_cluster())
        .args(["--oxhorn", OXHORN, "--hold"])
        .env("TMPDIR", dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let group = Pid::from_raw(child.id() as i32);
    let _leftovers = Leftovers { group, dir };
    let (lines, seen) = mpsc::channel();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let reader = std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let stderr = child.stderr.take().unwrap();
    let errors = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());

    let mut output = Vec::new();
    let held = loop {
        match seen.recv_timeout(Duration::from_secs(300)) {
            Ok(line) => {
                let held = line.contains("Ctrl-C stops the cluster");
                output.push(line);
                if held {
                    break true;
                }
            }
            Err(_) => break false,
        }
    };
    if !held {
        let _ = killpg(group, Signal::SIGKILL);
        let _ = child.wait();
        panic!(
            "the cluster never held:\n{}\n{}",
            output.join("\n"),
            errors.join().unwrap()
        );
    }
    // What a terminal does on Ctrl-C.
    killpg(group, Signal::SIGINT).unwrap();
    let status = child.wait().unwrap();
    reader.join().unwrap();
    output.extend(seen.try_iter());
    let errors = errors.join().unwrap();
    assert!(
        status.success(),
        "exit {status}:\n{}\n{errors}",
        output.join("\n")
    );
    assert!(
        output
            .iter()
            .any(|l| l.contains("claim deleted: its PV, volume and replicas are gone")),
        "{}",
        output.join("\n")
    );
}
