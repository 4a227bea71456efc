//! NVIDIA's `ConsumableShares` (`--consumable-shares`): GPUs and MIG
//! devices published for several claims at once, as NVIDIA's driver
//! publishes them, so that claims written for it share devices here too.
//! Nothing holds a claim to its share (no MPS limits, as in NVIDIA's
//! driver): the modes ration how many claims land on a device, like the
//! device plugin's time-slicing `replicas`. Enforced shares are
//! `ConsumableCapacity` ([`super::shares`]).
//!
//! | mode | `memory` request policy | `shares` capacity |
//! |---|---|---|
//! | `memory` | default all, min 1Mi, step 1Mi | none |
//! | `unlimited` | default 0, min 0, step 1Mi | none |
//! | `N` | default 0, min 0, step 1Mi | N, default 1, step 1 |
//!
//! Every mode sets `allowMultipleAllocations` and rounds `memory` down to
//! whole MiB, as NVIDIA's `applyConsumableShares` does.

use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;

use k8s_openapi::api::resource::v1::{CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::attributes::name;
use dra_cel::quantity;

/// The `shares` capacity's name (NVIDIA's).
pub const SHARES: &str = "shares";

const MIB: u64 = 1 << 20;

/// How devices are shared under `ConsumableShares`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SharesMode {
    /// Devices are not shared this way.
    #[default]
    Disabled,
    /// A claim takes the memory it asks for; all of it by default.
    Memory,
    /// A claim takes the memory it asks for; none by default, so any
    /// number of claims fit.
    Unlimited,
    /// At most N claims per device (each takes one share by default).
    Count(NonZeroU32),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--consumable-shares {0:?} is not a mode: use disabled, memory, unlimited, or a number of shares from 1 to 4294967295"
)]
pub struct InvalidSharesMode(String);

impl FromStr for SharesMode {
    type Err = InvalidSharesMode;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "" | "disabled" => Ok(SharesMode::Disabled),
            "memory" => Ok(SharesMode::Memory),
            "unlimited" => Ok(SharesMode::Unlimited),
            n => n
                .parse::<NonZeroU32>()
                .map(SharesMode::Count)
                .map_err(|_| InvalidSharesMode(n.chars().take(64).collect())),
        }
    }
}

impl fmt::Display for SharesMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SharesMode::Disabled => f.write_str("disabled"),
            SharesMode::Memory => f.write_str("memory"),
            SharesMode::Unlimited => f.write_str("unlimited"),
            SharesMode::Count(n) => write!(f, "{n}"),
        }
    }
}

/// Publishes `device` (a whole GPU or a MIG device, `memory_bytes` of
/// memory) for sharing in `mode`.
pub fn apply(device: &mut Device, memory_bytes: u64, mode: SharesMode) {
    if mode == SharesMode::Disabled {
        return;
    }
    device.allow_multiple_allocations = Some(true);
    let whole_mib = memory_bytes / MIB * MIB;
    let caps = device.capacity.get_or_insert_with(Default::default);
    let (default, min) = match mode {
        SharesMode::Memory => (quantity::bytes(whole_mib), quantity::bytes(MIB)),
        _ => (zero(), zero()),
    };
    caps.insert(
        name::MEMORY.to_string(),
        DeviceCapacity {
            value: quantity::bytes(whole_mib),
            request_policy: Some(policy(default, min, quantity::bytes(whole_mib), quantity::bytes(MIB))),
        },
    );
    if let SharesMode::Count(n) = mode {
        let n = u64::from(n.get());
        caps.insert(
            SHARES.to_string(),
            DeviceCapacity {
                value: quantity::count(n),
                request_policy: Some(policy(
                    quantity::count(1),
                    quantity::count(1),
                    quantity::count(n),
                    quantity::count(1),
                )),
            },
        );
    }
}

fn zero() -> Quantity {
    quantity::count(0)
}

fn policy(default: Quantity, min: Quantity, max: Quantity, step: Quantity) -> CapacityRequestPolicy {
    CapacityRequestPolicy {
        default: Some(default),
        valid_range: Some(CapacityRequestPolicyRange { min, max: Some(max), step: Some(step) }),
        valid_values: None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn published(mode: &str) -> serde_json::Value {
        let mut d = Device { name: "gpu-0".into(), ..Default::default() };
        apply(&mut d, (81559 << 20) + 123, mode.parse().unwrap());
        serde_json::to_value(&d).unwrap()
    }

    #[test]
    fn each_mode_is_published_as_nvidia_publishes_it() {
        assert_eq!(
            published("memory"),
            json!({"name": "gpu-0", "allowMultipleAllocations": true, "capacity": {"memory": {
                "value": "81559Mi",
                "requestPolicy": {"default": "81559Mi", "validRange": {"min": "1Mi", "max": "81559Mi", "step": "1Mi"}}
            }}})
        );
        assert_eq!(
            published("unlimited")["capacity"]["memory"]["requestPolicy"],
            json!({"default": "0", "validRange": {"min": "0", "max": "81559Mi", "step": "1Mi"}})
        );
        let four = published("4");
        assert_eq!(four["capacity"]["memory"]["requestPolicy"]["default"], "0");
        assert_eq!(
            four["capacity"]["shares"],
            json!({"value": "4", "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}}})
        );
        assert_eq!(published("disabled"), json!({"name": "gpu-0"}));
    }

    #[test]
    fn modes_read_as_nvidia_writes_them() {
        assert_eq!("4".parse::<SharesMode>().unwrap().to_string(), "4");
        assert_eq!(" unlimited ".parse::<SharesMode>(), Ok(SharesMode::Unlimited));
        assert_eq!("".parse::<SharesMode>(), Ok(SharesMode::Disabled));
        let e = "0".parse::<SharesMode>().unwrap_err().to_string();
        assert_eq!(
            e,
            "--consumable-shares \"0\" is not a mode: use disabled, memory, unlimited, or a number of shares from 1 to 4294967295"
        );
        assert!("half".parse::<SharesMode>().is_err());
    }
}
