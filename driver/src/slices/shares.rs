//! Fractional GPUs (`ConsumableCapacity`): a whole GPU published for
//! several claims at once, each taking a share of its memory and,
//! optionally, of its compute.
//!
//! A shareable GPU gets `allowMultipleAllocations: true` and two
//! capacities with a `requestPolicy` (the scheduler's consumable capacity,
//! `DRAConsumableCapacity`):
//!
//! - `memory`: the GPU's memory; requests round up to whole GiB (`validRange
//!   {min: 1Gi, step: 1Gi}`). The default, what a claim that asks for no
//!   memory consumes, is all of it (rounded down to a whole step), so a
//!   claim written for a dedicated GPU still gets the GPU to itself.
//! - `smPercent`: the share's limit on the GPU's streaming multiprocessors,
//!   in percent (MPS's active thread percentage). Capacity names are C
//!   identifiers, so the issue's `sm-percent` is spelled `smPercent`, in
//!   the driver's domain like `memory`. The default is 0: a claim that asks
//!   only for memory reserves no compute and is not limited, so memory-only
//!   shares pack by memory alone; claims that ask for a compute limit never
//!   add up to more than the whole GPU.
//!
//! Only GPUs without MIG are shared this way. A MIG-enabled GPU is published
//! as its MIG devices alone (static MIG, no shared counters), so a GPU is
//! either partitioned by MIG or shared by memory, never both. (Were MIG
//! ever published as partitions through shared counters, a shareable whole
//! GPU could stay beside them: the allocator draws a multi-allocatable
//! device's counters once, at its first share, so shares and partitions
//! would exclude each other as they must.)
//! MIG devices stay dedicated: each already is a hardware-isolated share,
//! and claims that want to share one can still ask for MPS in a
//! `MigDeviceConfig`.
//!
//! The shares are enforced at prepare (the MPS limits from a result's
//! `consumedCapacity`), which is why `ConsumableCapacity` needs `MPSSupport`.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::attributes::name;
use crate::inventory::Gpu;
use dra_cel::quantity;

/// The memory step: requests round up to whole GiB, fine enough for model
/// sizes and coarse enough that a GPU holds at most ~100 shares.
pub const MEMORY_STEP_BYTES: u64 = 1 << 30;

/// The whole GPU in `smPercent`.
pub const SM_PERCENT_WHOLE: u64 = 100;

/// Makes `device`, the whole GPU `gpu`, shareable. A GPU too small for two
/// memory steps (never a real one) stays dedicated, since the apiserver
/// refuses a range whose first step exceeds the capacity.
pub fn make_shareable(device: &mut Device, gpu: &Gpu) {
    let memory = gpu.memory_bytes;
    if memory < 2 * MEMORY_STEP_BYTES {
        return;
    }
    let whole_steps = memory / MEMORY_STEP_BYTES * MEMORY_STEP_BYTES;
    let caps = device.capacity.get_or_insert_with(BTreeMap::new);
    caps.insert(
        name::MEMORY.to_string(),
        DeviceCapacity {
            value: quantity::bytes(memory),
            request_policy: Some(range(
                quantity::bytes(whole_steps),
                quantity::bytes(MEMORY_STEP_BYTES),
                quantity::bytes(MEMORY_STEP_BYTES),
            )),
        },
    );
    caps.insert(
        name::SM_PERCENT.to_string(),
        DeviceCapacity {
            value: quantity::count(SM_PERCENT_WHOLE),
            request_policy: Some(range(quantity::count(0), quantity::count(0), quantity::count(1))),
        },
    );
    device.allow_multiple_allocations = Some(true);
}

/// `{default, validRange: {min, step}}`: requests below `min` take `min`,
/// others round up to `min + k·step`; no `max` (the capacity is the limit).
fn range(default: Quantity, min: Quantity, step: Quantity) -> CapacityRequestPolicy {
    CapacityRequestPolicy {
        default: Some(default),
        valid_range: Some(CapacityRequestPolicyRange { min, max: None, step: Some(step) }),
        valid_values: None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::inventory::test_support::gpu;

    fn shared(memory: u64) -> Device {
        let mut g = gpu(0);
        g.memory_bytes = memory;
        let mut d = Device {
            name: "gpu-0".into(),
            capacity: Some(BTreeMap::from([(
                name::MEMORY.to_string(),
                DeviceCapacity { value: quantity::bytes(memory), request_policy: None },
            )])),
            ..Default::default()
        };
        make_shareable(&mut d, &g);
        d
    }

    #[test]
    fn an_h100_is_published_for_memory_and_compute_shares() {
        let d = shared(80 << 30);
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            json!({
                "name": "gpu-0",
                "allowMultipleAllocations": true,
                "capacity": {
                    "memory": {
                        "value": "80Gi",
                        "requestPolicy": {"default": "80Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}
                    },
                    "smPercent": {
                        "value": "100",
                        "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1"}}
                    }
                }
            })
        );
    }

    #[test]
    fn memory_that_is_not_whole_gib_defaults_to_the_whole_steps() {
        // NVML's H100 80GB HBM3: 81559 MiB.
        let d = shared(81559 << 20);
        let memory = &d.capacity.as_ref().unwrap()["memory"];
        assert_eq!(memory.value.0, "81559Mi");
        assert_eq!(memory.request_policy.as_ref().unwrap().default.as_ref().unwrap().0, "79Gi");
    }

    #[test]
    fn a_gpu_smaller_than_two_steps_stays_dedicated() {
        let d = shared(1 << 30);
        assert_eq!(d.allow_multiple_allocations, None);
        assert!(d.capacity.as_ref().unwrap()["memory"].request_policy.is_none());
        assert!(!d.capacity.as_ref().unwrap().contains_key("smPercent"));
    }
}
