//! Allocator cases: in-use devices and admin access, taints, partitionable
//! devices, consumable capacity, config, CEL errors, node selection, first
//! fit and caching.

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, CapacityRequirements, DeviceClaimConfiguration,
    DeviceClassConfiguration, DeviceToleration, OpaqueDeviceConfiguration, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

use super::test_support::*;
use super::tests_core::{GPU, allocator, fatal, one, pairs, picks, unsatisfiable};
use super::*;

fn gpu(name: &str) -> k8s_openapi::api::resource::v1::Device {
    device(name).string("type", "gpu")
}

fn with_allocation(mut c: ResourceClaim, a: AllocationResult) -> ResourceClaim {
    c.status = Some(ResourceClaimStatus { allocation: Some(a), ..Default::default() });
    c
}

#[test]
fn allocated_devices_are_excluded_and_their_owner_named() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0"), gpu("gpu-1")])], &[gpu_class()]);
    let train = claim("train-0", vec![request("r", "gpu", 2)]);
    let result = one(&mut a, "n1", &train).unwrap();
    // Recorded from status, as a claim read from the cluster would be.
    a.record_allocated(&with_allocation(train, result)).unwrap();
    let e = unsatisfiable(one(&mut a, "n1", &claim("c", vec![with_selectors(request("r", "gpu", 1), &[GPU])])));
    let text = e.to_string();
    assert!(text.contains("selector #0 matches 2; all 2 are allocated to default/train-0; 0 available"), "{text}");
}

#[test]
fn admin_access_uses_busy_devices_and_does_not_make_them_busy() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0")])], &[gpu_class()]);
    a.place(&[&claim("user", vec![request("r", "gpu", 1)])]).unwrap();
    let mut admin = exact("gpu", 1);
    admin.admin_access = Some(true);
    let monitor = claim("monitor", vec![request_with("r", admin)]);
    let placed = a.place(&[&monitor]).unwrap();
    let res = &placed.allocations[0].devices.as_ref().unwrap().results.as_ref().unwrap()[0];
    assert_eq!((res.device.as_str(), res.admin_access), ("gpu-0", Some(true)));
    // Two admin requests of one claim still need two different devices.
    let mut twice = exact("gpu", 2);
    twice.admin_access = Some(true);
    unsatisfiable(one(&mut a, "n1", &claim("m2", vec![request_with("r", twice)])));
}

#[test]
fn taints_block_unless_tolerated_and_tolerations_are_copied() {
    let devices = vec![
        gpu("gpu-0").taint("gpu.nvidia.com/xid", Some("79"), "NoSchedule"),
        gpu("gpu-1").taint("gpu.nvidia.com/gpu-lost", None, "NoExecute"),
        gpu("gpu-2").taint("note", None, "None"),
    ];
    let mut a = allocator(&[node_slice("n1", devices)], &[gpu_class()]);
    assert_eq!(picks(&one(&mut a, "n1", &claim("c", vec![request("r", "gpu", 1)])).unwrap()), pairs(&[("r", "gpu-2")]));
    let e = unsatisfiable(one(&mut a, "n1", &claim("c", vec![request("r", "gpu", 2)])));
    assert_eq!(e.requests[0].tainted.len(), 2);
    assert!(e.to_string().contains("gpu.nvidia.com/n1/gpu-0 (gpu.nvidia.com/xid=79:NoSchedule)"), "{e}");
    let tolerate = DeviceToleration {
        key: Some("gpu.nvidia.com/xid".into()),
        operator: Some("Exists".into()),
        ..Default::default()
    };
    let c = claim("c", vec![with_tolerations(request("r", "gpu", 2), vec![tolerate.clone()])]);
    let r = one(&mut a, "n1", &c).unwrap();
    assert_eq!(picks(&r), pairs(&[("r", "gpu-0"), ("r", "gpu-2")]));
    let res = &r.devices.as_ref().unwrap().results.as_ref().unwrap()[0];
    assert_eq!(res.tolerations.as_deref(), Some(&[tolerate][..]));
}

/// A DeviceTaintRule on device `device` of pool n1, its taint's value `name`.
fn taint_rule(name: &str, device: &str) -> super::TaintRule {
    let api: k8s_openapi::api::resource::v1::DeviceTaintRule = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"deviceSelector": {"driver": DRIVER, "pool": "n1", "device": device},
                 "taint": {"key": "example.com/maintenance", "value": name, "effect": "NoSchedule"}}
    }))
    .unwrap();
    super::TaintRule::from_api(&api).unwrap()
}

#[test]
fn device_taint_rules_taint_the_devices_they_name_whenever_they_come() {
    let rule = taint_rule;
    let mut builder = super::Allocator::builder();
    builder.add_taint_rule(rule("before", "gpu-0"));
    builder.add_slice(&node_slice("n1", vec![gpu("gpu-0"), gpu("gpu-1"), gpu("gpu-2")]));
    builder.add_taint_rule(rule("after", "gpu-1"));
    let mut a = builder.build(&[gpu_class()]);
    assert_eq!(picks(&one(&mut a, "n1", &claim("c", vec![request("r", "gpu", 1)])).unwrap()), pairs(&[("r", "gpu-2")]));
    let e = unsatisfiable(one(&mut a, "n1", &claim("c", vec![request("r", "gpu", 2)])));
    assert_eq!(e.requests[0].tainted.len(), 2, "{e}");
    assert!(e.to_string().contains("example.com/maintenance=after:NoSchedule"), "{e}");
}

/// Rules set on a live allocator (as a watch delivers them) taint what
/// they name, slices applied afterwards too, and their removal gives the
/// devices back with the slice's own taints kept.
#[test]
fn live_taint_rules_come_and_go_and_the_slices_own_taints_stay() {
    let own = gpu("gpu-2").taint("gpu.nvidia.com/xid", Some("79"), "NoSchedule");
    let slice = || node_slice("n1", vec![gpu("gpu-0"), gpu("gpu-1"), own.clone()]);
    let mut a = allocator(&[slice()], &[gpu_class()]);
    let two = claim("c", vec![request("r", "gpu", 2)]);
    assert_eq!(picks(&one(&mut a, "n1", &two).unwrap()), pairs(&[("r", "gpu-0"), ("r", "gpu-1")]));
    a.set_taint_rules(vec![taint_rule("drain", "gpu-0")]);
    let e = unsatisfiable(one(&mut a, "n1", &two));
    assert!(e.to_string().contains("example.com/maintenance=drain:NoSchedule"), "{e}");
    // The slice rewritten (a new generation): the rule still holds.
    let mut again = slice();
    again.spec.pool.generation += 1;
    a.apply_slice(&again);
    assert!(unsatisfiable(one(&mut a, "n1", &two)).to_string().contains("drain"));
    a.set_taint_rules(Vec::new());
    assert_eq!(picks(&one(&mut a, "n1", &two).unwrap()), pairs(&[("r", "gpu-0"), ("r", "gpu-1")]));
    let three = unsatisfiable(one(&mut a, "n1", &claim("c", vec![request("r", "gpu", 3)])));
    assert!(three.to_string().contains("gpu.nvidia.com/xid=79:NoSchedule"), "the slice's own taint stays: {three}");
}

fn partitioned_gpu() -> Vec<ResourceSlice> {
    let set = counter_set("gpu-0", &[("memory", "80Gi"), ("slices", "8")]);
    let devices = vec![
        gpu("gpu-0").consumes("gpu-0", &[("memory", "80Gi"), ("slices", "8")]),
        device("gpu-0-mig-0").string("type", "mig").consumes("gpu-0", &[("memory", "40Gi"), ("slices", "4")]),
        device("gpu-0-mig-1").string("type", "mig").consumes("gpu-0", &[("memory", "40Gi"), ("slices", "4")]),
    ];
    vec![counter_slice("n1-counters", "n1", "n1", 2, vec![set]), slice("n1-devices", "n1", "n1", 1, 2, devices)]
}

#[test]
fn shared_counters_keep_partitions_and_the_whole_gpu_apart() {
    let mut a = allocator(&partitioned_gpu(), &[gpu_class()]);
    let mig = r#"device.attributes["gpu.nvidia.com"].type == "mig""#;
    let two_migs = claim("migs", vec![with_selectors(request("r", "gpu", 2), &[mig])]);
    assert_eq!(picks(&one(&mut a, "n1", &two_migs).unwrap()), pairs(&[("r", "gpu-0-mig-0"), ("r", "gpu-0-mig-1")]));
    // A whole GPU and a partition of it cannot go together.
    unsatisfiable(one(
        &mut a,
        "n1",
        &claim("both", vec![with_selectors(request("g", "gpu", 1), &[GPU]), request("any", "gpu", 1)]),
    ));
    a.place(&[&claim("whole", vec![with_selectors(request("g", "gpu", 1), &[GPU])])]).unwrap();
    let e = unsatisfiable(one(&mut a, "n1", &claim("m", vec![with_selectors(request("r", "gpu", 1), &[mig])])));
    assert_eq!(e.requests[0].counters_exhausted, 2, "{e}");
}

fn shareable_gpu(policy: Option<CapacityRequestPolicy>) -> Vec<ResourceSlice> {
    let mut d = gpu("gpu-0").shareable().cap("memory", "40Gi");
    if let Some(c) = d.capacity.as_mut().and_then(|c| c.get_mut("memory")) {
        c.request_policy = policy;
    }
    vec![node_slice("n1", vec![d])]
}

fn capacity_claim(name: &str, memory: &str) -> ResourceClaim {
    let mut e = exact("gpu", 1);
    e.capacity = Some(CapacityRequirements { requests: Some([("memory".to_string(), q(memory))].into()) });
    claim(name, vec![request_with("r", e)])
}

#[test]
fn consumable_capacity_shares_a_device_with_share_ids() {
    let mut a = allocator(&shareable_gpu(None), &[gpu_class()]);
    for (i, name) in ["a", "b"].iter().enumerate() {
        let p = a.place(&[&capacity_claim(name, "20Gi")]).unwrap();
        let res = &p.allocations[0].devices.as_ref().unwrap().results.as_ref().unwrap()[0];
        assert_eq!(res.share_id.as_deref(), Some(format!("00000000-0000-4000-8000-00000000000{}", i + 1).as_str()));
        assert_eq!(res.consumed_capacity.as_ref().unwrap()["memory"].0, "20Gi");
    }
    let e = unsatisfiable(a.place(&[&capacity_claim("c", "1Gi")]));
    assert_eq!(e.requests[0].capacity_exhausted, 1, "{e}");
    // Without a capacity request a share takes the whole capacity.
    let mut b = allocator(&shareable_gpu(None), &[gpu_class()]);
    b.place(&[&claim("all", vec![request("r", "gpu", 1)])]).unwrap();
    unsatisfiable(b.place(&[&capacity_claim("more", "1Gi")]));
}

#[test]
fn capacity_request_policy_rounds_up_and_rejects() {
    let policy = CapacityRequestPolicy {
        default: Some(q("8Gi")),
        valid_range: Some(k8s_openapi::api::resource::v1::CapacityRequestPolicyRange {
            min: q("8Gi"),
            max: Some(q("24Gi")),
            step: Some(q("8Gi")),
        }),
        valid_values: None,
    };
    let mut a = allocator(&shareable_gpu(Some(policy)), &[gpu_class()]);
    let p = a.place(&[&capacity_claim("a", "9Gi")]).unwrap();
    let res = &p.allocations[0].devices.as_ref().unwrap().results.as_ref().unwrap()[0];
    assert_eq!(res.consumed_capacity.as_ref().unwrap()["memory"].0, "16Gi");
    unsatisfiable(a.place(&[&capacity_claim("big", "25Gi")]));
    let p = a.place(&[&claim("dflt", vec![request("r", "gpu", 1)])]).unwrap();
    let res = &p.allocations[0].devices.as_ref().unwrap().results.as_ref().unwrap()[0];
    assert_eq!(res.consumed_capacity.as_ref().unwrap()["memory"].0, "8Gi", "default applies");
}

#[test]
fn capacity_requests_bound_dedicated_devices_too() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0").cap("memory", "40Gi")])], &[gpu_class()]);
    unsatisfiable(a.place(&[&capacity_claim("big", "80Gi")]));
    let p = a.place(&[&capacity_claim("ok", "40Gi")]).unwrap();
    let res = &p.allocations[0].devices.as_ref().unwrap().results.as_ref().unwrap()[0];
    assert!(res.share_id.is_none() && res.consumed_capacity.is_none());
}

fn opaque(driver: &str, json: serde_json::Value) -> Option<OpaqueDeviceConfiguration> {
    Some(OpaqueDeviceConfiguration { driver: driver.into(), parameters: RawExtension(json) })
}

#[test]
fn class_then_claim_config_is_copied_in_order() {
    let mut with_cfg = gpu_class();
    if let Some(spec) = with_cfg.spec.as_mut() {
        spec.config = Some(vec![DeviceClassConfiguration { opaque: opaque(DRIVER, serde_json::json!({"a": 1})) }]);
    }
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0"), gpu("gpu-1"), gpu("gpu-2")])], &[with_cfg]);
    let mut c = claim("c", vec![request("x", "gpu", 1), request("y", "gpu", 1), request("z", "gpu", 1)]);
    if let Some(d) = c.spec.as_mut().and_then(|s| s.devices.as_mut()) {
        d.config = Some(vec![
            DeviceClaimConfiguration {
                requests: Some(vec!["y".into(), "z".into()]),
                opaque: opaque(DRIVER, serde_json::json!({"b": 2})),
            },
            DeviceClaimConfiguration {
                requests: Some(vec!["nope".into()]),
                opaque: opaque(DRIVER, serde_json::json!({"c": 3})),
            },
            DeviceClaimConfiguration { requests: None, opaque: opaque(DRIVER, serde_json::json!({"d": 4})) },
        ]);
    }
    let r = one(&mut a, "n1", &c).unwrap();
    let cfg = r.devices.as_ref().unwrap().config.as_ref().unwrap();
    let got: Vec<(&str, Vec<String>, String)> = cfg
        .iter()
        .map(|c| {
            (
                c.source.as_str(),
                c.requests.clone().unwrap_or_default(),
                c.opaque.as_ref().unwrap().parameters.0.to_string(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("FromClass", vec!["x".to_string(), "y".into(), "z".into()], r#"{"a":1}"#.to_string()),
            ("FromClaim", vec!["y".into(), "z".into()], r#"{"b":2}"#.into()),
            ("FromClaim", vec![], r#"{"d":4}"#.into()),
        ]
    );
}

#[test]
fn cel_compile_errors_name_the_class_and_selector() {
    let broken = class("broken", &["true", "device.driver =="]);
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0")])], &[broken]);
    let err = fatal(one(&mut a, "n1", &claim("c", vec![request("r", "broken", 1)])));
    assert!(
        matches!(&err, FatalError::CelCompile { source_ref, index: 1, .. } if source_ref == "class broken"),
        "{err}"
    );
    assert!(err.to_string().contains("claim default/c: class broken: selector #1: CEL compile error"), "{err}");
}

#[test]
fn cel_runtime_errors_name_request_selector_and_device() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0").int("cores", 8), gpu("gpu-1")])], &[gpu_class()]);
    let cores = r#"device.attributes["gpu.nvidia.com"].cores == 8"#;
    // gpu-0 matches, so gpu-1 is never evaluated by the search: no error.
    let ok = claim("ok", vec![with_selectors(request("r", "gpu", 1), &[cores])]);
    assert_eq!(picks(&one(&mut a, "n1", &ok).unwrap()), pairs(&[("r", "gpu-0")]));
    let two = claim("two", vec![with_selectors(request("r", "gpu", 2), &[cores])]);
    let err = fatal(one(&mut a, "n1", &two));
    assert!(
        matches!(&err, FatalError::CelRuntime { source_ref, index: 0, device, .. }
            if source_ref == "request r" && device == "gpu.nvidia.com/n1/gpu-1"),
        "{err}"
    );
}

#[test]
fn a_busy_device_is_not_evaluated() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0"), gpu("gpu-1").int("cores", 8)])], &[gpu_class()]);
    let held = with_allocation(claim("held", vec![]), allocation(vec![device_result("gpu-0")]));
    a.record_allocated(&held).unwrap();
    let c = claim(
        "c",
        vec![with_selectors(request("r", "gpu", 1), &[r#"device.attributes["gpu.nvidia.com"].cores == 8"#])],
    );
    assert_eq!(picks(&one(&mut a, "n1", &c).unwrap()), pairs(&[("r", "gpu-1")]));
}

#[test]
fn node_selection_of_shared_slices_and_the_result_selector() {
    let mut zonal = slice("zonal", "", "fabric", 1, 1, vec![device("nic-0")]);
    zonal.spec.node_name = None;
    zonal.spec.node_selector = Some(label_selector("zone", &["a"]));
    let mut global = slice("global", "", "licenses", 1, 1, vec![device("lic-0")]);
    global.spec.node_name = None;
    global.spec.all_nodes = Some(true);
    let nodes = [node("n1", &[("zone", "a")]), node("n2", &[("zone", "b")])];
    let nic = class("nic", &[r#"device.attributes["gpu.nvidia.com"].kind == "nic""#]);
    let mut a = Allocator::new(&[zonal, global], &[gpu_class(), nic], &nodes);
    let r = one(&mut a, "n1", &claim("c", vec![request("r", "gpu", 2)])).unwrap();
    let sel = r.node_selector.unwrap();
    assert_eq!(sel.node_selector_terms[0].match_expressions.as_ref().unwrap()[0].key, "zone");
    let r = one(&mut a, "n2", &claim("c", vec![request("r", "gpu", 1)])).unwrap();
    assert_eq!(picks(&r), pairs(&[("r", "lic-0")]));
    assert!(r.node_selector.is_none(), "allNodes devices are usable everywhere");
}

#[test]
fn first_fit_fills_nodes_in_name_order_and_commits() {
    let slices: Vec<_> = ["n2", "n1", "n3"].iter().map(|n| node_slice(n, vec![gpu("gpu-0"), gpu("gpu-1")])).collect();
    let mut a = allocator(&slices, &[gpu_class()]);
    let nodes: Vec<String> =
        (0..5).map(|i| a.place(&[&claim(&format!("c{i}"), vec![request("r", "gpu", 1)])]).unwrap().node).collect();
    assert_eq!(nodes, ["n1", "n1", "n2", "n2", "n3"]);
    let e = unsatisfiable(a.place(&[&claim("c5", vec![request("r", "gpu", 2)])]));
    assert_eq!(e.nodes_tried, 3);
    assert_eq!(e.claim, "default/c5");
    // A restricted node list.
    let only = vec!["n1".to_string()];
    unsatisfiable(a.allocate_first_fit(Some(&only), &[&claim("x", vec![request("r", "gpu", 1)])]));
}

#[test]
fn steady_state_allocation_does_no_cel_work() {
    // Distinct UUIDs: no two devices share a signature (see the next test).
    let slices: Vec<_> = ["n1", "n2"]
        .iter()
        .map(|n| node_slice(n, (0..4).map(|i| gpu(&format!("gpu-{i}")).string("uuid", &format!("{n}-{i}"))).collect()))
        .collect();
    let mut a = allocator(&slices, &[gpu_class()]);
    let shape = |i: usize| claim(&format!("c{i}"), vec![with_selectors(request("r", "gpu", 1), &[GPU])]);
    a.place(&[&shape(0)]).unwrap();
    let after_first = a.selectors.evaluations;
    for i in 1..8 {
        a.place(&[&shape(i)]).unwrap();
    }
    assert!(after_first > 0);
    // Node n2's devices are evaluated once when first reached, never again.
    assert_eq!(a.selectors.evaluations, after_first * 2);
    unsatisfiable(a.place(&[&shape(9)]));
    assert_eq!(a.selectors.evaluations, after_first * 2);
}

#[test]
fn devices_that_look_alike_to_selectors_are_evaluated_once() {
    // Same driver, attributes and capacities: one evaluation serves all.
    let slices: Vec<_> =
        ["n1", "n2"].iter().map(|n| node_slice(n, (0..4).map(|i| gpu(&format!("gpu-{i}"))).collect())).collect();
    let mut a = allocator(&slices, &[gpu_class()]);
    let shape = |i: usize| claim(&format!("c{i}"), vec![with_selectors(request("r", "gpu", 1), &[GPU])]);
    a.place(&[&shape(0)]).unwrap();
    let after_first = a.selectors.evaluations;
    for i in 1..8 {
        assert_eq!(a.place(&[&shape(i)]).unwrap().node, if i < 4 { "n1" } else { "n2" });
    }
    assert_eq!(a.selectors.evaluations, after_first, "n2's devices share n1's results");
}

#[test]
fn the_claim_that_breaks_a_pod_is_named() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0"), gpu("gpu-1")])], &[gpu_class()]);
    let c0 = claim("c0", vec![request("r", "gpu", 1)]);
    let c1 = claim("c1", vec![request("r", "gpu", 2)]);
    let e = unsatisfiable(a.allocate("n1", &[&c0, &c1]));
    assert_eq!(e.claim, "default/c1");
    assert!(e.to_string().contains("fits on its own, but not on the same node together with default/c0"), "{e}");
}

/// A device of the H100 at `minor` with the attributes NVIDIA's GPU driver
/// publishes for every device of it (as its slice builder writes them for
/// a fake H100).
fn h100_device(name: &str, minor: u32) -> k8s_openapi::api::resource::v1::Device {
    device(name)
        .string("architecture", "Hopper")
        .string("brand", "Nvidia")
        .version("cudaComputeCapability", "9.0.0")
        .version("cudaDriverVersion", "13.0.0")
        .version("driverVersion", "580.82.7")
        .string("productName", "NVIDIA H100 80GB HBM3")
        .int("resource.kubernetes.io/numaNode", 0)
        .string("resource.kubernetes.io/pciBusID", &format!("0000:{:02x}:00.0", 0x18 + minor))
        .string("resource.kubernetes.io/pcieRoot", "pci0000:17")
}

/// The whole H100 at `minor`, as published.
fn published_h100(minor: u32) -> k8s_openapi::api::resource::v1::Device {
    h100_device(&format!("gpu-{minor}"), minor)
        .string("type", "gpu")
        .string("uuid", &format!("GPU-00000000-0000-0000-0000-{minor:012}"))
        .cap("memory", "80Gi")
}

/// A node's one slice, named and pooled as the GPU driver names it.
fn published_slice(node: &str, devices: Vec<k8s_openapi::api::resource::v1::Device>) -> ResourceSlice {
    slice(&format!("{node}-{DRIVER}-0"), node, node, 1, 1, devices)
}

#[test]
fn fleet_of_published_h100s() {
    let slices: Vec<_> =
        ["node-a", "node-b"].iter().map(|n| published_slice(n, (0..8).map(published_h100).collect())).collect();
    let mut a = allocator(&slices, &[gpu_class()]);
    let train = claim("train-0", vec![with_selectors(request("r", "gpu", 8), &[GPU])]);
    assert_eq!(a.place(&[&train]).unwrap().node, "node-a");
    let other = claim("x", vec![with_selectors(request("r", "gpu", 1), &[GPU])]);
    assert_eq!(a.place(&[&other]).unwrap().node, "node-b");
    let e = unsatisfiable(a.allocate("node-a", &[&other]));
    assert!(
        e.to_string().contains(
            "class gpu matches 8 devices of 8 visible; selector #0 matches 8; all 8 are allocated to default/train-0"
        ),
        "{e}"
    );
}

/// A capacity request policy: `default`, then from `min` in `step`s.
fn stepped(default: &str, min: &str, step: &str) -> CapacityRequestPolicy {
    CapacityRequestPolicy {
        default: Some(q(default)),
        valid_range: Some(CapacityRequestPolicyRange { min: q(min), max: None, step: Some(q(step)) }),
        valid_values: None,
    }
}

/// The slices a node with one H100 and one MIG-partitioned H100 publishes
/// with `ConsumableCapacity` and `MpsSupport` on: the whole H100 shareable
/// by memory (whole GiB) and compute (smPercent, none unless asked), and
/// the other's 3g.40gb MIG device, dedicated.
fn fractional_node() -> Vec<ResourceSlice> {
    let mut whole = published_h100(0).shareable().cap("smPercent", "100");
    let caps = whole.capacity.as_mut().unwrap();
    caps.get_mut("memory").unwrap().request_policy = Some(stepped("80Gi", "1Gi", "1Gi"));
    caps.get_mut("smPercent").unwrap().request_policy = Some(stepped("0", "0", "1"));
    let mut mig = h100_device("gpu-1-mig-3g40gb-9-0", 1)
        .string("parentUUID", "GPU-00000000-0000-0000-0000-000000000001")
        .string("profile", "3g.40gb")
        .string("type", "mig")
        .string("uuid", "MIG-00000000-0000-0000-0000-000000000000");
    for (name, value) in [
        ("copyEngines", "1"),
        ("decoders", "1"),
        ("encoders", "0"),
        ("jpegEngines", "0"),
        ("memory", "9984Mi"),
        ("memorySlice0", "1"),
        ("memorySlice1", "1"),
        ("memorySlice2", "1"),
        ("memorySlice3", "1"),
        ("multiprocessors", "16"),
        ("ofaEngines", "0"),
    ] {
        mig = mig.cap(name, value);
    }
    vec![published_slice("n1", vec![whole, mig])]
}

fn share_claim(name: &str, requests: &[(&str, &str)]) -> ResourceClaim {
    let mut e = exact("gpu", 1);
    e.capacity =
        Some(CapacityRequirements { requests: Some(requests.iter().map(|(k, v)| (k.to_string(), q(v))).collect()) });
    claim(name, vec![with_selectors(request_with("r", e), &[GPU])])
}

fn consumed(p: &Placement) -> (String, Vec<(String, String)>) {
    let res = &p.allocations[0].devices.as_ref().unwrap().results.as_ref().unwrap()[0];
    let caps = res.consumed_capacity.as_ref().unwrap().iter().map(|(k, v)| (k.clone(), v.0.clone())).collect();
    (res.device.clone(), caps)
}

fn caps(memory: &str, sm: &str) -> Vec<(String, String)> {
    vec![("memory".into(), memory.into()), ("smPercent".into(), sm.into())]
}

#[test]
fn memory_shares_of_a_published_h100_fill_it_and_the_next_is_refused() {
    let slices = fractional_node();
    let devices = slices[0].spec.devices.as_ref().unwrap();
    let mig = devices.iter().find(|d| d.name.contains("-mig-")).unwrap();
    assert_eq!(mig.allow_multiple_allocations, None, "MIG devices stay dedicated");
    let mut a = allocator(&slices, &[gpu_class()]);
    for name in ["a", "b", "c"] {
        let p = a.place(&[&share_claim(name, &[("memory", "20Gi")])]).unwrap();
        assert_eq!(consumed(&p), ("gpu-0".into(), caps("20Gi", "0")), "{name}: no compute share unless asked");
    }
    let e = unsatisfiable(a.place(&[&share_claim("d", &[("memory", "30Gi")])]));
    let text = e.to_string();
    assert!(
        text.contains(
            "1 device without enough capacity left: gpu.nvidia.com/n1/gpu-0 (memory: 30Gi requested, 20Gi of 80Gi left)"
        ),
        "{text}"
    );
    // What is left still fits a smaller share.
    let p = a.place(&[&share_claim("e", &[("memory", "20Gi")])]).unwrap();
    assert_eq!(consumed(&p).0, "gpu-0");
}

#[test]
fn shares_round_up_to_the_step_and_plain_claims_take_the_whole_gpu() {
    let mut a = allocator(&fractional_node(), &[gpu_class()]);
    let p = a.place(&[&share_claim("odd", &[("memory", "1500Mi"), ("smPercent", "30")])]).unwrap();
    assert_eq!(consumed(&p), ("gpu-0".into(), caps("2Gi", "30")));
    let p = a.place(&[&share_claim("compute", &[("memory", "1Gi"), ("smPercent", "70")])]).unwrap();
    assert_eq!(consumed(&p).1, caps("1Gi", "70"));
    // Without a memory request a share takes the default, all of it.
    let e = unsatisfiable(a.place(&[&share_claim("no-memory", &[])]));
    assert!(
        e.to_string().contains(
            "memory: none requested, so the default took the whole device (80Gi), and 77Gi of 80Gi is left; to share \
             the device, ask for less memory in the request's capacity.requests (e.g. capacity: {requests: {memory: \
             10Gi}})"
        ),
        "{e}"
    );
    let e = unsatisfiable(a.place(&[&share_claim("more", &[("memory", "1Gi"), ("smPercent", "1")])]));
    assert!(e.to_string().contains("smPercent: 1 requested, 0 of 100 left"), "{e}");

    // A claim written for a dedicated GPU consumes the default: all of it.
    let mut b = allocator(&fractional_node(), &[gpu_class()]);
    let p = b.place(&[&claim("plain", vec![with_selectors(request("r", "gpu", 1), &[GPU])])]).unwrap();
    assert_eq!(consumed(&p), ("gpu-0".into(), caps("80Gi", "0")));
    let e = unsatisfiable(b.place(&[&share_claim("share", &[("memory", "1Gi")])]));
    assert!(e.to_string().contains("memory: 1Gi requested, 0 of 80Gi left"), "{e}");
}
