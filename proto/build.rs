//! Compiles the kubelet's protos with protox (pure Rust, no system `protoc`)
//! and generates prost messages plus tonic servers and clients. The clients
//! are used by the kubelet stand-in in the integration tests.

use std::path::Path;

const PROTOS: [&str; 5] = [
    "dra/v1/api.proto",
    "dra/v1beta1/api.proto",
    "pluginregistration/v1/api.proto",
    "dra-health/v1alpha1/api.proto",
    "dra-health/v1/api.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new("proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let files: Vec<_> = PROTOS.iter().map(|p| root.join(p)).collect();
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let descriptors = protox::compile(&files, [root])?;
    // dra-health v1 is v1alpha1 under another package name: its messages
    // are v1alpha1's, so one server implementation answers both.
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .extern_path(".v1", "crate::health_v1alpha1")
        .compile_fds(descriptors)?;
    Ok(())
}
