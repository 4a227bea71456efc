//! The plugin's gRPC servers in-process, over a test `DraService`, called by
//! the kubelet stand-in through real unix sockets: the edge conversions
//! (base request names, share_id in v1 only) and the every-claim rules.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpu_dra_driver::inventory::fake;
use gpu_dra_driver::names::{DriverName, NodeName};
use gpu_kubelet_plugin::deadline::Deadline;
use gpu_kubelet_plugin::kubelet_api::grpc::DraService;
use gpu_kubelet_plugin::kubelet_api::grpc::serve::{self, ServeConfig};
use gpu_kubelet_plugin::kubelet_api::sockets::SocketPaths;
use gpu_kubelet_plugin::observe::metrics::Metrics;
use gpu_kubelet_plugin::prepare::types::{ClaimError, ClaimOutcome, ClaimRef};
use gpu_kubelet_plugin::prepared::PreparedDevice;
use integration_tests::kubelet::{DraVersion, Kubelet, KubeletConfig, KubeletError, claim};

const OK: &str = "11111111-1111-4111-8111-111111111111";
const FAILS: &str = "22222222-2222-4222-8222-222222222222";
const FORGOTTEN: &str = "33333333-3333-4333-8333-333333333333";
const EXTRA: &str = "44444444-4444-4444-8444-444444444444";
const FLAKY: &str = "55555555-5555-4555-8555-555555555555";

/// Prepares OK, fails FAILS, forgets FORGOTTEN, invents EXTRA, and fails
/// FLAKY on its first two calls only.
#[derive(Default)]
struct Scripted {
    calls: Mutex<Vec<Vec<ClaimRef>>>,
    deadlines: Mutex<Vec<Deadline>>,
}

impl DraService for Scripted {
    async fn prepare(&self, claims: Vec<ClaimRef>, deadline: Deadline) -> HashMap<String, ClaimOutcome> {
        self.calls.lock().unwrap().push(claims.clone());
        self.deadlines.lock().unwrap().push(deadline);
        let mut out = HashMap::new();
        for c in claims {
            match c.uid.as_str() {
                OK => {
                    let device = PreparedDevice {
                        request_names: vec!["gpu/large".into(), "gpu/small".into()],
                        pool_name: "node-a".into(),
                        device_name: "gpu-0".into(),
                        cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim={OK}-gpu-0")],
                        share_id: Some("5d2c7a4e-0000-4000-8000-000000000001".into()),
                    };
                    out.insert(c.uid, Ok(vec![device]));
                }
                FLAKY => {
                    let calls = self.calls.lock().unwrap().iter().flatten().filter(|c| c.uid == FLAKY).count();
                    let result = if calls <= 2 {
                        Err(ClaimError::service(format!("attempt {calls}: API server unavailable")))
                    } else {
                        Ok(Vec::new())
                    };
                    out.insert(c.uid, result);
                }
                FAILS => {
                    out.insert(
                        c.uid,
                        Err(ClaimError::service(format!("claim {}/{}: not allocated", c.namespace, c.name))),
                    );
                }
                _ => {}
            }
        }
        out.insert(EXTRA.into(), Ok(Vec::new()));
        out
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>, deadline: Deadline) -> HashMap<String, Result<(), ClaimError>> {
        self.deadlines.lock().unwrap().push(deadline);
        claims.into_iter().filter(|c| c.uid != FORGOTTEN).map(|c| (c.uid, Ok(()))).collect()
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    servers: serve::PluginServers,
    service: Arc<Scripted>,
    kubelet_config: KubeletConfig,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeName::new("node-a").unwrap();
    let driver = DriverName::nvidia_default();
    let inventory = fake::parse("gpus:\n  - model: H100-80GB\n    count: 1\n", &node).unwrap();
    let (_tx, rx) = tokio::sync::watch::channel(Arc::new(inventory));
    let registry = dir.path().join("registry");
    let config = ServeConfig {
        paths: SocketPaths::new(&dir.path().join("plugins"), &registry, &driver),
        driver,
        node,
        health_resend: Duration::from_secs(60),
    };
    let service = Arc::new(Scripted::default());
    let servers = serve::start(&config, service.clone(), rx, Arc::new(Metrics::new())).await.unwrap();
    Setup { _dir: dir, servers, service, kubelet_config: KubeletConfig::new(registry, "gpu.nvidia.com") }
}

#[tokio::test]
async fn v1_answers_with_base_request_names_and_share_id() {
    let s = setup().await;
    let kubelet = Kubelet::new(s.kubelet_config.clone());
    let plugin = kubelet.wait_and_register(Duration::from_secs(10)).await.unwrap();
    assert_eq!(plugin.version, DraVersion::V1);
    let devices = kubelet.prepare(&plugin, &[claim("ns", "c", OK)]).await.unwrap();
    let device = &devices[OK][0];
    assert_eq!(device.request_names, ["gpu"]);
    assert_eq!(device.share_id.as_deref(), Some("5d2c7a4e-0000-4000-8000-000000000001"));
    assert_eq!((device.pool_name.as_str(), device.device_name.as_str()), ("node-a", "gpu-0"));
    // The core saw the claim exactly as the kubelet sent it.
    let calls = s.service.calls.lock().unwrap().clone();
    assert_eq!(calls, [vec![ClaimRef { namespace: "ns".into(), name: "c".into(), uid: OK.into() }]]);
    assert!(s.servers.registration_state().is_registered());
}

#[tokio::test]
async fn the_kubelets_deadline_reaches_the_service() {
    let s = setup().await;
    let mut config = s.kubelet_config.clone();
    config.call_timeout = Duration::from_secs(7);
    let kubelet = Kubelet::new(config);
    let plugin = kubelet.wait_and_register(Duration::from_secs(10)).await.unwrap();
    kubelet.prepare(&plugin, &[claim("ns", "c", OK)]).await.unwrap();
    kubelet.unprepare(&plugin, &[claim("ns", "c", OK)]).await.unwrap();
    let deadlines = s.service.deadlines.lock().unwrap().clone();
    // Sent as grpc-timeout; tonic's client may round it down a little.
    assert_eq!(deadlines.len(), 2);
    for d in deadlines {
        assert!(d.timeout <= Duration::from_secs(7) && d.timeout > Duration::from_secs(6), "{:?}", d.timeout);
    }
}

#[tokio::test]
async fn v1beta1_answers_without_share_id() {
    let s = setup().await;
    let kubelet = Kubelet::new(s.kubelet_config.clone().v1beta1_only());
    let plugin = kubelet.wait_and_register(Duration::from_secs(10)).await.unwrap();
    assert_eq!(plugin.version, DraVersion::V1beta1);
    let devices = kubelet.prepare(&plugin, &[claim("ns", "c", OK)]).await.unwrap();
    assert_eq!(devices[OK][0].request_names, ["gpu"]);
    assert_eq!(devices[OK][0].share_id, None);
}

#[tokio::test]
async fn every_claim_gets_exactly_one_entry() {
    let s = setup().await;
    let kubelet = Kubelet::new(s.kubelet_config.clone());
    let plugin = kubelet.wait_and_register(Duration::from_secs(10)).await.unwrap();
    let claims = [claim("ns", "ok", OK), claim("ns", "fails", FAILS), claim("ns", "forgotten", FORGOTTEN)];
    let raw = kubelet.prepare_raw(&plugin, &claims).await.unwrap();
    let mut uids: Vec<&str> = raw.keys().map(String::as_str).collect();
    uids.sort_unstable();
    // EXTRA (not asked for) is dropped; FORGOTTEN gets an error.
    assert_eq!(uids, [OK, FAILS, FORGOTTEN]);
    assert_eq!(raw[OK].error, "");
    assert_eq!(raw[FAILS].error, "claim ns/fails: not allocated");
    assert!(raw[FORGOTTEN].error.contains("no prepare result"), "{}", raw[FORGOTTEN].error);

    // The kubelet surfaces the per-claim error.
    let err = kubelet.prepare(&plugin, &claims[1..2]).await.unwrap_err();
    assert!(matches!(&err, KubeletError::ClaimFailed { claim, .. } if claim == "fails"), "{err}");
    assert_eq!(err.to_string(), "NodePrepareResources failed for ResourceClaim fails: claim ns/fails: not allocated");

    let raw = kubelet.unprepare_raw(&plugin, &claims).await.unwrap();
    assert_eq!(raw.len(), 3);
    assert!(raw[FORGOTTEN].contains("no unprepare result"), "{}", raw[FORGOTTEN]);
    assert_eq!(raw[OK], "");
}

#[tokio::test]
async fn the_kubelet_retries_a_failed_prepare() {
    let s = setup().await;
    let kubelet = Kubelet::new(s.kubelet_config.clone());
    let plugin = kubelet.wait_and_register(Duration::from_secs(10)).await.unwrap();
    let claims = [claim("ns", "flaky", FLAKY)];
    let (result, errors) = kubelet.prepare_until_ok(&plugin, &claims, 5, Duration::from_millis(10)).await;
    assert_eq!(result.unwrap()[FLAKY], []);
    let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        [
            "NodePrepareResources failed for ResourceClaim flaky: attempt 1: API server unavailable",
            "NodePrepareResources failed for ResourceClaim flaky: attempt 2: API server unavailable",
        ]
    );
}

#[tokio::test]
async fn stop_removes_the_registration_socket_then_the_dra_socket() {
    let s = setup().await;
    let paths = s.servers.paths().clone();
    assert!(paths.dra.exists() && paths.registration.exists());
    s.servers.stop().await;
    assert!(!paths.registration.exists());
    assert!(!paths.dra.exists());
}
