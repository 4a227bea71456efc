//! A fake GB200 tray on the real cluster: its Node (with an InternalIP, as
//! a kubelet registers it), its plugin serving `gpu.nvidia.com` and
//! `compute-domain.nvidia.com` over an [`ImexHost`], and the kubelet
//! stand-in's connection to each driver, to prepare what the real
//! scheduler allocated there.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, Patch, PatchParams};
use kubelet_proto::dra_v1::Claim;
use serde_json::{Value, json};

use super::Cluster;
use super::driver::{NodePlugin, WAIT, start_plugin_with};
use crate::imex_host::ImexHost;
use crate::kubelet::{Kubelet, KubeletConfig, Plugin, claim};

pub const GPU_DRIVER: &str = "gpu.nvidia.com";
pub const CD_DRIVER: &str = gpu_dra_driver::compute_domain::DRIVER_NAME;

pub struct Tray {
    pub plugin: NodePlugin,
    pub address: String,
    pub imex: ImexHost,
    kubelet_gpu: Kubelet,
    gpu: Plugin,
    kubelet_cd: Kubelet,
    cd: Plugin,
}

impl Tray {
    /// Node `name` from `inventory` (a GB200 tray of some clique) at
    /// `address`; its channels wait at most `ready_timeout_ms`.
    pub async fn start(cluster: &Cluster, name: &str, inventory: &Path, address: &str, ready_timeout_ms: u32) -> Self {
        let imex = ImexHost::build(&cluster.dir().join(format!("tray-{name}")))
            .unwrap_or_else(|e| panic!("{name}'s fake host: {e}"));
        let args = imex.plugin_args(ready_timeout_ms);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let plugin = start_plugin_with(cluster, name, inventory, &args).await;
        // The controller puts the InternalIP in the domain's status: the
        // IMEX peer list.
        let addresses = json!({"status": {"addresses": [
            {"type": "Hostname", "address": name}, {"type": "InternalIP", "address": address}]}});
        Api::<Node>::all(cluster.admin())
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&addresses))
            .await
            .unwrap_or_else(|e| panic!("node {name} addresses: {e}"));
        let kubelet_gpu = Kubelet::new(KubeletConfig::new(&plugin.dirs.registry, GPU_DRIVER));
        let gpu = register(&kubelet_gpu, &plugin, GPU_DRIVER).await;
        let kubelet_cd = Kubelet::new(KubeletConfig::new(&plugin.dirs.registry, CD_DRIVER));
        let cd = register(&kubelet_cd, &plugin, CD_DRIVER).await;
        Self { plugin, address: address.to_string(), imex, kubelet_gpu, gpu, kubelet_cd, cd }
    }

    pub fn name(&self) -> &str {
        &self.plugin.node
    }

    /// The kubelet and plugin connection of the driver of `claim`'s devices.
    fn driver_of(&self, claim: &ResourceClaim) -> (&Kubelet, &Plugin) {
        let results = claim.status.as_ref().and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref());
        let driver = results.and_then(|d| d.results.as_ref()).and_then(|r| r.first()).map(|r| r.driver.as_str());
        match driver {
            Some(CD_DRIVER) => (&self.kubelet_cd, &self.cd),
            Some(GPU_DRIVER) => (&self.kubelet_gpu, &self.gpu),
            other => panic!("claim {:?} allocated for driver {other:?}", claim.metadata.name),
        }
    }

    /// NodePrepareResources of one claim with its driver: its CDI device
    /// IDs, or the plugin's error for it.
    pub async fn prepare(&self, claim: &ResourceClaim) -> Result<Vec<String>, String> {
        let (kubelet, plugin) = self.driver_of(claim);
        let request = claim_request(claim);
        let answers = kubelet
            .prepare_raw(plugin, std::slice::from_ref(&request))
            .await
            .unwrap_or_else(|e| panic!("prepare call on {}: {e}\n{}", self.name(), self.log()));
        let answer = answers.get(&request.uid).unwrap_or_else(|| panic!("no answer for {}", request.uid));
        if answer.error.is_empty() {
            Ok(answer.devices.iter().flat_map(|d| d.cdi_device_ids.clone()).collect())
        } else {
            Err(answer.error.clone())
        }
    }

    /// NodeUnprepareResources of one claim with its driver; panics on an error.
    pub async fn unprepare(&self, claim: &ResourceClaim) {
        let (kubelet, plugin) = self.driver_of(claim);
        kubelet
            .unprepare(plugin, &[claim_request(claim)])
            .await
            .unwrap_or_else(|e| panic!("unprepare {:?} on {}: {e}\n{}", claim.metadata.name, self.name(), self.log()));
    }

    pub fn log(&self) -> String {
        format!("---- plugin {}\n{}", self.name(), self.plugin.process.log())
    }

    /// The CDI spec the plugin wrote for claim `uid`, as JSON.
    pub fn cdi_spec(&self, uid: &str) -> Option<Value> {
        let entries = std::fs::read_dir(&self.plugin.dirs.cdi).ok()?;
        let file = entries.flatten().find(|e| e.file_name().to_string_lossy().contains(uid))?;
        serde_json::from_slice(&std::fs::read(file.path()).ok()?).ok()
    }

    /// CDI spec files left in the plugin's CDI directory.
    pub fn cdi_files(&self) -> Vec<PathBuf> {
        let entries = std::fs::read_dir(&self.plugin.dirs.cdi).into_iter().flatten().flatten();
        entries.map(|e| e.path()).collect()
    }

    /// Files under the plugin's directories and the host's `/dev` (logs
    /// aside) whose path or content mentions one of `uids`.
    pub fn files_mentioning(&self, uids: &[String]) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut pending = vec![self.plugin.dirs.root.path().to_path_buf(), self.imex.host.join("dev")];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                let Ok(kind) = entry.file_type() else { continue };
                if kind.is_dir() {
                    pending.push(path);
                    continue;
                }
                if !kind.is_file() || path.extension().is_some_and(|e| e == "log") {
                    continue;
                }
                let name = path.to_string_lossy().to_string();
                let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap_or_default()).to_string();
                if uids.iter().any(|u| name.contains(u.as_str()) || text.contains(u.as_str())) {
                    found.push(path);
                }
            }
        }
        found
    }
}

/// Registers with `driver`'s registration socket once the plugin serves it.
async fn register(kubelet: &Kubelet, plugin: &NodePlugin, driver: &str) -> Plugin {
    let socket = plugin.dirs.registration_socket(driver);
    let deadline = Instant::now() + WAIT;
    loop {
        match kubelet.register(&socket).await {
            Ok(registered) => return registered,
            Err(e) if Instant::now() >= deadline => {
                panic!("{driver} on {}: {e}\n{}", plugin.node, plugin.process.log())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The kubelet's request for a stored claim.
fn claim_request(stored: &ResourceClaim) -> Claim {
    claim(
        stored.metadata.namespace.as_deref().unwrap_or_default(),
        stored.metadata.name.as_deref().unwrap_or_default(),
        stored.metadata.uid.as_deref().unwrap_or_default(),
    )
}
