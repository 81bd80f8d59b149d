//! afl target: replica store operations against a model (see `fuzz::store`).

fn main() {
    afl::fuzz!(|data: &[u8]| fuzz::store(data));
}
