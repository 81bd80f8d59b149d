//! Generates the CSI gRPC client and server code from csi-proto/csi.proto.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=csi-proto/csi.proto");
    tonic_prost_build::configure().compile_protos(&["csi-proto/csi.proto"], &["csi-proto"])?;
    Ok(())
}
