//! afl target: the iSCSI PDU decoder and text parser (see `fuzz::iscsi`).

fn main() {
    afl::fuzz!(|data: &[u8]| fuzz::iscsi(data));
}
