//! A GPU claim's `status.devices` as the real plugin binary writes it
//! against the API-server stand-in: each prepared device `Ready` with its
//! GPU UUID, a failed prepare `Ready=False` with its reason, unprepare
//! removing ours only; forged entries of ours for devices not allocated
//! dropped while other drivers' and pools' stay; and a server that refuses
//! the status write (403), fails it (500) or stalls it never fails or
//! holds up a prepare or unprepare: a warning says so, a 403 is explained
//! by one Warning Event on the claim, and the error counter counts it.

use std::time::{Duration, Instant};

use integration_tests::apiserver::Matcher;
use integration_tests::claim_fixtures::{self, Allocated, allocated_claim};
use integration_tests::kubelet::{KubeletConfig, claim};
use integration_tests::node::{DRIVER, NODE, RunningNode, WAIT};
use integration_tests::plugin_process::{PluginOptions, scrape_metrics};
use integration_tests::wait;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use serde_json::json;

const INVENTORY: &str = "gpus:\n  - model: H100-80GB\n    count: 4\n";
/// A call answered "promptly": well under the stalled write.
const PROMPT: Duration = Duration::from_secs(3);

fn start() -> RunningNode {
    let options = PluginOptions { metrics_addr: "127.0.0.1:0".into(), ..PluginOptions::default() };
    RunningNode::start(INVENTORY, KubeletConfig::new("", DRIVER), options)
}

fn devices(node: &RunningNode, name: &str) -> Vec<AllocatedDeviceStatus> {
    let claim: ResourceClaim = node.server.get(Some("default"), name).expect("the claim");
    claim.status.and_then(|s| s.devices).unwrap_or_default()
}

fn ours(node: &RunningNode, name: &str) -> Vec<AllocatedDeviceStatus> {
    devices(node, name).into_iter().filter(|d| d.driver == DRIVER).collect()
}

fn ready(entry: &AllocatedDeviceStatus) -> Option<(String, String, String)> {
    let c = entry.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn wait_until(node: &RunningNode, what: &str, check: impl FnMut() -> bool) {
    wait::wait_until(what, WAIT, check, || node.process.log());
}

fn claim_status_errors(node: &mut RunningNode) -> u64 {
    let addr = node.process.metrics_addr(WAIT).expect("the metrics address");
    let text = scrape_metrics(&addr).expect("scraping /metrics");
    let line = text.lines().find(|l| l.starts_with("gpu_dra_errors_total{kind=\"claim_status\"}"));
    line.and_then(|l| l.rsplit(' ').next()).map_or(0, |n| n.parse().expect("a counter"))
}

#[test]
fn prepared_and_failed_claims_show_their_devices_status_and_unprepare_removes_it() {
    let node = start();
    let train = node.gpu_claim("train", &["gpu-0", "gpu-1"]);
    assert!(node.prepare(std::slice::from_ref(&train))[&train.uid].is_ok());
    wait_until(&node, "both devices Ready", || {
        let ours = ours(&node, "train");
        ours.len() == 2 && ours.iter().all(|d| ready(d).is_some_and(|r| r.0 == "True" && r.1 == "Prepared"))
    });
    for entry in ours(&node, "train") {
        assert_eq!(entry.pool, NODE);
        let uuid = entry.data.as_ref().map(|d| d.0["uuid"].clone()).unwrap_or_default();
        assert!(uuid.as_str().is_some_and(|u| u.starts_with("GPU-")), "{entry:?}");
    }

    let broken = node.gpu_claim("broken", &["gpu-9"]);
    let error = node.prepare(std::slice::from_ref(&broken))[&broken.uid].clone().unwrap_err();
    wait_until(&node, "the failed device NotReady", || {
        ours(&node, "broken").first().and_then(ready).is_some_and(|r| r.0 == "False" && r.1 == "PrepareFailed")
    });
    let message = ready(&ours(&node, "broken")[0]).unwrap().2;
    assert!(message.contains("gpu-9") && error.contains(&message), "{message}\n{error}");

    node.unprepare(std::slice::from_ref(&train));
    wait_until(&node, "the entries to go", || ours(&node, "train").is_empty());
}

#[test]
fn forged_entries_of_ours_go_and_other_writers_entries_stay() {
    let node = start();
    let mut object = allocated_claim("default", "forged", &[Allocated::new("gpu", NODE, "gpu-0")], vec![]);
    let entry = |driver: &str, pool: &str, device: &str| -> AllocatedDeviceStatus {
        serde_json::from_value(json!({"driver": driver, "pool": pool, "device": device,
            "data": {"uuid": "GPU-forged"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "Forged", "message": "\u{1b}[2J",
                            "lastTransitionTime": "2020-01-01T00:00:00Z"}]}))
        .unwrap()
    };
    let theirs = entry("nic.example.com", NODE, "nic-0");
    let other_pool = entry(DRIVER, "node-b", "gpu-0");
    if let Some(status) = object.status.as_mut() {
        status.devices =
            Some(vec![theirs.clone(), entry(DRIVER, NODE, "gpu-3"), other_pool.clone(), entry(DRIVER, NODE, "gpu-0")]);
    }
    let uid = claim_fixtures::store(&node.server, &object).unwrap();
    let forged = claim("default", "forged", &uid);
    assert!(node.prepare(std::slice::from_ref(&forged))[&uid].is_ok());
    wait_until(&node, "our allocated device's entry rewritten", || {
        devices(&node, "forged").iter().any(|d| {
            d.pool == NODE && d.device == "gpu-0" && d.driver == DRIVER && ready(d).is_some_and(|r| r.1 == "Prepared")
        })
    });
    let now = devices(&node, "forged");
    assert_eq!(now.len(), 3, "{now:#?}");
    assert_eq!((&now[0], &now[1]), (&theirs, &other_pool), "another driver's and another pool's entries stay");
    assert_ne!(now[2].data.as_ref().unwrap().0["uuid"], "GPU-forged");

    node.unprepare(std::slice::from_ref(&forged));
    wait_until(&node, "our entry to go", || devices(&node, "forged").len() == 2);
}

#[test]
fn a_refused_failing_or_stalled_status_write_holds_up_no_call() {
    let mut node = start();
    // Refused (RBAC): the prepare succeeds; one Event explains it.
    node.server.faults().fail_next(Matcher::new("PUT", "/resourceclaims/refused/status"), 100, 403);
    let refused = node.gpu_claim("refused", &["gpu-0"]);
    let refusals = || node.server.faults().count(&Matcher::new("PUT", "/resourceclaims/refused/status"), 403);
    // Each prepare's write is waited for before the next: the queue keeps
    // only a claim's latest wish, so a second prepare submitted before the
    // first write starts replaces it and one write serves both.
    for tried in 1..=2 {
        assert!(node.prepare(std::slice::from_ref(&refused))[&refused.uid].is_ok());
        wait_until(&node, &format!("write {tried} tried"), || refusals() >= tried);
    }
    let events = || node.server.list::<Event>(Some("default"), "").unwrap_or_default();
    wait_until(&node, "the refusal's Event", || !events().is_empty());
    let all = events();
    assert_eq!(all.len(), 1, "explained once: {all:#?}");
    let event = &all[0];
    assert_eq!((event.reason.as_deref(), event.type_.as_deref()), (Some("ReadyConditionRefused"), Some("Warning")));
    assert_eq!(event.regarding.as_ref().and_then(|r| r.name.as_deref()), Some("refused"));
    let note = event.note.clone().unwrap_or_default();
    assert!(note.contains("HTTP 403") && note.contains("resourceclaims/driver for gpu.nvidia.com"), "{note}");
    node.unprepare(std::slice::from_ref(&refused));
    assert!(node.process.log().contains("cannot write the claim's device status"), "{}", node.process.log());

    // Failing (500): no Event (the next call tries again), counted.
    node.server.faults().fail_next(Matcher::new("PUT", "/resourceclaims/failing/status"), 100, 500);
    let failing = node.gpu_claim("failing", &["gpu-1"]);
    assert!(node.prepare(std::slice::from_ref(&failing))[&failing.uid].is_ok());
    wait_until(&node, "the failed write", || {
        node.server.faults().count(&Matcher::new("PUT", "/resourceclaims/failing/status"), 500) >= 1
    });

    // Stalled: the prepare and the unprepare answer at once.
    node.server.faults().delay(Matcher::new("PUT", "/resourceclaims/stalled/status"), Duration::from_secs(120));
    let stalled = node.gpu_claim("stalled", &["gpu-2"]);
    let start = Instant::now();
    assert!(node.prepare(std::slice::from_ref(&stalled))[&stalled.uid].is_ok());
    node.unprepare(std::slice::from_ref(&stalled));
    assert!(start.elapsed() < PROMPT, "prepare and unprepare took {:?}", start.elapsed());
    let records = node.records();
    assert!(records.iter().all(|r| r.name != "stalled"), "unprepared: {records:?}");

    let counted = claim_status_errors(&mut node);
    assert!(counted >= 3, "gpu_dra_errors_total{{kind=\"claim_status\"}} = {counted}");
}
