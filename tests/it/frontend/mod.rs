//! The FUSE frontend on real kernel objects: FUSE mounts, loop devices,
//! filesystems made and checked by their own tools. Needs root, /dev/fuse and
//! /dev/loop-control; fails when not root.
//!
//! Every test works under its own temporary directory and cleans up through
//! guards, so that a failing test leaves no mount or loop device behind.
//!
//! Each test runs on both FUSE transports, `/dev/fuse` and io_uring
//! (`transport.rs`: what is particular to either). One of the tests
//! re-runs the test binary as a frontend that crashes (`crash.rs`).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use bytes::Bytes;
use nix::libc;
use oxhorn::frontend::{
    BLOCK_SIZE, BlockDevice, FILE_NAME, FrontendError, FuseFrontend, FuseOptions, FuseTransport,
    StopOutcome, loopdev,
};
use oxhorn_testbed::{self as testbed, Mounted, loop_devices_under, mounts_under};

use crate::common::{eventually, init_tracing, require_root};

const MIB: usize = 1 << 20;

/// Each test named runs on both transports, as `<test>::dev_fuse` and
/// `<test>::io_uring`; the latter is skipped, with a line saying so, where
/// the kernel has no FUSE over io_uring.
macro_rules! on_both_transports {
    ($($test:ident),* $(,)?) => {$(
        mod $test {
            use super::*;

            #[test]
            fn dev_fuse() {
                super::$test(FuseTransport::DevFuse);
            }

            #[test]
            fn io_uring() {
                if let Some(_on) = testbed::fuse_uring::on() {
                    super::$test(FuseTransport::IoUring);
                }
            }
        }
    )*};
}

mod crash;
mod transport;

on_both_transports!(
    loop_device_does_direct_io_and_round_trips_random_writes,
    requests_reach_the_device_concurrently,
    concurrent_unaligned_writes_to_the_file_lose_nothing,
    the_file_has_the_volume_size_and_keeps_it,
    discards_unmap_and_holes_zero_exactly_their_range,
    device_errors_reach_the_caller,
    stop_with_the_device_open_detaches_lazily,
    ext4_survives_fsck_and_remount,
    xfs_survives_repair_check_and_remount,
);

// ---------------------------------------------------------------------------
// A block device in memory that checks the frontend keeps the contract.

/// Volume contents in memory. Every call is checked for alignment (an
/// unaligned one fails with EINVAL and is counted, so a test can assert the
/// frontend never made one), and in-flight calls are counted to observe
/// concurrency. Failures can be switched on.
struct MemDevice {
    data: Mutex<Vec<u8>>,
    size: u64,
    read_delay: Duration,
    misaligned: AtomicUsize,
    unmaps: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// 0 to succeed, else the errno every call fails with.
    fail_with: AtomicI32,
}

impl MemDevice {
    fn new(size: usize) -> Arc<Self> {
        Self::with_read_delay(size, Duration::ZERO)
    }

    fn with_read_delay(size: usize, read_delay: Duration) -> Arc<Self> {
        Arc::new(MemDevice {
            data: Mutex::new(vec![0; size]),
            size: size as u64,
            read_delay,
            misaligned: AtomicUsize::new(0),
            unmaps: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            fail_with: AtomicI32::new(0),
        })
    }

    fn contents(&self, offset: usize, len: usize) -> Vec<u8> {
        self.data.lock().unwrap()[offset..offset + len].to_vec()
    }

    fn fail(&self, errno: i32) {
        self.fail_with.store(errno, Ordering::SeqCst);
    }

    fn assert_only_aligned_calls(&self) {
        assert_eq!(self.misaligned.load(Ordering::SeqCst), 0, "unaligned calls");
    }

    /// Checks a call, and counts it in flight until the guard drops.
    fn enter(&self, offset: u64, len: u64) -> io::Result<InFlight<'_>> {
        let aligned = offset.is_multiple_of(BLOCK_SIZE) && len.is_multiple_of(BLOCK_SIZE);
        if !aligned || offset + len > self.size {
            self.misaligned.fetch_add(1, Ordering::SeqCst);
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        match self.fail_with.load(Ordering::SeqCst) {
            0 => {}
            errno => return Err(io::Error::from_raw_os_error(errno)),
        }
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        Ok(InFlight(&self.in_flight))
    }
}

struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl BlockDevice for MemDevice {
    fn size(&self) -> u64 {
        self.size
    }

    async fn read(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        let _in_flight = self.enter(offset, len as u64)?;
        if !self.read_delay.is_zero() {
            tokio::time::sleep(self.read_delay).await;
        }
        let start = offset as usize;
        Ok(Bytes::copy_from_slice(
            &self.data.lock().unwrap()[start..start + len],
        ))
    }

    async fn write(&self, offset: u64, bytes: Bytes) -> io::Result<()> {
        let _in_flight = self.enter(offset, bytes.len() as u64)?;
        let start = offset as usize;
        self.data.lock().unwrap()[start..start + bytes.len()].copy_from_slice(&bytes);
        Ok(())
    }

    async fn flush(&self) -> io::Result<()> {
        let _in_flight = self.enter(0, 0)?;
        Ok(())
    }

    async fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        let _in_flight = self.enter(offset, len)?;
        self.unmaps.fetch_add(1, Ordering::SeqCst);
        let start = offset as usize;
        self.data.lock().unwrap()[start..start + len as usize].fill(0);
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Test environment and guards.

/// A test's directory (run dir, dev dir, mount points) and runtime. Dropping
/// it detaches loop devices backed by files under the directory and lazily
/// unmounts everything mounted under it, whatever state the test left.
struct Env {
    runtime: tokio::runtime::Runtime,
    dir: tempfile::TempDir,
    transport: FuseTransport,
}

impl Env {
    fn new(transport: FuseTransport) -> Self {
        require_root();
        init_tracing();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::Builder::new()
            .prefix("oxhorn-frontend-")
            .tempdir()
            .unwrap();
        Env {
            runtime,
            dir,
            transport,
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().canonicalize().unwrap()
    }

    fn options(&self) -> FuseOptions {
        let mut options = FuseOptions::new(self.path().join("run"));
        options.dev_dir = self.path().join("dev");
        options.transport = self.transport;
        options
    }

    fn start(&self, device: &Arc<MemDevice>, volume: &str) -> FuseFrontend {
        let handle = self.runtime.handle().clone();
        let frontend =
            FuseFrontend::start(device.clone(), volume, &self.options(), handle).unwrap();
        if self.transport != FuseTransport::Auto {
            assert_eq!(frontend.transport(), self.transport);
        }
        frontend
    }

    /// Asserts that requests came the way the test asked for: through the
    /// rings on io_uring, never on `/dev/fuse`.
    fn assert_transport_used(&self, frontend: &FuseFrontend) {
        let through_rings = frontend.ring_requests();
        match self.transport {
            FuseTransport::IoUring => {
                assert!(through_rings > 0, "no request came through io_uring")
            }
            _ => assert_eq!(through_rings, 0),
        }
    }

    fn mount_dir(&self, name: &str) -> PathBuf {
        let dir = self.path().join(name);
        fs::create_dir_all(&dir).unwrap();
        dir
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        testbed::release_under(&self.path());
    }
}

fn loop_number(device: &Path) -> u32 {
    let name = device.file_name().unwrap().to_str().unwrap();
    name.strip_prefix("loop").unwrap().parse().unwrap()
}

fn sysfs(device: &Path, attribute: &str) -> String {
    let path = format!("/sys/block/loop{}/{attribute}", loop_number(device));
    fs::read_to_string(path).unwrap().trim().to_string()
}

/// Waits, on the test's runtime, until loop device `number` is no longer
/// bound to `bound`.
fn until_unbound(env: &Env, number: u32, bound: &Option<PathBuf>) {
    let unbound = eventually(Duration::from_secs(20), || async {
        (loopdev::backing_file(number).unwrap() != *bound).then_some(())
    });
    if let Err(e) = env.runtime.block_on(unbound) {
        panic!("{e} waiting for loop{number} to go");
    }
}

/// Checks nothing of a stopped frontend remains.
fn assert_gone(env: &Env, backing_file: &Path, link: &Path) {
    assert!(
        !link.exists() && link.symlink_metadata().is_err(),
        "link remains"
    );
    assert_eq!(loopdev::backed_by(backing_file).unwrap(), Vec::<u32>::new());
    assert_eq!(loop_devices_under(&env.path()), Vec::<u32>::new());
    assert_eq!(mounts_under(&env.path()), Vec::<PathBuf>::new());
}

// ---------------------------------------------------------------------------
// I/O helpers.

/// A zeroed buffer whose start is aligned for O_DIRECT.
struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> Self {
        let storage = vec![0; len + BLOCK_SIZE as usize];
        let start = storage.as_ptr().align_offset(BLOCK_SIZE as usize);
        AlignedBuf {
            storage,
            start,
            len,
        }
    }

    fn from(data: &[u8]) -> Self {
        let mut buf = Self::new(data.len());
        buf.as_mut().copy_from_slice(data);
        buf
    }

    fn as_ref(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

fn open_direct(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap_or_else(|e| panic!("opening {} with O_DIRECT: {e}", path.display()))
}

fn open_rw(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

/// Deterministic pseudo-random bytes (xorshift), different per seed.
fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// A deterministic sequence of numbers below `bound`.
struct Numbers(u64);

impl Numbers {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

fn run(command: &mut Command) {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?} failed: {}\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
}

// ---------------------------------------------------------------------------
// Tests.

fn loop_device_does_direct_io_and_round_trips_random_writes(transport: FuseTransport) {
    let env = Env::new(transport);
    let size = 64 * MIB;
    let device = MemDevice::new(size);
    let frontend = env.start(&device, "round-trip");
    let loop_path = frontend.device_path().to_path_buf();
    let (backing, link) = (
        frontend.backing_file().to_path_buf(),
        frontend.link_path().to_path_buf(),
    );

    assert_eq!(fs::read_link(&link).unwrap(), loop_path);
    assert!(frontend.direct_io());
    assert_eq!(sysfs(&loop_path, "loop/dio"), "1");
    assert_eq!(sysfs(&loop_path, "queue/logical_block_size"), "4096");
    assert_eq!(sysfs(&loop_path, "size"), (size / 512).to_string());
    assert_eq!(
        loopdev::backed_by(&backing).unwrap(),
        vec![loop_number(&loop_path)]
    );

    let file = open_direct(&link);
    let mut expected = vec![0u8; size];
    let mut numbers = Numbers(7);
    let blocks = (size as u64) / BLOCK_SIZE;
    for round in 0..200 {
        let block = numbers.below(blocks);
        let count = 1 + numbers.below(64.min(blocks - block));
        let (offset, len) = ((block * BLOCK_SIZE) as usize, (count * BLOCK_SIZE) as usize);
        let data = random_bytes(len, round);
        file.write_all_at(AlignedBuf::from(&data).as_ref(), offset as u64)
            .unwrap();
        expected[offset..offset + len].copy_from_slice(&data);
    }
    file.sync_all().unwrap();
    for _ in 0..100 {
        let block = numbers.below(blocks);
        let count = 1 + numbers.below(256.min(blocks - block));
        let (offset, len) = ((block * BLOCK_SIZE) as usize, (count * BLOCK_SIZE) as usize);
        let mut buf = AlignedBuf::new(len);
        file.read_exact_at(buf.as_mut(), offset as u64).unwrap();
        assert!(
            buf.as_ref() == &expected[offset..offset + len],
            "read {offset}+{len}"
        );
    }
    assert!(
        device.contents(0, size) == expected,
        "device contents differ"
    );
    drop(file);

    env.assert_transport_used(&frontend);
    assert_eq!(frontend.stop().unwrap(), StopOutcome::Complete);
    assert_gone(&env, &backing, &link);
    device.assert_only_aligned_calls();
}

/// mkfs, mount, write files, unmount, check with the filesystem's own
/// checker, mount again and compare.
fn filesystem_survives_a_remount(
    transport: FuseTransport,
    volume: &str,
    size: usize,
    fstype: &str,
) {
    let env = Env::new(transport);
    let device = MemDevice::new(size);
    let frontend = env.start(&device, volume);
    let link = frontend.link_path().to_path_buf();
    let mount_point = env.mount_dir("mnt");

    match fstype {
        "ext4" => run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&link)),
        _ => run(Command::new("mkfs.xfs").args(["-q", "-f"]).arg(&link)),
    }
    let files: Vec<(String, Vec<u8>)> = (0..6)
        .map(|i| {
            (
                format!("file-{i}"),
                random_bytes((i + 1) * MIB + 123 * i, i as u64),
            )
        })
        .collect();
    let mounted = Mounted::new(&link, &mount_point, fstype, None).unwrap();
    for (name, data) in &files {
        fs::write(mount_point.join(name), data).unwrap();
    }
    run(&mut Command::new("sync"));
    mounted.unmount().unwrap();

    match fstype {
        "ext4" => run(Command::new("e2fsck").arg("-fn").arg(&link)),
        _ => run(Command::new("xfs_repair").arg("-n").arg(&link)),
    }

    let mounted = Mounted::new(&link, &mount_point, fstype, None).unwrap();
    for (name, data) in &files {
        let back = fs::read(mount_point.join(name)).unwrap();
        assert!(&back == data, "{name} differs after remount");
    }
    mounted.unmount().unwrap();

    env.assert_transport_used(&frontend);
    assert_eq!(frontend.stop().unwrap(), StopOutcome::Complete);
    device.assert_only_aligned_calls();
}

fn ext4_survives_fsck_and_remount(transport: FuseTransport) {
    filesystem_survives_a_remount(transport, "ext4-vol", 128 * MIB, "ext4");
}

fn xfs_survives_repair_check_and_remount(transport: FuseTransport) {
    // XFS refuses filesystems under 300 MB.
    filesystem_survives_a_remount(transport, "xfs-vol", 320 * MIB, "xfs");
}

/// 16 reads that each take 50 ms on the device: served one at a time, the
/// device would never see two at once.
fn requests_reach_the_device_concurrently(transport: FuseTransport) {
    let env = Env::new(transport);
    let device = MemDevice::with_read_delay(16 * MIB, Duration::from_millis(50));
    let frontend = env.start(&device, "concurrent");

    for path in [frontend.device_path(), frontend.backing_file()] {
        device.max_in_flight.store(0, Ordering::SeqCst);
        let barrier = Arc::new(Barrier::new(16));
        let readers: Vec<_> = (0..16u64)
            .map(|i| {
                let (path, barrier) = (path.to_path_buf(), barrier.clone());
                thread::spawn(move || {
                    let file = open_direct(&path);
                    let mut buf = AlignedBuf::new(BLOCK_SIZE as usize);
                    barrier.wait();
                    file.read_exact_at(buf.as_mut(), i * MIB as u64).unwrap();
                })
            })
            .collect();
        for reader in readers {
            reader.join().unwrap();
        }
        let max = device.max_in_flight.load(Ordering::SeqCst);
        assert!(
            max >= 2,
            "{}: at most {max} request in flight",
            path.display()
        );
    }

    env.assert_transport_used(&frontend);
    assert_eq!(frontend.stop().unwrap(), StopOutcome::Complete);
    device.assert_only_aligned_calls();
}

/// 512-byte writes at unaligned offsets, straight to the FUSE file, from
/// several threads at once: neighbouring pieces share blocks, so a
/// read-modify-write that is not serialized would lose some of them.
fn concurrent_unaligned_writes_to_the_file_lose_nothing(transport: FuseTransport) {
    let env = Env::new(transport);
    let device = MemDevice::new(4 * MIB);
    let frontend = env.start(&device, "unaligned");
    let (threads, pieces, piece, base) = (8usize, 512usize, 512usize, 300usize);

    let writers: Vec<_> = (0..threads)
        .map(|t| {
            let path = frontend.backing_file().to_path_buf();
            thread::spawn(move || {
                let file = open_rw(&path);
                for k in (t..pieces).step_by(threads) {
                    let data = random_bytes(piece, k as u64);
                    file.write_all_at(&data, (base + k * piece) as u64).unwrap();
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }

    let file = open_rw(frontend.backing_file());
    let mut back = vec![0; pieces * piece];
    file.read_exact_at(&mut back, base as u64).unwrap();
    let on_device = device.contents(base, pieces * piece);
    for k in 0..pieces {
        let expected = random_bytes(piece, k as u64);
        let range = k * piece..(k + 1) * piece;
        assert!(
            back[range.clone()] == expected[..],
            "piece {k} read back differs"
        );
        assert!(
            on_device[range] == expected[..],
            "piece {k} on the device differs"
        );
    }
    assert!(
        device.contents(0, base).iter().all(|&b| b == 0),
        "bytes before pieces changed"
    );
    drop(file);

    env.assert_transport_used(&frontend);
    assert_eq!(frontend.stop().unwrap(), StopOutcome::Complete);
    device.assert_only_aligned_calls();
}

/// The FUSE file behaves as a file of fixed size: reads stop at the end,
/// writes past it fail, it cannot be truncated.
fn the_file_has_the_volume_size_and_keeps_it(transport: FuseTransport) {
    let env = Env::new(transport);
    let size = 2 * MIB;
    let device = MemDevice::new(size);
    let frontend = env.start(&device, "fixed-size");
    let file = open_rw(frontend.backing_file());
    let size = size as u64;

    assert_eq!(file.metadata().unwrap().len(), size);
    let names: Vec<_> = fs::read_dir(frontend.mount_point())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(names, [FILE_NAME]);
    let mut buf = vec![0; 100];
    assert_eq!(file.read_at(&mut buf, size - 10).unwrap(), 10);
    assert_eq!(file.read_at(&mut buf, size).unwrap(), 0);
    assert_eq!(file.write_at(&buf, size - 10).unwrap(), 10);
    let past_end = file.write_at(&buf, size).unwrap_err();
    assert_eq!(past_end.raw_os_error(), Some(libc::EFBIG));
    let truncate = file.set_len(size / 2).unwrap_err();
    assert_eq!(truncate.raw_os_error(), Some(libc::EPERM));
    assert_eq!(file.metadata().unwrap().len(), size);
    drop(file);

    env.assert_transport_used(&frontend);
    assert_eq!(frontend.stop().unwrap(), StopOutcome::Complete);
    device.assert_only_aligned_calls();
}

/// Discards on the loop device become unmaps; punching an unaligned hole
/// in the file zeroes exactly that range.
fn discards_unmap_and_holes_zero_exactly_their_range(transport: FuseTransport) {
    let env = Env::new(transport);
    let size = 8 * MIB;
    let device = MemDevice::new(size);
    let frontend = env.start(&device, "discard");
    let pattern = random_bytes(size, 1);
    let loop_file = open_rw(frontend.device_path());
    loop_file.write_all_at(&pattern, 0).unwrap();
    loop_file.sync_all().unwrap();
    drop(loop_file);
    let mut expected = pattern.clone();

    run(Command::new("blkdiscard")
        .args(["--offset", "1048576", "--length", "2097152"])
        .arg(frontend.device_path()));
    expected[MIB..3 * MIB].fill(0);
    assert!(
        device.unmaps.load(Ordering::SeqCst) > 0,
        "no unmap reached the device"
    );
    assert!(
        device.contents(0, size) == expected,
        "discard zeroed the wrong range"
    );

    let file = open_rw(frontend.backing_file());
    let (offset, len) = (5 * MIB + 1000, 3 * BLOCK_SIZE as usize + 77);
    let mode = nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
        | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
    nix::fcntl::fallocate(&file, mode, offset as i64, len as i64).unwrap();
    expected[offset..offset + len].fill(0);
    assert!(
        device.contents(0, size) == expected,
        "hole punched the wrong range"
    );
    drop(file);

    env.assert_transport_used(&frontend);
    assert_eq!(frontend.stop().unwrap(), StopOutcome::Complete);
    device.assert_only_aligned_calls();
}

/// A failing device fails the caller's I/O: EIO through the loop device, the
/// device's own errno through the file.
fn device_errors_reach_the_caller(transport: FuseTransport) {
    let env = Env::new(transport);
    let device = MemDevice::new(4 * MIB);
    let frontend = env.start(&device, "failing");
    let block = AlignedBuf::from(&random_bytes(BLOCK_SIZE as usize, 3));
    let loop_file = open_direct(frontend.device_path());
    loop_file.write_all_at(block.as_ref(), 0).unwrap();

    device.fail(libc::EIO);
    let write = loop_file
        .write_all_at(block.as_ref(), BLOCK_SIZE)
        .unwrap_err();
    assert_eq!(write.raw_os_error(), Some(libc::EIO), "{write}");
    let mut buf = AlignedBuf::new(BLOCK_SIZE as usize);
    let read = loop_file.read_exact_at(buf.as_mut(), 0).unwrap_err();
    assert_eq!(read.raw_os_error(), Some(libc::EIO), "{read}");

    device.fail(libc::ENOSPC);
    let file = open_rw(frontend.backing_file());
    let write = file.write_at(b"data", 10).unwrap_err();
    assert_eq!(write.raw_os_error(), Some(libc::ENOSPC), "{write}");
    let sync = file.sync_all().unwrap_err();
    assert_eq!(sync.raw_os_error(), Some(libc::ENOSPC), "{sync}");

    device.fail(0);
    loop_file.write_all_at(block.as_ref(), BLOCK_SIZE).unwrap();
    drop((file, loop_file));
    env.assert_transport_used(&frontend);
    assert_eq!(frontend.stop().unwrap(), StopOutcome::Complete);
    device.assert_only_aligned_calls();
}

/// Stopping while the device is open does not wait: the device goes when
/// its user closes it, and serves I/O until then.
fn stop_with_the_device_open_detaches_lazily(transport: FuseTransport) {
    let env = Env::new(transport);
    let device = MemDevice::new(4 * MIB);
    let frontend = env.start(&device, "busy");
    let (backing, link) = (
        frontend.backing_file().to_path_buf(),
        frontend.link_path().to_path_buf(),
    );
    let number = loop_number(frontend.device_path());
    let user = open_direct(frontend.device_path());

    env.assert_transport_used(&frontend);
    assert_eq!(frontend.stop().unwrap(), StopOutcome::DeviceStillOpen);
    assert!(link.symlink_metadata().is_err(), "link remains");
    let block = AlignedBuf::from(&random_bytes(BLOCK_SIZE as usize, 4));
    user.write_all_at(block.as_ref(), 0).unwrap();
    assert!(device.contents(0, BLOCK_SIZE as usize) == block.as_ref());

    let bound = loopdev::backing_file(number).unwrap();
    drop(user);
    until_unbound(&env, number, &bound);
    assert_gone(&env, &backing, &link);
}

#[test]
fn invalid_volume_names_are_refused_before_touching_anything() {
    let env = Env::new(FuseTransport::DevFuse);
    let device = MemDevice::new(MIB);
    for name in ["", "../escape", "a/b", "Upper", ".", "..", "-dash"] {
        let handle = env.runtime.handle().clone();
        let result = FuseFrontend::start(device.clone(), name, &env.options(), handle);
        assert!(
            matches!(result, Err(FrontendError::InvalidVolume(_))),
            "{name:?}"
        );
    }
    assert!(!env.options().run_dir.exists());
    assert!(!env.options().dev_dir.exists());
}
