//! An NFSv3 export as an object store, through a client in this process
//! (no kernel mount): objects are files, `/` in their paths directories.
//! It behaves as `object_store`'s `LocalFileSystem` does on a directory:
//!
//! - a put writes a file of a unique temporary name (`<name>#<digits>`,
//!   which listings skip) with stable (FILE_SYNC) writes, then RENAMEs it
//!   onto the name: readers see the old object or the new one, whole;
//! - a put that must create (`PutMode::Create`, the volume's lock) LINKs
//!   the written file to the name instead, which the server refuses
//!   atomically with NFS3ERR_EXIST if the name is taken, then removes the
//!   temporary name. On a server without hard links it CREATEs the name
//!   GUARDED and writes it (a reader may then see it partly written);
//! - directories are made as a put needs them and never removed;
//! - a get LOOKUPs the path and READs it in the server's transfer size.
//!
//! The server is reached on first use (see `session.rs`), so that a target
//! whose server is down is a store error like any other.

mod error;
mod session;

pub use error::NfsError;
pub use session::Server;

use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use nfs3_client::nfs3_types::nfs3::{fattr3, nfs_fh3, nfsstat3};
use object_store::path::{Path, PathPart};
use object_store::{
    CopyMode, CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload,
    ObjectMeta, ObjectStore, PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use tracing::warn;

use error::STORE;
use session::{Lease, Pool, is_dir, is_file};

/// Directory deletions at once in a `delete_stream`.
const DELETE_PARALLEL: usize = 8;

/// An NFS export as an object store.
#[derive(Clone)]
pub struct NfsStore {
    pool: Arc<Pool>,
}

impl NfsStore {
    /// The store of `server`; nothing is connected until it is used.
    pub fn new(server: Server) -> Self {
        Self {
            pool: Arc::new(Pool::new(server)),
        }
    }
}

impl std::fmt::Display for NfsStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let server = self.pool.server();
        write!(f, "NfsStore(nfs://{}:{})", server.host, server.path)
    }
}

impl std::fmt::Debug for NfsStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// An object's place: the directories leading to it and its name.
struct Place {
    dirs: Vec<String>,
    name: String,
    /// The object's path, for messages.
    path: String,
}

/// The names a path's parts become, refusing what would leave the
/// directory or clash with a temporary file.
fn names(location: &Path) -> Result<Vec<String>, NfsError> {
    location
        .parts()
        .map(|part| {
            let name = part.as_ref();
            check_name(name).map_err(|why| NfsError::Path {
                path: location.to_string(),
                why,
            })?;
            Ok(name.to_owned())
        })
        .collect()
}

/// `object_store` paths never hold `.` or `..` parts; checked all the same,
/// as a file name on the server is no place for doubt.
fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        Err("not a valid name on NFS")
    } else if is_temporary(name) {
        Err("names ending in # and digits are reserved for uploads")
    } else {
        Ok(())
    }
}

fn place(location: &Path) -> Result<Place, NfsError> {
    let mut dirs = names(location)?;
    let name = dirs.pop().ok_or_else(|| NfsError::Path {
        path: location.to_string(),
        why: "an object needs a name",
    })?;
    Ok(Place {
        dirs,
        name,
        path: location.to_string(),
    })
}

/// Whether `name` is an upload's temporary file, as `LocalFileSystem`'s.
fn is_temporary(name: &str) -> bool {
    name.rsplit_once('#')
        .is_some_and(|(_, suffix)| !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit()))
}

fn temporary_name(name: &str) -> String {
    let random = crate::protocol::random();
    let mut nonce = [0; 8];
    nonce.copy_from_slice(&random[..8]);
    format!("{name}#{}", u64::from_le_bytes(nonce))
}

fn meta(location: Path, attributes: &fattr3) -> ObjectMeta {
    let modified = std::time::SystemTime::from(attributes.mtime);
    ObjectMeta {
        location,
        last_modified: modified.into(),
        size: attributes.size,
        e_tag: Some(e_tag(attributes)),
        version: None,
    }
}

/// As `LocalFileSystem`'s: the file, its modification and its size.
fn e_tag(attributes: &fattr3) -> String {
    let mtime = u64::from(attributes.mtime.seconds) * 1_000_000
        + u64::from(attributes.mtime.nseconds) / 1_000;
    format!(
        "\"{:x}-{mtime:x}-{:x}\"",
        attributes.fileid, attributes.size
    )
}

/// What a LOOKUP of a missing object answers.
fn not_found(place: &Place) -> NfsError {
    NfsError::Status {
        procedure: "LOOKUP",
        path: place.path.clone(),
        status: nfsstat3::NFS3ERR_NOENT,
    }
}

impl Lease<'_> {
    /// The handle of directory `dirs` under the target's root; `Ok(None)`
    /// if it does not exist.
    async fn walk(&mut self, dirs: &[String], path: &str) -> Result<Option<nfs_fh3>, NfsError> {
        let mut handle = self.root.clone();
        let parts: Vec<String> = self.prefix.iter().chain(dirs).cloned().collect();
        for name in &parts {
            match self.lookup(&handle, name, path).await {
                Ok((next, _)) => handle = next,
                Err(e) if e.is_not_found() => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Ok(Some(handle))
    }

    /// As [`walk`](Self::walk), making the directories missing.
    async fn make_dirs(&mut self, dirs: &[String], path: &str) -> Result<nfs_fh3, NfsError> {
        let mut handle = self.root.clone();
        let parts: Vec<String> = self.prefix.iter().chain(dirs).cloned().collect();
        for name in &parts {
            handle = match self.lookup(&handle, name, path).await {
                Ok((next, _)) => next,
                Err(e) if e.is_not_found() => {
                    match self.mkdir(&handle, name, path).await {
                        // Made meanwhile by another writer: as good.
                        Err(e) if e.status() != Some(nfsstat3::NFS3ERR_EXIST) => return Err(e),
                        _ => {}
                    }
                    self.lookup(&handle, name, path).await?.0
                }
                Err(e) => return Err(e),
            };
        }
        Ok(handle)
    }

    /// The handle of the directory holding the object at `place`, which
    /// must be there.
    async fn dir_of(&mut self, place: &Place) -> Result<nfs_fh3, NfsError> {
        let dir = self.walk(&place.dirs, &place.path).await?;
        dir.ok_or_else(|| not_found(place))
    }

    /// The handle and attributes of the object at `place`.
    async fn find(&mut self, place: &Place) -> Result<(nfs_fh3, fattr3), NfsError> {
        let dir = self.dir_of(place).await?;
        let (handle, attributes) = self.lookup(&dir, &place.name, &place.path).await?;
        let attributes = match attributes {
            Some(attributes) => attributes,
            None => self.getattr(&handle, &place.path).await?,
        };
        // A directory is no object (as on a local filesystem).
        if !is_file(&attributes) {
            return Err(not_found(place));
        }
        Ok((handle, attributes))
    }

    /// Writes `payload` into `file` from its start; its attributes after.
    async fn write_all(
        &mut self,
        file: &nfs_fh3,
        payload: &PutPayload,
        path: &str,
    ) -> Result<Option<fattr3>, NfsError> {
        let (mut offset, mut unstable, mut after) = (0u64, false, None);
        let chunk = self.wtmax as usize;
        for bytes in payload.iter() {
            let mut rest: &[u8] = bytes;
            while !rest.is_empty() {
                let piece = &rest[..rest.len().min(chunk)];
                let (written, stable, attributes) = self.write(file, offset, piece, path).await?;
                if written == 0 {
                    return Err(NfsError::Path {
                        path: path.to_owned(),
                        why: "the NFS server wrote nothing",
                    });
                }
                let written = (written as usize).min(piece.len());
                rest = &rest[written..];
                offset += written as u64;
                unstable |= !stable;
                after = attributes.or(after);
            }
        }
        if unstable {
            self.commit(file, path).await?;
        }
        Ok(after)
    }

    /// Writes `payload` to a temporary file in `dir` and makes it the
    /// object at `place`: replacing one there, or only if there is none.
    async fn publish(
        &mut self,
        dir: &nfs_fh3,
        place: &Place,
        payload: &PutPayload,
        create: bool,
    ) -> Result<Option<fattr3>, NfsError> {
        let temporary = temporary_name(&place.name);
        let file = self.create(dir, &temporary, false, &place.path).await?;
        let published = match self.write_all(&file, payload, &place.path).await {
            Ok(after) if create => self
                .link(&file, dir, &place.name, &place.path)
                .await
                .map(|()| after),
            Ok(after) => self
                .rename(dir, &temporary, &place.name, &place.path)
                .await
                .map(|()| after),
            Err(e) => Err(e),
        };
        // Renamed, it is gone; linked or failed, it is left to remove.
        let renamed = published.is_ok() && !create;
        if !renamed
            && !self.is_broken()
            && let Err(error) = self.remove(dir, &temporary, &place.path).await
        {
            warn!(%error, "an upload's temporary file is left behind");
        }
        published
    }

    /// A create on a server without hard links: the name made GUARDED,
    /// then written.
    async fn create_guarded(
        &mut self,
        dir: &nfs_fh3,
        place: &Place,
        payload: &PutPayload,
    ) -> Result<Option<fattr3>, NfsError> {
        let file = self.create(dir, &place.name, true, &place.path).await?;
        let written = self.write_all(&file, payload, &place.path).await;
        // Half written, it would be a lock no one could read or break.
        if written.is_err()
            && !self.is_broken()
            && let Err(error) = self.remove(dir, &place.name, &place.path).await
        {
            warn!(%error, "a partly written object is left behind");
        }
        written
    }
}

impl NfsStore {
    async fn put(
        &self,
        location: &Path,
        payload: PutPayload,
        create: bool,
    ) -> object_store::Result<PutResult> {
        let place = place(location)?;
        let mut lease = self.pool.lease().await?;
        let dir = lease.make_dirs(&place.dirs, &place.path).await?;
        let attributes = if create && !lease.links {
            lease.create_guarded(&dir, &place, &payload).await
        } else {
            match lease.publish(&dir, &place, &payload, create).await {
                Err(e) if create && e.status() == Some(nfsstat3::NFS3ERR_NOTSUPP) => {
                    lease.create_guarded(&dir, &place, &payload).await
                }
                result => result,
            }
        }?;
        Ok(PutResult {
            e_tag: attributes.as_ref().map(e_tag),
            version: None,
            extensions: Default::default(),
        })
    }

    /// The bytes `range` of `file`, read a transfer at a time.
    fn read(
        &self,
        file: nfs_fh3,
        range: std::ops::Range<u64>,
        path: String,
    ) -> BoxStream<'static, object_store::Result<Bytes>> {
        let pool = Arc::clone(&self.pool);
        futures::stream::try_unfold(range.start, move |offset| {
            let (pool, file, path) = (Arc::clone(&pool), file.clone(), path.clone());
            async move {
                if offset >= range.end {
                    return Ok(None);
                }
                let mut lease = pool.lease().await?;
                let want = (range.end - offset).min(u64::from(lease.rtmax));
                // Invariant: want is at most rtmax, a u32.
                let want = u32::try_from(want).expect("a read of at most rtmax");
                let data = lease.read(&file, offset, want, &path).await?;
                if data.is_empty() {
                    return Err(NfsError::Path {
                        path,
                        why: "the file ended before the range read",
                    }
                    .into());
                }
                let next = offset + data.len() as u64;
                Ok(Some((Bytes::from(data), next)))
            }
        })
        .boxed()
    }

    async fn delete(&self, location: &Path) -> object_store::Result<()> {
        let place = place(location)?;
        let mut lease = self.pool.lease().await?;
        let dir = lease.dir_of(&place).await?;
        lease.remove(&dir, &place.name, &place.path).await?;
        Ok(())
    }

    async fn get(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        let place = place(location)?;
        let (file, attributes) = self.pool.lease().await?.find(&place).await?;
        let meta = meta(location.clone(), &attributes);
        options.check_preconditions(&meta)?;
        let range = match &options.range {
            Some(range) => range
                .as_range(meta.size)
                .map_err(|e| object_store::Error::Generic {
                    store: STORE,
                    source: Box::new(e),
                })?,
            None => 0..meta.size,
        };
        let payload = if options.head {
            futures::stream::empty().boxed()
        } else {
            self.read(file, range.clone(), place.path)
        };
        Ok(GetResult {
            payload: GetResultPayload::Stream(payload),
            meta,
            range,
            attributes: Default::default(),
            extensions: Default::default(),
        })
    }

    /// The objects and directories right under `prefix`.
    async fn list_one(&self, prefix: Path) -> object_store::Result<ListResult> {
        let dirs = names(&prefix)?;
        let mut lease = self.pool.lease().await?;
        let mut listed = ListResult {
            common_prefixes: Vec::new(),
            objects: Vec::new(),
            extensions: Default::default(),
        };
        let Some(dir) = lease.walk(&dirs, prefix.as_ref()).await? else {
            return Ok(listed);
        };
        for (child, _, attributes) in entries(&mut lease, &prefix, &dir).await? {
            if is_dir(&attributes) {
                listed.common_prefixes.push(child);
            } else if is_file(&attributes) {
                listed.objects.push(meta(child, &attributes));
            }
        }
        listed.common_prefixes.sort();
        Ok(listed)
    }

    /// Every object under `prefix`, depth first.
    async fn list_all(&self, prefix: Option<Path>) -> object_store::Result<Vec<ObjectMeta>> {
        let prefix = prefix.unwrap_or_default();
        let dirs = names(&prefix)?;
        let mut lease = self.pool.lease().await?;
        let Some(start) = lease.walk(&dirs, prefix.as_ref()).await? else {
            return Ok(Vec::new());
        };
        let mut objects = Vec::new();
        let mut pending = vec![(prefix, start)];
        while let Some((path, dir)) = pending.pop() {
            for (child, handle, attributes) in entries(&mut lease, &path, &dir).await? {
                if is_dir(&attributes) {
                    pending.push((child, handle));
                } else if is_file(&attributes) {
                    objects.push(meta(child, &attributes));
                }
            }
        }
        Ok(objects)
    }
}

/// The entries of directory `dir` at `path` but temporary files, with
/// their handles and attributes.
async fn entries(
    lease: &mut Lease<'_>,
    path: &Path,
    dir: &nfs_fh3,
) -> Result<Vec<(Path, nfs_fh3, fattr3)>, NfsError> {
    let mut out = Vec::new();
    for entry in lease.read_dir(dir, path.as_ref()).await? {
        if is_temporary(&entry.name) {
            continue;
        }
        let Ok(part) = PathPart::parse(&entry.name) else {
            warn!(dir = %path, name = %entry.name, "a file whose name is no object path is skipped");
            continue;
        };
        let child = path.clone().join(part);
        let (handle, attributes) = match (entry.handle, entry.attributes) {
            (Some(handle), Some(attributes)) => (handle, attributes),
            _ => match lease.lookup(dir, &entry.name, child.as_ref()).await {
                Ok((handle, Some(attributes))) => (handle, attributes),
                Ok((handle, None)) => {
                    let attributes = lease.getattr(&handle, child.as_ref()).await?;
                    (handle, attributes)
                }
                // Removed since it was listed.
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e),
            },
        };
        out.push((child, handle, attributes));
    }
    Ok(out)
}

#[async_trait::async_trait]
impl ObjectStore for NfsStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if !opts.attributes.is_empty() {
            return Err(not_implemented("put_opts with attributes"));
        }
        match opts.mode {
            PutMode::Overwrite => self.put(location, payload, false).await,
            PutMode::Create => self.put(location, payload, true).await,
            PutMode::Update(_) => Err(not_implemented("put_opts with PutMode::Update")),
        }
    }

    async fn put_multipart_opts(
        &self,
        _location: &Path,
        _opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Err(not_implemented("put_multipart_opts"))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.get(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let store = self.clone();
        locations
            .map(move |location| {
                let store = store.clone();
                async move {
                    let location = location?;
                    store.delete(&location).await?;
                    Ok(location)
                }
            })
            .buffered(DELETE_PARALLEL)
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let (store, prefix) = (self.clone(), prefix.cloned());
        futures::stream::once(async move { store.list_all(prefix).await })
            .map_ok(|objects| futures::stream::iter(objects.into_iter().map(Ok)))
            .try_flatten()
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.list_one(prefix.cloned().unwrap_or_default()).await
    }

    /// A read and a put: NFSv3 has no copy.
    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        let data = self.get(from, GetOptions::default()).await?.bytes().await?;
        let create = matches!(options.mode, CopyMode::Create);
        self.put(to, data.into(), create).await.map(drop)
    }
}

fn not_implemented(operation: &str) -> object_store::Error {
    object_store::Error::NotImplemented {
        operation: operation.to_owned(),
        implementer: STORE.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_names_are_recognised_and_never_taken_for_objects() {
        let temporary = temporary_name("lock");
        assert!(temporary.starts_with("lock#") && is_temporary(&temporary));
        assert_ne!(temporary, temporary_name("lock"));
        assert!(!is_temporary("a#b") && !is_temporary("a#") && !is_temporary("lock"));
        let error = place(&Path::parse("volumes/lock#12").unwrap())
            .err()
            .unwrap();
        assert!(error.to_string().contains("reserved"), "{error}");
        // Path::from encodes the # of a user's name.
        assert!(place(&Path::from("volumes/lock#12")).is_ok());
    }

    #[test]
    fn names_that_would_leave_a_directory_are_refused() {
        for name in [".", "..", "", "a/b", "a\0"] {
            assert!(check_name(name).is_err(), "{name:?}");
        }
        assert_eq!(check_name("b.json"), Ok(()));
    }

    #[test]
    fn a_path_becomes_directories_and_a_name() {
        let place = place(&Path::from("volumes/v/backups/b.json")).unwrap();
        assert_eq!(place.dirs, ["volumes", "v", "backups"]);
        assert_eq!(place.name, "b.json");
        assert!(
            super::place(&Path::default()).is_err(),
            "the root is no object"
        );
    }

    #[test]
    fn e_tags_change_with_the_file() {
        let mut attributes = fattr3 {
            type_: nfs3_client::nfs3_types::nfs3::ftype3::NF3REG,
            mode: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            size: 10,
            used: 10,
            rdev: Default::default(),
            fsid: 1,
            fileid: 42,
            atime: Default::default(),
            mtime: Default::default(),
            ctime: Default::default(),
        };
        let before = e_tag(&attributes);
        attributes.size = 11;
        assert_ne!(before, e_tag(&attributes));
        assert_eq!(meta(Path::from("a"), &attributes).size, 11);
    }
}
