//! `kubectl gpu` at fleet scale: 5,000 nodes of 64 GPUs (one ResourceSlice
//! each, built by the plugin's slice builder, so each device carries the
//! attributes a real node publishes) in the API stand-in, which pages its
//! lists as the real server does. Runs the real binary's `nodes` and
//! `why` (one pending claim for a GPU model no node has, so its selector is
//! evaluated on every device of the fleet) and prints
//! each one's wall time and peak RSS, from `/usr/bin/time -v`: the binary
//! is started by `time`, a small process, because a child exec'd straight
//! from this one (which holds the stand-in's gigabytes) would report this
//! process's RSS as its own peak (the kernel keeps the old address
//! space's high-water mark across exec).
//! Target: under 300 MiB each. Figures only.
//!
//! `cargo bench -p integration-tests --bench kubectl_gpu_memory`
//! (`NODES=500` for a smaller fleet, `HEAPTRACK=<dir>` to profile the heap).

use std::process::Command;
use std::time::Instant;

use gpu_dra_driver::inventory::fake;
use gpu_dra_driver::names::{DriverName, NodeName};
use gpu_dra_driver::slices::SliceBuilder;
use integration_tests::apiserver::ApiServer;
use integration_tests::go_allocator::measured;
use integration_tests::{kubectl_gpu, workspace_root};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use serde_json::json;

const GPUS: usize = 64;
const INVENTORY: &str =
    "driverVersion: \"580.82.07\"\ncudaDriverVersion: \"13.0\"\ngpus:\n  - model: H100-80GB\n    count: 64\n";

fn main() {
    let nodes: usize = std::env::var("NODES").ok().and_then(|n| n.parse().ok()).unwrap_or(5000);
    let binary = kubectl_gpu();
    let server = ApiServer::start_in_thread().expect("the API stand-in");
    let started = Instant::now();
    let mut devices = 0;
    for n in 0..nodes {
        let node = NodeName::new(format!("node-{n:05}")).expect("a node name");
        let inventory = fake::parse(INVENTORY, &node).expect("the inventory");
        for slice in SliceBuilder::new(DriverName::nvidia_default(), node).build(&inventory, 1).expect("slices") {
            devices += slice.spec.devices.as_ref().map_or(0, Vec::len);
            server.create(&slice).expect("a slice");
        }
    }
    assert_eq!(devices, nodes * GPUS, "{GPUS} devices a node");
    for file in ["gpu.nvidia.com.yaml", "mig.nvidia.com.yaml"] {
        let text = std::fs::read_to_string(workspace_root().join("deviceclasses").join(file)).expect("a class");
        server.create(&serde_yaml_ng::from_str::<DeviceClass>(&text).expect("a class")).expect("a class");
    }
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "b200", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA B200'"}}]
        }}]}}
    }))
    .expect("a claim");
    server.create(&claim).expect("a claim");
    println!(
        "fleet: {nodes} nodes x {GPUS} GPUs ({devices} devices) stored in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let dir = tempfile::tempdir().expect("a directory");
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("a kubeconfig");
    let kubeconfig = kubeconfig.display().to_string();
    for args in [&["nodes"][..], &["why", "b200"]] {
        // `HEAPTRACK=<dir>`: record each run with heaptrack instead (where
        // the peak is: `heaptrack_print -f <dir>/<command>.zst`).
        let mut command = match std::env::var_os("HEAPTRACK") {
            Some(out) => {
                let mut c = Command::new("heaptrack");
                c.arg("-o").arg(std::path::Path::new(&out).join(args[0]));
                c
            }
            None => {
                let mut c = Command::new("/usr/bin/time");
                c.arg("-v");
                c
            }
        };
        command.arg(binary).args(["--kubeconfig", &kubeconfig, "--request-timeout", "0"]).args(args);
        match measured(&mut command) {
            Ok(run) => {
                let lines = run.stdout.lines().count();
                let last = run.stdout.lines().last().unwrap_or_default().chars().take(160).collect::<String>();
                let peak_kib: f64 = run
                    .stderr
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("Maximum resident set size (kbytes): "))
                    .and_then(|kib| kib.trim().parse().ok())
                    .unwrap_or(f64::NAN);
                println!(
                    "kubectl gpu {}: {:.1} s, peak RSS {:.0} MiB, {lines} lines of output (last: {last})",
                    args.join(" "),
                    run.wall.as_secs_f64(),
                    peak_kib / 1024.0
                );
            }
            Err(e) => println!("kubectl gpu {}: failed: {e}", args.join(" ")),
        }
    }
    let lists = server.faults().requests().iter().filter(|r| r.method == "GET" && r.query.contains("limit=")).count();
    println!("paged list requests the stand-in served: {lists}");
}
