//! The benchmark fleets, shared by the allocation benchmark
//! (`allocator/benches/allocate.rs`) and the `simulate` benchmark
//! (`controller/benches/simulate.rs`, which writes them to files as
//! `kubectl get resourceslices -o json` would).
//!
//! 1,000 nodes × 8 H100, each GPU published NVIDIA-style as a partitionable
//! device (the whole GPU plus every MIG placement, all drawing on the GPU's
//! eight memory-slice counters: 208,000 devices), or as whole GPUs alone.

use std::collections::BTreeMap;
use std::io::Write;

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, Counter, CounterSet, Device, DeviceAttribute, DeviceCapacity, DeviceClaim, DeviceClass,
    DeviceClassSpec, DeviceCounterConsumption, DeviceRequest, DeviceSelector, ExactDeviceRequest, ResourceClaim,
    ResourceClaimSpec, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub(crate) const DRIVER: &str = "gpu.nvidia.com";
pub(crate) const NODES: usize = 1_000;
pub(crate) const GPUS_PER_NODE: usize = 8;
/// `ResourceSliceMaxDevicesWithTaintsOrConsumesCounters`.
pub(crate) const DEVICES_PER_SLICE: usize = 64;
pub(crate) const PRODUCT: &str = "NVIDIA H100 80GB HBM3";
pub(crate) const DRIVER_VERSION: &str = "580.82.7";

/// The shipped classes' selectors (double quotes: same expression).
pub(crate) const GPU_CLASS: &str =
    r#"device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu""#;
pub(crate) const MIG_CLASS: &str =
    r#"device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "mig""#;
/// A MIG profile: name, memory, placements as (first memory slice, slices).
pub(crate) type Profile = (&'static str, &'static str, &'static [(u32, u32)]);

/// The H100 80GB's MIG profiles.
pub(crate) const PROFILES: &[Profile] = &[
    ("1g.10gb", "9856Mi", &[(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)]),
    ("1g.10gb+me", "9856Mi", &[(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)]),
    ("1g.20gb", "19968Mi", &[(0, 2), (2, 2), (4, 2), (6, 2)]),
    ("2g.20gb", "19968Mi", &[(0, 2), (2, 2), (4, 2)]),
    ("3g.40gb", "40192Mi", &[(0, 4), (4, 4)]),
    ("4g.40gb", "40192Mi", &[(0, 4)]),
    ("7g.80gb", "80384Mi", &[(0, 8)]),
];

pub(crate) fn string(v: &str) -> DeviceAttribute {
    DeviceAttribute { string: Some(v.to_string()), ..Default::default() }
}

pub(crate) fn version(v: &str) -> DeviceAttribute {
    DeviceAttribute { version: Some(v.to_string()), ..Default::default() }
}

pub(crate) fn capacity(v: &str) -> DeviceCapacity {
    DeviceCapacity { value: Quantity(v.to_string()), ..Default::default() }
}

/// Counter names are DNS labels (the apiserver refuses `memorySlice0`).
pub(crate) fn counters(slices: impl Iterator<Item = u32>) -> BTreeMap<String, Counter> {
    slices.map(|s| (format!("memory-slice-{s}"), Counter { value: Quantity("1".to_string()) })).collect()
}

/// The devices of GPU `g` on `node`: the whole GPU, then every MIG placement
/// (`partitionable`), or the whole GPU alone.
pub(crate) fn gpu_devices(node: usize, g: usize, partitionable: bool, driver_version: &str) -> Vec<Device> {
    let set = format!("gpu-{g}-counters");
    let uuid = format!("GPU-{node:08x}-{g:04x}");
    let common = |kind: &str| {
        BTreeMap::from([
            ("type".to_string(), string(kind)),
            ("productName".to_string(), string(PRODUCT)),
            ("architecture".to_string(), string("Hopper")),
            ("driverVersion".to_string(), version(driver_version)),
        ])
    };
    let mut whole = common("gpu");
    whole.insert("uuid".to_string(), string(&uuid));
    let mut out = vec![Device {
        name: format!("gpu-{g}"),
        attributes: Some(whole),
        capacity: Some(BTreeMap::from([("memory".to_string(), capacity("80Gi"))])),
        consumes_counters: partitionable.then(|| {
            vec![DeviceCounterConsumption { counter_set: set.clone(), counters: counters(0..8), ..Default::default() }]
        }),
        ..Default::default()
    }];
    if !partitionable {
        return out;
    }
    for (profile, memory, placements) in PROFILES {
        for &(start, size) in *placements {
            let mut attributes = common("mig");
            attributes.insert("profile".to_string(), string(profile));
            attributes.insert("parentUUID".to_string(), string(&uuid));
            let short: String = profile.chars().filter(|c| *c != '.' && *c != '+').collect();
            out.push(Device {
                name: format!("gpu-{g}-mig-{short}-{start}"),
                attributes: Some(attributes),
                capacity: Some(BTreeMap::from([("memory".to_string(), capacity(memory))])),
                consumes_counters: Some(vec![DeviceCounterConsumption {
                    counter_set: set.clone(),
                    counters: counters(start..start + size),
                    ..Default::default()
                }]),
                ..Default::default()
            });
        }
    }
    out
}

pub(crate) fn node_name(n: usize) -> String {
    format!("node-{n:04}")
}

/// One pool per node: a slice of counter sets (partitionable fleets), then
/// device slices of 64.
pub(crate) fn node_slices(n: usize, partitionable: bool, generation: i64, driver_version: &str) -> Vec<ResourceSlice> {
    let node = node_name(n);
    let devices: Vec<Device> =
        (0..GPUS_PER_NODE).flat_map(|g| gpu_devices(n, g, partitionable, driver_version)).collect();
    let chunks: Vec<Vec<Device>> = devices.chunks(DEVICES_PER_SLICE).map(<[Device]>::to_vec).collect();
    let counter_slices = usize::from(partitionable);
    let count = i64::try_from(chunks.len() + counter_slices).unwrap_or(i64::MAX);
    let slice = |i: usize, devices: Option<Vec<Device>>, shared: Option<Vec<CounterSet>>| ResourceSlice {
        metadata: ObjectMeta { name: Some(format!("{node}-{DRIVER}-{i}")), ..Default::default() },
        spec: ResourceSliceSpec {
            driver: DRIVER.to_string(),
            node_name: Some(node.clone()),
            pool: ResourcePool { name: node.clone(), generation, resource_slice_count: count },
            devices,
            shared_counters: shared,
            ..Default::default()
        },
    };
    let sets = (0..GPUS_PER_NODE)
        .map(|g| CounterSet { name: format!("gpu-{g}-counters"), counters: counters(0..8) })
        .collect();
    let mut out: Vec<ResourceSlice> = Vec::new();
    if partitionable {
        out.push(slice(0, None, Some(sets)));
    }
    out.extend(chunks.into_iter().enumerate().map(|(i, d)| slice(i + 1, Some(d), None)));
    out
}

pub(crate) fn class(name: &str, expression: &str) -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
        spec: Some(DeviceClassSpec { selectors: Some(vec![selector(expression)]), ..Default::default() }),
    }
}

pub(crate) fn selector(expression: &str) -> DeviceSelector {
    DeviceSelector { cel: Some(CELDeviceSelector { expression: expression.to_string() }) }
}

/// Writes `slices` as one `v1` List, in kubectl's key order (`items`
/// before `kind`), one slice serialized at a time. Returns the bytes written.
pub(crate) fn write_list(out: impl Write, slices: impl Iterator<Item = ResourceSlice>) -> std::io::Result<u64> {
    let mut out = CountingWriter { inner: std::io::BufWriter::new(out), written: 0 };
    out.write_all(b"{\n    \"apiVersion\": \"v1\",\n    \"items\": [")?;
    for (i, slice) in slices.enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        out.write_all(b"\n")?;
        serde_json::to_writer_pretty(&mut out, &slice)?;
    }
    out.write_all(b"\n    ],\n    \"kind\": \"List\",\n    \"metadata\": {\"resourceVersion\": \"\"}\n}\n")?;
    out.flush()?;
    Ok(out.written)
}

struct CountingWriter<W> {
    inner: W,
    written: u64,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Benchmark claim `i`: one request of `class` with one CEL selector
/// (`mode`: its allocation mode, default ExactCount).
pub(crate) fn claim(i: usize, class: &str, expression: &str, mode: Option<&str>) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(format!("claim-{i:05}")),
            namespace: Some("bench".to_string()),
            uid: Some(format!("00000000-0000-4000-8000-{i:012}")),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: "gpu".to_string(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: class.to_string(),
                        allocation_mode: mode.map(str::to_string),
                        selectors: Some(vec![selector(expression)]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }),
        status: None,
    }
}
