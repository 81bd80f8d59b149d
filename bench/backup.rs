//! Backup and restore speed against MinIO on loopback: a 1 GiB volume (one
//! `oxhorn replica` behind an engine) with 512 MiB of incompressible data
//! written, backed up from a snapshot through the replica's control API as
//! the Backup controller does, and restored into a file. The baseline, in
//! the same invocation against the same server: the same 2 MiB pieces read
//! from the replica the same way and put as plain objects, four at once,
//! then got back into a file (each object read once untimed first: the
//! first read after a write is slower). Each is timed after a `sync`, three
//! times in turn, and the medians compared. Then 1% of the volume's blocks are rewritten
//! and an incremental backup taken. Prints the times and the ratios
//! (targets: backup and restore >= 0.7 of plain; the incremental under 10%
//! of the full backup's time).
//!
//!     cargo bench --bench backup

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use oxhorn::backup::{BLOCK_SIZE, Backupstore, Compression, NewBackup, VolumeReader, VolumeWriter};
use oxhorn::controller::backup::SnapshotReader;
use oxhorn::engine::Engine;
use oxhorn::frontend::BlockDevice;
use oxhorn::protocol::control::ReplicaStatusRequest;
use oxhorn::protocol::control::replica_control_client::ReplicaControlClient;
use oxhorn::protocol::{Access, Key};
use oxhorn_testbed::{
    MINIO_ACCESS_KEY, MINIO_SECRET_KEY, ObjectServer, ObjectServerKind, ReplicaProcess,
};

const SIZE: u64 = 1 << 30;
const WRITTEN: u64 = 512 << 20;
/// Pieces in flight in the baseline: as many as the store's uploads.
const PARALLEL: usize = 8;
const BUCKET: &str = "bench";
/// Each comparison is run this many times, alternating: the machine is
/// noisy, and the median is what is printed.
const ROUNDS: usize = 3;

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
    let access = Access {
        volume: "bench".into(),
        key: Key::generate().for_volume("bench"),
        generation: 1,
    };
    let mut replica = ReplicaProcess::spawn(oxhorn, &work.path().join("replica"), SIZE, &access)
        .expect("replica");
    replica
        .wait_serving(Duration::from_secs(30))
        .await
        .expect("replica serving");
    let engine = Engine::start(&access, SIZE, &[replica.address()], false)
        .await
        .expect("engine");
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for at in (0..WRITTEN).step_by(BLOCK_SIZE as usize) {
        engine
            .write(at, noise(&mut seed, BLOCK_SIZE))
            .await
            .expect("write");
    }
    engine.flush().await.expect("flush");
    engine.snapshot("full", true).await.expect("snapshot");

    let secret = BTreeMap::from([
        ("AWS_ACCESS_KEY_ID".to_owned(), MINIO_ACCESS_KEY.to_owned()),
        (
            "AWS_SECRET_ACCESS_KEY".to_owned(),
            MINIO_SECRET_KEY.to_owned(),
        ),
        ("AWS_ENDPOINTS".to_owned(), minio.endpoint()),
    ]);
    // A store of its own per round, so that each backup uploads everything.
    let stores: Vec<Backupstore> = (0..ROUNDS)
        .map(|round| {
            let url = format!("s3://{BUCKET}@us-east-1/backups-{round}");
            oxhorn::backup::target::open(&url, "bench", &secret).expect("store")
        })
        .collect();
    let plain = plain_store(&minio);
    let control = control_client(&replica, &access).await;
    let restore_to = work.path().join("restored.img");

    println!(
        "backup of a {} MiB volume with {} MiB written, to MinIO on loopback; medians of {ROUNDS} rounds",
        SIZE >> 20,
        WRITTEN >> 20
    );
    let reader = reader_at(&control, "full").await;
    let (mut backups, mut uploads, mut restores, mut downloads) = (vec![], vec![], vec![], vec![]);
    // Each phase starts with nothing left to write back from the one
    // before: MinIO's writes would otherwise land in the next one's time.
    for (round, store) in stores.iter().enumerate() {
        sync();
        backups.push(timed_backup(store, &reader, "full", None).await.0);
        sync();
        uploads.push(plain_upload(&*plain, &reader, round).await);
    }
    // The first read of an object after its write is slower: every one is
    // read once, untimed, first.
    for (round, store) in stores.iter().enumerate() {
        timed_restore(store, "full", &restore_to).await;
        plain_download(&*plain, &restore_to, round).await;
    }
    for (round, store) in stores.iter().enumerate() {
        sync();
        restores.push(timed_restore(store, "full", &restore_to).await);
        sync();
        downloads.push(plain_download(&*plain, &restore_to, round).await);
    }
    let (backup, upload) = (median(&mut backups), median(&mut uploads));
    let (restore, download) = (median(&mut restores), median(&mut downloads));
    println!(
        "backup: {backup:.2} s; plain upload: {upload:.2} s; ratio {:.2} (backups {backups:.2?}, uploads {uploads:.2?})",
        upload / backup
    );
    println!(
        "restore: {restore:.2} s; plain download: {download:.2} s; ratio {:.2} (restores {restores:.2?}, downloads {downloads:.2?})",
        download / restore
    );

    // 1% of the volume's blocks, spread over it, rewritten.
    let blocks = SIZE / BLOCK_SIZE;
    let changed = blocks.div_ceil(100);
    for i in 0..changed {
        let at = (i * blocks / changed) * BLOCK_SIZE;
        engine
            .write(at, noise(&mut seed, BLOCK_SIZE))
            .await
            .expect("write");
    }
    engine.flush().await.expect("flush");
    engine.snapshot("next", true).await.expect("snapshot");
    sync();
    let reader = reader_at(&control, "next").await;
    let (incremental, uploaded) = timed_backup(&stores[0], &reader, "next", Some("full")).await;
    let incremental = incremental.as_secs_f64();
    println!(
        "incremental after {changed} of {blocks} blocks changed: {incremental:.2} s ({uploaded} uploaded), {:.1}% of the full backup's time",
        100.0 * incremental / backup
    );
    drop(engine);
}

/// The median of `times`, in seconds.
fn median(times: &mut [Duration]) -> f64 {
    times.sort();
    times[times.len() / 2].as_secs_f64()
}

fn sync() {
    let status = std::process::Command::new("sync").status().expect("sync");
    assert!(status.success());
}

/// `len` bytes of xorshift noise: incompressible, as most data at rest is.
fn noise(state: &mut u64, len: u64) -> Bytes {
    let mut out = Vec::with_capacity(len as usize);
    while (out.len() as u64) < len {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    Bytes::from(out)
}

async fn control_client(
    replica: &ReplicaProcess,
    access: &Access,
) -> ReplicaControlClient<oxhorn::protocol::TokenChannel> {
    let address = replica.address();
    let (host, port) = address.rsplit_once(':').expect("host:port");
    let port: u16 = port.parse().expect("port");
    let control = format!(
        "{host}:{}",
        oxhorn::protocol::control_port(port).expect("control port")
    );
    let channel = oxhorn::protocol::control_endpoint(&control)
        .expect("endpoint")
        .connect()
        .await
        .expect("control");
    ReplicaControlClient::new(oxhorn::protocol::with_token(channel, access))
        .max_decoding_message_size(64 << 20)
}

async fn reader_at(
    control: &ReplicaControlClient<oxhorn::protocol::TokenChannel>,
    snapshot: &str,
) -> SnapshotReader {
    let status = control
        .clone()
        .status(ReplicaStatusRequest {})
        .await
        .expect("status")
        .into_inner();
    let chain: Vec<String> = status.snapshots.iter().map(|s| s.name.clone()).collect();
    SnapshotReader::new(control.clone(), &chain, snapshot)
        .await
        .expect("layers")
        .expect("the snapshot")
}

async fn timed_backup(
    store: &Backupstore,
    reader: &SnapshotReader,
    name: &str,
    previous: Option<&str>,
) -> (Duration, usize) {
    let changed = reader.changed(previous);
    let labels = BTreeMap::new();
    let request = NewBackup {
        volume: "bench",
        name,
        snapshot: name,
        size: SIZE,
        previous,
        changed: &changed,
        owner: "bench",
        labels: &labels,
        compression: Compression::default(),
        progress: None,
    };
    let started = Instant::now();
    let report = store.create(&request, reader).await.expect("backup");
    (started.elapsed(), report.blocks_uploaded)
}

/// Writes restored blocks into a file.
struct FileWriter(std::fs::File);

impl VolumeWriter for FileWriter {
    async fn write(&self, offset: u64, data: Bytes) -> std::io::Result<()> {
        self.0.write_all_at(&data, offset)
    }
}

async fn timed_restore(store: &Backupstore, name: &str, to: &Path) -> Duration {
    let file = std::fs::File::create(to).expect("restore file");
    file.set_len(SIZE).expect("size");
    let started = Instant::now();
    store
        .restore("bench", name, &FileWriter(file))
        .await
        .expect("restore");
    started.elapsed()
}

fn plain_store(minio: &ObjectServer) -> Arc<dyn ObjectStore> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let s3 = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(BUCKET)
        .with_region("us-east-1")
        .with_access_key_id(MINIO_ACCESS_KEY)
        .with_secret_access_key(MINIO_SECRET_KEY)
        .with_endpoint(minio.endpoint())
        .with_allow_http(true)
        .build()
        .expect("plain s3");
    Arc::new(s3)
}

fn piece(round: usize, at: u64) -> ObjectPath {
    ObjectPath::from(format!("plain-{round}/{at:012}"))
}

/// The written pieces read from the replica and put as they are.
async fn plain_upload(store: &dyn ObjectStore, reader: &SnapshotReader, round: usize) -> Duration {
    let started = Instant::now();
    futures::stream::iter((0..WRITTEN).step_by(BLOCK_SIZE as usize))
        .map(|at| async move {
            let data = reader.read(at, BLOCK_SIZE).await.expect("read");
            store.put(&piece(round, at), data.into()).await.map(drop)
        })
        .buffer_unordered(PARALLEL)
        .try_collect::<Vec<()>>()
        .await
        .expect("plain upload");
    started.elapsed()
}

/// The pieces got back and written into a file.
async fn plain_download(store: &dyn ObjectStore, to: &Path, round: usize) -> Duration {
    let file = std::fs::File::create(to).expect("download file");
    file.set_len(SIZE).expect("size");
    let file = &file;
    let started = Instant::now();
    futures::stream::iter((0..WRITTEN).step_by(BLOCK_SIZE as usize))
        .map(|at| async move {
            let data = store.get(&piece(round, at)).await?.bytes().await?;
            file.write_all_at(&data, at)
                .map_err(|e| object_store::Error::Generic {
                    store: "file",
                    source: Box::new(e),
                })
        })
        .buffer_unordered(PARALLEL)
        .try_collect::<Vec<()>>()
        .await
        .expect("plain download");
    started.elapsed()
}
