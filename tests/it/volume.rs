//! A volume end to end: three `oxhorn replica` processes, an `oxhorn engine`
//! process exposing the volume through FUSE and a loop device, a real
//! filesystem on it. Replicas and the engine are killed with SIGKILL along
//! the way; the filesystem must come out clean and hold every file.
//!
//! The filesystems, ext4 and xfs, are checked with their own checkers.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use oxhorn::protocol::control::{
    AddReplicaRequest, EngineStatusRequest, ExpandRequest, ReplicaMode,
};
use oxhorn::protocol::{Access, Key};
use oxhorn_testbed::{EngineProcess, Mounted, ReplicaProcess};

use crate::common::{OXHORN, eventually, require_root, run};
/// xfs wants at least 300 MiB.
const SIZE: u64 = 320 << 20;
const PATIENCE: Duration = Duration::from_secs(60);

fn mkfs(fstype: &str, device: &str) {
    match fstype {
        "ext4" => run("mkfs.ext4", &["-q", "-F", device]),
        _ => run("mkfs.xfs", &["-q", "-f", device]),
    }
}

/// The filesystem checker's read-only verdict must be "clean".
fn fsck(fstype: &str, device: &str) {
    match fstype {
        "ext4" => run("e2fsck", &["-f", "-n", device]),
        _ => run("xfs_repair", &["-n", device]),
    }
}

/// Writes `count` files of varied sizes under `dir`, returning their contents.
fn write_files(dir: &Path, prefix: &str, count: usize, seed: u64) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut state = seed;
    for i in 0..count {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let len = 4096 + (state >> 40) as usize % (3 << 20);
        let data: Vec<u8> = (0..len)
            .map(|j| (state.wrapping_add(j as u64 * 2654435761) >> 32) as u8)
            .collect();
        let name = format!("{prefix}-{i}");
        std::fs::write(dir.join(&name), &data).unwrap();
        files.insert(name, data);
    }
    run("sync", &[]);
    files
}

fn check_files(dir: &Path, files: &BTreeMap<String, Vec<u8>>) {
    for (name, data) in files {
        let read = std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(read == *data, "{name} differs after remount");
    }
}

/// Waits until the kernel sees the block device at `size` bytes.
async fn until_device_size(device: &str, size: u64) {
    let name = Path::new(device)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let bytes = || {
        let sectors: u64 = std::fs::read_to_string(format!("/sys/block/{name}/size"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        sectors * 512
    };
    if let Err(e) = eventually(PATIENCE, || async { (bytes() == size).then_some(()) }).await {
        panic!("{e}: {device} stayed at {} bytes", bytes());
    }
}

async fn until_all_rw(engine: &EngineProcess, count: usize) {
    let mut client = engine.client().await.unwrap();
    let all_rw = eventually(PATIENCE, || {
        let mut client = client.clone();
        async move {
            let status = client
                .status(EngineStatusRequest {})
                .await
                .unwrap()
                .into_inner();
            let rw = status
                .replicas
                .iter()
                .filter(|r| r.mode() == ReplicaMode::Rw)
                .count();
            (rw == count && status.replicas.len() == count).then_some(())
        }
    })
    .await;
    if let Err(e) = all_rw {
        let status = client.status(EngineStatusRequest {}).await.unwrap();
        panic!("{e}: replicas never all RW: {:#?}", status.into_inner());
    }
}

async fn a_filesystem_survives_replica_and_engine_crashes(fstype: &str) {
    require_root();
    let work = tempfile::tempdir().unwrap();
    let volume = format!("vol-{fstype}");
    let access = Access {
        volume: volume.clone(),
        key: Key::generate().for_volume(&volume),
        generation: 1,
    };
    let mut replicas: Vec<ReplicaProcess> = (0..3)
        .map(|i| {
            let dir = work.path().join(format!("r{i}"));
            ReplicaProcess::spawn(Path::new(OXHORN), &dir, SIZE, &access).unwrap()
        })
        .collect();
    for replica in &mut replicas {
        replica.wait_serving(PATIENCE).await.unwrap();
    }
    let addresses: Vec<String> = replicas.iter().map(ReplicaProcess::address).collect();
    let mut engine =
        EngineProcess::spawn(Path::new(OXHORN), work.path(), &access, SIZE, &addresses).unwrap();
    let device = engine.wait_device(PATIENCE).await.unwrap();
    let device = device.to_str().unwrap().to_string();
    until_all_rw(&engine, 3).await;

    mkfs(fstype, &device);
    let mount_point = work.path().join("mnt");
    let mounted = Mounted::new(Path::new(&device), &mount_point, fstype, None).unwrap();
    let mut files = write_files(&mount_point, "before", 12, 1);

    // A replica dies while files are written; the filesystem never notices.
    replicas[1].kill();
    files.extend(write_files(&mount_point, "degraded", 12, 2));
    replicas[1].start().unwrap();
    replicas[1].wait_serving(PATIENCE).await.unwrap();
    let mut control = engine.client().await.unwrap();
    control
        .add_replica(AddReplicaRequest {
            address: addresses[1].clone(),
        })
        .await
        .unwrap();
    files.extend(write_files(&mount_point, "rebuilding", 8, 3));
    until_all_rw(&engine, 3).await;
    check_files(&mount_point, &files);
    mounted.unmount().unwrap();
    fsck(fstype, &device);

    // The engine crashes; a new one serves the same data.
    engine.kill();
    engine.start().unwrap();
    let device = engine.wait_device(PATIENCE).await.unwrap();
    let device = device.to_str().unwrap().to_string();
    until_all_rw(&engine, 3).await;
    fsck(fstype, &device);
    let mounted = Mounted::new(Path::new(&device), &mount_point, fstype, None).unwrap();
    check_files(&mount_point, &files);

    // Online expansion: the block device grows under the mounted filesystem.
    let before = nix::sys::statvfs::statvfs(&mount_point).unwrap().blocks();
    let mut control = engine.client().await.unwrap();
    let grown = SIZE + (64 << 20);
    control.expand(ExpandRequest { size: grown }).await.unwrap();
    until_device_size(&device, grown).await;
    let mounted = match fstype {
        // This kernel refuses ext4's online resize ioctl (EPERM): grow it
        // unmounted; the device itself grew while mounted.
        "ext4" => {
            mounted.unmount().unwrap();
            // -p records the check resize2fs asks for; exit 0 means clean.
            run("e2fsck", &["-f", "-p", &device]);
            run("resize2fs", &[&device]);
            Mounted::new(Path::new(&device), &mount_point, fstype, None).unwrap()
        }
        _ => {
            run("xfs_growfs", &[mount_point.to_str().unwrap()]);
            mounted
        }
    };
    let after = nix::sys::statvfs::statvfs(&mount_point).unwrap().blocks();
    assert!(
        after > before,
        "filesystem did not grow: {before} -> {after} blocks"
    );
    files.extend(write_files(&mount_point, "grown", 4, 4));
    check_files(&mount_point, &files);
    mounted.unmount().unwrap();
    fsck(fstype, &device);
    let status = engine.stop().unwrap();
    assert!(status.success(), "engine exit {status}:\n{}", engine.log());
    assert!(!engine.device_link.exists(), "device link left behind");
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let root = work.path().to_str().unwrap();
    assert!(
        !mounts.contains(root),
        "mounts left behind:\n{mounts}\n{}",
        engine.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext4_survives_replica_and_engine_crashes() {
    a_filesystem_survives_replica_and_engine_crashes("ext4").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xfs_survives_replica_and_engine_crashes() {
    a_filesystem_survives_replica_and_engine_crashes("xfs").await;
}
