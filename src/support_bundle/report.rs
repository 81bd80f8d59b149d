//! What a bundle says about itself, in its `summary.txt`: who made it and
//! how, each collection step and how it went (a step that failed is
//! recorded, and the bundle goes on), what was redacted, and every file
//! with its size.

use std::fmt::Write as _;

/// How one step of the collection went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Collected; what, in a few words ("12 objects").
    Done(String),
    /// Collected in part; what is missing.
    Partial(String),
    /// Not collected: why.
    Failed(String),
    /// Not attempted: why (the caller may not read it).
    Skipped(String),
}

#[derive(Clone, Debug)]
pub struct Step {
    pub what: String,
    pub outcome: Outcome,
}

/// A file of the bundle, as written.
#[derive(Clone, Debug)]
pub struct Listed {
    pub path: String,
    pub bytes: u64,
    pub redactions: usize,
}

/// Everything `summary.txt` says.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Lines of the head: when, by whom, with which options.
    pub head: Vec<String>,
    pub steps: Vec<Step>,
    /// How redaction was done.
    pub redaction: Vec<String>,
}

impl Report {
    pub fn record(&mut self, what: impl Into<String>, outcome: Outcome) {
        let what = what.into();
        match &outcome {
            Outcome::Failed(why) => {
                tracing::warn!(step = what, why, "support bundle: not collected")
            }
            Outcome::Partial(why) => tracing::info!(step = what, why, "support bundle: in part"),
            _ => tracing::debug!(step = what, ?outcome, "support bundle"),
        }
        self.steps.push(Step { what, outcome });
    }

    /// How many steps failed.
    pub fn failed(&self) -> usize {
        let failed = |s: &&Step| matches!(s.outcome, Outcome::Failed(_));
        self.steps.iter().filter(failed).count()
    }

    /// `summary.txt`, listing `files` (itself excepted).
    pub fn render(&self, files: &[Listed]) -> String {
        let mut out = String::from("Oxhorn support bundle\n\n");
        for line in &self.head {
            let _ = writeln!(out, "{line}");
        }
        out.push_str(LAYOUT);
        let _ = writeln!(
            out,
            "\nWhat was collected ({} steps, {} failed)\n",
            self.steps.len(),
            self.failed()
        );
        for step in &self.steps {
            let (mark, detail) = match &step.outcome {
                Outcome::Done(what) => ("ok", what),
                Outcome::Partial(why) => ("PARTIAL", why),
                Outcome::Failed(why) => ("FAILED", why),
                Outcome::Skipped(why) => ("skipped", why),
            };
            let _ = writeln!(out, "  {mark:<8} {}: {detail}", step.what);
        }
        out.push_str("\nRedaction\n\n");
        for line in &self.redaction {
            let _ = writeln!(out, "  {line}");
        }
        let total: u64 = files.iter().map(|f| f.bytes).sum();
        let _ = writeln!(
            out,
            "\nFiles ({} and this one, {total} bytes; redactions made in each)\n",
            files.len()
        );
        for file in files {
            let _ = writeln!(
                out,
                "  {:>10}  {:>5}  {}",
                file.bytes, file.redactions, file.path
            );
        }
        out
    }
}

/// What each part of a bundle holds.
const LAYOUT: &str = "
Layout
  summary.txt          this file
  versions.yaml        the CLI's or manager's version, Kubernetes', the workloads' images and their pods' running images
  settings.yaml        every setting: its value (its Setting's or the default), whether it is in effect
  resources/           every oxhorn.io object, one file per kind (the Nodes' status holds their disks)
  kubernetes/          Nodes, CSINodes, the CSIDriver, Oxhorn's StorageClasses, PersistentVolumes, claims
                       and VolumeAttachments, and the namespace's pods, DaemonSets, Deployments, Leases and
                       Secrets (names, types and keys only)
  events.yaml          the Events of the namespace, and those of Oxhorn's PersistentVolumes and claims and of
                       the pods whose volumes they are, oldest first
  metrics/<pod>.txt    each manager's /metrics, when reachable
  logs/<pod>/<container>.log           each container's log (timestamped), the newest part
  logs/<pod>/<container>.previous.log  the log of the container before its last restart
";
