//! The initiator against a fake iscsiadm: each test scripts its answers
//! and checks the argv it was called with.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Mutex;

use super::*;

const PORTAL: &str = "10.0.0.7:3260";
const IQN: &str = "iqn.2026-01.io.oxhorn:pvc-1";
const SHORT_WAIT: Duration = Duration::from_millis(300);

type Answer = Box<dyn Fn(&[String]) -> Result<Output> + Send + Sync>;

/// A scripted iscsiadm: `answer` gives the output for an argv, every argv
/// is recorded.
struct FakeIscsiadm {
    calls: Mutex<Vec<String>>,
    answer: Answer,
}

impl FakeIscsiadm {
    fn new(answer: impl Fn(&[String]) -> Result<Output> + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Self {
            calls: Mutex::new(Vec::new()),
            answer: Box::new(answer),
        })
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

impl HostCommands for FakeIscsiadm {
    fn output<'a>(&'a self, program: &'a str, args: &'a [String]) -> BoxFuture<'a, Result<Output>> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("{program} {}", args.join(" ")));
        let answer = (self.answer)(args);
        Box::pin(async move { answer })
    }
}

fn exit(code: i32, stderr: &str) -> Result<Output> {
    Ok(Output {
        status: ExitStatus::from_raw(code << 8),
        stdout: Vec::new(),
        stderr: stderr.as_bytes().to_vec(),
    })
}

fn ok() -> Result<Output> {
    exit(0, "")
}

fn is_login(args: &[String]) -> bool {
    args.last().is_some_and(|a| a == "--login")
}

fn portal() -> SocketAddr {
    PORTAL.parse().unwrap()
}

fn initiator(fake: &Arc<FakeIscsiadm>, dir: &tempfile::TempDir) -> Initiator<Arc<FakeIscsiadm>> {
    Initiator::new(Arc::clone(fake))
        .with_by_path_dir(dir.path())
        .with_transport_module(dir.path().join("iscsi_tcp"))
        .with_device_wait(SHORT_WAIT)
}

fn disk_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join(format!("ip-{PORTAL}-iscsi-{IQN}-lun-1"))
}

const DISCOVERY: &str = "iscsiadm -m discovery -t sendtargets -p 10.0.0.7:3260";
const LOGIN: &str = "iscsiadm -m node -T iqn.2026-01.io.oxhorn:pvc-1 -p 10.0.0.7:3260 --login";
const AUTH_NONE: &str = "iscsiadm -m node -T iqn.2026-01.io.oxhorn:pvc-1 -p 10.0.0.7:3260 -o update -n node.session.auth.authmethod -v None";
const LOGOUT: &str = "iscsiadm -m node -T iqn.2026-01.io.oxhorn:pvc-1 --logout";
const DELETE: &str = "iscsiadm -m node -T iqn.2026-01.io.oxhorn:pvc-1 -o delete";

#[tokio::test]
async fn attach_discovers_logs_in_and_returns_the_disk_udev_names() {
    let dir = tempfile::tempdir().unwrap();
    let disk = disk_path(&dir);
    let made = disk.clone();
    // The disk appears only once logged in, as udev would make it.
    let fake = FakeIscsiadm::new(move |args| {
        if is_login(args) {
            std::fs::write(&made, b"").unwrap();
        }
        ok()
    });
    let found = initiator(&fake, &dir)
        .attach(portal(), IQN, 1, None)
        .await
        .unwrap();
    assert_eq!(found, disk);
    assert_eq!(fake.calls(), [DISCOVERY, AUTH_NONE, LOGIN]);
}

#[tokio::test]
async fn chap_credentials_are_set_on_the_node_record_before_login_and_never_shown() {
    use crate::frontend::iscsi::chap::Credential;

    let dir = tempfile::tempdir().unwrap();
    let made = disk_path(&dir);
    let fake = FakeIscsiadm::new(move |args| {
        if is_login(args) {
            std::fs::write(&made, b"").unwrap();
        }
        // The target's password cannot be stored.
        if args.last().is_some_and(|a| a == "target-secret-1") {
            return exit(7, "iscsiadm: cannot update");
        }
        ok()
    });
    let credential = |user: &str, secret: &str| Credential {
        user: user.into(),
        secret: secret.into(),
    };
    let mut chap = ChapSecrets {
        initiator: credential("node", "initiator-secret"),
        target: None,
    };
    initiator(&fake, &dir)
        .attach(portal(), IQN, 1, Some(&chap))
        .await
        .unwrap();
    let update = |setting: &str| {
        format!("iscsiadm -m node -T {IQN} -p {PORTAL} -o update -n node.session.auth.{setting}")
    };
    assert_eq!(
        fake.calls(),
        [
            DISCOVERY.to_owned(),
            update("authmethod -v CHAP"),
            update("username -v node"),
            update("password -v initiator-secret"),
            LOGIN.to_owned(),
        ]
    );
    chap.target = Some(credential("target", "target-secret-1"));
    let err = initiator(&fake, &dir)
        .attach(portal(), IQN, 1, Some(&chap))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("password_in -v <hidden>"), "{err}");
    assert!(!err.contains("target-secret-1"), "{err}");
    assert!(!fake.calls().last().unwrap().ends_with("--login"));
}

#[tokio::test]
async fn a_failed_login_names_the_status_its_meaning_and_stderr() {
    let dir = tempfile::tempdir().unwrap();
    for (code, meaning) in [
        (8, "ISCSI_ERR_TRANS_TIMEOUT"),
        (24, "ISCSI_ERR_LOGIN_AUTH_FAILED"),
    ] {
        let fake = FakeIscsiadm::new(move |args| {
            if is_login(args) {
                exit(code, "iscsiadm: Could not login to [iface: default]")
            } else {
                ok()
            }
        });
        let err = initiator(&fake, &dir)
            .attach(portal(), IQN, 1, None)
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, HostError::Iscsiadm { .. }), "{text}");
        for needle in [
            LOGIN,
            &format!("exit status: {code}"),
            meaning,
            "Could not login",
        ] {
            assert!(text.contains(needle), "{text:?} lacks {needle:?}");
        }
        assert_eq!(fake.calls(), [DISCOVERY, AUTH_NONE, LOGIN]);
    }
}

#[tokio::test]
async fn a_failed_discovery_stops_before_login() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeIscsiadm::new(|_| exit(4, "iscsiadm: connection refused"));
    let err = initiator(&fake, &dir)
        .attach(portal(), IQN, 1, None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("connection refused"), "{err}");
    assert_eq!(fake.calls(), [DISCOVERY]);
}

#[tokio::test]
async fn an_existing_session_is_reused_and_its_disk_found() {
    let dir = tempfile::tempdir().unwrap();
    let disk = disk_path(&dir);
    std::fs::write(&disk, b"").unwrap();
    let fake = FakeIscsiadm::new(|args| {
        if is_login(args) {
            exit(
                15,
                "iscsiadm: default: 1 session requested, but 1 already present.",
            )
        } else {
            ok()
        }
    });
    let found = initiator(&fake, &dir)
        .attach(portal(), IQN, 1, None)
        .await
        .unwrap();
    assert_eq!(found, disk);
    assert_eq!(fake.calls(), [DISCOVERY, AUTH_NONE, LOGIN]);
}

#[tokio::test]
async fn a_disk_that_never_appears_names_the_path_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeIscsiadm::new(|_| ok());
    let started = Instant::now();
    let err = initiator(&fake, &dir)
        .attach(portal(), IQN, 1, None)
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < SHORT_WAIT * 4,
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(err, HostError::IscsiDeviceMissing { .. }), "{err}");
    let text = err.to_string();
    let path = disk_path(&dir);
    assert!(text.contains(&*path.to_string_lossy()), "{text}");
    assert!(text.contains("300ms"), "{text}");
    // The session is left for the retry: no logout.
    assert_eq!(fake.calls(), [DISCOVERY, AUTH_NONE, LOGIN]);
}

#[tokio::test]
async fn an_ipv6_portal_finds_the_disk_whatever_the_address_spelling() {
    let dir = tempfile::tempdir().unwrap();
    let portal: SocketAddr = "[fd00::7]:3260".parse().unwrap();
    let disk = dir.path().join(format!(
        "ip-fd00:0000:0000:0000:0000:0000:0000:0007:3260-iscsi-{IQN}-lun-1"
    ));
    std::fs::write(&disk, b"").unwrap();
    let fake = FakeIscsiadm::new(|_| ok());
    let found = initiator(&fake, &dir)
        .attach(portal, IQN, 1, None)
        .await
        .unwrap();
    assert_eq!(found, disk);
    assert!(
        fake.calls()[0].ends_with("-p [fd00::7]:3260"),
        "{:?}",
        fake.calls()
    );
}

#[tokio::test]
async fn detach_logs_out_then_deletes_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeIscsiadm::new(|_| ok());
    initiator(&fake, &dir).detach(IQN).await.unwrap();
    assert_eq!(fake.calls(), [LOGOUT, DELETE]);
}

#[tokio::test]
async fn a_rescan_reads_the_targets_luns_again_and_a_failed_one_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeIscsiadm::new(|_| ok());
    initiator(&fake, &dir).rescan(IQN).await.unwrap();
    assert_eq!(
        fake.calls(),
        ["iscsiadm -m node -T iqn.2026-01.io.oxhorn:pvc-1 -R"]
    );
    let gone = FakeIscsiadm::new(|_| exit(21, "iscsiadm: No session found."));
    let error = initiator(&gone, &dir).rescan(IQN).await.unwrap_err();
    assert!(error.to_string().contains("No session found"), "{error}");
}

#[tokio::test]
async fn logout_of_a_gone_session_is_success() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeIscsiadm::new(|args| {
        if args.last().is_some_and(|a| a == "--logout") {
            exit(21, "iscsiadm: No matching sessions found")
        } else {
            ok()
        }
    });
    initiator(&fake, &dir).detach(IQN).await.unwrap();
    assert_eq!(fake.calls(), [LOGOUT, DELETE]);
}

#[tokio::test]
async fn delete_of_a_gone_record_is_success() {
    let dir = tempfile::tempdir().unwrap();
    // Both gone: a detach after a detach, or after a crash between the two.
    let fake = FakeIscsiadm::new(|_| exit(21, "iscsiadm: No records found"));
    initiator(&fake, &dir).detach(IQN).await.unwrap();
    assert_eq!(fake.calls(), [LOGOUT, DELETE]);
}

#[tokio::test]
async fn a_failed_logout_is_an_error_and_keeps_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeIscsiadm::new(|_| exit(10, "iscsiadm: Could not logout"));
    let err = initiator(&fake, &dir).detach(IQN).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("ISCSI_ERR_LOGOUT") && text.contains("Could not logout"),
        "{text}"
    );
    assert_eq!(fake.calls(), [LOGOUT]);
}

#[tokio::test]
async fn bad_values_are_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeIscsiadm::new(|_| ok());
    let initiator = initiator(&fake, &dir);
    let too_long = format!("{IQN_PREFIX}{}", "a".repeat(MAX_NAME_LEN));
    for iqn in [
        "",
        "iqn.2026-01.io.oxhorn:",
        "iqn.2003-01.org.other:pvc-1",
        "--login",
        "iqn.2026-01.io.oxhorn:PVC-1",
        "iqn.2026-01.io.oxhorn:pvc 1",
        "iqn.2026-01.io.oxhorn:pvc-1 --logout",
        "iqn.2026-01.io.oxhorn:pvc/1",
        too_long.as_str(),
    ] {
        let err = initiator.attach(portal(), iqn, 1, None).await.unwrap_err();
        assert!(
            matches!(err, HostError::IscsiArgument { .. }),
            "{iqn}: {err}"
        );
        let err = initiator.detach(iqn).await.unwrap_err();
        assert!(
            err.to_string().contains("invalid iSCSI target name"),
            "{err}"
        );
    }
    for portal in [
        "0.0.0.0:3260",
        "10.0.0.7:0",
        "255.255.255.255:3260",
        "[::]:3260",
    ] {
        let err = initiator
            .attach(portal.parse().unwrap(), IQN, 1, None)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("invalid iSCSI portal"), "{err}");
    }
    let err = initiator
        .attach(portal(), IQN, 256, None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("invalid iSCSI LUN"), "{err}");
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
}

#[tokio::test]
async fn available_with_iscsiadm_and_the_module() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("iscsi_tcp")).unwrap();
    let fake = FakeIscsiadm::new(|_| {
        Ok(Output {
            status: ExitStatus::from_raw(0),
            stdout: b"iscsiadm version 2.1.8\n".to_vec(),
            stderr: Vec::new(),
        })
    });
    assert_eq!(initiator(&fake, &dir).available().await, Ok(()));
    assert_eq!(fake.calls(), ["iscsiadm --version"]);
}

#[tokio::test]
async fn unavailable_without_the_module_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeIscsiadm::new(|_| ok());
    let reason = initiator(&fake, &dir).available().await.unwrap_err();
    assert!(reason.contains("no iSCSI initiator"), "{reason}");
    assert!(reason.contains("iscsi_tcp"), "{reason}");
}

#[tokio::test]
async fn unavailable_without_iscsiadm_says_so() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("iscsi_tcp")).unwrap();
    let fake = FakeIscsiadm::new(|_| {
        Err(HostError::MissingProgram {
            program: ISCSIADM.into(),
            source: std::io::ErrorKind::NotFound.into(),
        })
    });
    let reason = initiator(&fake, &dir).available().await.unwrap_err();
    assert!(reason.contains("iscsiadm is not available"), "{reason}");
    assert!(reason.contains("open-iscsi"), "{reason}");
}

#[tokio::test]
async fn the_real_host_without_iscsiadm_is_unavailable_not_stuck() {
    // This machine has neither iscsiadm nor the module; either reason will do.
    let reason = Initiator::new(Host::default())
        .with_transport_module("/nonexistent/iscsi_tcp")
        .available()
        .await
        .unwrap_err();
    assert!(
        reason.contains("open-iscsi") || reason.contains("iscsi_tcp"),
        "{reason}"
    );
}

#[test]
fn disks_are_recognised_by_their_target_only() {
    let initiator = Initiator::new(Host::default()).with_by_path_dir("/dev/disk/by-path");
    let disk = |name: &str| PathBuf::from("/dev/disk/by-path").join(name);
    let ours = format!("ip-{PORTAL}-iscsi-{IQN}-lun-1");
    assert!(initiator.is_disk_of(&disk(&ours), IQN));
    // Another volume whose name extends this one's.
    let longer = format!("ip-{PORTAL}-iscsi-{IQN}-lun-1-lun-1");
    assert!(!initiator.is_disk_of(&disk(&longer), IQN));
    assert!(!initiator.is_disk_of(&disk(&ours), "iqn.2026-01.io.oxhorn:pvc"));
    assert!(!initiator.is_disk_of(Path::new("/dev/loop3"), IQN));
    assert!(!initiator.is_disk_of(&PathBuf::from("/tmp").join(&ours), IQN));
}
