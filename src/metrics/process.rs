//! A process's CPU time and resident memory, from /proc: the manager's own,
//! and its node's instance manager's (both run with the host's PID
//! namespace, so the instance manager's PID is visible).

use std::time::Duration;

/// What a process has used.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Usage {
    /// User and system CPU time since it started.
    pub cpu: Duration,
    /// Resident memory, in bytes.
    pub resident: u64,
}

/// The CPU time and resident memory of process `pid`; None when it is gone.
pub fn usage(pid: u32) -> Option<Usage> {
    Some(Usage {
        cpu: stat(pid)?.cpu,
        resident: resident(pid)?,
    })
}

/// The fields of /proc/PID/stat this crate reads.
pub struct Stat {
    pub parent: u32,
    /// User and system CPU time.
    pub cpu: Duration,
}

/// The parent and the user + system CPU time of process `pid`.
pub fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text, clock_ticks())
}

/// /proc/PID/stat's text, with `hertz` clock ticks per second.
fn parse_stat(text: &str, hertz: u64) -> Option<Stat> {
    // The command name is in parentheses and may hold spaces.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    let field = |n: usize| fields.get(n)?.parse::<u64>().ok();
    // Fields after the name: state(0) ppid(1) ... utime(11) stime(12).
    let ticks = field(11)? + field(12)?;
    Some(Stat {
        parent: u32::try_from(field(1)?).ok()?,
        cpu: Duration::from_millis(ticks * 1000 / hertz.max(1)),
    })
}

fn clock_ticks() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|hz| u64::try_from(hz).ok())
        .unwrap_or(100)
}

/// Resident memory of process `pid`, in bytes.
pub fn resident(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse::<u64>()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cpu_time_and_parent_past_a_name_with_spaces() {
        let text = "4242 (oxhorn (x) y) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0";
        let stat = parse_stat(text, 100).unwrap();
        assert_eq!(stat.parent, 17);
        assert_eq!(stat.cpu, Duration::from_millis(3250));
    }

    #[test]
    fn this_process_uses_memory_and_a_gone_one_nothing() {
        let me = usage(std::process::id()).unwrap();
        assert!(me.resident > 1 << 20, "{me:?}");
        assert_eq!(usage(u32::MAX), None);
    }
}
