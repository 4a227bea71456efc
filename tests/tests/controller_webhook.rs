//! The controller's validating webhook over HTTPS, called by a client other
//! than our own (Python's `urllib` and `ssl`) with real AdmissionReview
//! JSON: denials naming the JSON path, warnings, bounds on hostile
//! requests, and certificate rotation without a restart.

use std::io::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use integration_tests::apiserver::ApiServer;
use integration_tests::controller_process::ControllerProcess;
use integration_tests::wait;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use serde_json::{Value, json};

fn write_cert(dir: &Path) -> String {
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    let pem = generated.cert.pem();
    std::fs::write(dir.join("tls.crt.tmp"), &pem).unwrap();
    std::fs::write(dir.join("tls.key.tmp"), generated.signing_key.serialize_pem()).unwrap();
    // Replace both files at once, as a Secret volume update does.
    std::fs::rename(dir.join("tls.key.tmp"), dir.join("tls.key")).unwrap();
    std::fs::rename(dir.join("tls.crt.tmp"), dir.join("tls.crt")).unwrap();
    pem
}

struct Webhook {
    _server: ApiServer,
    dir: tempfile::TempDir,
    port: u16,
    controller: ControllerProcess,
}

impl Webhook {
    fn start() -> Webhook {
        let server = ApiServer::start_in_thread().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        let class: DeviceClass = integration_tests::claim_fixtures::shipped_device_class("gpu.nvidia.com");
        server.create(&class).unwrap();
        server.create(&serde_json::from_value::<Node>(json!({"metadata": {"name": "n1"}})).unwrap()).unwrap();
        let slice: ResourceSlice = serde_json::from_value(json!({
            "metadata": {"name": "n1-gpu"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "n1", "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA H100 80GB HBM3"}}}]},
        }))
        .unwrap();
        server.create(&slice).unwrap();
        write_cert(dir.path());
        let [port] = integration_tests::ports::reserve();
        let port_text = port.to_string();
        let cert = dir.path().join("tls.crt");
        let key = dir.path().join("tls.key");
        let controller = ControllerProcess::spawn(
            &kubeconfig,
            "webhook",
            &[
                "--webhook-port",
                &port_text,
                "--tls-cert-file",
                cert.to_str().unwrap(),
                "--tls-key-file",
                key.to_str().unwrap(),
                "--leader-elect",
                "false",
            ],
        )
        .unwrap();
        let webhook = Webhook { _server: server, dir, port, controller };
        webhook.wait_until_serving();
        webhook
    }

    fn wait_until_serving(&self) {
        let listening = || std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok();
        wait::wait_until("the webhook to listen", Duration::from_secs(60), listening, || self.controller.log());
        // The fleet view fills from the watches; give it a moment.
        std::thread::sleep(Duration::from_millis(500));
    }

    /// POSTs `body` with Python; returns the status and the parsed body.
    fn post(&self, body: &[u8]) -> (u16, Value) {
        let file = self.dir.path().join(format!("body-{}.json", uuid::Uuid::new_v4()));
        std::fs::write(&file, body).unwrap();
        let out = Command::new("python3")
            .arg(integration_tests::workspace_root().join("tests/python/https_post.py"))
            .arg(format!("https://localhost:{}/validate", self.port))
            .arg(self.dir.path().join("tls.crt"))
            .arg(&file)
            .output()
            .expect("python3 runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "python failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.controller.log()
        );
        let (status, rest) = stdout.split_once('\n').unwrap();
        (status.trim().parse().unwrap(), serde_json::from_str(rest.trim()).unwrap_or(Value::Null))
    }

    /// The certificate the server presents now, as PEM.
    fn served_certificate(&self) -> String {
        let out = Command::new("python3")
            .args(["-c", "import ssl, sys; print(ssl.get_server_certificate(('127.0.0.1', int(sys.argv[1]))))"])
            .arg(self.port.to_string())
            .output()
            .expect("python3 runs");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

fn review(kind: &str, object: Value) -> Vec<u8> {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0df28fbd-5f5f-11e8-bc74-36e6bb280816",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
            "requestKind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
            "name": "c", "namespace": "default", "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        }
    })
    .to_string()
    .into_bytes()
}

fn claim(selector: &str, parameters: Value) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": selector}}]}}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": parameters}}],
        }},
    })
}

fn gpu_config() -> Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"})
}

#[test]
fn denials_warnings_bounds_and_rotation_over_https() {
    let webhook = Webhook::start();

    // A valid claim that fits: allowed, no warnings, the uid echoed.
    let (status, body) = webhook.post(&review("ResourceClaim", claim("true", gpu_config())));
    assert_eq!(status, 200);
    let response = &body["response"];
    assert_eq!(response["uid"], "0df28fbd-5f5f-11e8-bc74-36e6bb280816");
    assert_eq!((response["allowed"].as_bool(), response.get("warnings")), (Some(true), None), "{body}");

    // Unknown field in our opaque config: denied, naming the path.
    let mut bad = gpu_config();
    bad["sharing"] = json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}, "typo": true});
    let (_, body) = webhook.post(&review("ResourceClaim", claim("true", bad)));
    assert_eq!(body["response"]["allowed"], false, "{body}");
    let message = body["response"]["status"]["message"].as_str().unwrap();
    assert!(message.starts_with("spec.devices.config[0].opaque.parameters.sharing"), "{message}");

    // A template is reviewed at spec.spec.
    let template = json!({"metadata": {"name": "t", "namespace": "default"},
        "spec": {"spec": claim("true", json!({"apiVersion": "v9", "kind": "GpuConfig"}))["spec"].clone()}});
    let (_, body) = webhook.post(&review("ResourceClaimTemplate", template));
    assert!(
        body["response"]["status"]["message"].as_str().unwrap().starts_with("spec.spec.devices.config[0]"),
        "{body}"
    );

    // Selector problems are warnings, never denials.
    let (_, body) = webhook.post(&review("ResourceClaim", claim("device.driver > 1", gpu_config())));
    assert_eq!(body["response"]["allowed"], true);
    let warning = body["response"]["warnings"][0].as_str().unwrap();
    assert!(warning.contains("found no matching overload for '_>_'"), "{warning}");
    let h200 = r#"device.attributes["gpu.nvidia.com"].productName == "NVIDIA H200""#;
    let (_, body) = webhook.post(&review("ResourceClaim", claim(h200, gpu_config())));
    assert_eq!(body["response"]["allowed"], true);
    let warning = body["response"]["warnings"][0].as_str().unwrap();
    assert!(warning.starts_with("no device in the cluster matches request gpu today"), "{warning}");

    // Hostile requests: garbage, deep nesting, a body over 3 MiB; a
    // connection that sends nothing does not stall the others.
    let (status, body) = webhook.post(b"{\"apiVersion\": ");
    assert_eq!((status, body["response"]["allowed"].as_bool()), (200, Some(false)));
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let (_, body) = webhook.post(deep.as_bytes());
    assert_eq!(body["response"]["allowed"], false);
    let (status, _) = webhook.post(&vec![b' '; 4 * 1024 * 1024]);
    assert_eq!(status, 413);
    let mut idle = std::net::TcpStream::connect(("127.0.0.1", webhook.port)).unwrap();
    idle.write_all(b"\x16\x03\x01").unwrap();
    let start = Instant::now();
    let (status, _) = webhook.post(&review("ResourceClaim", claim("true", gpu_config())));
    assert_eq!(status, 200);
    assert!(start.elapsed() < Duration::from_secs(5), "a stalled connection held up a review");

    // cert-manager rotates the certificate: the next handshake serves it.
    let before = webhook.served_certificate();
    std::thread::sleep(Duration::from_millis(1100));
    let rotated = write_cert(webhook.dir.path());
    let after = webhook.served_certificate();
    assert_ne!(before, after);
    assert_eq!(after.replace('\n', ""), rotated.trim().replace('\n', ""));
    let (status, _) = webhook.post(&review("ResourceClaim", claim("true", gpu_config())));
    assert_eq!(status, 200, "the rotated certificate verifies");
}
