//! Generates the gRPC code of the data-plane processes' control APIs
//! (proto/dataplane.proto).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/dataplane.proto");
    // Layer data as `Bytes`: handed on without copying.
    tonic_prost_build::configure()
        .bytes(".oxhorn.dataplane.v1.LayerData.data")
        .compile_protos(&["proto/dataplane.proto"], &["proto"])?;
    Ok(())
}
