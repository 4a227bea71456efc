//! The real kube-scheduler's time per pod for dynamic-MIG claims on 100 and
//! 1,000 nodes of 8 dynamic H100 each. Not a test: it prints figures.
//!
//! Run: `cargo bench -p integration-tests --bench real_scheduler_mig`
//! (`-- --release 1.34`, `1.37` (default) or `all`; `-- --layout NAME` for
//! one layout: plugin, per-gpu, sets-together). Every layout is measured at
//! 100 nodes and the plugin's also at 1,000 (`--full`: every layout at
//! 1,000; `--quick`: 100 nodes only).
//! Needs the cached Kubernetes binaries (`tests/kube-bins/build.sh`).
//!
//! Per release and slice layout, a fresh control plane (etcd, API server,
//! controller manager, scheduler: `real_cluster::Cluster`); the shipped
//! DeviceClasses; Node objects as `Cluster::create_node` makes them (no
//! kubelet; the node-lifecycle controller and the not-ready taint are off,
//! so no node is tainted during the run); and per node the slices our
//! plugin publishes for it (the driver's slice builder with `DynamicMIG`,
//! for the node's name and the release: 208 devices and 8 counter sets),
//! written with the admin client, or the same sets and devices in another
//! layout the release's API allows (`mig_fleet::Layout`). A layout is
//! measured at 100 nodes, then the same cluster grows to 1,000.
//!
//! At each size: a lone pod's latency (claim made, then the pod; from the
//! pod's creation until the API shows it bound with the claim allocated,
//! polled every 20 ms), for each kind of claim; then a batch of pods each with its own
//! claim, created at once, timed until the last is bound: time per pod is
//! that time over the pods, and the scheduler's CPU time during the batch
//! (`/proc/<pid>/stat`) over the pods: on a busy machine the CPU time moves
//! much less than the wall time. Claims alternate docs/mig.md's `1g.10gb` by
//! profile and "16 GiB or more" by memory; every fourth is the 4g + 2g + 1g
//! on one GPU. The scheduler runs Filter (our allocator's Go counterpart,
//! `Allocate` on one node) until it found `percentageOfNodesToScore`'s share
//! of feasible nodes: all of 100 nodes, 420 of 1,000 (50 % - nodes/125,
//! Kubernetes' default); "per node tried" divides the pod's time by that.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use gpu_dra_driver::slices::ServerRules;
use integration_tests::real_cluster::driver::yaml_documents;
use integration_tests::real_cluster::mig_fleet::{Layout, node_name, node_slices};
use integration_tests::real_cluster::objects::create_all;
use integration_tests::real_cluster::{Cluster, Release, V1_34, V1_37};
use integration_tests::workspace_root;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

/// Concurrent writes while filling the fleet.
const WRITERS: usize = 16;
/// Longest wait for a batch to be scheduled.
const BATCH_DEADLINE: Duration = Duration::from_secs(600);

/// A fleet size and how many pods the batch has there.
struct Stage {
    nodes: usize,
    pods: usize,
}

const STAGES: [Stage; 2] = [Stage { nodes: 100, pods: 60 }, Stage { nodes: 1_000, pods: 20 }];

type Result<T> = std::result::Result<T, String>;

struct Row {
    release: &'static str,
    layout: Layout,
    nodes: usize,
    slices: usize,
    fill: Duration,
    lone: Vec<Duration>,
    pods: usize,
    batch: Duration,
    /// The scheduler's CPU time during the batch.
    cpu: Duration,
}

impl Row {
    fn tried(&self) -> usize {
        if self.nodes < 100 { self.nodes } else { (self.nodes * (50 - self.nodes / 125) / 100).max(100) }
    }
}

fn millis(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let releases: Vec<Release> = match value("--release").as_deref() {
        None | Some("1.37") => vec![V1_37],
        Some("1.34") => vec![V1_34],
        Some("all") => vec![V1_37, V1_34],
        Some(other) => {
            eprintln!("error: --release {other}: use 1.34, 1.37 or all");
            return ExitCode::FAILURE;
        }
    };
    let layouts: Vec<Layout> = match value("--layout") {
        None => Layout::ALL.to_vec(),
        Some(name) => match Layout::ALL.into_iter().find(|l| l.name() == name) {
            Some(l) => vec![l],
            None => {
                let names: Vec<&str> = Layout::ALL.iter().map(|l| l.name()).collect();
                eprintln!("error: --layout {name}: layouts are {}", names.join(", "));
                return ExitCode::FAILURE;
            }
        },
    };
    let quick = args.iter().any(|a| a == "--quick");
    let full = args.iter().any(|a| a == "--full");
    println!(
        "The real kube-scheduler on dynamic-MIG nodes (cargo bench -p integration-tests --bench real_scheduler_mig)"
    );
    let started = Instant::now();
    let mut rows = Vec::new();
    for release in releases {
        let rules = ServerRules { minor: release.minor[2..].parse().unwrap_or(34) };
        for &layout in layouts.iter().filter(|l| l.allowed(rules)) {
            // Every layout at 100 nodes; the plugin's (or with --full
            // every one) also at 1,000.
            let grow = !quick && (full || layout == Layout::Plugin);
            let stages = if grow { &STAGES[..] } else { &STAGES[..1] };
            match run(release, rules, layout, stages).await {
                Ok(mut r) => rows.append(&mut r),
                Err(e) => {
                    eprintln!("error: {} {}: {e}", release.minor, layout.name());
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    print_table(&rows);
    println!("\ntotal run time {:.0} s", started.elapsed().as_secs_f64());
    ExitCode::SUCCESS
}

/// One release and layout: 100 nodes, then (unless quick) 1,000.
async fn run(release: Release, rules: ServerRules, layout: Layout, stages: &[Stage]) -> Result<Vec<Row>> {
    eprintln!("== {} {}: {}", release.minor, layout.name(), layout.describe(rules));
    let cluster = Cluster::start(release).await;
    let classes = ["gpu.nvidia.com.yaml", "mig.nvidia.com.yaml"]
        .iter()
        .flat_map(|f| yaml_documents(&workspace_root().join("deviceclasses").join(f)))
        .collect::<Vec<_>>();
    create_all(&cluster.admin(), &classes).await?;
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "bench"}})).map_err(|e| e.to_string())?;
    Api::<Namespace>::all(cluster.admin())
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    let mut have = 0;
    for stage in stages {
        let fill_started = Instant::now();
        let slices = fill(&cluster, rules, layout, have..stage.nodes).await?;
        let fill = fill_started.elapsed();
        have = stage.nodes;
        // The scheduler's informers catch up with the writes.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let tag = format!("n{}", stage.nodes);
        let mut lone = Vec::new();
        for kind in LONE_KINDS {
            lone.push(batch(&cluster, &format!("{tag}-lone{kind}"), kind, 1).await?);
        }
        let cpu_before = cluster.cpu_time("kube-scheduler");
        let took = batch(&cluster, &format!("{tag}-batch"), 0, stage.pods).await?;
        let cpu =
            cluster.cpu_time("kube-scheduler").zip(cpu_before).map(|(after, before)| after.saturating_sub(before));
        let cpu = cpu.ok_or("the kube-scheduler's CPU time is not readable")?;
        let row = Row {
            release: release.minor,
            layout,
            nodes: stage.nodes,
            slices: slices * stage.nodes,
            fill,
            lone,
            pods: stage.pods,
            batch: took,
            cpu,
        };
        eprintln!(
            "   {} nodes: filled in {:.0} s, lone pod {} ms, {} pods in {:.1} s ({} ms per pod, scheduler CPU {} ms per pod)",
            row.nodes,
            fill.as_secs_f64(),
            row.lone.iter().map(|d| millis(*d)).collect::<Vec<_>>().join("/"),
            row.pods,
            took.as_secs_f64(),
            millis(took / u32::try_from(row.pods).unwrap_or(1)),
            millis(cpu / u32::try_from(row.pods).unwrap_or(1)),
        );
        rows.push(row);
    }
    Ok(rows)
}

/// Makes nodes `range` with their slices; the slices per node.
async fn fill(cluster: &Cluster, rules: ServerRules, layout: Layout, range: std::ops::Range<usize>) -> Result<usize> {
    let per_node = node_slices(&node_name(0), rules, layout).map_err(|e| e.to_string())?.len();
    let api: Api<ResourceSlice> = Api::all(cluster.admin());
    futures::stream::iter(range)
        .map(|n| {
            let api = api.clone();
            async move {
                let name = node_name(n);
                cluster.create_node(&name).await;
                for slice in node_slices(&name, rules, layout).map_err(|e| e.to_string())? {
                    api.create(&PostParams::default(), &slice).await.map_err(|e| format!("slice of {name}: {e}"))?;
                }
                Ok::<(), String>(())
            }
        })
        .buffer_unordered(WRITERS)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(per_node)
}

/// The lone pods' claims: 1g by profile, by memory, 4g + 2g + 1g.
const LONE_KINDS: [usize; 3] = [0, 1, 3];

/// Claim `i` of a batch: 1g.10gb by profile, 16 GiB or more by memory, or
/// (every fourth) 4g + 2g + 1g on one GPU.
fn claim(name: &str, i: usize) -> serde_json::Value {
    let by = |name: &str, expression: &str| json!({"name": name, "exactly": {"deviceClassName": "mig.nvidia.com", "selectors": [{"cel": {"expression": expression}}]}});
    let profile = |p: &str| format!("device.attributes['gpu.nvidia.com'].profile == '{p}'");
    let spec = match i % 4 {
        3 => json!({"devices": {
            "requests": [by("large", &profile("4g.40gb")), by("medium", &profile("2g.20gb")), by("small", &profile("1g.10gb"))],
            "constraints": [{"matchAttribute": "gpu.nvidia.com/parentUUID"}]}}),
        1 => json!({"devices": {"requests": [by("mig",
            "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('16Gi')) >= 0")]}}),
        _ => json!({"devices": {"requests": [by("mig", &profile("1g.10gb"))]}}),
    };
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": "bench"}, "spec": spec})
}

fn pod(name: &str, claim: &str, batch: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "bench", "labels": {"batch": batch}},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/app", "resources": {"claims": [{"name": "mig"}]}}],
                 "resourceClaims": [{"name": "mig", "resourceClaimName": claim}]}
    }))
    .unwrap_or_default()
}

/// Makes `count` claims (kinds from `first` on, see [`claim`]), then their
/// pods at once; the time from the first pod's creation until all are
/// bound with their claims allocated.
async fn batch(cluster: &Cluster, tag: &str, first: usize, count: usize) -> Result<Duration> {
    let claims: Vec<_> = (0..count).map(|i| claim(&format!("{tag}-{i}"), first + i)).collect();
    create_all(&cluster.admin(), &claims).await?;
    let pods: Api<Pod> = Api::namespaced(cluster.admin(), "bench");
    let started = Instant::now();
    futures::stream::iter(0..count)
        .map(|i| {
            let pods = pods.clone();
            let name = format!("{tag}-{i}");
            async move { pods.create(&PostParams::default(), &pod(&name, &name, tag)).await.map_err(|e| e.to_string()) }
        })
        .buffer_unordered(WRITERS)
        .try_collect::<Vec<_>>()
        .await?;
    let poll = if count == 1 { Duration::from_millis(20) } else { Duration::from_millis(100) };
    let selector = format!("batch={tag}");
    loop {
        let list = pods.list(&ListParams::default().labels(&selector)).await.map_err(|e| e.to_string())?;
        let bound = list.items.iter().filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some())).count();
        if bound == count && allocated(cluster, tag, count).await? {
            return Ok(started.elapsed());
        }
        if started.elapsed() > BATCH_DEADLINE {
            return Err(format!(
                "{tag}: {bound} of {count} pods bound after {} s\n{}",
                BATCH_DEADLINE.as_secs(),
                cluster.logs()
            ));
        }
        tokio::time::sleep(poll).await;
    }
}

/// Whether every claim of the batch is allocated.
async fn allocated(cluster: &Cluster, tag: &str, count: usize) -> Result<bool> {
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.admin(), "bench");
    let list = claims.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
    let done = list
        .items
        .iter()
        .filter(|c| c.metadata.name.as_deref().is_some_and(|n| n.starts_with(&format!("{tag}-"))))
        .filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some()))
        .count();
    Ok(done == count)
}

fn print_table(rows: &[Row]) {
    let per_pod = |d: Duration, r: &Row| d.as_secs_f64() * 1000.0 / r.pods as f64;
    println!();
    println!(
        "| release | layout | nodes | slices | fill s | lone pod ms: 1g / by memory / 4g+2g+1g | pods | ms per pod \
         | ms per node tried | scheduler CPU ms per pod | CPU ms per node tried |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let (wall, cpu) = (per_pod(r.batch, r), per_pod(r.cpu, r));
        println!(
            "| {} | {} | {} | {} | {:.0} | {} | {} | {wall:.0} | {:.2} | {cpu:.0} | {:.2} |",
            r.release,
            r.layout.name(),
            r.nodes,
            r.slices,
            r.fill.as_secs_f64(),
            r.lone.iter().map(|d| millis(*d)).collect::<Vec<_>>().join(" / "),
            r.pods,
            wall / r.tried() as f64,
            cpu / r.tried() as f64,
        );
    }
    // What one more node tried costs: the growth from 100 to 1,000 nodes
    // over the nodes tried more (100 -> 420), free of per-pod costs
    // (PreFilter, binding, the claim's status write).
    for small in rows.iter().filter(|r| r.nodes == 100) {
        let large = rows.iter().find(|r| r.nodes == 1_000 && r.release == small.release && r.layout == small.layout);
        if let Some(large) = large {
            let more = (large.tried() - small.tried()) as f64;
            let wall = (per_pod(large.batch, large) - per_pod(small.batch, small)) / more;
            let cpu = (per_pod(large.cpu, large) - per_pod(small.cpu, small)) / more;
            println!(
                "\n{} {}: {wall:.2} ms ({cpu:.2} ms of scheduler CPU) per node tried more (100 -> 1,000 nodes)",
                small.release,
                small.layout.name()
            );
        }
    }
}
