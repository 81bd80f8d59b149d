//! Generates gRPC code: the CSI services (csi-proto/csi.proto), the control
//! APIs of the data-plane processes (proto/dataplane.proto), the instance
//! manager's (proto/instance.proto) and the kubelet's plugin registration
//! (proto/pluginregistration.proto).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=csi-proto/csi.proto");
    println!("cargo:rerun-if-changed=proto/dataplane.proto");
    println!("cargo:rerun-if-changed=proto/pluginregistration.proto");
    println!("cargo:rerun-if-changed=proto/instance.proto");
    tonic_prost_build::configure().compile_protos(&["csi-proto/csi.proto"], &["csi-proto"])?;
    // Layer data as `Bytes`: handed on without copying.
    tonic_prost_build::configure()
        .bytes(".oxhorn.dataplane.v1.LayerData.data")
        .compile_protos(&["proto/dataplane.proto"], &["proto"])?;
    tonic_prost_build::configure()
        .compile_protos(&["proto/pluginregistration.proto"], &["proto"])?;
    tonic_prost_build::configure().compile_protos(&["proto/instance.proto"], &["proto"])?;
    Ok(())
}
