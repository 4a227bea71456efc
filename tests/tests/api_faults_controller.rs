//! The controller against a faulty API server, through the fault proxy
//! (`fault_proxy`): claim writes answered with a body cut short, a list cut
//! short, garbage in a watch and status writes answered with a 503 page
//! neither stall its loop nor double an allocation, and it recovers when
//! the fault lifts; with the leader's Lease calls hung, the leader stops
//! writing before the other replica starts.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use integration_tests::apiserver::{ApiServer, RequestRecord};
use integration_tests::controller_process::ControllerProcess;
use integration_tests::fault_proxy::{Fault, FaultProxy, Rule};
use integration_tests::wait::eventually;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::json;

struct Cluster {
    server: ApiServer,
    proxy: FaultProxy,
    dir: tempfile::TempDir,
}

impl Cluster {
    async fn start(nodes: usize, gpus: usize) -> Cluster {
        let server = ApiServer::start().await.unwrap();
        let proxy = FaultProxy::start(server.addr()).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        proxy.write_kubeconfig(&dir.path().join("kubeconfig")).unwrap();
        let class: DeviceClass = integration_tests::claim_fixtures::shipped_device_class("gpu.nvidia.com");
        server.create(&class).unwrap();
        for n in 0..nodes {
            let name = format!("node-{n:03}");
            let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
            server.create(&node).unwrap();
            let devices: Vec<_> = (0..gpus)
                .map(|i| json!({"name": format!("gpu-{i}"), "attributes": {"type": {"string": "gpu"}}}))
                .collect();
            let slice: ResourceSlice = serde_json::from_value(json!({
                "metadata": {"name": format!("{name}-gpu.nvidia.com")},
                "spec": {"driver": "gpu.nvidia.com", "nodeName": name,
                         "pool": {"name": name, "generation": 1, "resourceSliceCount": 1}, "devices": devices},
            }))
            .unwrap();
            server.create(&slice).unwrap();
        }
        Cluster { server, proxy, dir }
    }

    /// A controller whose calls go through the proxy, with a 2 s call bound.
    fn controller(&self, identity: &str) -> ControllerProcess {
        let args = ["--explain-after", "0s", "--api-timeout", "2s"];
        ControllerProcess::spawn(&self.dir.path().join("kubeconfig"), identity, &args).unwrap()
    }

    fn delegated(&self, name: &str) {
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "annotations": {"gpu.nvidia.com/allocate": "true"}},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        }))
        .unwrap();
        self.server.create(&claim).unwrap();
    }

    fn claims(&self) -> Vec<ResourceClaim> {
        self.server.list::<ResourceClaim>(Some("default"), "").unwrap()
    }

    /// How many claims are allocated; panics if a device is in two.
    fn allocated_once(&self) -> usize {
        let mut devices = BTreeSet::new();
        let mut allocated = 0;
        for claim in self.claims() {
            let Some(allocation) = claim.status.and_then(|s| s.allocation) else { continue };
            allocated += 1;
            for r in allocation.devices.and_then(|d| d.results).unwrap_or_default() {
                let device = format!("{}/{}", r.pool, r.device);
                assert!(devices.insert(device.clone()), "{device} is allocated twice");
            }
        }
        allocated
    }
}

/// Once the faults are cleared, each of the `claims` made so far is
/// allocated once, and the watches still work: a new claim is allocated too.
async fn recovers(cluster: &Cluster, controller: &ControllerProcess, claims: usize) {
    cluster.proxy.clear();
    let what = format!("all {claims} allocated once");
    eventually(&what, Duration::from_secs(30), || cluster.allocated_once() == claims, || controller.log()).await;
    cluster.delegated("after");
    let log = || controller.log();
    eventually("the new claim allocated", Duration::from_secs(30), || cluster.allocated_once() == claims + 1, log)
        .await;
}

fn is_write(r: &RequestRecord) -> bool {
    matches!(r.method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cut_short_writes_and_lists_neither_stall_nor_double_and_the_loop_recovers() {
    let cluster = Cluster::start(1, 8).await;
    // Every claim status write lands, but its answer stops half-way and the
    // connection stays open; the slice list is cut short the same way.
    cluster.proxy.inject(Rule::path("PUT", "/resourceclaims/").watches(false), Fault::TruncateThenStall);
    cluster.proxy.inject(Rule::path("GET", "/resourceslices").watches(false), Fault::TruncateThenStall);
    for i in 0..6 {
        cluster.delegated(&format!("d{i}"));
    }
    let controller = cluster.controller("a");
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(cluster.allocated_once(), 0, "nothing allocated before the fleet is listed");
    // The list goes through now; claim writes are still cut short.
    cluster.proxy.clear();
    cluster.proxy.inject(Rule::path("PUT", "/resourceclaims/").watches(false), Fault::TruncateThenStall);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let during = cluster.allocated_once();
    println!("allocated while every claim write's answer was cut short: {during} of 6");

    recovers(&cluster, &controller, 6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn garbage_in_watches_and_503_pages_are_survived_and_logged_sparingly() {
    let cluster = Cluster::start(1, 8).await;
    cluster.proxy.inject(Rule::path("GET", "/resourceclaims").watches(true), Fault::WatchGarbage);
    cluster.proxy.inject(Rule::path("PUT", "/resourceclaims/"), Fault::Status(503));
    cluster.proxy.inject(Rule::path("POST", "/events"), Fault::Status(503));
    for i in 0..4 {
        cluster.delegated(&format!("d{i}"));
    }
    let controller = cluster.controller("a");
    tokio::time::sleep(Duration::from_secs(12)).await;
    let log = controller.log();
    let lines = log.lines().count();
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    println!("12 s of 503 pages and watch garbage: {lines} log lines, the longest {longest} bytes");
    assert!(lines < 60, "{lines} lines:\n{log}");
    assert!(longest < 1500, "a {longest}-byte line");
    assert!(!log.contains("<html>\n") && !log.contains("Failed to parse error data"), "{log}");
    assert!(log.contains("unavailable (HTTP 503"), "{log}");

    recovers(&cluster, &controller, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_whose_lease_calls_hang_stops_writing_before_the_other_starts() {
    let cluster = Cluster::start(4, 8).await;
    let a = cluster.controller("a");
    let holder = || {
        cluster
            .server
            .get::<Lease>(Some("gpu-dra-driver"), "gpu-dra-controller")
            .ok()
            .and_then(|l| l.spec.and_then(|s| s.holder_identity))
    };
    eventually("a to lead", Duration::from_secs(30), || holder().as_deref() == Some("a"), || a.log()).await;
    let b = cluster.controller("b");
    let logs = || format!("--- a\n{}\n--- b\n{}", a.log(), b.log());
    // a keeps working, then its Lease calls stop answering; its other
    // calls still go through, so only its own check can stop its writes.
    let mut created = 0;
    for _ in 0..6 {
        cluster.delegated(&format!("c{created:02}"));
        created += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eventually("a's allocations", Duration::from_secs(30), || cluster.allocated_once() == created, &logs).await;
    let hung = Rule { path_contains: "/leases/".into(), ..Rule::any() }.agent("(a)");
    cluster.proxy.inject(hung, Fault::Stall);
    let started = Instant::now();
    // New work keeps arriving through the takeover (at most 22 claims in
    // all, for the 32 GPUs).
    while started.elapsed() < Duration::from_secs(8) {
        cluster.delegated(&format!("c{created:02}"));
        created += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eventually("b to lead", Duration::from_secs(30), || holder().as_deref() == Some("b"), &logs).await;
    eventually("every claim allocated once", Duration::from_secs(30), || cluster.allocated_once() == created, &logs)
        .await;

    let records = cluster.server.faults().requests();
    let by = |r: &RequestRecord, id: &str| r.user_agent.contains(&format!("({id})"));
    let b_first = records.iter().position(|r| by(r, "b") && is_write(r)).expect("b wrote");
    let a_after: Vec<String> = records[b_first..]
        .iter()
        .filter(|r| by(r, "a") && is_write(r))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    let a_writes = records.iter().filter(|r| by(r, "a") && is_write(r)).count();
    println!("a wrote {a_writes} times; b's first write was request #{b_first}; a's writes after it: {a_after:?}");
    assert!(a_writes > 6, "a did the first allocations");
    assert!(a_after.is_empty(), "a wrote after b's first write: {a_after:?}\n{}", logs());
    assert!(a.log().contains("no longer leading"), "{}", a.log());
}
