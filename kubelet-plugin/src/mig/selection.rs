//! Which GPUs are dynamic: every inventory the plugin reads (the first and
//! each re-read) goes through [`DynamicMigSelection::apply`] before anyone
//! sees it, so the slices and prepare agree on it.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

use gpu_dra_driver::feature_gates::{FeatureGates, Gate};
use gpu_dra_driver::inventory::dynamic_mig::{self, DynamicMigGpus};
use gpu_dra_driver::inventory::{Inventory, MigDevice, MigMode, Placement};

use super::ownership::Withheld;

/// The `DynamicMIG` gate, `--dynamic-mig-gpus`, and the MIG instances the
/// plugin made (so a GPU holding only those stays dynamic across restarts).
#[derive(Debug)]
pub struct DynamicMigSelection {
    enabled: bool,
    gpus: DynamicMigGpus,
    /// UUIDs of MIG instances made for prepared claims.
    ours: RwLock<BTreeSet<String>>,
    /// Instances the plugin may have made but cannot prove: their GPU stays
    /// dynamic, their placements are not offered.
    withheld: RwLock<Vec<Withheld>>,
}

impl DynamicMigSelection {
    pub fn new(gates: FeatureGates, gpus: DynamicMigGpus) -> Arc<Self> {
        Arc::new(Self {
            enabled: gates.enabled(Gate::DynamicMig),
            gpus,
            ours: RwLock::new(BTreeSet::new()),
            withheld: RwLock::new(Vec::new()),
        })
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

    /// The instances start-up kept because the plugin may have made them
    /// (see [`super::ownership::withheld`]).
    pub fn set_withheld(&self, withheld: Vec<Withheld>) {
        *self.withheld.write().unwrap_or_else(std::sync::PoisonError::into_inner) = withheld;
    }

    /// Marks the selected MIG-mode GPUs of `inventory` dynamic (a no-op
    /// with the gate off); logs the selected ones that must stay static.
    /// On a dynamic GPU holding a withheld instance, the placements that
    /// overlap it are not offered, nor is the whole GPU (MIG mode cannot be
    /// switched while the instance exists).
    pub fn apply(&self, inventory: &mut Inventory) {
        if !self.enabled {
            return;
        }
        let ours = self.ours.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let withheld = self.withheld.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let is_ours = |m: &MigDevice| {
            ours.contains(&m.uuid) || withheld.iter().any(|w| w.mig_uuid.as_deref() == Some(m.uuid.as_str()))
        };
        for left in dynamic_mig::select(inventory, &self.gpus, &is_ours) {
            tracing::warn!(minor = left.minor, reason = %left.reason, "GPU stays as configured, not dynamic MIG");
        }
        for gpu in &mut inventory.gpus {
            let (MigMode::Dynamic(_), Some(caps)) = (&gpu.mig, gpu.mig_capabilities.as_mut()) else { continue };
            let mine: Vec<Placement> =
                withheld.iter().filter(|w| w.gpu_uuid == gpu.uuid).map(|w| w.placement).collect();
            if mine.is_empty() {
                continue;
            }
            for profile in &mut caps.profiles {
                profile.placements.retain(|p| !mine.iter().any(|w| w.overlaps(*p)));
            }
            caps.mig_mode_switchable = false;
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

    /// An instance the plugin may have made (its create was cut short of
    /// the ledger) keeps its GPU dynamic; its placements and the whole GPU
    /// are not offered; the others are.
    #[test]
    fn a_withheld_instance_keeps_its_gpu_dynamic_without_its_placements() {
        let on = DynamicMigSelection::new("DynamicMIG=true".parse().unwrap(), DynamicMigGpus::Auto);
        let MigMode::Enabled(migs) = &node().gpus[1].mig else { panic!() };
        let held = &migs[0];
        on.set_withheld(vec![Withheld {
            gpu_uuid: node().gpus[1].uuid.clone(),
            gpu_instance_id: held.gpu_instance_id,
            placement: held.placement,
            mig_uuid: Some(held.uuid.clone()),
        }]);
        let mut inv = node();
        on.apply(&mut inv);
        assert!(matches!(inv.gpus[1].mig, MigMode::Dynamic(_)), "not stranded");
        let caps = inv.gpus[1].mig_capabilities.as_ref().unwrap();
        assert!(!caps.mig_mode_switchable);
        let offered: Vec<Placement> = caps.profiles.iter().flat_map(|p| p.placements.clone()).collect();
        assert!(!offered.is_empty());
        assert!(offered.iter().all(|p| !p.overlaps(held.placement)), "{offered:?}");
        let full = inv.gpus[0].mig_capabilities.as_ref().unwrap();
        assert!(full.profiles.iter().map(|p| p.placements.len()).sum::<usize>() > offered.len());
    }
}
