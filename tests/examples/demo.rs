//! The whole system on one machine, with no cluster and no GPU: the
//! API-server stand-in, two fake GPU nodes (a DGX H100 and an HGX A100 with
//! MIG) each running the real `gpu-kubelet-plugin` with its kubelet
//! stand-in, and the real `gpu-dra-controller`. It applies the
//! DeviceClasses and a workload of pods with ResourceClaimTemplates
//! (`examples/demo/workload.yaml`), lets the controller allocate the claims
//! (delegated allocation stands in for the kube-scheduler: nobody picks
//! devices by hand), shows what was published, allocated or explained, has
//! each node prepare its claims and shows what a container would get, then
//! unprepares, deletes and stops everything. Nothing is left behind.
//!
//! `cargo run -p integration-tests --example demo`
//!
//! With `-- --real-cluster [1.34|1.37]` the same nodes, controller and
//! workload run against the real control plane of that release (etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler, built once by
//! `tests/kube-bins/build.sh`): the real controller manager makes the
//! claims and the real scheduler allocates them (see `demo/real_cluster.rs`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use gpu_dra_driver::driver_root::fake_tree;
use integration_tests::apiserver::ApiServer;
use integration_tests::apiserver::audit::calls_by;
use integration_tests::controller_process::ControllerProcess;
use integration_tests::kubelet::{Kubelet, KubeletConfig, Plugin, claim};
use integration_tests::plugin_process::{PluginDirs, PluginOptions, PluginProcess};
use integration_tests::workspace_root;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use serde_json::json;

const DRIVER: &str = "gpu.nvidia.com";
const WAIT: Duration = Duration::from_secs(60);

/// The demo's two nodes and their fake inventories.
const NODES: [(&str, &str); 2] = [
    ("dgx-h100-a", include_str!("../../examples/inventories/dgx-h100.yaml")),
    ("hgx-a100-mig", include_str!("../../examples/inventories/a100-mig.yaml")),
];

struct DemoNode {
    name: &'static str,
    dirs: PluginDirs,
    process: PluginProcess,
    kubelet: Kubelet,
    plugin: Option<Plugin>,
}

#[path = "demo/real_cluster.rs"]
mod real_cluster;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] => standin(),
        ["--real-cluster"] => real_cluster::run("1.37"),
        ["--real-cluster", minor] => real_cluster::run(minor),
        ["-h" | "--help"] => {
            print!("{USAGE}");
            Ok(())
        }
        _ => bail!("unknown arguments {args:?}\n{USAGE}"),
    }
}

const USAGE: &str = "\
usage: cargo run -p integration-tests --example demo [-- OPTIONS]

The whole system on loopback, no cluster and no GPU: an API-server stand-in,
two fake GPU nodes running the real node agent, and the real controller.

options:
  --real-cluster [1.34|1.37]  the same against the real control plane of that
                              release (built once by tests/kube-bins/build.sh)
  -h, --help                  this text
";

/// The demo on the API-server stand-in (the default: no Go, seconds).
fn standin() -> anyhow::Result<()> {
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let server = ApiServer::start_in_thread().context("starting the API-server stand-in")?;
    let work = tempfile::tempdir().context("a working directory")?;
    let kubeconfig = work.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig)?;
    println!("== the cluster: API-server stand-in on {}", server.url());

    let mut nodes = Vec::new();
    for (name, inventory) in NODES {
        nodes.push(start_node(&kubeconfig, &runtime, name, inventory)?);
    }
    let mut controller = ControllerProcess::spawn(
        &kubeconfig,
        "demo",
        // Leader election on, as the chart installs it: the lone replica
        // takes the free Lease on its first try.
        &["--explain-after", "0s", "--event-qps", "100"],
    )
    .context("starting gpu-dra-controller")?;
    println!("   gpu-dra-controller started (delegated allocation, explanations)");

    let result = run(&server, &runtime, &mut nodes);
    if result.is_err() {
        eprintln!("controller log:\n{}", controller.log());
        for node in &nodes {
            eprintln!("{} plugin log:\n{}", node.name, node.process.log());
        }
    }
    controller.kill();
    for node in &mut nodes {
        let _ = node.process.terminate(WAIT);
    }
    println!(
        "\n== stopped the controller and both plugins; removed every file ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = std::env::var_os(API_CALLS_FILE) {
        write_api_calls(&server, Path::new(&path))?;
    }
    result
}

/// With this variable set to a file, the demo writes there the API calls
/// each binary made (as RBAC sees them), one JSON object per line: the
/// chart's RBAC test compares them with the rendered rules.
const API_CALLS_FILE: &str = "DEMO_API_CALLS_FILE";

fn write_api_calls(server: &ApiServer, path: &Path) -> anyhow::Result<()> {
    let records = server.faults().requests();
    let mut lines = String::new();
    for agent in ["gpu-kubelet-plugin/", "gpu-dra-controller/"] {
        for call in calls_by(&records, agent) {
            let line = json!({
                "agent": agent.trim_end_matches('/'),
                "verb": call.verb,
                "group": call.group,
                "resource": call.resource,
                "namespace": call.namespace,
            });
            lines.push_str(&format!("{line}\n"));
        }
    }
    std::fs::write(path, lines).with_context(|| format!("writing {}", path.display()))
}

/// A fake driver install for the node, and its plugin (using a copy of
/// `kubeconfig`), registered.
fn start_node(
    kubeconfig: &Path,
    runtime: &tokio::runtime::Runtime,
    name: &'static str,
    inventory: &str,
) -> anyhow::Result<DemoNode> {
    let dirs = PluginDirs::new(inventory).context("plugin directories")?;
    std::fs::copy(kubeconfig, &dirs.kubeconfig).with_context(|| format!("copying {}", kubeconfig.display()))?;
    let version = inventory
        .lines()
        .find_map(|l| l.strip_prefix("driverVersion:"))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .unwrap_or_else(|| "580.82.07".to_owned());
    let root = dirs.root.path().join("driver-root");
    fake_tree::build(&root, &version, &[("libcuda.so", "libcuda.so.1"), ("libnvidia-ml.so", "libnvidia-ml.so.1")])
        .context("building a fake driver install (needs cc and ldconfig)")?;
    let options = PluginOptions {
        node: name.to_owned(),
        extra_args: vec!["--driver-root".into(), root.to_string_lossy().into_owned()],
        ..PluginOptions::default()
    };
    let process = PluginProcess::spawn(&dirs, &options).context("starting gpu-kubelet-plugin")?;
    let kubelet = Kubelet::new(KubeletConfig::new(&dirs.registry, DRIVER));
    let plugin = runtime
        .block_on(kubelet.wait_and_register(WAIT))
        .with_context(|| format!("{name}: the plugin did not register:\n{}", process.log()))?;
    println!("   node {name}: gpu-kubelet-plugin registered with its kubelet (driver {version})");
    Ok(DemoNode { name, dirs, process, kubelet, plugin: Some(plugin) })
}

fn run(server: &ApiServer, runtime: &tokio::runtime::Runtime, nodes: &mut [DemoNode]) -> anyhow::Result<()> {
    println!("\n== published devices");
    for node in nodes.iter() {
        let slices = wait_for(|| {
            let slices: Vec<ResourceSlice> = server.list(None, &format!("spec.nodeName={}", node.name)).ok()?;
            (!slices.is_empty()).then_some(slices)
        })
        .with_context(|| format!("{} published no ResourceSlices", node.name))?;
        let devices: Vec<String> =
            slices.iter().flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone())).collect();
        println!("   {:<13} {} devices: {}", node.name, devices.len(), shorten(&devices, 6));
    }

    println!("\n== applying the DeviceClasses and the workload");
    for entry in std::fs::read_dir(workspace_root().join("deviceclasses"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let class: DeviceClass = serde_yaml_ng::from_str(&std::fs::read_to_string(&path)?)?;
            server.create(&class)?;
            println!("   DeviceClass {}", class.metadata.name.unwrap_or_default());
        }
    }
    let workload = std::fs::read_to_string(workspace_root().join("examples/demo/workload.yaml"))?;
    let mut pods = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(&workload) {
        let value = serde_json::to_value(serde_yaml_ng::Value::deserialize(document)?)?;
        match value.get("kind").and_then(|k| k.as_str()) {
            Some("ResourceClaimTemplate") => {
                let template: ResourceClaimTemplate = serde_json::from_value(value)?;
                server.create(&template)?;
                println!("   ResourceClaimTemplate {}", template.metadata.name.unwrap_or_default());
            }
            Some("Pod") => {
                let pod: Pod = serde_json::from_value(value)?;
                let created = server.create(&pod)?;
                println!("   Pod {} (pending)", created.metadata.name.clone().unwrap_or_default());
                pods.push(created);
            }
            other => bail!("unexpected kind {other:?} in the workload"),
        }
    }

    // kube-controller-manager's resourceclaim controller: one claim per
    // template entry of each pod, `<pod>-<entry>`, with the template's
    // metadata, named in the pod's status.
    println!("\n== claims made from the templates (the resourceclaim controller's job)");
    let mut claims: Vec<(String, String)> = Vec::new();
    for pod in &pods {
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let mut statuses = Vec::new();
        for entry in pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref()).into_iter().flatten() {
            let Some(template_name) = entry.resource_claim_template_name.as_deref() else { continue };
            let template: ResourceClaimTemplate = server.get(Some("default"), template_name)?;
            let template = template.spec.unwrap_or_default();
            let name = format!("{pod_name}-{}", entry.name);
            let claim = ResourceClaim {
                metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some("default".into()),
                    annotations: template.metadata.as_ref().and_then(|m| m.annotations.clone()),
                    labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
                    ..Default::default()
                },
                spec: template.spec.clone(),
                status: None,
            };
            server.create(&claim)?;
            println!("   {name} from {template_name}");
            statuses.push(json!({"name": entry.name, "resourceClaimName": name}));
            claims.push((pod_name.clone(), name));
        }
        let status = json!({"status": {"resourceClaimStatuses": statuses}});
        server.merge_patch::<Pod>(Some("default"), &pod_name, true, &status)?;
    }

    println!("\n== the controller allocates (or explains)");
    let settled = wait_for(|| {
        let ready = claims.iter().all(|(_, name)| {
            let allocated = server
                .get::<ResourceClaim>(Some("default"), name)
                .ok()
                .and_then(|c| c.status)
                .and_then(|s| s.allocation)
                .is_some();
            allocated || !events_about(server, name).is_empty()
        });
        ready.then_some(())
    });
    settled.context("the controller did not settle every claim")?;
    let mut by_node: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for (pod, name) in &claims {
        let claim: ResourceClaim = server.get(Some("default"), name)?;
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        match claim.status.as_ref().and_then(|s| s.allocation.as_ref()) {
            Some(allocation) => {
                let results = allocation.devices.as_ref().and_then(|d| d.results.as_ref()).cloned().unwrap_or_default();
                let node = results.first().map(|r| r.pool.clone()).unwrap_or_default();
                let devices: Vec<String> = results.iter().map(|r| r.device.clone()).collect();
                println!("   {name:<20} pod {pod:<10} -> {node}: {}", devices.join(", "));
                by_node.entry(node).or_default().push((name.clone(), uid));
            }
            None => {
                let note = events_about(server, name).first().and_then(|e| e.note.clone()).unwrap_or_default();
                println!("   {name:<20} pod {pod:<10} -> not allocated: {note}");
            }
        }
    }

    runtime.block_on(prepare_on_each_node(nodes, &by_node))?;

    println!("\n== deleting the workload: the controller deallocates its claims");
    for (_, name) in &claims {
        server.delete::<ResourceClaim>(Some("default"), name)?;
    }
    wait_for(|| server.list::<ResourceClaim>(Some("default"), "").ok().filter(Vec::is_empty).map(|_| ()))
        .context("claims were not released")?;
    println!("   every claim deallocated and gone");
    Ok(())
}

/// What a container of the claim gets: device nodes, and mounts from the
/// driver install.
/// Each node prepares its claims of `by_node` (name and UID by node) as
/// the kubelet does when the pod starts, shows the devices and CDI specs
/// it gets, and unprepares them: the stand-in and the real-cluster demo
/// end the same way.
async fn prepare_on_each_node(
    nodes: &[DemoNode],
    by_node: &BTreeMap<String, Vec<(String, String)>>,
) -> anyhow::Result<()> {
    println!("\n== each node prepares its claims (as the kubelet does when the pod starts)");
    for node in nodes {
        let Some(plugin) = node.plugin.as_ref() else { continue };
        let mine = by_node.get(node.name).cloned().unwrap_or_default();
        if mine.is_empty() {
            continue;
        }
        let refs: Vec<_> = mine.iter().map(|(name, uid)| claim("default", name, uid)).collect();
        let prepared = node.kubelet.prepare(plugin, &refs).await?;
        for (name, uid) in &mine {
            for device in prepared.get(uid).into_iter().flatten() {
                println!(
                    "   {:<13} {name}: {} -> CDI {}",
                    node.name,
                    device.device_name,
                    device.cdi_device_ids.join(", ")
                );
            }
            describe_spec(&node.dirs.cdi.join(format!("k8s.{DRIVER}-claim_{uid}.json")))?;
        }
        node.kubelet.unprepare(plugin, &refs).await?;
        println!("   {:<13} unprepared {} claim(s); CDI specs removed", node.name, refs.len());
    }
    Ok(())
}

fn describe_spec(path: &Path) -> anyhow::Result<()> {
    let spec: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let mut nodes: Vec<String> = Vec::new();
    let mut mounts: Vec<String> = Vec::new();
    let edits =
        spec["devices"].as_array().into_iter().flatten().map(|d| &d["containerEdits"]).chain([&spec["containerEdits"]]);
    for edit in edits {
        nodes.extend(
            edit["deviceNodes"].as_array().into_iter().flatten().filter_map(|n| n["path"].as_str().map(str::to_owned)),
        );
        mounts.extend(
            edit["mounts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m["containerPath"].as_str().map(str::to_owned)),
        );
    }
    nodes.sort();
    nodes.dedup();
    let libraries: Vec<String> =
        mounts.iter().filter(|m| m.contains(".so")).map(|m| m.rsplit('/').next().unwrap_or(m).to_owned()).collect();
    println!("      device nodes: {}", nodes.join(" "));
    println!("      mounts: {} ({} libraries: {})", mounts.len(), libraries.len(), shorten(&libraries, 4));
    Ok(())
}

fn events_about(server: &ApiServer, name: &str) -> Vec<Event> {
    server
        .list::<Event>(Some("default"), "")
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

fn shorten(items: &[String], keep: usize) -> String {
    if items.len() <= keep {
        return items.join(", ");
    }
    format!("{}, ... ({} more)", items[..keep].join(", "), items.len() - keep)
}

/// Polls `check` every 100 ms until it returns something, for a minute.
fn wait_for<T>(mut check: impl FnMut() -> Option<T>) -> anyhow::Result<T> {
    let start = Instant::now();
    loop {
        if let Some(found) = check() {
            return Ok(found);
        }
        if start.elapsed() > WAIT {
            bail!("timed out after {WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

use serde::Deserialize as _;
