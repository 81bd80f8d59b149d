//! Operations on the layer chain: snapshot, list, remove, revert, expand.
//!
//! Each one builds the new files first and then commits with one atomic
//! metadata replacement; files the committed chain no longer references are
//! deleted afterwards, or by the next `open` if we crash first. The chain is
//! always linear: see [`ReplicaStore::revert`].

use std::collections::BTreeMap;
use std::fs;
use std::mem;

use super::error::{Result, StorageError};
use super::layer::Layer;
use super::lock;
use super::meta::{LayerMeta, check_size};
use super::naming::{
    VOLUME_HEAD, checksum_file, companion_files, head_file, head_index_of, intent_file,
    snapshot_file, snapshot_name_of, validate_snapshot_name,
};
use super::store::{ReplicaStore, State};

/// A snapshot as reported to the engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub name: String,
    /// The next older snapshot.
    pub parent: Option<String>,
    /// The next newer snapshot, or [`VOLUME_HEAD`] for the newest.
    pub children: Vec<String>,
    /// Seconds since the Unix epoch.
    pub created: u64,
    pub user_created: bool,
    /// Bytes held by the snapshot's own layer (not the whole volume).
    pub size: u64,
    pub labels: BTreeMap<String, String>,
}

/// The snapshot name of a snapshot layer. Snapshot layers are only ever
/// created or opened under validated `snap-<name>.img` file names, so the
/// fallback to the file name is never taken.
fn snapshot_name(layer: &Layer) -> String {
    snapshot_name_of(&layer.file_name)
        .unwrap_or(&layer.file_name)
        .to_string()
}

impl State {
    pub(super) fn find_snapshot(&self, name: &str) -> Result<usize> {
        let file = snapshot_file(name);
        self.snapshots
            .iter()
            .position(|layer| layer.file_name == file)
            .ok_or_else(|| StorageError::SnapshotNotFound(name.to_string()))
    }

    /// Metadata for the head replacing the current one: the next index.
    /// The current head's name was validated, so it always has an index.
    fn next_head(&self, parent: String) -> LayerMeta {
        let index = head_index_of(&self.head.file_name).unwrap_or(0) + 1;
        LayerMeta::new(head_file(index), parent, false, BTreeMap::new())
    }
}

impl ReplicaStore {
    /// Freezes the head as snapshot `name` and starts a new empty head.
    ///
    /// The head file (with its checksums) is hard-linked under the
    /// snapshot's name, the new head created, and `volume.meta` switched to
    /// it (the commit); only then is the old head name unlinked. Before the
    /// commit the old layout is intact.
    pub fn snapshot(
        &self,
        name: &str,
        user_created: bool,
        labels: BTreeMap<String, String>,
    ) -> Result<()> {
        validate_snapshot_name(name)?;
        let mut state = lock::write(&self.state)?;
        // A staged layer (a rebuild filling it) owns the name's file too.
        if state.find_snapshot(name).is_ok() || state.staged.contains_key(name) {
            return Err(StorageError::SnapshotExists(name.to_string()));
        }
        self.flush_locked(&state)?;
        let snap_file = snapshot_file(name);
        let snap_meta = LayerMeta::new(
            snap_file.clone(),
            state.head.meta.parent.clone(),
            user_created,
            labels,
        );
        // No write is in flight: the head's checksums are all current.
        state.head.settle()?;
        snap_meta.save(&self.dir)?;
        for (from, to) in [
            (state.head.file_name.clone(), snap_file.clone()),
            (
                checksum_file(&state.head.file_name),
                checksum_file(&snap_file),
            ),
            (intent_file(&state.head.file_name), intent_file(&snap_file)),
        ] {
            self.dir.remove_if_exists(&to)?;
            let to = self.dir.join(&to);
            fs::hard_link(self.dir.join(&from), &to).map_err(|e| StorageError::io(&to, e))?;
        }
        let new_head = Layer::create(
            &self.dir,
            state.meta.size,
            state.next_head(snap_file.clone()),
        )?;
        state.update_meta(&self.dir, |meta| {
            meta.head.clone_from(&new_head.file_name);
            meta.parent = snap_file;
        })?;

        let mut old_head = mem::replace(&mut state.head, new_head);
        let old_name = mem::take(&mut old_head.file_name);
        old_head.rename(&self.dir, snap_meta);
        state.snapshots.push(old_head);
        drop(state);
        self.delete_layer_files(&[old_name]);
        Ok(())
    }

    /// Snapshots, oldest first.
    pub fn snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        let state = lock::read(&self.state)?;
        let names: Vec<String> = state.snapshots.iter().map(snapshot_name).collect();
        let mut infos = Vec::with_capacity(names.len());
        for (i, layer) in state.snapshots.iter().enumerate() {
            let child = names.get(i + 1).map_or(VOLUME_HEAD, String::as_str);
            infos.push(SnapshotInfo {
                name: names[i].clone(),
                parent: i.checked_sub(1).map(|p| names[p].clone()),
                children: vec![child.to_string()],
                created: layer.meta.created,
                user_created: layer.meta.user_created,
                size: layer.allocated_bytes()?,
                labels: layer.meta.labels.clone(),
            });
        }
        Ok(infos)
    }

    /// Removes snapshot `name` without changing what any newer layer reads:
    /// the blocks it holds that its child (the next newer layer, possibly
    /// the head) does not are copied into the child, then the child is
    /// relinked to the removed snapshot's parent (the commit). A crash before
    /// the commit leaves extra copies in the child, which hold the same data.
    pub fn remove_snapshot(&self, name: &str) -> Result<()> {
        let mut state = lock::write(&self.state)?;
        let index = state.find_snapshot(name)?;
        self.flush_locked(&state)?;
        let state = &mut *state;
        let (removed, newer) = state.snapshots[index..]
            .split_first_mut()
            .ok_or_else(|| StorageError::SnapshotNotFound(name.to_string()))?;
        let child = newer.first_mut().unwrap_or(&mut state.head);
        let missing = removed.extents()?.difference(&child.extents()?);
        child.open_whole()?;
        removed.copy_into(child, &missing)?;
        child.settle()?;
        let mut child_meta = child.meta.clone();
        child_meta.parent.clone_from(&removed.meta.parent);
        child_meta.save(&self.dir)?;
        child.meta = child_meta;

        let removed = state.snapshots.remove(index);
        self.sync_parent_mirror(state);
        self.delete_layer_files(&[removed.file_name]);
        Ok(())
    }

    /// Updates `volume.meta`'s copy of the head's parent after the head was
    /// relinked. The chain is already committed and `open` repairs the copy,
    /// so a failure is logged rather than failing the committed operation.
    fn sync_parent_mirror(&self, state: &mut State) {
        if state.meta.parent == state.head.meta.parent {
            return;
        }
        let parent = state.head.meta.parent.clone();
        if let Err(e) = state.update_meta(&self.dir, |meta| meta.parent = parent) {
            tracing::warn!(dir = %self.dir.path().display(), error = %e, "volume.meta parent left stale until the next open");
        }
    }

    /// Reverts the volume to snapshot `name`: a new empty head on top of it.
    ///
    /// The old head and every snapshot newer than `name` are deleted, so the
    /// chain stays linear (Longhorn keeps them as a branch; we do not
    /// support branches). Take a snapshot first to keep the current data.
    pub fn revert(&self, name: &str) -> Result<()> {
        let mut state = lock::write(&self.state)?;
        let index = state.find_snapshot(name)?;
        self.flush_locked(&state)?;
        let new_head = Layer::create(
            &self.dir,
            state.meta.size,
            state.next_head(snapshot_file(name)),
        )?;
        state.update_meta(&self.dir, |meta| {
            meta.head.clone_from(&new_head.file_name);
            meta.parent = snapshot_file(name);
        })?;

        let old_head = mem::replace(&mut state.head, new_head);
        let discarded = state.snapshots.split_off(index + 1);
        drop(state);
        let names: Vec<String> = discarded
            .into_iter()
            .chain([old_head])
            .map(|l| l.file_name)
            .collect();
        self.delete_layer_files(&names);
        Ok(())
    }

    /// Grows the volume to `new_size` bytes; new space reads as zeros.
    /// Layer files grow first, staged ones included (a rebuild installs them
    /// later), then `volume.meta` commits the new size (a file longer than
    /// the volume is harmless).
    pub fn expand(&self, new_size: u64) -> Result<()> {
        check_size(new_size)?;
        let mut state = lock::write(&self.state)?;
        let size = state.meta.size;
        if new_size < size {
            return Err(StorageError::CannotShrink {
                size,
                requested: new_size,
            });
        }
        if new_size == size {
            return Ok(());
        }
        self.flush_locked(&state)?;
        let staged = state.staged.values();
        for layer in state.snapshots.iter().chain(staged).chain([&state.head]) {
            layer.grow(new_size)?;
        }
        state.update_meta(&self.dir, |meta| meta.size = new_size)
    }

    /// Deletes layer files (and their metadata) that a committed change
    /// stopped referencing. A failure only leaves debris that the next open
    /// collects, so it is logged rather than reported as a failed operation.
    pub(super) fn delete_layer_files(&self, names: &[String]) {
        let result = names
            .iter()
            .try_for_each(|name| {
                self.dir.remove_if_exists(name)?;
                companion_files(name)
                    .iter()
                    .try_for_each(|file| self.dir.remove_if_exists(file))
            })
            .and_then(|()| self.dir.sync());
        if let Err(e) = result {
            tracing::warn!(dir = %self.dir.path().display(), error = %e, "leaving unreferenced layer files for the next open");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::replica::BLOCK_SIZE;
    use crate::replica::testutil::{
        block_bytes, blocks, new_store, read_all, reopen, snapshot_names,
    };

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    /// Four blocks; snapshots a, b, c each overwrite a different mix.
    /// Returns what the head reads: [3, 2, 1, 4].
    fn three_snapshots() -> (tempfile::TempDir, ReplicaStore) {
        let (tmp, store) = new_store(4);
        store.write_at(0, &blocks(1, 3)).unwrap();
        store.snapshot("a", true, BTreeMap::new()).unwrap();
        store.write_at(0, &blocks(2, 2)).unwrap();
        store.snapshot("b", true, BTreeMap::new()).unwrap();
        store.write_at(0, &blocks(3, 1)).unwrap();
        store.snapshot("c", false, BTreeMap::new()).unwrap();
        store.write_at(3 * BLOCK_SIZE, &blocks(4, 1)).unwrap();
        assert_eq!(block_bytes(&store), [3, 2, 1, 4]);
        (tmp, store)
    }

    #[test]
    fn snapshot_freezes_the_head_and_starts_a_new_one() {
        let (_tmp, store) = new_store(4);
        store.write_at(0, &blocks(1, 2)).unwrap();
        store.snapshot("s1", true, BTreeMap::new()).unwrap();
        assert_eq!(
            files(store.path()),
            [
                "head-2.img",
                "head-2.img.crc",
                "head-2.img.intent",
                "head-2.img.meta",
                "revision.counter",
                "snap-s1.img",
                "snap-s1.img.crc",
                "snap-s1.img.intent",
                "snap-s1.img.meta",
                "volume.meta"
            ]
        );
        store.write_at(BLOCK_SIZE, &blocks(2, 2)).unwrap();
        assert_eq!(block_bytes(&store), [1, 2, 2, 0]);
        let store = reopen(store);
        assert_eq!(block_bytes(&store), [1, 2, 2, 0]);
        assert_eq!(store.revision(), 1, "snapshot flushed the first write only");
    }

    #[test]
    fn invalid_or_duplicate_snapshot_names_are_rejected() {
        let (_tmp, store) = new_store(4);
        for bad in ["../x", "", "A", "a/b"] {
            let err = store.snapshot(bad, true, BTreeMap::new()).unwrap_err();
            assert!(
                matches!(err, StorageError::InvalidName(ref n) if n == bad),
                "{err}"
            );
        }
        store.snapshot("x", true, BTreeMap::new()).unwrap();
        let err = store.snapshot("x", true, BTreeMap::new()).unwrap_err();
        assert!(
            matches!(err, StorageError::SnapshotExists(ref n) if n == "x"),
            "{err}"
        );
        assert_eq!(snapshot_names(&store), ["x"]);
    }

    #[test]
    fn snapshots_are_listed_oldest_first_with_links_and_sizes() {
        let (_tmp, store) = three_snapshots();
        let labels = BTreeMap::from([("k".to_string(), "v".to_string())]);
        store.snapshot("d", true, labels.clone()).unwrap();
        let infos = store.snapshots().unwrap();
        assert_eq!(snapshot_names(&store), ["a", "b", "c", "d"]);
        assert_eq!(infos[0].parent, None);
        assert_eq!(infos[0].children, ["b"]);
        assert_eq!(infos[1].parent.as_deref(), Some("a"));
        assert_eq!(infos[3].children, [VOLUME_HEAD]);
        assert_eq!(
            infos
                .iter()
                .map(|i| i.size / BLOCK_SIZE)
                .collect::<Vec<_>>(),
            [3, 2, 1, 1]
        );
        assert!(!infos[2].user_created && infos[3].user_created);
        assert_eq!(infos[3].labels, labels);
        assert!(infos[0].created > 1_600_000_000);
        let store = reopen(store);
        assert_eq!(store.snapshots().unwrap(), infos);
    }

    #[test]
    fn removing_any_snapshot_keeps_the_data() {
        for (victim, left) in [("a", ["b", "c"]), ("b", ["a", "c"]), ("c", ["a", "b"])] {
            let (_tmp, store) = three_snapshots();
            store.remove_snapshot(victim).unwrap();
            assert_eq!(block_bytes(&store), [3, 2, 1, 4], "removing {victim}");
            assert_eq!(snapshot_names(&store), left);
            assert!(!store.path().join(format!("snap-{victim}.img")).exists());
            assert!(
                !store
                    .path()
                    .join(format!("snap-{victim}.img.meta"))
                    .exists()
            );
            let store = reopen(store);
            assert_eq!(block_bytes(&store), [3, 2, 1, 4]);
            assert_eq!(snapshot_names(&store), left);
        }
    }

    #[test]
    fn removing_a_snapshot_preserves_older_snapshots_as_seen_by_revert() {
        let (_tmp, store) = three_snapshots();
        store.remove_snapshot("b").unwrap();
        store.revert("c").unwrap();
        assert_eq!(block_bytes(&store), [3, 2, 1, 0]);
        store.revert("a").unwrap();
        assert_eq!(block_bytes(&store), [1, 1, 1, 0]);
    }

    #[test]
    fn removing_the_newest_snapshot_merges_into_the_head() {
        let (_tmp, store) = three_snapshots();
        store.remove_snapshot("c").unwrap();
        let head = store.layer_files().unwrap().pop().unwrap();
        assert_eq!(head.extents.iter().collect::<Vec<_>>(), [(0, 1), (3, 4)]);
        let meta = crate::replica::meta::VolumeMeta::load(&store.dir).unwrap();
        assert_eq!(meta.parent, "snap-b.img");
        store.remove_snapshot("a").unwrap();
        store.remove_snapshot("b").unwrap();
        assert!(store.snapshots().unwrap().is_empty());
        assert_eq!(block_bytes(&reopen(store)), [3, 2, 1, 4]);
    }

    #[test]
    fn unknown_snapshots_are_not_found() {
        let (_tmp, store) = three_snapshots();
        for result in [
            store.remove_snapshot("zz"),
            store.revert("zz"),
            store.remove_snapshot("../a"),
        ] {
            assert!(
                matches!(result, Err(StorageError::SnapshotNotFound(_))),
                "{result:?}"
            );
        }
    }

    #[test]
    fn revert_restores_the_snapshot_and_drops_newer_layers() {
        let (_tmp, store) = three_snapshots();
        store.revert("b").unwrap();
        assert_eq!(block_bytes(&store), [2, 2, 1, 0]);
        assert_eq!(snapshot_names(&store), ["a", "b"]);
        assert_eq!(
            files(store.path()),
            [
                "head-5.img",
                "head-5.img.crc",
                "head-5.img.intent",
                "head-5.img.meta",
                "revision.counter",
                "snap-a.img",
                "snap-a.img.crc",
                "snap-a.img.intent",
                "snap-a.img.meta",
                "snap-b.img",
                "snap-b.img.crc",
                "snap-b.img.intent",
                "snap-b.img.meta",
                "volume.meta"
            ]
        );
        store.write_at(BLOCK_SIZE, &blocks(9, 1)).unwrap();
        store.revert("b").unwrap();
        assert_eq!(
            block_bytes(&store),
            [2, 2, 1, 0],
            "revert discards head writes"
        );
        store.snapshot("c", true, BTreeMap::new()).unwrap();
        let store = reopen(store);
        assert_eq!(snapshot_names(&store), ["a", "b", "c"]);
        assert_eq!(block_bytes(&store), [2, 2, 1, 0]);
    }

    #[test]
    fn expand_grows_every_layer_with_zeros() {
        let (_tmp, store) = three_snapshots();
        store.expand(8 * BLOCK_SIZE).unwrap();
        assert_eq!(store.size().unwrap(), 8 * BLOCK_SIZE);
        assert_eq!(block_bytes(&store), [3, 2, 1, 4, 0, 0, 0, 0]);
        store.write_at(7 * BLOCK_SIZE, &blocks(5, 1)).unwrap();
        store.expand(8 * BLOCK_SIZE).unwrap();
        let store = reopen(store);
        assert_eq!(store.size().unwrap(), 8 * BLOCK_SIZE);
        assert_eq!(read_all(&store).len(), 8 * BLOCK_SIZE as usize);
        store.revert("a").unwrap();
        assert_eq!(block_bytes(&store), [1, 1, 1, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn expand_rejects_shrinking_and_bad_sizes() {
        let (_tmp, store) = new_store(4);
        let err = store.expand(2 * BLOCK_SIZE).unwrap_err();
        assert!(
            matches!(err, StorageError::CannotShrink { size, requested } if size == 4 * BLOCK_SIZE && requested == 2 * BLOCK_SIZE)
        );
        assert!(matches!(
            store.expand(5 * BLOCK_SIZE + 1),
            Err(StorageError::InvalidSize { .. })
        ));
        assert_eq!(store.size().unwrap(), 4 * BLOCK_SIZE);
    }

    /// A crash between linking the snapshot and committing `volume.meta`
    /// leaves a hard link to the live head; open must drop it, and a retry
    /// of the same snapshot must succeed.
    #[test]
    fn an_interrupted_snapshot_is_cleaned_up() {
        let (_tmp, store) = new_store(4);
        store.write_at(0, &blocks(1, 1)).unwrap();
        let dir = store.path().to_path_buf();
        drop(store);
        fs::hard_link(dir.join("head-1.img"), dir.join("snap-s.img")).unwrap();
        fs::copy(dir.join("head-1.img.meta"), dir.join("head-2.img.meta")).unwrap();
        let store = ReplicaStore::open(&dir).unwrap();
        assert!(store.snapshots().unwrap().is_empty());
        assert!(!dir.join("snap-s.img").exists() && !dir.join("head-2.img.meta").exists());
        store.write_at(BLOCK_SIZE, &blocks(2, 1)).unwrap();
        store.snapshot("s", true, BTreeMap::new()).unwrap();
        assert_eq!(block_bytes(&reopen(store)), [1, 2, 0, 0]);
    }
}
