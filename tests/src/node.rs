//! A node under test: the real plugin process on a fake inventory, the
//! API-server stand-in holding its claims, and a kubelet stand-in that
//! registered it. Blocking methods, for tests and benchmarks.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use gpu_kubelet_plugin::state::checkpoint::{CheckpointDir, ClaimRecord};
use k8s_openapi::api::resource::v1::DeviceAllocationConfiguration;
use kubelet_proto::dra_v1::{Claim, Device};

use crate::apiserver::ApiServer;
use crate::claim_fixtures::{self, Allocated, allocated_claim};
use crate::kubelet::{Kubelet, KubeletConfig, Plugin, claim};
use crate::plugin_process::{PluginDirs, PluginOptions, PluginProcess};

pub const DRIVER: &str = "gpu.nvidia.com";
pub const NODE: &str = "node-a";
/// Start-up and registration wait; generous for busy CI machines.
pub const WAIT: Duration = Duration::from_secs(60);

pub struct RunningNode {
    pub server: ApiServer,
    pub dirs: PluginDirs,
    pub process: PluginProcess,
    pub kubelet: Kubelet,
    pub plugin: Plugin,
    pub runtime: tokio::runtime::Runtime,
    options: PluginOptions,
}

/// A claim's answer: its devices or the error text.
pub type Answer = Result<Vec<Device>, String>;

impl RunningNode {
    /// Starts everything on `inventory` (fake inventory YAML); `kubelet`'s
    /// registry directory is replaced by the node's own.
    pub fn start(inventory: &str, kubelet: KubeletConfig, options: PluginOptions) -> Self {
        let server = ApiServer::start_in_thread().expect("API-server stand-in");
        let dirs = PluginDirs::new(inventory).expect("plugin directories");
        server.write_kubeconfig(&dirs.kubeconfig).expect("kubeconfig");
        let kubelet = Kubelet::new(KubeletConfig { registry_dir: dirs.registry.clone(), ..kubelet });
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let process = PluginProcess::spawn(&dirs, &options).expect("plugin process");
        let plugin =
            runtime.block_on(kubelet.wait_and_register(WAIT)).unwrap_or_else(|e| panic!("{e}\n{}", process.log()));
        Self { server, dirs, process, kubelet, plugin, runtime, options }
    }

    /// SIGTERM, then a new process on the same files, registered again.
    pub fn restart(&mut self) {
        let status = self.process.terminate(WAIT).expect("SIGTERM");
        assert!(status.is_some_and(|s| s.success()), "{}", self.process.log());
        self.process = PluginProcess::spawn(&self.dirs, &self.options).expect("plugin process");
        self.plugin = self
            .runtime
            .block_on(self.kubelet.wait_and_register(WAIT))
            .unwrap_or_else(|e| panic!("{e}\n{}", self.process.log()));
    }

    /// A new plugin process with `options` on the node's files (the old
    /// one must be gone: stopped, or killed at a kill point), registered
    /// with the kubelet stand-in.
    pub fn respawn(&mut self, options: &PluginOptions) {
        self.process = PluginProcess::spawn(&self.dirs, options).expect("plugin process");
        self.plugin = self
            .runtime
            .block_on(self.kubelet.wait_and_register(WAIT))
            .unwrap_or_else(|e| panic!("{e}\n{}", self.process.log()));
    }

    /// Restarts the plugin so that it SIGKILLs itself at kill point `step`
    /// during `call` (which must therefore get no answer), then starts it
    /// again with `options`.
    pub fn killed_during(&mut self, options: &PluginOptions, step: &str, call: impl FnOnce(&RunningNode) -> bool) {
        self.process.terminate(WAIT).expect("SIGTERM");
        self.respawn(&options.killing_at(step));
        let answered = call(self);
        assert!(!answered, "{step}: the call was answered, the kill point never reached\n{}", self.process.log());
        let status =
            self.process.wait_timeout(Duration::from_secs(30)).expect("wait").expect("the plugin killed itself");
        assert!(!status.success(), "{step}: {status:?}");
        self.respawn(options);
    }

    /// Whether a NodePrepareResources call for `claim` was answered at all.
    pub fn prepare_answered(&self, claim: &Claim) -> bool {
        self.runtime.block_on(self.kubelet.prepare_raw(&self.plugin, std::slice::from_ref(claim))).is_ok()
    }

    /// Whether a NodeUnprepareResources call for `claim` was answered at all.
    pub fn unprepare_answered(&self, claim: &Claim) -> bool {
        self.runtime.block_on(self.kubelet.unprepare_raw(&self.plugin, std::slice::from_ref(claim))).is_ok()
    }

    /// Stores an allocated claim `default/<name>`; returns the kubelet's
    /// reference to it.
    pub fn claim(&self, name: &str, results: &[Allocated], config: Vec<DeviceAllocationConfiguration>) -> Claim {
        let uid = claim_fixtures::store(&self.server, &allocated_claim("default", name, results, config))
            .expect("storing a claim");
        claim("default", name, &uid)
    }

    /// A claim for `devices` of this node, request `gpu`.
    pub fn gpu_claim(&self, name: &str, devices: &[&str]) -> Claim {
        let results: Vec<Allocated> = devices.iter().map(|d| Allocated::new("gpu", NODE, d)).collect();
        self.claim(name, &results, vec![])
    }

    /// NodePrepareResources; each claim's answer.
    pub fn prepare(&self, claims: &[Claim]) -> HashMap<String, Answer> {
        let answers = self.runtime.block_on(self.kubelet.prepare_raw(&self.plugin, claims)).expect("prepare call");
        answers
            .into_iter()
            .map(|(uid, a)| (uid, if a.error.is_empty() { Ok(a.devices) } else { Err(a.error) }))
            .collect()
    }

    /// NodeUnprepareResources, judged as the kubelet does.
    pub fn unprepare(&self, claims: &[Claim]) {
        self.runtime
            .block_on(self.kubelet.unprepare(&self.plugin, claims))
            .unwrap_or_else(|e| panic!("{e}\n{}", self.process.log()));
    }

    /// The claim's CDI spec file.
    pub fn spec_path(&self, uid: &str) -> PathBuf {
        self.dirs.cdi.join(format!("k8s.{DRIVER}-claim_{uid}.json"))
    }

    /// The plugin's checkpoint records.
    pub fn records(&self) -> Vec<ClaimRecord> {
        CheckpointDir::open(self.dirs.plugin_dir(DRIVER).join("checkpoint"))
            .expect("checkpoint")
            .load()
            .expect("load")
            .records
    }
}
