//! The node agent end to end, on one machine without a cluster or a GPU:
//! an API-server stand-in, the real `gpu-kubelet-plugin run` on a fake DGX
//! H100 inventory, and a kubelet stand-in that registers it, prepares a
//! claim for two GPUs and unprepares it.
//!
//! `cargo run -p integration-tests --example node_demo [-- INVENTORY.yaml]`

use std::time::Duration;

use anyhow::{Context as _, bail};
use integration_tests::apiserver::ApiServer;
use integration_tests::claim_fixtures::{self, Allocated, allocated_claim};
use integration_tests::kubelet::{Kubelet, KubeletConfig, claim};
use integration_tests::plugin_process::{PluginDirs, PluginOptions, PluginProcess};
use k8s_openapi::api::resource::v1::ResourceSlice;

const DRIVER: &str = "gpu.nvidia.com";
const NODE: &str = "node-a";
const DEFAULT_INVENTORY: &str = include_str!("../../examples/inventories/dgx-h100.yaml");
const WAIT: Duration = Duration::from_secs(30);

fn main() -> anyhow::Result<()> {
    let inventory = match std::env::args().nth(1) {
        Some(path) => std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?,
        None => DEFAULT_INVENTORY.to_string(),
    };
    let server = ApiServer::start_in_thread().context("starting the API-server stand-in")?;
    let dirs = PluginDirs::new(&inventory).context("creating the plugin directories")?;
    server.write_kubeconfig(&dirs.kubeconfig)?;
    println!("API-server stand-in on {}; plugin directories under {}", server.url(), dirs.root.path().display());

    let mut plugin = PluginProcess::spawn(&dirs, &PluginOptions::default()).context("starting gpu-kubelet-plugin")?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let result = runtime.block_on(demo(&server, &dirs));
    let status = match plugin.terminate(WAIT)? {
        Some(status) => status.to_string(),
        None => format!("no exit within {WAIT:?}"),
    };
    println!("\nSIGTERM: plugin {status}; DRA socket left behind: {}", dirs.dra_socket(DRIVER).exists());
    if result.is_err() {
        eprintln!("plugin log:\n{}", plugin.log());
    }
    result
}

async fn demo(server: &ApiServer, dirs: &PluginDirs) -> anyhow::Result<()> {
    let kubelet = Kubelet::new(KubeletConfig::new(&dirs.registry, DRIVER));
    let plugin = kubelet.wait_and_register(WAIT).await?;
    println!("registered: {} (calls DRAPlugin {:?})", plugin.info.name, plugin.version);

    let slices = wait_for_slices(server).await?;
    let devices: Vec<String> =
        slices.iter().flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone())).collect();
    println!("published {} ResourceSlice(s) with {} devices: {}", slices.len(), devices.len(), devices.join(", "));

    let first_two: Vec<&str> = devices.iter().take(2).map(String::as_str).collect();
    let results: Vec<Allocated> = first_two.iter().map(|d| Allocated::new("gpus", NODE, d)).collect();
    let uid = claim_fixtures::store(server, &allocated_claim("default", "train-gpus", &results, vec![]))?;
    let request = [claim("default", "train-gpus", &uid)];
    println!("\nResourceClaim default/train-gpus ({uid}) allocated {first_two:?}");

    let prepared = kubelet.prepare(&plugin, &request).await?;
    for device in prepared.get(&uid).into_iter().flatten() {
        println!(
            "prepared {} for request {:?}: CDI {}",
            device.device_name,
            device.request_names,
            device.cdi_device_ids.join(", ")
        );
    }
    let spec_path = dirs.cdi.join(format!("k8s.{DRIVER}-claim_{uid}.json"));
    println!("\n{}:\n{}", spec_path.display(), std::fs::read_to_string(&spec_path)?);

    kubelet.unprepare(&plugin, &request).await?;
    println!("unprepared; CDI spec still present: {}", spec_path.exists());
    Ok(())
}

async fn wait_for_slices(server: &ApiServer) -> anyhow::Result<Vec<ResourceSlice>> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let slices: Vec<ResourceSlice> = server.list(None, &format!("spec.nodeName={NODE}"))?;
        if !slices.is_empty() {
            return Ok(slices);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("no ResourceSlices published within {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
