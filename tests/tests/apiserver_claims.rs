//! The plugin's ResourceClaim lookup against the API server stand-in.

use std::time::Duration;

use gpu_dra_driver::service::api_call::CallError;
use gpu_kubelet_plugin::prepare::claims::{ClaimSourceConfig, KubeClaimSource};
use integration_tests::apiserver::{ApiServer, Matcher};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::json;

async fn source(server: &ApiServer, config: ClaimSourceConfig) -> KubeClaimSource {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path).unwrap();
    let client = gpu_dra_driver::service::kube_client::client_from_file(&path).await.unwrap();
    KubeClaimSource::new(client, config)
}

fn config() -> ClaimSourceConfig {
    ClaimSourceConfig::default()
}

/// A lookup's deadline, as the kubelet's call would set it.
fn soon() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(10)
}

fn claim(name: &str, allocated: bool) -> ResourceClaim {
    let mut value = json!({
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
    });
    if allocated {
        value["status"] = json!({"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}]}}});
    }
    serde_json::from_value(value).unwrap()
}

const CLAIM_GETS: &str = "/namespaces/ns/resourceclaims/";

#[tokio::test]
async fn reads_claims_and_caches_only_allocated_ones() {
    let server = ApiServer::start().await.unwrap();
    let created = server.create_with_status(&claim("a", true)).unwrap();
    server.create(&claim("pending", false)).unwrap();
    let source = source(&server, config()).await;

    let got = source.get("ns", "a", soon()).await.unwrap().unwrap();
    assert_eq!(got.metadata.uid, created.metadata.uid);
    assert!(source.get("ns", "missing", soon()).await.unwrap().is_none());
    assert!(source.get("ns", "pending", soon()).await.unwrap().unwrap().status.is_none());
    assert_eq!(source.cached(), 1);

    // A second lookup of the allocated claim is served from the cache; the
    // pending one is read again (its allocation may appear any moment).
    source.get("ns", "a", soon()).await.unwrap();
    source.get("ns", "pending", soon()).await.unwrap();
    let gets = |name: &str| server.faults().count(&Matcher::new("GET", &format!("{CLAIM_GETS}{name}")), 200);
    assert_eq!((gets("a"), gets("pending")), (1, 2));
    source.forget("ns", "a");
    source.get("ns", "a", soon()).await.unwrap();
    assert_eq!(gets("a"), 2);
}

#[tokio::test]
async fn transient_errors_are_retried_and_others_are_not() {
    let server = ApiServer::start().await.unwrap();
    server.create_with_status(&claim("a", true)).unwrap();
    let source = source(&server, config()).await;
    server.faults().fail_next(Matcher::new("GET", CLAIM_GETS), 3, 500);
    assert!(source.get("ns", "a", soon()).await.unwrap().is_some());
    assert_eq!(server.faults().count(&Matcher::new("GET", CLAIM_GETS), 500), 3);

    source.forget("ns", "a");
    // Failing for good: retried with backoff until the deadline, and the
    // error says so in words with the last cause.
    server.faults().fail_next(Matcher::new("GET", CLAIM_GETS), 1000, 503);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let err = source.get("ns", "a", deadline).await.unwrap_err();
    assert!(tokio::time::Instant::now() < deadline + Duration::from_millis(500), "answered at the deadline");
    let CallError::Deadline { attempts, last: Some(last), .. } = &err.0 else { panic!("{err:?}") };
    assert!(*attempts >= 3, "{err}");
    assert!(last.starts_with("the API server is unavailable (HTTP 503"), "{err}");
    assert!(err.to_string().starts_with("reading ResourceClaim ns/a: no answer within"), "{err}");
    server.faults().clear();

    // A client error (here 403) is not retried.
    server.faults().fail_next(Matcher::new("GET", CLAIM_GETS), 10, 403);
    assert!(matches!(source.get("ns", "a", soon()).await, Err(e) if matches!(e.0, CallError::Failed { .. })));
    assert_eq!(server.faults().count(&Matcher::new("GET", CLAIM_GETS), 403), 1);
}
