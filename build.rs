//! Generates gRPC code: the CSI services (csi-proto/csi.proto), the instance
//! manager's API (proto/instance.proto) and the kubelet's plugin registration
//! (proto/pluginregistration.proto). The data plane's own APIs are generated
//! by its crate (dataplane/build.rs).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=csi-proto/csi.proto");
    println!("cargo:rerun-if-changed=proto/pluginregistration.proto");
    println!("cargo:rerun-if-changed=proto/instance.proto");
    tonic_prost_build::configure().compile_protos(&["csi-proto/csi.proto"], &["csi-proto"])?;
    tonic_prost_build::configure()
        .compile_protos(&["proto/pluginregistration.proto"], &["proto"])?;
    tonic_prost_build::configure().compile_protos(&["proto/instance.proto"], &["proto"])?;
    Ok(())
}
