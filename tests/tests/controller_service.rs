//! `gpu-dra-controller run` against the API stand-in: explanation events,
//! delegated allocation with conflicts, leader election and failover.

use std::collections::HashMap;
use std::time::Duration;

use integration_tests::apiserver::{ApiServer, Matcher};
use integration_tests::claim_fixtures::pending_claim;
use integration_tests::controller_process::ControllerProcess;
use integration_tests::wait::eventually;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::json;

fn class() -> DeviceClass {
    integration_tests::claim_fixtures::shipped_device_class("gpu.nvidia.com")
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
}

fn slice(node: &str, gpus: usize) -> ResourceSlice {
    let devices: Vec<_> =
        (0..gpus).map(|i| json!({"name": format!("gpu-{i}"), "attributes": {"type": {"string": "gpu"}}})).collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-gpu.nvidia.com")},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices},
    }))
    .unwrap()
}

/// A claim of `count` GPUs, whose allocation the controller makes when `delegated`.
fn claim(name: &str, count: u32, delegated: bool) -> ResourceClaim {
    let mut claim = pending_claim(name, "gpu.nvidia.com", count, None);
    if delegated {
        claim.metadata.annotations = Some([("gpu.nvidia.com/allocate".to_string(), "true".to_string())].into());
    }
    claim
}

struct Cluster {
    server: ApiServer,
    dir: tempfile::TempDir,
}

impl Cluster {
    async fn start(nodes: usize, gpus: usize) -> Cluster {
        let server = ApiServer::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        server.write_kubeconfig(&dir.path().join("kubeconfig")).unwrap();
        server.create(&class()).unwrap();
        for n in 0..nodes {
            let name = format!("node-{n:03}");
            server.create(&node(&name)).unwrap();
            server.create(&slice(&name, gpus)).unwrap();
        }
        Cluster { server, dir }
    }

    fn controller(&self, identity: &str, args: &[&str]) -> ControllerProcess {
        ControllerProcess::spawn(&self.dir.path().join("kubeconfig"), identity, args).unwrap()
    }

    fn claims(&self) -> Vec<ResourceClaim> {
        self.server.list::<ResourceClaim>(Some("default"), "").unwrap()
    }

    fn events(&self) -> Vec<Event> {
        self.server.list::<Event>(Some("default"), "").unwrap()
    }

    fn events_about(&self, name: &str) -> Vec<Event> {
        self.events()
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .collect()
    }
}

fn allocated_devices(claim: &ResourceClaim) -> Vec<String> {
    let results = claim.status.as_ref().and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref());
    results
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .map(|r| format!("{}/{}/{}", r.driver, r.pool, r.device))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn pending_claims_and_their_pods_get_the_explanation_until_allocated() {
    let cluster = Cluster::start(1, 2).await;
    cluster.server.create(&claim("big", 3, false)).unwrap();
    cluster.server.create(&claim("fits", 1, false)).unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "trainer", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "x"}], "resourceClaims": [{"name": "gpus", "resourceClaimName": "big"}]},
    }))
    .unwrap();
    cluster.server.create(&pod).unwrap();
    let controller = cluster.controller("a", &["--explain-after", "0s"]);
    eventually(
        "the claim's and the pod's events",
        Duration::from_secs(60),
        || cluster.events_about("big").len() == 1 && cluster.events_about("trainer").len() == 1,
        || controller.log(),
    )
    .await;
    let event = &cluster.events_about("big")[0];
    assert_eq!(event.reason.as_deref(), Some("Unsatisfiable"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.reporting_controller.as_deref(), Some("gpu.nvidia.com/controller"));
    let note = event.note.clone().unwrap();
    assert!(note.contains("default/big") && note.contains("3"), "{note}");
    let pod_note = cluster.events_about("trainer")[0].note.clone().unwrap();
    assert!(pod_note.starts_with("claim big: "), "{pod_note}");
    // A claim that fits waits for the scheduler: nothing to explain.
    assert!(cluster.events_about("fits").is_empty());

    // The answer changes (a second node, still too small): the event is
    // replaced by one with the new answer (an Event's note is immutable).
    cluster.server.create(&node("node-small")).unwrap();
    cluster.server.create(&slice("node-small", 2)).unwrap();
    eventually(
        "the explanation to follow the fleet",
        Duration::from_secs(30),
        || {
            let events = cluster.events_about("big");
            events.len() == 1 && events[0].note.as_deref() != Some(note.as_str())
        },
        || controller.log(),
    )
    .await;
    assert!(
        cluster.events_about("big")[0].note.as_deref().unwrap().contains("2 nodes"),
        "{:?}",
        cluster.events_about("big")[0].note
    );

    // The scheduler allocates it (on a node added meanwhile): the events go.
    cluster.server.create(&node("node-big")).unwrap();
    cluster.server.create(&slice("node-big", 4)).unwrap();
    let results: Vec<_> = (0..3)
        .map(
            |i| json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-big", "device": format!("gpu-{i}")}),
        )
        .collect();
    let status = json!({"status": {"allocation": {"devices": {"results": results}}}});
    cluster.server.merge_patch::<ResourceClaim>(Some("default"), "big", true, &status).unwrap();
    eventually(
        "the events to be deleted",
        Duration::from_secs(30),
        || cluster.events_about("big").is_empty() && cluster.events_about("trainer").is_empty(),
        || controller.log(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn delegated_claims_are_allocated_through_conflicts_and_deallocated_on_delete() {
    let cluster = Cluster::start(1, 2).await;
    // The first two status writes lose a race (409): the controller re-reads and retries.
    cluster.server.faults().fail_next(Matcher::new("PUT", "/status"), 2, 409);
    for name in ["d1", "d2", "d3"] {
        cluster.server.create(&claim(name, 1, true)).unwrap();
    }
    let controller = cluster.controller("a", &["--explain-after", "0s"]);
    let allocated = |c: &ResourceClaim| c.status.as_ref().and_then(|s| s.allocation.as_ref()).is_some();
    eventually(
        "two allocations and one explanation",
        Duration::from_secs(60),
        || cluster.claims().iter().filter(|c| allocated(c)).count() == 2 && !cluster.events().is_empty(),
        || controller.log(),
    )
    .await;
    let claims = cluster.claims();
    let mut devices: Vec<String> = claims.iter().flat_map(allocated_devices).collect();
    devices.sort();
    assert_eq!(devices, ["gpu.nvidia.com/node-000/gpu-0", "gpu.nvidia.com/node-000/gpu-1"]);
    for c in claims.iter().filter(|c| allocated(c)) {
        assert_eq!(c.metadata.finalizers.as_deref(), Some(&["gpu.nvidia.com/delegated-allocation".to_owned()][..]));
    }
    let waiting: Vec<_> = claims.iter().filter(|c| !allocated(c)).map(|c| c.metadata.name.clone().unwrap()).collect();
    assert_eq!(cluster.events_about(&waiting[0]).len(), 1);
    let conflicts = cluster.server.faults().count(&Matcher::new("PUT", "/status"), 409);
    assert_eq!(conflicts, 2, "the injected conflicts were hit");

    // Deleting an allocated claim: the controller deallocates it and removes
    // its finalizer (so it goes), and the waiting claim gets its device.
    let first = claims.iter().find(|c| allocated(c)).unwrap().metadata.name.clone().unwrap();
    cluster.server.delete::<ResourceClaim>(Some("default"), &first).unwrap();
    eventually(
        "the deleted claim to go and the waiting one to be allocated",
        Duration::from_secs(60),
        || {
            let now = cluster.claims();
            now.len() == 2 && now.iter().all(allocated)
        },
        || controller.log(),
    )
    .await;
    eventually(
        "the explanation to go",
        Duration::from_secs(30),
        || cluster.events_about(&waiting[0]).is_empty(),
        || controller.log(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_share_the_work_through_a_lease_and_survive_a_killed_leader() {
    let cluster = Cluster::start(64, 8).await;
    for i in 0..2000 {
        cluster.server.create(&claim(&format!("c{i:04}"), 1, true)).unwrap();
    }
    let args = ["--explain-after", "0s", "--event-qps", "5000"];
    let mut replicas: HashMap<String, ControllerProcess> =
        ["a", "b"].iter().map(|id| (id.to_string(), cluster.controller(id, &args))).collect();
    let log = |replicas: &HashMap<String, ControllerProcess>| {
        replicas.iter().map(|(id, r)| format!("--- {id}\n{}", r.log())).collect::<String>()
    };
    let allocated = |cluster: &Cluster| {
        cluster.claims().iter().filter(|c| c.status.as_ref().and_then(|s| s.allocation.as_ref()).is_some()).count()
    };
    eventually("the first allocations", Duration::from_secs(120), || allocated(&cluster) >= 50, || log(&replicas))
        .await;
    // Kill the leader mid-run: the other takes the lease over and finishes.
    let lease: Lease = cluster.server.get(Some("gpu-dra-driver"), "gpu-dra-controller").unwrap();
    let holder = lease.spec.and_then(|s| s.holder_identity).unwrap();
    let leader_id = holder.clone();
    replicas.get_mut(&leader_id).expect("the holder is one of the replicas").kill();
    let done = |cluster: &Cluster| {
        let claims = cluster.claims();
        let events = cluster.events();
        let explained: std::collections::HashSet<&str> =
            events.iter().filter_map(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref())).collect();
        let allocated =
            claims.iter().filter(|c| c.status.as_ref().and_then(|s| s.allocation.as_ref()).is_some()).count();
        let waiting_explained = claims
            .iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.allocation.as_ref()).is_none())
            .all(|c| explained.contains(c.metadata.name.as_deref().unwrap_or_default()));
        allocated == 512 && waiting_explained
    };
    eventually(
        "512 claims allocated and the other 1,488 explained",
        Duration::from_secs(240),
        || done(&cluster),
        || log(&replicas),
    )
    .await;
    let lease: Lease = cluster.server.get(Some("gpu-dra-driver"), "gpu-dra-controller").unwrap();
    let spec = lease.spec.unwrap();
    assert_ne!(spec.holder_identity.as_deref(), Some(holder.as_str()), "the lease changed hands");
    assert!(spec.lease_transitions.unwrap_or(0) >= 1);
    // No device is in two allocations, and nothing was lost.
    let mut seen: HashMap<String, String> = HashMap::new();
    let claims = cluster.claims();
    assert_eq!(claims.len(), 2000);
    for c in &claims {
        for device in allocated_devices(c) {
            if let Some(other) = seen.insert(device.clone(), c.metadata.name.clone().unwrap()) {
                panic!("{device} is allocated to {other} and {}", c.metadata.name.as_deref().unwrap());
            }
        }
    }
    assert_eq!(seen.len(), 512);
}

/// A delegated claim whose consumers are gone is deallocated after the
/// grace period (and, still delegated, allocated again on the next pass);
/// one nobody used yet keeps its devices.
#[tokio::test(flavor = "multi_thread")]
async fn delegated_claims_are_deallocated_when_their_consumers_are_gone() {
    let cluster = Cluster::start(1, 2).await;
    cluster.server.create(&claim("used", 1, true)).unwrap();
    cluster.server.create(&claim("unused", 1, true)).unwrap();
    let controller = cluster.controller("a", &["--explain-after", "0s", "--deallocate-after", "1s"]);
    let allocated = |name: &str| {
        cluster
            .server
            .get::<ResourceClaim>(Some("default"), name)
            .ok()
            .and_then(|c| c.status)
            .and_then(|s| s.allocation)
            .is_some()
    };
    eventually(
        "both allocated",
        Duration::from_secs(60),
        || allocated("used") && allocated("unused"),
        || controller.log(),
    )
    .await;
    let reserve = json!({"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "11111111-2222-3333-4444-555555555555"}]}});
    cluster.server.merge_patch::<ResourceClaim>(Some("default"), "used", true, &reserve).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let status_writes = |name: &str| {
        let path = format!("/resourceclaims/{name}/status");
        cluster.server.faults().requests().iter().filter(|r| r.method == "PUT" && r.path.ends_with(&path)).count()
    };
    assert_eq!((status_writes("used"), status_writes("unused")), (1, 1), "nothing deallocated while in use or unused");
    let release = json!({"status": {"reservedFor": null}});
    cluster.server.merge_patch::<ResourceClaim>(Some("default"), "used", true, &release).unwrap();
    eventually(
        "the idle claim deallocated and allocated again",
        Duration::from_secs(30),
        || status_writes("used") >= 3,
        || controller.log(),
    )
    .await;
    assert_eq!(status_writes("unused"), 1);
}

/// An administrator's DeviceTaintRule is honoured as the scheduler
/// honours it: a delegated claim is not given the device it taints, the
/// explanation names the rule's taint, and the device comes back when the
/// rule goes. A rule the allocator cannot apply (no taint key, refused by
/// the real API server) is left out on its own.
#[tokio::test(flavor = "multi_thread")]
async fn device_taint_rules_take_devices_out_and_give_them_back() {
    use k8s_openapi::api::resource::v1::DeviceTaintRule;
    let cluster = Cluster::start(1, 1).await;
    let rule = |name: &str, key: &str| -> DeviceTaintRule {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "node-000", "device": "gpu-0"},
                     "taint": {"key": key, "value": "drain", "effect": "NoSchedule"}},
        }))
        .unwrap()
    };
    cluster.server.create(&rule("maintenance", "example.com/maintenance")).unwrap();
    cluster.server.create(&rule("keyless", "")).unwrap();
    cluster.server.create(&claim("one", 1, true)).unwrap();
    let controller = cluster.controller("a", &["--explain-after", "0s"]);
    eventually(
        "the explanation",
        Duration::from_secs(60),
        || !cluster.events_about("one").is_empty(),
        || controller.log(),
    )
    .await;
    let note = cluster.events_about("one")[0].note.clone().unwrap();
    assert!(note.contains("example.com/maintenance=drain:NoSchedule"), "{note}");
    let claim = cluster.claims().into_iter().find(|c| c.metadata.name.as_deref() == Some("one")).unwrap();
    assert!(allocated_devices(&claim).is_empty(), "the tainted GPU was given: {claim:?}");
    assert!(controller.log().contains("a DeviceTaintRule is left out"), "{}", controller.log());

    cluster.server.delete::<DeviceTaintRule>(None, "maintenance").unwrap();
    let allocated = || {
        let claims = cluster.claims();
        claims.iter().any(|c| allocated_devices(c) == ["gpu.nvidia.com/node-000/gpu-0"])
    };
    eventually("the claim allocated once the rule is gone", Duration::from_secs(60), allocated, || controller.log())
        .await;
}
