//! The driver's feature gates, named and defaulted as NVIDIA's are (all
//! off), set with `--feature-gates A=true,B=false` / `FEATURE_GATES` on
//! every component, so that the node agent and the controller's webhook
//! judge a claim's config alike.
//!
//! | gate | default | what it turns on |
//! |---|---|---|
//! | `TimeSlicingSettings` | off | the `TimeSlicing` sharing strategy and its intervals |
//! | `MPSSupport` | off | the `MPS` sharing strategy (a control daemon per claim) |
//! | `ConsumableCapacity` | off | whole GPUs published for several claims at once, shared by memory (and optionally compute), each share's limit enforced through MPS: needs `MPSSupport` |
//! | `ConsumableShares` | off | NVIDIA's unenforced sharing: GPUs and MIG devices published for several claims, by memory, without limit, or as N shares (`--consumable-shares`); nothing holds a claim to its share, as in NVIDIA's driver |
//! | `DRAListTypeAttributes` | off | the cluster has Kubernetes' `DRAListTypeAttributes` (alpha in 1.36 and 1.37) on: `resource.kubernetes.io/numaNode` is published as a list (the GPU's NUMA node, as upstream's `deviceattribute` list form without SLIT distances), the webhook and `simulate` check selectors with list-typed attributes and constraints match lists by a common element; a server with the gate off refuses the slices |
//! | `PassthroughSupport` | off | each whole GPU whose IOMMU group is known is also published as `gpu-vfio-<minor>` (`type: vfio`, the `vfio.gpu.nvidia.com` class), sharing a counter with `gpu-<minor>` so the scheduler gives a GPU one way at a time; prepare binds it (and its IOMMU group) to `vfio-pci`, unprepare back to `nvidia`; the server needs `DRAPartitionableDevices`. Not with `DynamicMIG`, `ConsumableCapacity` or `ConsumableShares` |
//! | `DynamicMIG` | off | MIG devices made at prepare: MIG-mode GPUs the plugin manages (`--dynamic-mig-gpus`) are published as one device per MIG profile and placement plus the whole GPU (Hopper+), sharing counters (KEP-4815); the server needs `DRAPartitionableDevices` (on by default from 1.36) |

use std::fmt;
use std::str::FromStr;

/// One gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Gate {
    TimeSlicingSettings,
    MpsSupport,
    ConsumableCapacity,
    ConsumableShares,
    DynamicMig,
    ListTypeAttributes,
    Passthrough,
}

impl Gate {
    pub const ALL: [Gate; 7] = [
        Gate::TimeSlicingSettings,
        Gate::MpsSupport,
        Gate::ConsumableCapacity,
        Gate::ConsumableShares,
        Gate::DynamicMig,
        Gate::ListTypeAttributes,
        Gate::Passthrough,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Gate::TimeSlicingSettings => "TimeSlicingSettings",
            Gate::MpsSupport => "MPSSupport",
            Gate::ConsumableCapacity => "ConsumableCapacity",
            Gate::ConsumableShares => "ConsumableShares",
            Gate::DynamicMig => "DynamicMIG",
            Gate::ListTypeAttributes => "DRAListTypeAttributes",
            Gate::Passthrough => "PassthroughSupport",
        }
    }
}

/// Which gates are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct FeatureGates {
    time_slicing: bool,
    mps: bool,
    consumable_capacity: bool,
    consumable_shares: bool,
    dynamic_mig: bool,
    list_type_attributes: bool,
    passthrough: bool,
}

/// A `--feature-gates` value that cannot be used, with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeatureGateError {
    #[error(
        "unknown feature gate {0:?}; the gates are TimeSlicingSettings, MPSSupport, ConsumableCapacity, ConsumableShares, DynamicMIG, DRAListTypeAttributes and PassthroughSupport"
    )]
    Unknown(String),
    #[error("feature gate {gate}: {value:?} is not true or false")]
    BadValue { gate: String, value: String },
    #[error("{0:?} is not NAME=true|false; write gates as A=true,B=false")]
    Malformed(String),
    /// ConsumableCapacity without MPSSupport ([`FeatureGates::check_dependencies`]).
    #[error(
        "{} needs {}: shares are enforced through MPS; turn both on, or neither",
        Gate::ConsumableCapacity.name(),
        Gate::MpsSupport.name()
    )]
    SharesWithoutMps,
    /// ConsumableCapacity and ConsumableShares together.
    #[error(
        "{} (shares enforced through MPS) and {} (NVIDIA's unenforced shares) publish the same GPUs in two \
         ways: turn on one of them",
        Gate::ConsumableCapacity.name(),
        Gate::ConsumableShares.name()
    )]
    TwoKindsOfShares,
    /// PassthroughSupport with another gate that publishes whole GPUs its own way.
    #[error(
        "{} and {} both decide how a whole GPU is published: turn on one of them",
        Gate::Passthrough.name(),
        .0.name()
    )]
    PassthroughWith(Gate),
}

impl FeatureGates {
    pub fn enabled(&self, gate: Gate) -> bool {
        match gate {
            Gate::TimeSlicingSettings => self.time_slicing,
            Gate::MpsSupport => self.mps,
            Gate::ConsumableCapacity => self.consumable_capacity,
            Gate::ConsumableShares => self.consumable_shares,
            Gate::DynamicMig => self.dynamic_mig,
            Gate::ListTypeAttributes => self.list_type_attributes,
            Gate::Passthrough => self.passthrough,
        }
    }

    /// `ConsumableCapacity` needs `MPSSupport`: a share of a GPU is only
    /// held to its memory (and compute) by MPS client limits set at
    /// prepare. Publishing shares that nothing enforces would let one
    /// claim take the memory another was promised, so the combination is
    /// refused rather than documented as a caveat.
    pub fn check_dependencies(self) -> Result<Self, FeatureGateError> {
        if self.consumable_capacity && !self.mps {
            return Err(FeatureGateError::SharesWithoutMps);
        }
        if self.consumable_capacity && self.consumable_shares {
            return Err(FeatureGateError::TwoKindsOfShares);
        }
        if self.passthrough {
            // NVIDIA's driver refuses PassthroughSupport with DynamicMIG too;
            // here the VFIO device and the whole GPU share a counter, which
            // neither dynamic MIG's counters nor shares leave room for.
            let other = [Gate::DynamicMig, Gate::ConsumableCapacity, Gate::ConsumableShares]
                .into_iter()
                .find(|g| self.enabled(*g));
            if let Some(other) = other {
                return Err(FeatureGateError::PassthroughWith(other));
            }
        }
        Ok(self)
    }

    pub fn with(mut self, gate: Gate, on: bool) -> Self {
        match gate {
            Gate::TimeSlicingSettings => self.time_slicing = on,
            Gate::MpsSupport => self.mps = on,
            Gate::ConsumableCapacity => self.consumable_capacity = on,
            Gate::ConsumableShares => self.consumable_shares = on,
            Gate::DynamicMig => self.dynamic_mig = on,
            Gate::ListTypeAttributes => self.list_type_attributes = on,
            Gate::Passthrough => self.passthrough = on,
        }
        self
    }
}

impl FromStr for FeatureGates {
    type Err = FeatureGateError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut gates = FeatureGates::default();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, value) = item.split_once('=').ok_or_else(|| FeatureGateError::Malformed(item.to_owned()))?;
            let (name, value) = (name.trim(), value.trim());
            let gate = Gate::ALL
                .into_iter()
                .find(|g| g.name() == name)
                .ok_or_else(|| FeatureGateError::Unknown(name.to_owned()))?;
            let on = match value.to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                _ => return Err(FeatureGateError::BadValue { gate: name.to_owned(), value: value.to_owned() }),
            };
            gates = gates.with(gate, on);
        }
        Ok(gates)
    }
}

impl fmt::Display for FeatureGates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = Gate::ALL.iter().map(|g| format!("{}={}", g.name(), self.enabled(*g))).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_parse_as_kubernetes_components_take_them() {
        let gates: FeatureGates = "TimeSlicingSettings=true, MPSSupport=false".parse().unwrap();
        assert!(gates.enabled(Gate::TimeSlicingSettings) && !gates.enabled(Gate::MpsSupport));
        assert!(!gates.enabled(Gate::ConsumableCapacity), "off unless asked");
        assert_eq!("".parse::<FeatureGates>().unwrap(), FeatureGates::default());
        assert!(matches!("Sharing=true".parse::<FeatureGates>(), Err(FeatureGateError::Unknown(_))));
        assert!(matches!("MPSSupport=yes".parse::<FeatureGates>(), Err(FeatureGateError::BadValue { .. })));
        assert!(matches!("MPSSupport".parse::<FeatureGates>(), Err(FeatureGateError::Malformed(_))));
        let shown = gates.to_string();
        assert_eq!(shown.parse::<FeatureGates>().unwrap(), gates);
    }

    #[test]
    fn consumable_capacity_is_refused_without_mps() {
        let alone: FeatureGates = "ConsumableCapacity=true".parse().unwrap();
        let err = alone.check_dependencies().unwrap_err().to_string();
        assert_eq!(
            err,
            "ConsumableCapacity needs MPSSupport: shares are enforced through MPS; turn both on, or neither"
        );
        let both: FeatureGates = "ConsumableCapacity=true,MPSSupport=true".parse().unwrap();
        assert!(both.check_dependencies().is_ok());
        let time_slicing: FeatureGates = "TimeSlicingSettings=true".parse().unwrap();
        assert!(time_slicing.check_dependencies().is_ok());
        let two: FeatureGates = "ConsumableCapacity=true,MPSSupport=true,ConsumableShares=true".parse().unwrap();
        assert!(two.check_dependencies().unwrap_err().to_string().contains("turn on one of them"));
        let nvidia: FeatureGates = "ConsumableShares=true".parse().unwrap();
        assert!(nvidia.check_dependencies().is_ok(), "NVIDIA's shares need no MPS");
    }

    #[test]
    fn passthrough_excludes_the_other_ways_of_publishing_a_whole_gpu() {
        let alone: FeatureGates = "PassthroughSupport=true".parse().unwrap();
        assert!(alone.enabled(Gate::Passthrough) && alone.check_dependencies().is_ok());
        for other in ["DynamicMIG", "ConsumableShares", "ConsumableCapacity=true,MPSSupport"] {
            let gates: FeatureGates = format!("PassthroughSupport=true,{other}=true").parse().unwrap();
            assert!(gates.check_dependencies().unwrap_err().to_string().contains("turn on one of them"), "{other}");
        }
    }
}
