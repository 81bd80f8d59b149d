//! A standby (disaster-recovery) volume's recovery time and data lag: a
//! 1 GiB source volume (2 replicas, 512 MiB written) on two `oxhorn
//! manager` nodes, backed up to MinIO on loopback every minute while 8 MiB
//! of it is rewritten every 10 s; a 1 GiB standby (2 replicas) follows
//! the backups. Half a minute after the third backup (the middle of an
//! interval: the average case) the source is given up for lost, the
//! standby is activated and attached on the other node, and read back
//! whole against the source as it was at the backup it holds.
//!
//! Prints, for each backup: its upload time, how long after its
//! completion the standby held it, and what that restore wrote; then the
//! recovery time (the activation asked until the standby is activated, and
//! until it is attached and serving) and the data lag (the last backup the
//! standby holds was asked this long before the source was lost: the
//! writes since are what is lost). Backups here are made in the standby's
//! own cluster, so no sync of the BackupTarget delays it following them;
//! across clusters, add up to the target's pollInterval.
//!
//!     cargo bench --bench standby

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use oxhorn::backup::block_checksum;
use oxhorn::types::{
    Backup, BackupState, BackupTarget, Engine, Setting, SettingSpec, StandbyStatus, Volume,
    VolumeState,
};
use oxhorn_testbed::{
    self as testbed, ControlPlane, MINIO_ACCESS_KEY, MINIO_SECRET_KEY, ManagerOptions,
    ManagerProcess, ObjectServer, ObjectServerKind,
};
use serde_json::json;

const GIB: u64 = 1 << 30;
const WRITTEN: u64 = 512 << 20;
const BLOCK: u64 = 2 << 20;
const BACKUP_EVERY: Duration = Duration::from_secs(60);
const CHURN_EVERY: Duration = Duration::from_secs(10);
const CHURN: u64 = 8 << 20;
const BACKUPS: usize = 3;
const BUCKET: &str = "standby";
/// The nodes' addresses, of their own: the tests take 127.0.x.y, the
/// scale bench 127.2.0.1.
const SUBNET: [u8; 3] = [127, 3, 0];
const PATIENCE: Duration = Duration::from_secs(600);

#[tokio::main]
async fn main() {
    let oxhorn = Path::new(env!("CARGO_BIN_EXE_oxhorn"));
    let work = tempfile::Builder::new()
        .prefix("oxhorn-bench-")
        .tempdir_in("/var/tmp")
        .expect("work dir");
    let minio = ObjectServer::start(
        ObjectServerKind::Minio,
        &work.path().join("minio"),
        &[BUCKET],
    )
    .expect("minio");
    let control_plane = ControlPlane::start().await.expect("control plane");
    let client = control_plane.client().expect("client");
    let ns = format!("standby-{}", std::process::id());
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let mut namespace = k8s_openapi::api::core::v1::Namespace::default();
    namespace.metadata.name = Some(ns.clone());
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace");
    let api = Apis::new(&client, &ns);
    let minimal = Setting::new(
        "storage-minimal-available-percentage",
        SettingSpec { value: "1".into() },
    );
    api.settings
        .create(&PostParams::default(), &minimal)
        .await
        .expect("setting");
    let mut managers = Vec::new();
    for i in 1..=2u8 {
        let node = format!("{ns}-n{i}");
        testbed::register_kube_node(&client, &node, &[])
            .await
            .expect("kube node");
        let mut options = ManagerOptions::new(control_plane.kubeconfig(), &node, &ns);
        options.ip = IpAddr::from([SUBNET[0], SUBNET[1], SUBNET[2], i]);
        let mut manager = ManagerProcess::start(oxhorn, options).expect("manager");
        manager
            .connect(Duration::from_secs(60))
            .await
            .expect("manager serving");
        managers.push((node, manager));
    }
    make_target(&client, &ns, &minio).await;

    let (source_node, standby_node) = (managers[0].0.clone(), managers[1].0.clone());
    create_volume(&api, "src", json!({"size": GIB, "numberOfReplicas": 2})).await;
    let device = attach(&api, "src", &source_node).await;
    let mut image = vec![0u8; GIB as usize];
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let started = Instant::now();
    write_at(&device, &mut image, 0, WRITTEN, &mut seed);
    println!(
        "wrote {} MiB to the source in {:.1} s",
        WRITTEN >> 20,
        started.elapsed().as_secs_f64()
    );

    let mut held = checksums(&image);
    let (took, _) = back_up(&api, "b0").await;
    println!("b0 (full): uploaded in {took:.1} s");
    create_volume(
        &api,
        "dr",
        json!({"size": GIB, "numberOfReplicas": 2, "fromBackup": "b0", "standby": true}),
    )
    .await;
    let (after, step) = until_holds(&api, "dr", "b0", Instant::now()).await;
    println!("standby: holds b0 {after:.1} s after it was created; {step}");

    let mut next_backup = Instant::now() + BACKUP_EVERY;
    let mut last_asked = Instant::now();
    for i in 1..=BACKUPS {
        churn_until(&device, &mut image, &mut seed, next_backup);
        let name = format!("b{i}");
        last_asked = Instant::now();
        held = checksums(&image);
        let (took, completed) = back_up(&api, &name).await;
        let (after, step) = until_holds(&api, "dr", &name, completed).await;
        println!("{name}: uploaded in {took:.1} s; the standby held it {after:.1} s after; {step}");
        next_backup += BACKUP_EVERY;
    }
    churn_until(
        &device,
        &mut image,
        &mut seed,
        last_asked + BACKUP_EVERY / 2,
    );
    let lost = Instant::now();
    let lag = lost - last_asked;

    // Disaster: the source is given up; the standby takes over.
    let asked = Instant::now();
    api.volumes
        .patch(
            "dr",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"standby": false}})),
        )
        .await
        .expect("activate");
    let activation = until(&api, "dr", |v| {
        let standby = v.status.as_ref()?.standby.as_ref()?;
        standby.activation.as_ref()?.activated_at.as_ref()?;
        standby.activation.clone()
    })
    .await;
    let activated = asked.elapsed();
    let device = attach(&api, "dr", &standby_node).await;
    let serving = asked.elapsed();
    let read = checksums(&read_device(&device, &work.path().join("dr.img")));
    assert!(
        read == held,
        "the activated standby differs from the last backup"
    );
    println!(
        "activation of a 1 GiB standby: activated {:.1} s after it was asked (its status: {} ms), attached and serving after {:.1} s; read back whole: identical to the source at its last backup",
        activated.as_secs_f64(),
        activation.duration_millis,
        serving.as_secs_f64()
    );
    println!(
        "data lag: the last backup held was asked {:.1} s before the source was lost (backups every {} s: at most one interval plus the backup's upload and the standby's restore)",
        lag.as_secs_f64(),
        BACKUP_EVERY.as_secs()
    );
    drop(managers);
}

/// The APIs of the bench's namespace.
struct Apis {
    volumes: Api<Volume>,
    backups: Api<Backup>,
    engines: Api<Engine>,
    settings: Api<Setting>,
}

impl Apis {
    fn new(client: &Client, ns: &str) -> Self {
        Self {
            volumes: Api::namespaced(client.clone(), ns),
            backups: Api::namespaced(client.clone(), ns),
            engines: Api::namespaced(client.clone(), ns),
            settings: Api::namespaced(client.clone(), ns),
        }
    }
}

async fn make_target(client: &Client, ns: &str, minio: &ObjectServer) {
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), ns);
    let secret = serde_json::from_value(json!({
        "metadata": {"name": "creds"},
        "stringData": {
            "AWS_ACCESS_KEY_ID": MINIO_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": MINIO_SECRET_KEY,
            "AWS_ENDPOINTS": minio.endpoint(),
        },
    }))
    .expect("secret");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
    let target = BackupTarget::new(
        "default",
        serde_json::from_value(json!({
            "backupTargetURL": format!("s3://{BUCKET}@us-east-1/bench"),
            "credentialSecret": "creds",
            "pollInterval": "300s",
        }))
        .expect("target"),
    );
    Api::<BackupTarget>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &target)
        .await
        .expect("target");
}

async fn create_volume(api: &Apis, name: &str, spec: serde_json::Value) {
    let volume = Volume::new(name, serde_json::from_value(spec).expect("spec"));
    api.volumes
        .create(&PostParams::default(), &volume)
        .await
        .expect("volume");
}

/// Waits until `check` finds what it looks for in volume `name`.
async fn until<T>(api: &Apis, name: &str, check: impl Fn(&Volume) -> Option<T>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(volume) = api.volumes.get_opt(name).await.expect("volume")
            && let Some(found) = check(&volume)
        {
            return found;
        }
        assert!(Instant::now() < deadline, "volume {name}: timed out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Attaches `name` to `node`; its device.
async fn attach(api: &Apis, name: &str, node: &str) -> String {
    api.volumes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeID": node}})),
        )
        .await
        .expect("attach");
    until(api, name, |v| {
        (v.status.as_ref()?.state == VolumeState::Attached).then_some(())
    })
    .await;
    let engine = api.engines.get(&format!("{name}-e")).await.expect("engine");
    engine.status.expect("engine status").endpoint
}

/// Backs `src` up as `name`: seconds until completed, and when.
async fn back_up(api: &Apis, name: &str) -> (f64, Instant) {
    let backup = Backup::new(
        name,
        serde_json::from_value(json!({"volumeName": "src"})).expect("backup"),
    );
    let started = Instant::now();
    api.backups
        .create(&PostParams::default(), &backup)
        .await
        .expect("backup");
    loop {
        let status = api.backups.get(name).await.expect("backup").status;
        if status
            .as_ref()
            .is_some_and(|s| s.state == BackupState::Completed)
        {
            return (started.elapsed().as_secs_f64(), Instant::now());
        }
        assert!(
            started.elapsed() < PATIENCE,
            "backup {name}: timed out: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until standby `name` holds `backup`: the seconds since `since`,
/// and what its last restore did.
async fn until_holds(api: &Apis, name: &str, backup: &str, since: Instant) -> (f64, String) {
    let standby: StandbyStatus = until(api, name, |v| {
        let standby = v.status.as_ref()?.standby.as_ref()?;
        (standby.last_restored_backup == backup && standby.applying.is_none())
            .then(|| standby.clone())
    })
    .await;
    let step = standby.last_step.expect("a restore");
    let note = format!(
        "its restore ({:?}) wrote {} blocks ({} MiB), zeroed {}, in {} ms",
        step.method,
        step.blocks_written,
        step.bytes_restored >> 20,
        step.blocks_zeroed,
        step.duration_millis
    );
    (since.elapsed().as_secs_f64(), note)
}

/// Rewrites CHURN bytes at a pseudo-random block every CHURN_EVERY until
/// `until`.
fn churn_until(device: &str, image: &mut [u8], seed: &mut u64, until: Instant) {
    loop {
        let now = Instant::now();
        if now >= until {
            return;
        }
        let blocks = GIB / BLOCK;
        let at = next(seed) % (blocks - CHURN / BLOCK) * BLOCK;
        write_at(device, image, at, CHURN, seed);
        std::thread::sleep(CHURN_EVERY.min(until.saturating_duration_since(Instant::now())));
    }
}

fn next(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *seed >> 11
}

/// Writes `len` bytes of noise at `offset` of `device` (direct I/O, then
/// synced), and into `image`.
fn write_at(device: &str, image: &mut [u8], offset: u64, len: u64, seed: &mut u64) {
    let (start, end) = (offset as usize, (offset + len) as usize);
    for chunk in image[start..end].chunks_mut(8) {
        let value = next(seed).to_le_bytes();
        chunk.copy_from_slice(&value[..chunk.len()]);
    }
    let file = tempfile::NamedTempFile::new_in("/var/tmp").expect("temp file");
    std::fs::write(file.path(), &image[start..end]).expect("write temp file");
    dd(&[
        &format!("if={}", file.path().display()),
        &format!("of={device}"),
        "bs=1M",
        &format!("seek={}", offset >> 20),
        "oflag=direct",
        "conv=fsync,notrunc",
    ]);
}

/// The whole of `device`, read with direct I/O through `scratch`.
fn read_device(device: &str, scratch: &Path) -> Vec<u8> {
    dd(&[
        &format!("if={device}"),
        &format!("of={}", scratch.display()),
        "bs=2M",
        "iflag=direct",
    ]);
    std::fs::read(scratch).expect("read scratch")
}

fn dd(args: &[&str]) {
    let output = Command::new("dd")
        .args(args)
        .arg("status=none")
        .output()
        .expect("dd");
    assert!(
        output.status.success(),
        "dd {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Each 2 MiB block's checksum.
fn checksums(image: &[u8]) -> Vec<String> {
    image.chunks(BLOCK as usize).map(block_checksum).collect()
}
