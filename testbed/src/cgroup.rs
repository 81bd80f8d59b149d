//! The cgroup a test node's kubelet puts its pods under (its `cgroupRoot`),
//! one directory in each cgroup hierarchy, emptied and removed when the
//! node stops, and swept at the next start if a crashed run left it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::{Error, Result};

const CGROUPS: &str = "/sys/fs/cgroup";
/// Every test node's cgroup is named with this prefix.
pub(crate) const PREFIX: &str = "oxhorn-testbed-";

/// The hierarchies: every v1 one, and the unified one, where runc makes
/// its containers' cgroups too on a hybrid host.
fn hierarchies() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(CGROUPS) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("cgroup.procs").is_file())
        .collect()
}

/// Creates `name` in every hierarchy; cpuset's gets its parent's CPUs and
/// memory nodes, without which no task may join it.
pub(crate) fn create(name: &str) -> Result<()> {
    for hierarchy in hierarchies() {
        let dir = hierarchy.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let parent = hierarchy.join(file);
            if parent.is_file() {
                let value = std::fs::read_to_string(&parent).map_err(|e| Error::io(&parent, e))?;
                let own = dir.join(file);
                std::fs::write(&own, value.trim()).map_err(|e| Error::io(&own, e))?;
            }
        }
    }
    Ok(())
}

/// Every directory under `root`, deepest first.
fn tree(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            pending.extend(
                entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        out.push(dir);
    }
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out
}

fn processes(root: &Path) -> Vec<i32> {
    tree(root)
        .iter()
        .filter_map(|dir| std::fs::read_to_string(dir.join("cgroup.procs")).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// Kills every process in `name` (the node's containers) and removes it
/// from every hierarchy. Best effort, never panics: also runs while
/// unwinding.
pub(crate) fn remove(name: &str) {
    let roots: Vec<PathBuf> = hierarchies().iter().map(|h| h.join(name)).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<i32> = roots.iter().flat_map(|r| processes(r)).collect();
        if left.is_empty() || Instant::now() > deadline {
            break;
        }
        for pid in left {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for root in roots {
        for dir in tree(&root) {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Removes what crashed runs left: every test node's cgroup.
pub(crate) fn sweep() {
    let mut names: Vec<String> = hierarchies()
        .iter()
        .filter_map(|h| std::fs::read_dir(h).ok())
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(PREFIX))
        .collect();
    names.sort();
    names.dedup();
    for name in names {
        remove(&name);
    }
}
