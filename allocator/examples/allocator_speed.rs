//! Rough allocator throughput on a generated fleet: N nodes × 8 GPUs, each
//! GPU published whole plus 12 MIG placements sharing its counters
//! (partitionable devices), single-GPU claims placed first-fit.
//! `cargo run --release -p dra-allocator --example allocator_speed [nodes] [claims]`

use std::collections::BTreeMap;
use std::time::Instant;

use dra_allocator::{Allocator, SequentialShareIds};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, Counter, CounterSet, Device, DeviceAttribute, DeviceClaim, DeviceClass, DeviceClassSpec,
    DeviceCounterConsumption, DeviceRequest, DeviceSelector, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const DRIVER: &str = "gpu.nvidia.com";

fn attr(s: &str) -> DeviceAttribute {
    DeviceAttribute { string: Some(s.into()), ..Default::default() }
}

fn counters(pairs: &[(&str, u64)]) -> BTreeMap<String, Counter> {
    pairs.iter().map(|(k, v)| (k.to_string(), Counter { value: Quantity(v.to_string()) })).collect()
}

fn device(name: String, kind: &str, profile: &str, set: &str, slices: u64, memory_gi: u64) -> Device {
    Device {
        name,
        attributes: Some(BTreeMap::from([
            ("type".to_string(), attr(kind)),
            ("profile".to_string(), attr(profile)),
            ("productName".to_string(), attr("NVIDIA H100 80GB HBM3")),
        ])),
        consumes_counters: Some(vec![DeviceCounterConsumption {
            counter_set: set.into(),
            counters: counters(&[("slices", slices), ("memory", memory_gi << 30)]),
            compatibility_groups: None,
        }]),
        ..Default::default()
    }
}

fn node_slices(node: &str) -> Vec<ResourceSlice> {
    let mut devices = Vec::new();
    let mut sets = Vec::new();
    for g in 0..8 {
        let set = format!("gpu-{g}");
        sets.push(CounterSet { name: set.clone(), counters: counters(&[("slices", 8), ("memory", 80 << 30)]) });
        devices.push(device(format!("gpu-{g}"), "gpu", "", &set, 8, 80));
        for p in 0..7 {
            devices.push(device(format!("gpu-{g}-mig-1g-{p}"), "mig", "1g.10gb", &set, 1, 10));
        }
        for p in 0..3 {
            devices.push(device(format!("gpu-{g}-mig-2g-{p}"), "mig", "2g.20gb", &set, 2, 20));
        }
        for p in 0..2 {
            devices.push(device(format!("gpu-{g}-mig-3g-{p}"), "mig", "3g.40gb", &set, 4, 40));
        }
    }
    let spec = |devices: Option<Vec<Device>>, shared: Option<Vec<CounterSet>>| ResourceSliceSpec {
        driver: DRIVER.into(),
        node_name: Some(node.into()),
        pool: ResourcePool { name: node.into(), generation: 1, resource_slice_count: 3 },
        devices,
        shared_counters: shared,
        ..Default::default()
    };
    let meta = |i: usize| ObjectMeta { name: Some(format!("{node}-{i}")), ..Default::default() };
    let second = devices.split_off(64);
    vec![
        ResourceSlice { metadata: meta(0), spec: spec(None, Some(sets)) },
        ResourceSlice { metadata: meta(1), spec: spec(Some(devices), None) },
        ResourceSlice { metadata: meta(2), spec: spec(Some(second), None) },
    ]
}

fn selector(e: &str) -> DeviceSelector {
    DeviceSelector { cel: Some(CELDeviceSelector { expression: e.into() }) }
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let nodes = args.first().copied().unwrap_or(1000);
    let claims = args.get(1).copied().unwrap_or(10_000);
    let slices: Vec<ResourceSlice> = (0..nodes).flat_map(|n| node_slices(&format!("node-{n:05}"))).collect();
    let class = DeviceClass {
        metadata: ObjectMeta { name: Some(DRIVER.into()), ..Default::default() },
        spec: Some(DeviceClassSpec {
            selectors: Some(vec![selector(r#"device.driver == "gpu.nvidia.com""#)]),
            ..Default::default()
        }),
    };
    let claim = |i: usize| ResourceClaim {
        metadata: ObjectMeta { name: Some(format!("c-{i}")), namespace: Some("default".into()), ..Default::default() },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: "gpu".into(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: DRIVER.into(),
                        selectors: Some(vec![selector(r#"device.attributes["gpu.nvidia.com"].type == "gpu""#)]),
                        ..Default::default()
                    }),
                    first_available: None,
                }]),
                ..Default::default()
            }),
        }),
        status: None,
    };
    let t0 = Instant::now();
    let mut a = Allocator::new(&slices, &[class], &[]).with_share_ids(Box::new(SequentialShareIds::new()));
    let built = t0.elapsed();
    let all: Vec<ResourceClaim> = (0..claims).map(claim).collect();
    let t1 = Instant::now();
    let (mut placed, mut failed) = (0, 0);
    let mut first_claim = None;
    for c in &all {
        match a.place(&[c]) {
            Ok(_) => placed += 1,
            Err(_) => failed += 1,
        }
        if first_claim.is_none() {
            first_claim = Some(t1.elapsed());
        }
    }
    let secs = t1.elapsed().as_secs_f64();
    println!(
        "{nodes} nodes, {} devices: build {:.3}s, first claim {:.3}s; {claims} claims ({placed} placed, {failed} did not fit) in {secs:.3}s = {:.0} claims/s",
        nodes * 104,
        built.as_secs_f64(),
        first_claim.unwrap_or_default().as_secs_f64(),
        claims as f64 / secs
    );
}
