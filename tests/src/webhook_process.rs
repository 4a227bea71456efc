//! The controller serving its webhook (and metrics port) against the API
//! stand-in with a fleet of GPU nodes, for the webhook's connection tests
//! and its benchmark.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use serde_json::{Value, json};

use crate::apiserver::ApiServer;
use crate::https_client;

/// A node's slice of `gpus` whole H100s.
pub fn gpu_slice(node: &str, gpus: usize) -> ResourceSlice {
    gpus_slice(node, gpus, json!({"productName": {"string": "NVIDIA H100 80GB HBM3"}}))
}

/// A node's slice of `gpus` whole 80 GiB GPUs of type `gpu`, each with its
/// UUID and the `attributes` given (an object of attribute name to value).
pub fn gpus_slice(node: &str, gpus: usize, attributes: Value) -> ResourceSlice {
    let devices: Vec<_> = (0..gpus)
        .map(|i| {
            let mut all = attributes.clone();
            all["type"] = json!({"string": "gpu"});
            all["uuid"] = json!({"string": format!("GPU-{node}-{i}")});
            json!({"name": format!("gpu-{i}"), "attributes": all, "capacity": {"memory": {"value": "80Gi"}}})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-gpu.nvidia.com")},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices},
    }))
    .expect("a valid slice")
}

/// An AdmissionReview of creating `claim`, with request uid `uid`.
pub fn review(uid: &str, claim: Value) -> Vec<u8> {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
            "name": claim["metadata"]["name"], "namespace": "default", "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": claim,
        }
    })
    .to_string()
    .into_bytes()
}

/// A claim of `requests` requests for one GPU each.
pub fn one_gpu_requests(name: &str, requests: usize) -> Value {
    let requests: Vec<Value> = (0..requests)
        .map(|r| json!({"name": format!("gpu-{r}"), "exactly": {"deviceClassName": "gpu.nvidia.com"}}))
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"devices": {"requests": requests}}})
}

/// How the controller is started.
#[derive(Debug, Clone, Default)]
pub struct WebhookOptions {
    pub nodes: usize,
    pub gpus_per_node: usize,
    /// `RLIMIT_NOFILE` of the controller (inherited when `None`).
    pub fd_limit: Option<u64>,
}

/// The stand-in, the certificate and a controller serving its webhook.
pub struct WebhookProcess {
    pub server: ApiServer,
    pub dir: tempfile::TempDir,
    pub port: u16,
    pub metrics_port: u16,
    child: Child,
    log: PathBuf,
}

/// Writes a fresh self-signed pair for `localhost` to `tls.crt`/`tls.key`
/// in `dir` (each replaced at once); returns the certificate's PEM.
pub fn write_cert(dir: &Path) -> String {
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("a certificate");
    let pem = generated.cert.pem();
    replace(&dir.join("tls.key"), generated.signing_key.serialize_pem().as_bytes());
    replace(&dir.join("tls.crt"), pem.as_bytes());
    pem
}

/// Replaces `path` at once (rename), as a Secret volume update does.
pub fn replace(path: &Path, content: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).expect("writing a temporary file");
    std::fs::rename(&tmp, path).expect("renaming into place");
}

impl WebhookProcess {
    pub fn start(options: &WebhookOptions) -> WebhookProcess {
        let server = ApiServer::start_in_thread().expect("the stand-in starts");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).expect("a kubeconfig");
        let class: DeviceClass = crate::claim_fixtures::shipped_device_class("gpu.nvidia.com");
        server.create(&class).expect("class");
        for n in 0..options.nodes {
            let name = format!("node-{n:04}");
            let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).expect("node");
            server.create(&node).expect("node");
            server.create(&gpu_slice(&name, options.gpus_per_node)).expect("slice");
        }
        write_cert(dir.path());
        let [port, metrics_port] = crate::ports::reserve();
        let log = dir.path().join("controller.log");
        let stderr = std::fs::File::create(&log).expect("a log file");
        let mut cmd = match options.fd_limit {
            Some(limit) => {
                let mut sh = Command::new("sh");
                sh.arg("-c").arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\"")).arg(crate::controller());
                sh
            }
            None => Command::new(crate::controller()),
        };
        cmd.arg("run")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--namespace", "gpu-dra-driver", "--identity", "webhook", "--leader-elect", "false"])
            .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
            .args(["--webhook-port", &port.to_string()])
            .arg("--tls-cert-file")
            .arg(dir.path().join("tls.crt"))
            .arg("--tls-key-file")
            .arg(dir.path().join("tls.key"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        for var in crate::controller_process::CONTROLLER_ENV {
            cmd.env_remove(var);
        }
        let child = cmd.spawn().expect("the controller starts");
        let process = WebhookProcess { server, dir, port, metrics_port, child, log };
        process.wait_until_synced(options.nodes * options.gpus_per_node);
        process
    }

    /// Waits until both ports listen and the fleet holds `devices`.
    fn wait_until_synced(&self, devices: usize) {
        let start = Instant::now();
        let wanted = format!("gpu_dra_controller_fleet_devices {devices}\n");
        loop {
            let listening = std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok();
            if listening && self.metrics().contains(&wanted) {
                return;
            }
            assert!(start.elapsed() < Duration::from_secs(120), "the controller never synced:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `/metrics` of the controller ("" when it does not answer).
    pub fn metrics(&self) -> String {
        use std::io::{Read, Write};
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port)) else {
            return String::new();
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        let mut text = String::new();
        let _ = stream.read_to_string(&mut text);
        text
    }

    /// The client configuration trusting the certificate on disk now.
    pub fn client(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        let pem = std::fs::read_to_string(self.dir.path().join("tls.crt")).expect("the certificate");
        https_client::config(&pem, alpn)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Open file descriptors of the controller.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid())).map(|d| d.count()).unwrap_or(0)
    }

    /// CPU time (user + system) the controller used so far.
    pub fn cpu_time(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        // Fields after the command name (which may hold spaces): utime is
        // the 14th field, stime the 15th, in clock ticks (100 per second).
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
        let fields: Vec<u64> = rest.split_whitespace().skip(11).take(2).filter_map(|f| f.parse().ok()).collect();
        Duration::from_millis(fields.iter().sum::<u64>() * 10)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for WebhookProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
