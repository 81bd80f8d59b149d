//! Runs host programs with an argv, never through a shell, optionally inside
//! the host's mount and network namespaces.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::process::Output;

use nix::sched::{CloneFlags, setns};
use tokio::process::Command;
use tracing::debug;

use super::{Host, HostError, Result};

impl Host {
    /// Runs `program` with `args` and returns its output if it exited 0.
    pub async fn run<S: AsRef<OsStr>>(&self, program: &str, args: &[S]) -> Result<Output> {
        let output = self.output(program, args).await?;
        if output.status.success() {
            Ok(output)
        } else {
            Err(failure(program, args, &output))
        }
    }

    /// Runs `program` with `args` and returns its output, whatever its exit
    /// status (for programs whose status is an answer, like blkid's).
    pub async fn output<S: AsRef<OsStr>>(&self, program: &str, args: &[S]) -> Result<Output> {
        let mut command = Command::new(program);
        command.args(args).kill_on_drop(true);
        self.enter_namespaces(&mut command)?;
        debug!(program, args = ?shown(args), "running");
        command
            .output()
            .await
            .map_err(|source| match source.kind() {
                io::ErrorKind::NotFound => HostError::MissingProgram {
                    program: program.to_string(),
                    source,
                },
                _ => HostError::io("running", program.as_ref(), source),
            })
    }

    /// Makes the child join the host's mount and network namespaces before
    /// exec, so it sees the host's devices, mounts and network.
    fn enter_namespaces(&self, command: &mut Command) -> Result<()> {
        let Some(process) = &self.host_process else {
            return Ok(());
        };
        // Opened here, before fork: the child may only make async-signal-safe
        // calls. They are close-on-exec, so the program does not inherit them.
        let open = |ns: &str| {
            let path = process.join("ns").join(ns);
            File::open(&path).map_err(|e| HostError::io("opening", &path, e))
        };
        let (net, mnt) = (open("net")?, open("mnt")?);
        // SAFETY: the closure only calls setns(2), which is async-signal-safe,
        // on descriptors the parent keeps open until the child has exec'd.
        unsafe {
            command.pre_exec(move || {
                setns(&net, CloneFlags::CLONE_NEWNET)?;
                setns(&mnt, CloneFlags::CLONE_NEWNS)?;
                Ok(())
            });
        }
        Ok(())
    }
}

/// `args` as logs and errors show them: the value set for a setting whose
/// name holds "password" (`-n node.session.auth.password -v <value>`, as
/// iscsiadm takes CHAP secrets) is hidden.
pub(super) fn shown<S: AsRef<OsStr>>(args: &[S]) -> Vec<String> {
    let mut shown: Vec<String> = args
        .iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect();
    for i in 3..shown.len() {
        if shown[i - 3] == "-n" && shown[i - 2].contains("password") && shown[i - 1] == "-v" {
            shown[i] = "<hidden>".to_owned();
        }
    }
    shown
}

/// The error for a program that exited unsuccessfully: its command line and
/// stderr (or stdout, for programs that report errors there).
pub(super) fn failure<S: AsRef<OsStr>>(program: &str, args: &[S], output: &Output) -> HostError {
    let command = format!("{program} {}", shown(args).join(" "));
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    let stderr = if stderr.is_empty() {
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    } else {
        stderr
    };
    HostError::Command {
        command,
        status: output.status.to_string(),
        stderr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_values_are_hidden_from_logs_and_errors() {
        let args = [
            "-m",
            "node",
            "-o",
            "update",
            "-n",
            "node.session.auth.password_in",
            "-v",
            "s3cret-value",
        ];
        assert_eq!(
            shown(&args).join(" "),
            "-m node -o update -n node.session.auth.password_in -v <hidden>"
        );
        let user = ["-n", "node.session.auth.username", "-v", "node"];
        assert_eq!(shown(&user), user);
    }

    #[tokio::test]
    async fn a_failing_program_reports_its_stderr() {
        let err = Host::default()
            .run("sh", &["-c", "echo broken >&2; exit 3"])
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("broken"), "{text}");
        assert!(text.contains("exit status: 3"), "{text}");
    }

    #[tokio::test]
    async fn a_missing_program_says_so() {
        let err = Host::default()
            .run("oxhorn-no-such-program", &["x"])
            .await
            .unwrap_err();
        assert!(matches!(err, HostError::MissingProgram { .. }), "{err}");
    }

    #[tokio::test]
    async fn arguments_are_not_interpreted_by_a_shell() {
        let out = Host::default().run("echo", &["$(id); `id`"]).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "$(id); `id`\n");
    }

    #[tokio::test]
    async fn programs_run_in_the_namespaces_of_the_host_process() {
        // The "host process" is us: the child joins the namespaces it is
        // already in, which exercises the setns path.
        let ours = format!("/proc/{}", std::process::id());
        let host = Host::new(Some(ours.clone().into()));
        let out = host.run("readlink", &["/proc/self/ns/mnt"]).await.unwrap();
        let mnt = std::fs::read_link(format!("{ours}/ns/mnt")).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            mnt.to_string_lossy()
        );
    }

    #[tokio::test]
    async fn an_unreachable_host_process_is_an_error_not_a_silent_local_run() {
        let host = Host::new(Some("/nonexistent-proc/1".into()));
        let err = host.run("true", &[] as &[&str]).await.unwrap_err();
        assert!(err.to_string().contains("/nonexistent-proc/1/ns"), "{err}");
    }
}
