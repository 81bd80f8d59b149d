//! libiscsi's conformance suite, `iscsi-test-cu` (Debian `libiscsi-bin`),
//! run whole against oxhorn's target and against tgtd serving a plain file
//! in the same run: every test named in sanity-tests/iscsi-conformance.txt
//! must pass on oxhorn (a skip, which the suite counts as a pass, does not
//! count), and the counts of both targets are printed side by side.

use std::collections::BTreeMap;
use std::fs::File;
use std::process::Command;

use oxhorn_testbed::Tgtd;

use super::IscsiVolume;
use crate::common::{init_tracing, require_root};

/// The tests required to pass, one `Suite.Test` a line.
const REQUIRED: &str = include_str!("../../../sanity-tests/iscsi-conformance.txt");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Passed,
    /// The suite found the command unsupported and skipped the test.
    Skipped,
    Failed,
}

/// Runs the suites of `family` (SCSI or iSCSI) against `url`, with the
/// destructive tests on, and reads each test's outcome from the output.
fn run_family(family: &str, url: &str) -> BTreeMap<String, Outcome> {
    let output = Command::new("iscsi-test-cu")
        .args(["-d", "-t", &format!("{family}.*"), url])
        .output()
        .expect("iscsi-test-cu (hack/install-test-deps.sh installs libiscsi-bin)");
    let text = String::from_utf8_lossy(&output.stdout);
    let outcomes = parse(&text);
    assert!(
        !outcomes.is_empty(),
        "iscsi-test-cu ran no {family} test against {url}:\n{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    outcomes
}

/// Reads CUnit's basic output: `Suite: S`, then for each test `Test: T
/// ...`, its log, and `passed` or `FAILED`. A skip is a pass whose log
/// says `[SKIPPED]` before the verdict.
fn parse(text: &str) -> BTreeMap<String, Outcome> {
    let mut outcomes = BTreeMap::new();
    let mut suite = "";
    let mut current: Option<(String, String)> = None;
    let mut close = |current: &mut Option<(String, String)>| {
        if let Some((name, log)) = current.take() {
            outcomes.insert(name, verdict(&log));
        }
    };
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("Suite: ") {
            close(&mut current);
            suite = name.trim();
        } else if let Some(rest) = line.trim_start().strip_prefix("Test: ") {
            close(&mut current);
            let (name, log) = rest.split_once(" ...").unwrap_or((rest, ""));
            current = Some((format!("{suite}.{}", name.trim()), format!("{log}\n")));
        } else if line.starts_with("Run Summary") {
            close(&mut current);
        } else if let Some((_, log)) = current.as_mut() {
            log.push_str(line);
            log.push('\n');
        }
    }
    close(&mut current);
    outcomes
}

/// The verdict in one test's log: the first `passed` or `FAILED` that is
/// not part of a bracketed log message like `[FAILED]`.
fn verdict(log: &str) -> Outcome {
    let word = |word: &str| {
        log.match_indices(word)
            .find(|(at, _)| {
                let before = log[..*at].chars().next_back();
                let after = log[at + word.len()..].chars().next();
                before != Some('[') && after != Some(']')
            })
            .map(|(at, _)| at)
    };
    match (word("passed"), word("FAILED")) {
        (_, Some(failed)) if word("passed").is_none_or(|passed| failed < passed) => Outcome::Failed,
        (Some(passed), _) if log[..passed].contains("[SKIPPED]") => Outcome::Skipped,
        (Some(_), _) => Outcome::Passed,
        (None, _) => Outcome::Failed,
    }
}

fn counts(outcomes: &BTreeMap<String, Outcome>) -> [usize; 3] {
    [Outcome::Passed, Outcome::Skipped, Outcome::Failed]
        .map(|kind| outcomes.values().filter(|o| **o == kind).count())
}

#[test]
fn verdicts_are_read_from_cunit_output() {
    let text = "Suite: Read10\n  Test: Simple ...passed\n  Test: Protect ...    \
                [FAILED] READ10 successful\n    [FAILED] again\nFAILED\n    1. x.c:1\n  \
                Test: Fua ...    [SKIPPED] MODESENSE6 is not implemented.\npassed    \
                [SKIPPED] PERSISTENT RESERVE IN is not implemented.\n\nSuite: Inquiry\n  \
                Test: Odd ...    [FAILED] a log line\npassed\nRun Summary: ...\n";
    let outcomes = parse(text);
    assert_eq!(outcomes["Read10.Simple"], Outcome::Passed);
    assert_eq!(outcomes["Read10.Protect"], Outcome::Failed);
    assert_eq!(outcomes["Read10.Fua"], Outcome::Skipped);
    assert_eq!(outcomes["Inquiry.Odd"], Outcome::Passed);
    assert_eq!(outcomes.len(), 4);
}

#[tokio::test]
async fn libiscsi_conformance_suite_side_by_side_with_tgtd() {
    init_tracing();
    require_root();
    let volume = IscsiVolume::start("conformance", 3).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lun.img");
    File::create(&file).unwrap().set_len(super::SIZE).unwrap();
    let tgtd = Tgtd::start(dir.path()).unwrap();
    let reference = tgtd
        .serve(1, "iqn.2026-01.io.oxhorn.test:tgtd", &file, 4096)
        .unwrap();

    let mut ours = run_family("SCSI", &volume.url);
    ours.extend(run_family("iSCSI", &volume.url));
    let mut theirs = run_family("SCSI", &reference);
    theirs.extend(run_family("iSCSI", &reference));

    println!("iscsi-test-cu, SCSI and iSCSI families, 4 KiB blocks, 256 MiB");
    println!(
        "{:<10} {:>22} {:>18}",
        "", "oxhorn (3 replicas)", "tgtd (a file)"
    );
    let (a, b) = (counts(&ours), counts(&theirs));
    for (i, label) in ["passed", "skipped", "failed"].iter().enumerate() {
        println!("{label:<10} {:>22} {:>18}", a[i], b[i]);
    }
    println!("{:<10} {:>22} {:>18}", "run", ours.len(), theirs.len());
    for (test, outcome) in &ours {
        let other = theirs.get(test);
        if other != Some(outcome) {
            println!("  {test}: oxhorn {outcome:?}, tgtd {other:?}");
        }
    }

    let unmet: Vec<String> = REQUIRED
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter(|test| ours.get(*test) != Some(&Outcome::Passed))
        .map(|test| format!("{test}: {:?}", ours.get(test)))
        .collect();
    assert!(
        unmet.is_empty(),
        "required tests did not pass on oxhorn's target:\n{}\nengine log:\n{}",
        unmet.join("\n"),
        volume.engine.log()
    );
}
