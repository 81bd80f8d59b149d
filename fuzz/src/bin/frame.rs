//! afl target: the data protocol decoders (see `fuzz::frame`).

fn main() {
    afl::fuzz!(|data: &[u8]| fuzz::frame(data));
}
