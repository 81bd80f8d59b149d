//! An engine killed with its device in use, and what the next frontend for
//! its volume clears.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use super::*;

on_both_transports!(a_crashed_frontend_is_cleaned_up_at_start);

/// A child process, killed on drop.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const CHILD_RUN_DIR: &str = "OXHORN_TEST_FRONTEND_CHILD_RUN_DIR";
const CHILD_DEV_DIR: &str = "OXHORN_TEST_FRONTEND_CHILD_DEV_DIR";
const CHILD_ON_IO_URING: &str = "OXHORN_TEST_FRONTEND_CHILD_ON_IO_URING";
const CHILD_VOLUME: &str = "crashed";

/// Not a test on its own: the process that crashes in
/// `a_crashed_frontend_is_cleaned_up_at_start`. Starts a frontend, reports
/// its device and waits to be killed.
#[test]
fn crashing_child() {
    let (Some(run_dir), Some(dev_dir)) = (
        std::env::var_os(CHILD_RUN_DIR),
        std::env::var_os(CHILD_DEV_DIR),
    ) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut options = FuseOptions::new(run_dir);
    options.dev_dir = dev_dir.into();
    options.transport = match std::env::var_os(CHILD_ON_IO_URING) {
        Some(_) => FuseTransport::IoUring,
        None => FuseTransport::DevFuse,
    };
    let device = MemDevice::new(4 * MIB);
    let frontend =
        FuseFrontend::start(device, CHILD_VOLUME, &options, runtime.handle().clone()).unwrap();
    println!("ready {}", frontend.device_path().display());
    loop {
        thread::sleep(Duration::from_secs(3600));
    }
}

/// Starts `crashing_child` and returns it with the device it reports.
fn spawn_crashing_child(options: &FuseOptions) -> (ChildGuard, PathBuf) {
    // The test's name as the harness knows it: its path without the crate.
    let (_crate, module) = module_path!().split_once("::").unwrap();
    let name = format!("{module}::crashing_child");
    let mut child = ChildGuard(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &name, "--nocapture", "--test-threads=1"])
            .env(CHILD_RUN_DIR, &options.run_dir)
            .env(CHILD_DEV_DIR, &options.dev_dir)
            .envs((options.transport == FuseTransport::IoUring).then_some((CHILD_ON_IO_URING, "1")))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = BufReader::new(child.0.stdout.take().unwrap());
    let device = stdout
        .lines()
        .map(Result::unwrap)
        // The harness has already printed "test frontend::crashing_child ... "
        // on it.
        .find_map(|line| {
            line.split_once("ready ")
                .map(|(_, device)| PathBuf::from(device))
        })
        .expect("child did not start its frontend");
    (child, device)
}

/// A loop device held open, as a mounted filesystem would hold it. Drop
/// detaches it (it cannot have been reused while we held it) and closes it.
struct HeldLoop {
    number: u32,
    _file: File,
}

impl HeldLoop {
    fn open(device: &Path) -> Self {
        HeldLoop {
            number: loop_number(device),
            _file: File::open(device).unwrap(),
        }
    }

    /// Binds a loop device to `file` the way an admin would (losetup: no
    /// autoclear), and holds it.
    fn losetup(file: &Path) -> Self {
        let output = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(file)
            .output()
            .unwrap();
        assert!(output.status.success(), "losetup: {output:?}");
        let device = PathBuf::from(String::from_utf8(output.stdout).unwrap().trim());
        let held = HeldLoop::open(&device);
        assert_eq!(sysfs(&device, "loop/autoclear"), "0");
        held
    }

    fn device(&self) -> PathBuf {
        PathBuf::from(format!("/dev/loop{}", self.number))
    }

    /// Closes it and waits until the kernel unbinds it.
    fn release(self, env: &Env) {
        let (number, bound) = (self.number, loopdev::backing_file(self.number).unwrap());
        assert!(bound.is_some(), "loop{number} went while still open");
        drop(self);
        until_unbound(env, number, &bound);
    }
}

impl Drop for HeldLoop {
    fn drop(&mut self) {
        let _ = loopdev::detach_number(self.number);
    }
}

/// An engine killed with its device in use leaves a dead FUSE mount
/// ("Transport endpoint is not connected"), its loop device and whatever else
/// was bound to the file (here a loop device without autoclear), both still
/// open. A new frontend for the volume clears them and works.
fn a_crashed_frontend_is_cleaned_up_at_start(transport: FuseTransport) {
    let env = Env::new(transport);
    let (child, crashed) = spawn_crashing_child(&env.options());
    let backing = env
        .options()
        .run_dir
        .join("fuse")
        .join(CHILD_VOLUME)
        .join(FILE_NAME);
    let leftover = HeldLoop::losetup(&backing);
    let crashed = HeldLoop::open(&crashed);
    drop(child);
    let dead = fs::metadata(&backing).unwrap_err();
    // Not connected; or aborted, or on io_uring cancelled with the dead
    // process's ring, for requests on their way when it died: dead.
    assert!(
        matches!(
            dead.raw_os_error(),
            Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED)
        ),
        "{dead}"
    );

    let device = MemDevice::new(4 * MIB);
    let frontend = env.start(&device, CHILD_VOLUME);
    let link = frontend.link_path().to_path_buf();
    assert_eq!(fs::read_link(&link).unwrap(), frontend.device_path());
    assert_eq!(
        loopdev::backed_by(&backing).unwrap(),
        vec![loop_number(frontend.device_path())]
    );
    // Detached: it goes as soon as its user closes it.
    assert_eq!(sysfs(&leftover.device(), "loop/autoclear"), "1");
    let block = AlignedBuf::from(&random_bytes(BLOCK_SIZE as usize, 5));
    let file = open_direct(&link);
    file.write_all_at(block.as_ref(), 0).unwrap();
    assert!(device.contents(0, BLOCK_SIZE as usize) == block.as_ref());
    drop(file);
    leftover.release(&env);
    crashed.release(&env);

    env.assert_transport_used(&frontend);
    assert_eq!(frontend.stop().unwrap(), StopOutcome::Complete);
    assert_gone(&env, &backing, &link);
    device.assert_only_aligned_calls();
}
