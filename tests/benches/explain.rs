//! The controller explaining pending claims at fleet scale, in the API
//! stand-in: 1,000 nodes × 8 H100, 10,000 claims none of which fits (half
//! want 9 GPUs on one node, half an H200 the fleet does not have), and
//! 1,000 more with nine one-GPU requests each, more than any node holds
//! (each with its own request names, so none shares another's search;
//! before the allocator counted, each such search ran out its step budget
//! on every node, ~0.7 s a node). Prints
//! how long the controller (release build) takes from its start until every
//! claim has its explanation event (target < 10 s), and its peak RSS
//! (target ≤ 150 MiB). Figures only.
//!
//! `cargo bench -p integration-tests --bench explain`

use std::time::{Duration, Instant};

use integration_tests::apiserver::ApiServer;
use integration_tests::controller_process::ControllerProcess;
use integration_tests::webhook_process::gpus_slice;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::json;

const NODES: usize = 1000;
const GPUS: usize = 8;
const CLAIMS: usize = 10_000;
/// Claims of more one-GPU requests than a node has GPUs.
const MANY_REQUESTS: usize = 1_000;

fn slice(node: &str) -> ResourceSlice {
    let attributes = json!({"productName": {"string": "NVIDIA H100 80GB HBM3"}, "architecture": {"string": "Hopper"}});
    gpus_slice(node, GPUS, attributes)
}

fn claim(i: usize) -> ResourceClaim {
    let exactly = if i.is_multiple_of(2) {
        json!({"deviceClassName": "gpu.nvidia.com", "count": 9})
    } else {
        json!({"deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression":
            "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"}}]})
    };
    serde_json::from_value(json!({
        "metadata": {"name": format!("claim-{i:05}"), "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }))
    .expect("a valid claim")
}

/// Claim `i` of [`MANY_REQUESTS`]: GPUS + 1 requests of one GPU.
fn many_requests(i: usize) -> ResourceClaim {
    let requests: Vec<_> = (0..=GPUS)
        .map(|r| json!({"name": format!("c{i}-gpu{r}"), "exactly": {"deviceClassName": "gpu.nvidia.com"}}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("many-{i:05}"), "namespace": "default"},
        "spec": {"devices": {"requests": requests}},
    }))
    .expect("a valid claim")
}

fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn main() {
    let server = ApiServer::start_in_thread().expect("the stand-in starts");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("a kubeconfig");
    let class: DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]},
    }))
    .expect("a valid class");
    server.create(&class).expect("class");
    for n in 0..NODES {
        let name = format!("node-{n:04}");
        server
            .create(&serde_json::from_value::<Node>(json!({"metadata": {"name": name}})).expect("node"))
            .expect("node");
        server.create(&slice(&name)).expect("slice");
    }
    for i in 0..CLAIMS {
        server.create(&claim(i)).expect("claim");
    }
    for i in 0..MANY_REQUESTS {
        server.create(&many_requests(i)).expect("claim");
    }
    let pending = CLAIMS + MANY_REQUESTS;
    println!("explain benchmark (cargo bench -p integration-tests --bench explain)");
    println!(
        "fleet: {NODES} nodes x {GPUS} H100 ({} devices), {pending} pending claims that do not fit ({MANY_REQUESTS} of them with {} one-GPU requests)",
        NODES * GPUS,
        GPUS + 1
    );
    // Built (if stale) before the clock starts: a rebuild inside the timed
    // region once read as 110 s of "explaining".
    integration_tests::controller();
    let started = Instant::now();
    let controller = ControllerProcess::spawn(
        &kubeconfig,
        "bench",
        &["--explain-after", "0s", "--event-qps", "1000000", "--leader-elect", "false"],
    )
    .expect("the controller starts");
    let mut rss = 0.0f64;
    loop {
        let events = server.list::<Event>(Some("default"), "").map(|e| e.len()).unwrap_or(0);
        rss = rss.max(peak_rss_mib(controller.pid()).unwrap_or(0.0));
        if events >= pending {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            println!("gave up after 600 s with {events} events; controller log:\n{}", controller.log());
            return;
        }
        // Listing 10,000 events holds the stand-in's lock: poll sparingly.
        std::thread::sleep(Duration::from_millis(1000));
    }
    let elapsed = started.elapsed().as_secs_f64();
    rss = rss.max(peak_rss_mib(controller.pid()).unwrap_or(0.0));
    let verdict = |ok: bool| if ok { "ok" } else { "MISSED" };
    println!(
        "  every claim explained, from start (s)      {elapsed:>8.2}   target < 10       {}",
        verdict(elapsed < 10.0)
    );
    println!("  controller peak RSS (MiB)                  {rss:>8.1}   target <= 150     {}", verdict(rss <= 150.0));
    println!("  claims explained per second                {:>8.0}", pending as f64 / elapsed);
    for line in controller.log().lines().filter(|l| l.contains("slow pass") || l.contains("synced")) {
        println!("  controller: {line}");
    }
}
