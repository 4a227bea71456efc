//! Fixtures for the preparer's unit tests.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use gpu_dra_driver::inventory::{Inventory, fake};
use gpu_dra_driver::names::{DriverName, NodeName};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult, DeviceRequestAllocationResult,
    ResourceClaim, ResourceClaimStatus,
};
use tokio::sync::watch;

use super::config::PreparerConfig;
use super::preparer::Preparer;
use super::reconcile::ReconcileReport;
use super::types::{ClaimRef, ClaimSource};

/// Two A100s on `node-a`: `gpu-0` whole, `gpu-1` with one 1g.10gb MIG
/// device `gpu-1-mig-1g10gb-19-0`.
pub fn two_gpu_inventory() -> Inventory {
    let text = r#"
driverVersion: "570.172.08"
cudaDriverVersion: "12.8"
gpus:
  - model: A100-SXM4-80GB
    count: 3
    mig:
      - gpus: [1]
        instances: [1g.10gb]
"#;
    match fake::parse(text, &node()) {
        Ok(inventory) => inventory,
        Err(e) => panic!("test inventory: {e:?}"),
    }
}

pub fn node() -> NodeName {
    NodeName::new("node-a").unwrap()
}

/// An opaque config entry from the claim, for every request.
pub fn claim_config(parameters: serde_json::Value) -> DeviceAllocationConfiguration {
    serde_json::from_value(serde_json::json!({
        "source": "FromClaim",
        "opaque": {"driver": "gpu.nvidia.com", "parameters": parameters},
    }))
    .unwrap()
}

/// A ResourceClaim allocated on `node-a` with one result per device.
pub fn allocated(uid: &str, name: &str, devices: &[&str]) -> ResourceClaim {
    let results = devices
        .iter()
        .map(|d| DeviceRequestAllocationResult {
            driver: "gpu.nvidia.com".into(),
            pool: "node-a".into(),
            device: d.to_string(),
            request: "gpu".into(),
            ..Default::default()
        })
        .collect();
    with_results(uid, name, results, vec![])
}

pub fn with_results(
    uid: &str,
    name: &str,
    results: Vec<DeviceRequestAllocationResult>,
    config: Vec<DeviceAllocationConfiguration>,
) -> ResourceClaim {
    let mut c = ResourceClaim::default();
    c.metadata.uid = Some(uid.into());
    c.metadata.name = Some(name.into());
    c.metadata.namespace = Some("default".into());
    c.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult { results: Some(results), config: Some(config) }),
            ..Default::default()
        }),
        ..Default::default()
    });
    c
}

pub fn claim_ref(uid: &str, name: &str) -> ClaimRef {
    ClaimRef { namespace: "default".into(), name: name.into(), uid: uid.into() }
}

/// Claims by `default/<name>`, counting lookups.
#[derive(Default, Clone)]
pub struct MapSource {
    pub claims: Arc<Mutex<HashMap<String, ResourceClaim>>>,
    pub gets: Arc<AtomicUsize>,
    pub error: Arc<Mutex<Option<String>>>,
}

impl MapSource {
    pub fn put(&self, claim: ResourceClaim) {
        let name = claim.metadata.name.clone().unwrap_or_default();
        self.claims.lock().unwrap().insert(name, claim);
    }

    pub fn remove(&self, name: &str) {
        self.claims.lock().unwrap().remove(name);
    }

    pub fn gets(&self) -> usize {
        self.gets.load(Ordering::SeqCst)
    }
}

impl ClaimSource for MapSource {
    type Error = String;

    async fn get(
        &self,
        _namespace: &str,
        name: &str,
        _deadline: tokio::time::Instant,
    ) -> Result<Option<ResourceClaim>, String> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        if let Some(error) = self.error.lock().unwrap().clone() {
            return Err(error);
        }
        Ok(self.claims.lock().unwrap().get(name).cloned())
    }

    fn forget(&self, _namespace: &str, _name: &str) {}
}

/// A preparer over temporary directories.
pub struct Harness {
    pub dir: tempfile::TempDir,
    pub source: MapSource,
    pub inventory: watch::Sender<Arc<Inventory>>,
    /// Gates and GPU control for the preparers it opens.
    pub gates: gpu_dra_driver::feature_gates::FeatureGates,
    pub gpu: Option<Arc<crate::prepare::sharing::test_support::Recorder>>,
    pub mps: Option<Arc<crate::prepare::mps::lifecycle::test_support::FakeHost>>,
    /// Dynamic MIG through an in-memory GPU (`<dir>/proc` for caps minors).
    pub mig: Option<Arc<crate::mig::control::fake::FakeControl>>,
    /// VFIO passthrough through a fake kernel.
    pub vfio: Option<crate::vfio::VfioHost>,
}

impl Harness {
    pub fn new() -> Self {
        let (inventory, _) = watch::channel(Arc::new(two_gpu_inventory()));
        Self {
            dir: tempfile::tempdir().unwrap(),
            source: MapSource::default(),
            inventory,
            gates: Default::default(),
            gpu: None,
            mps: None,
            mig: None,
            vfio: None,
        }
    }

    pub fn config(&self, boot_id: &str) -> PreparerConfig {
        PreparerConfig {
            driver: DriverName::nvidia_default(),
            node: node(),
            cdi_dir: self.dir.path().join("cdi"),
            checkpoint_dir: self.dir.path().join("state/checkpoint"),
            boot_id: boot_id.into(),
            driver_edits: Default::default(),
            gates: self.gates,
            gpu_control: self.gpu.clone().map(|r| r as Arc<dyn crate::prepare::sharing::GpuControl>),
            dev_root: None,
            mps_dir: self.dir.path().join("state/mps"),
            mps_host: self.mps.clone().map(|h| h as Arc<dyn crate::prepare::mps::host::MpsHost>),
            mps_timeouts: crate::prepare::mps::lifecycle::Timeouts {
                ready: std::time::Duration::from_millis(300),
                exit: std::time::Duration::from_millis(300),
            },
            mig: self.mig.clone().map(|control| crate::mig::lifecycle::MigHost {
                control,
                proc_root: self.dir.path().join("proc"),
                mode_observer: None,
                ledger: Arc::new(crate::mig::ledger::Ledger::new(self.dir.path().join("state/mig-ledger"))),
            }),
            selection: None,
            vfio: self.vfio.clone(),
            nvidia_dir: Some(self.dir.path().join("state")),
        }
    }

    pub fn open(&self) -> (Preparer<MapSource>, ReconcileReport) {
        self.open_boot("boot-1")
    }

    pub fn open_boot(&self, boot_id: &str) -> (Preparer<MapSource>, ReconcileReport) {
        Preparer::open(self.config(boot_id), self.source.clone(), self.inventory.subscribe()).unwrap()
    }

    pub fn cdi_files(&self) -> Vec<String> {
        self.file_names("cdi")
    }

    pub fn checkpoint_files(&self) -> Vec<String> {
        self.file_names("state/checkpoint")
    }

    fn file_names(&self, dir: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.dir.path().join(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}
