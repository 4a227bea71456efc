//! The plugin's sockets called by a gRPC client other than our own: Python
//! grpcio with default channel options (it sends the socket path as
//! `:authority`, which the h2 crate refuses as a URI authority).
//!
//! Needs `python3`; `grpcio` comes from the system when it has it, else
//! from PyPI into a virtual environment under the target directory.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use integration_tests::apiserver::ApiServer;
use integration_tests::kubelet::{Kubelet, KubeletConfig};
use integration_tests::plugin_process::{PluginDirs, PluginOptions, PluginProcess};
use kubelet_proto::dra_v1::NodePrepareResourcesResponse;
use kubelet_proto::registration::PluginInfo;
use prost::Message;

const DRIVER: &str = "gpu.nvidia.com";

fn decode_hex(hex: &str) -> Vec<u8> {
    (0..hex.len()).step_by(2).filter_map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect()
}

/// A Python that can `import grpc`.
fn python_with_grpcio() -> PathBuf {
    let system = PathBuf::from("python3");
    let imports =
        |python: &PathBuf| Command::new(python).args(["-c", "import grpc"]).output().is_ok_and(|o| o.status.success());
    if imports(&system) {
        return system;
    }
    let venv = integration_tests::helm::python_venv(&PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("python-grpcio"));
    integration_tests::first_use::install_once(&venv.join("installed-grpcio"), || {
        integration_tests::helm::pip_install(&venv, "grpcio")
    });
    venv.join("bin/python")
}

#[test]
fn python_grpcio_with_default_options_calls_both_sockets() {
    let server = ApiServer::start_in_thread().unwrap();
    let dirs = PluginDirs::new("gpus:\n  - model: H100-80GB\n    count: 2\n").unwrap();
    server.write_kubeconfig(&dirs.kubeconfig).unwrap();
    let plugin = PluginProcess::spawn(&dirs, &PluginOptions::default()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(Kubelet::new(KubeletConfig::new(&dirs.registry, DRIVER)).wait_and_register(Duration::from_secs(60)))
        .unwrap_or_else(|e| panic!("{e}\n{}", plugin.log()));

    let script = integration_tests::workspace_root().join("tests/python/grpc_client.py");
    let out = Command::new(python_with_grpcio())
        .arg(&script)
        .arg(dirs.registration_socket(DRIVER))
        .arg(dirs.dra_socket(DRIVER))
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the Python client failed\n{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}\n{stderr}\n{}", plugin.log());

    let info = lines[0]
        .strip_prefix("/pluginregistration.Registration/GetInfo ok ")
        .unwrap_or_else(|| panic!("GetInfo: {}\n{}", lines[0], plugin.log()));
    let info = PluginInfo::decode(&decode_hex(info)[..]).unwrap();
    assert_eq!((info.r#type.as_str(), info.name.as_str()), ("DRAPlugin", DRIVER));

    let prepared = lines[1]
        .strip_prefix("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources ok ")
        .unwrap_or_else(|| panic!("NodePrepareResources: {}\n{}", lines[1], plugin.log()));
    let prepared = NodePrepareResourcesResponse::decode(&decode_hex(prepared)[..]).unwrap();
    // The claim does not exist: a per-claim error, the call itself works.
    let result = prepared.claims.get("0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a").expect("the claim's result");
    assert!(!result.error.is_empty(), "{result:?}");
}
