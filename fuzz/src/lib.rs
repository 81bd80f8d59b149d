//! Coverage-guided fuzz targets for oxhorn, on the stable toolchain with
//! [afl.rs](https://github.com/rust-fuzz/afl.rs) (`cargo afl`).
//!
//! Each target is a plain function of the input bytes that panics on a
//! finding, so that normal builds and tests need no fuzzer:
//! - [`frame`]: the data protocol decoders, fed arbitrary bytes as a socket
//!   would deliver them;
//! - [`iscsi`]: the iSCSI target's PDU decoder and text parser, likewise;
//! - [`fuse`]: the FUSE request parser, fed requests as `/dev/fuse` would
//!   deliver them;
//! - [`store`]: a sequence of operations on a real `ReplicaStore`, checked
//!   against an in-memory model after every step.
//!
//! The afl binaries (`src/bin/`) only wrap them and are built with
//! `cargo afl build --release --features afl`; `hack/fuzz.sh <target>
//! <seconds>` builds and runs one. The corpora in `corpus/<target>/` are
//! the queues of long runs minimised by afl-cmin (`hack/fuzz.sh <target>
//! <seconds> --update-corpus`); the tests below replay every file through
//! its target, so `cargo test` checks each of them without afl. To follow
//! one store input step by step: `OXHORN_FUZZ_TRACE=1`.

mod frame;
mod fuse;
mod iscsi;
mod store;

pub use frame::frame;
pub use fuse::fuse;
pub use iscsi::iscsi;
pub use store::store;

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::PathBuf;

    /// Runs every file of `corpus/<target>/` through `run`; returns how many.
    fn replay(target: &str, run: fn(&[u8])) -> usize {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .join(target);
        let mut paths: Vec<_> = fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.unwrap().path())
            .collect();
        paths.sort();
        for path in &paths {
            let input = fs::read(path).unwrap();
            eprintln!("replaying {}", path.display());
            run(&input);
        }
        paths.len()
    }

    #[test]
    fn frame_corpus_replays_cleanly() {
        assert!(replay("frame", super::frame) > 0);
    }

    #[test]
    fn fuse_corpus_replays_cleanly() {
        assert!(replay("fuse", super::fuse) > 0);
    }

    #[test]
    fn iscsi_corpus_replays_cleanly() {
        assert!(replay("iscsi", super::iscsi) > 0);
    }

    #[test]
    fn store_corpus_replays_cleanly() {
        assert!(replay("store", super::store) > 0);
    }
}
