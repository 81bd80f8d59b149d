//! afl target: the FUSE request parser (see `fuzz::fuse`).

fn main() {
    afl::fuzz!(|data: &[u8]| fuzz::fuse(data));
}
