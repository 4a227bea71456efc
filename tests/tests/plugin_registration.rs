//! The real `gpu-kubelet-plugin run` binary against the kubelet stand-in
//! and the API server stand-in: sockets, registration, health stream,
//! readiness and shutdown.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::time::Duration;

use futures::StreamExt;
use integration_tests::apiserver::ApiServer;
use integration_tests::kubelet::{DraVersion, Kubelet, KubeletConfig, claim};
use integration_tests::plugin_process::{PluginDirs, PluginOptions, PluginProcess, wait_for_path};
use integration_tests::wait;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kubelet_proto::health_v1alpha1::HealthStatus;

const DRIVER: &str = "gpu.nvidia.com";
const TWO_GPUS: &str = "gpus:\n  - model: H100-80GB\n    count: 2\n";
const WAIT: Duration = Duration::from_secs(60);

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().mode() & 0o777
}

fn setup(inventory: &str) -> (ApiServer, PluginDirs) {
    let server = ApiServer::start_in_thread().unwrap();
    let dirs = PluginDirs::new(inventory).unwrap();
    server.write_kubeconfig(&dirs.kubeconfig).unwrap();
    (server, dirs)
}

fn kubelet(dirs: &PluginDirs) -> Kubelet {
    Kubelet::new(KubeletConfig::new(&dirs.registry, DRIVER))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
fn registers_with_v1_first_and_private_sockets() {
    let (_server, dirs) = setup(TWO_GPUS);
    let plugin = PluginProcess::spawn(&dirs, &PluginOptions::default()).unwrap();
    let rt = runtime();
    let registered =
        rt.block_on(kubelet(&dirs).wait_and_register(WAIT)).unwrap_or_else(|e| panic!("{e}\n{}", plugin.log()));

    assert_eq!(registered.info.r#type, "DRAPlugin");
    assert_eq!(registered.info.name, DRIVER);
    assert_eq!(registered.info.endpoint, dirs.dra_socket(DRIVER).display().to_string());
    assert_eq!(
        registered.info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
    );
    // The kubelet takes the first version it knows.
    assert_eq!(registered.version, DraVersion::V1);
    assert_eq!(registered.registration_socket, dirs.registration_socket(DRIVER));

    for socket in [dirs.dra_socket(DRIVER), dirs.registration_socket(DRIVER)] {
        assert!(std::fs::metadata(&socket).unwrap().file_type().is_socket(), "{}", socket.display());
        assert_eq!(mode(&socket), 0o600, "{}", socket.display());
    }
    assert_eq!(mode(&dirs.plugin_dir(DRIVER)), 0o700);
    assert!(plugin.log().contains("registered with the kubelet"), "{}", plugin.log());
}

#[test]
fn a_v1beta1_kubelet_gets_the_v1beta1_service() {
    let (_server, dirs) = setup(TWO_GPUS);
    let plugin = PluginProcess::spawn(&dirs, &PluginOptions::default()).unwrap();
    let rt = runtime();
    let kubelet = Kubelet::new(KubeletConfig::new(&dirs.registry, DRIVER).v1beta1_only());
    let registered = rt.block_on(kubelet.wait_and_register(WAIT)).unwrap_or_else(|e| panic!("{e}\n{}", plugin.log()));
    assert_eq!(registered.version, DraVersion::V1beta1);
    // The v1beta1 service answers, with an entry for the claim.
    let uid = "6b0e1f7c-3a52-4d0e-9f4b-2c1d0e9f8a7b";
    let raw = rt.block_on(kubelet.unprepare_raw(&registered, &[claim("default", "c", uid)])).unwrap();
    assert_eq!(raw.keys().collect::<Vec<_>>(), [uid]);
}

#[test]
fn a_wrong_driver_name_is_refused_by_the_kubelet() {
    let (_server, dirs) = setup(TWO_GPUS);
    let plugin = PluginProcess::spawn(&dirs, &PluginOptions::default()).unwrap();
    let rt = runtime();
    assert!(wait_for_path(&dirs.registration_socket(DRIVER), true, WAIT), "{}", plugin.log());
    let other = Kubelet::new(KubeletConfig::new(&dirs.registry, "other.example.com"));
    let err = rt.block_on(other.register(&dirs.registration_socket(DRIVER))).unwrap_err();
    assert!(err.to_string().contains("is not driver \"other.example.com\""), "{err}");
    // The plugin heard about the failure (NotifyRegistrationStatus false).
    let mut plugin = plugin;
    assert!(plugin.wait_for_log("rejected the plugin's registration", WAIT).is_some(), "{}", plugin.log());
}

#[test]
fn stale_sockets_are_replaced_and_sigterm_removes_both() {
    let (_server, dirs) = setup(TWO_GPUS);
    // Sockets left behind by a killed instance.
    std::fs::create_dir_all(dirs.plugin_dir(DRIVER)).unwrap();
    std::fs::create_dir_all(&dirs.registry).unwrap();
    for socket in [dirs.dra_socket(DRIVER), dirs.registration_socket(DRIVER)] {
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        assert!(std::os::unix::net::UnixStream::connect(&socket).is_err(), "the stale socket is dead");
    }
    let mut plugin = PluginProcess::spawn(&dirs, &PluginOptions::default()).unwrap();
    let rt = runtime();
    rt.block_on(kubelet(&dirs).wait_and_register(WAIT)).unwrap_or_else(|e| panic!("{e}\n{}", plugin.log()));

    let status = plugin.terminate(WAIT).unwrap().unwrap_or_else(|| panic!("no exit after SIGTERM\n{}", plugin.log()));
    assert!(status.success(), "exit {status:?}\n{}", plugin.log());
    assert!(!dirs.registration_socket(DRIVER).exists(), "registration socket left");
    assert!(!dirs.dra_socket(DRIVER).exists(), "DRA socket left");
}

#[test]
fn sigint_removes_the_sockets_too() {
    let (_server, dirs) = setup(TWO_GPUS);
    let mut plugin = PluginProcess::spawn(&dirs, &PluginOptions::default()).unwrap();
    assert!(wait_for_path(&dirs.registration_socket(DRIVER), true, WAIT), "{}", plugin.log());
    plugin.signal(rustix::process::Signal::INT).unwrap();
    let status = plugin.wait_timeout(WAIT).unwrap().unwrap_or_else(|| panic!("no exit\n{}", plugin.log()));
    assert!(status.success(), "{}", plugin.log());
    assert!(!dirs.registration_socket(DRIVER).exists());
    assert!(!dirs.dra_socket(DRIVER).exists());
}

#[test]
fn health_stream_follows_injected_faults() {
    let (_server, dirs) = setup(TWO_GPUS);
    let plugin = PluginProcess::spawn(&dirs, &PluginOptions::default()).unwrap();
    let rt = runtime();
    let kubelet = kubelet(&dirs);
    rt.block_on(async {
        let registered = kubelet.wait_and_register(WAIT).await.unwrap_or_else(|e| panic!("{e}\n{}", plugin.log()));
        let mut stream = kubelet.watch_health(&registered).await.unwrap();
        let first = stream.next().await.unwrap().unwrap();
        let names: Vec<_> = first.devices.iter().map(|d| d.device.clone().unwrap().device_name).collect();
        assert_eq!(names, ["gpu-0", "gpu-1"]);
        assert!(first.devices.iter().all(|d| d.health == i32::from(HealthStatus::Healthy)));
        assert!(first.devices.iter().all(|d| d.device.as_ref().unwrap().pool_name == "node-a"));

        // Fault injection: the fake file gains an XID on GPU 1.
        std::fs::write(&dirs.inventory, format!("{TWO_GPUS}    faults: [{{gpu: 1, xid: 79}}]\n")).unwrap();
        let unhealthy = tokio::time::timeout(WAIT, async {
            while let Some(message) = stream.next().await {
                let message = message.unwrap();
                if let Some(d) = message.devices.iter().find(|d| d.health == i32::from(HealthStatus::Unhealthy)) {
                    return Some(d.clone());
                }
            }
            None
        })
        .await
        .expect("no UNHEALTHY device within the wait")
        .expect("the stream ended");
        assert_eq!(unhealthy.device.unwrap().device_name, "gpu-1");
        assert_eq!(unhealthy.message, "critical XID 79");
    });
}

#[test]
fn readyz_turns_ready_after_registration_and_publishing() {
    let (server, dirs) = setup(TWO_GPUS);
    let options = PluginOptions { metrics_addr: "127.0.0.1:0".into(), ..PluginOptions::default() };
    let mut plugin = PluginProcess::spawn(&dirs, &options).unwrap();
    let line = plugin.wait_for_log("serving /metrics", WAIT).unwrap_or_else(|| panic!("{}", plugin.log()));
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))
        .unwrap_or_else(|| panic!("no addr in {line}"))
        .to_owned();
    let rt = runtime();
    let get = |path: &str| rt.block_on(http_get(&addr, path));
    assert_eq!(get("/healthz").0, 200);
    // Not registered yet: the stand-in kubelet has not looked.
    let (status, body) = get("/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("registered"), "{body}");

    rt.block_on(kubelet(&dirs).wait_and_register(WAIT)).unwrap_or_else(|e| panic!("{e}\n{}", plugin.log()));
    wait::wait_until("/readyz to answer 200", WAIT, || get("/readyz").0 == 200, || plugin.log());
    let slices: Vec<ResourceSlice> = server.list(None, "spec.nodeName=node-a").unwrap();
    assert!(!slices.is_empty());
    let (status, metrics) = get("/metrics");
    assert_eq!(status, 200);
    assert!(metrics.contains("gpu_dra_published_devices 2"), "{metrics}");
    assert!(metrics.contains("gpu_dra_registered 1"), "{metrics}");
}

/// A minimal HTTP/1.1 GET (the test crate has no HTTP client).
async fn http_get(addr: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

/// `run --driver-root DIR` on a tree without libcuda stops at start with one
/// line naming the directory and the fix, before any socket exists.
#[test]
fn a_driver_root_without_libcuda_stops_the_plugin_at_start() {
    let (_server, dirs) = setup(TWO_GPUS);
    let empty_root = tempfile::tempdir().unwrap();
    let options = PluginOptions {
        extra_args: vec!["--driver-root".into(), empty_root.path().display().to_string()],
        ..PluginOptions::default()
    };
    let mut plugin = PluginProcess::spawn(&dirs, &options).unwrap();
    let status = plugin.wait_timeout(WAIT).unwrap().expect("the plugin exits");
    assert!(!status.success());
    let log = plugin.log();
    let error: Vec<&str> = log.lines().filter(|l| l.contains("libcuda.so")).collect();
    assert_eq!(error.len(), 1, "{log}");
    assert!(error[0].contains(&*empty_root.path().to_string_lossy()) && error[0].contains("--driver-root"), "{log}");
    assert!(!dirs.dra_socket(DRIVER).exists(), "no socket is served");
}
