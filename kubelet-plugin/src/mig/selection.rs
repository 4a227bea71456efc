//! Which GPUs are dynamic: every inventory the plugin reads (the first and
//! each re-read) goes through [`DynamicMigSelection::apply`] before anyone
//! sees it, so the slices and prepare agree on it.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

use gpu_dra_driver::feature_gates::{FeatureGates, Gate};
use gpu_dra_driver::inventory::Inventory;
use gpu_dra_driver::inventory::dynamic_mig::{self, DynamicMigGpus};

/// The `DynamicMIG` gate, `--dynamic-mig-gpus`, and the MIG instances the
/// plugin made (so a GPU holding only those stays dynamic across restarts).
#[derive(Debug)]
pub struct DynamicMigSelection {
    enabled: bool,
    gpus: DynamicMigGpus,
    /// UUIDs of MIG instances made for prepared claims.
    ours: RwLock<BTreeSet<String>>,
}

impl DynamicMigSelection {
    pub fn new(gates: FeatureGates, gpus: DynamicMigGpus) -> Arc<Self> {
        Arc::new(Self { enabled: gates.enabled(Gate::DynamicMig), gpus, ours: RwLock::new(BTreeSet::new()) })
    }

    /// Nothing dynamic (the gate off).
    pub fn disabled() -> Arc<Self> {
        Self::new(FeatureGates::default(), DynamicMigGpus::None)
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The MIG instances (by `MIG-` UUID) the plugin made and still holds
    /// for claims: the checkpoint's, at start-up and after each change.
    pub fn set_ours(&self, uuids: impl IntoIterator<Item = String>) {
        let mut ours = self.ours.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        *ours = uuids.into_iter().collect();
    }

    /// Marks the selected MIG-mode GPUs of `inventory` dynamic (a no-op
    /// with the gate off); logs the selected ones that must stay static.
    pub fn apply(&self, inventory: &mut Inventory) {
        if !self.enabled {
            return;
        }
        let ours = self.ours.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        for left in dynamic_mig::select(inventory, &self.gpus, &|m| ours.contains(&m.uuid)) {
            tracing::warn!(minor = left.minor, reason = %left.reason, "GPU stays as configured, not dynamic MIG");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_dra_driver::inventory::{MigMode, fake};
    use gpu_dra_driver::names::NodeName;

    fn node() -> Inventory {
        let yaml = "gpus: [{model: H100-80GB, count: 2, mig: [{gpus: [0], dynamic: true}, {gpus: [1], instances: [3g.40gb]}]}]";
        fake::parse(yaml, &NodeName::new("n").unwrap()).unwrap()
    }

    #[test]
    fn the_gate_decides_and_our_instances_keep_a_gpu_dynamic() {
        let mut off = node();
        DynamicMigSelection::disabled().apply(&mut off);
        assert!(off.gpus.iter().all(|g| !matches!(g.mig, MigMode::Dynamic(_))));

        let on = DynamicMigSelection::new("DynamicMIG=true".parse().unwrap(), DynamicMigGpus::Auto);
        let mut inv = node();
        on.apply(&mut inv);
        assert!(matches!(inv.gpus[0].mig, MigMode::Dynamic(_)));
        assert!(matches!(inv.gpus[1].mig, MigMode::Enabled(_)), "an administrator's instance");
        let MigMode::Enabled(migs) = &node().gpus[1].mig else { panic!() };
        on.set_ours([migs[0].uuid.clone()]);
        let mut again = node();
        on.apply(&mut again);
        assert!(matches!(again.gpus[1].mig, MigMode::Dynamic(ref m) if m.len() == 1), "made by us: dynamic");
    }
}
