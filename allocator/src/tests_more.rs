//! More allocator cases: multi-host and network-attached pools, several
//! drivers, shareable devices across requests and cycles, binding
//! conditions, per-device node selection in results.

use k8s_openapi::api::resource::v1::{CapacityRequirements, DeviceRequestAllocationResult, ResourceClaimStatus};

use super::test_support::*;
use super::tests_core::{allocator, fatal, one, pairs, picks, unsatisfiable};
use super::*;

fn gpu(name: &str) -> k8s_openapi::api::resource::v1::Device {
    device(name).string("type", "gpu")
}

fn shared_result(device: &str, consumed: &[(&str, &str)]) -> AllocationResult {
    allocation(vec![DeviceRequestAllocationResult {
        share_id: Some("00000000-0000-4000-8000-0000000000ff".into()),
        consumed_capacity: Some(consumed.iter().map(|(k, v)| (k.to_string(), q(v))).collect()),
        ..device_result(device)
    }])
}

#[test]
fn a_stale_slice_of_a_multi_host_pool_is_not_used() {
    // Generation 2 of the pool lives on n2 only; n1 still has a generation-1
    // slice, which the driver is replacing.
    let slices =
        [slice("s1", "n1", "rack", 1, 2, vec![gpu("gpu-1")]), slice("s2", "n2", "rack", 2, 2, vec![gpu("gpu-2")])];
    let mut a = allocator(&slices, &[gpu_class()]);
    let e = unsatisfiable(one(&mut a, "n1", &claim("c", vec![request("r", "gpu", 1)])));
    assert_eq!(e.requests[0].visible, 0);
    let e = unsatisfiable(one(&mut a, "n2", &claim("c", vec![request("r", "gpu", 1)])));
    assert!(e.to_string().contains("incomplete, 1 of 2 slices"), "{e}");
}

#[test]
fn local_and_network_attached_devices_in_one_claim() {
    let mut fabric = slice("fabric", "", "fabric", 1, 1, vec![device("nic-0").string("type", "nic")]);
    fabric.spec.node_name = None;
    fabric.spec.node_selector = Some(label_selector("zone", &["a"]));
    let nodes = [node("n1", &[("zone", "a")])];
    let gpus = class("gpus", &[r#"device.attributes["gpu.nvidia.com"].type == "gpu""#]);
    let nics = class("nics", &[r#"device.attributes["gpu.nvidia.com"].type == "nic""#]);
    let mut a = Allocator::new(&[fabric, node_slice("n1", vec![gpu("gpu-0")])], &[gpus, nics], &nodes);
    let r = one(&mut a, "n1", &claim("c", vec![request("nic", "nics", 1), request("gpu", "gpus", 1)])).unwrap();
    assert_eq!(picks(&r), pairs(&[("nic", "nic-0"), ("gpu", "gpu-0")]));
    let fields = r.node_selector.unwrap().node_selector_terms[0].match_fields.clone().unwrap();
    assert_eq!(fields[0].values.as_deref().unwrap(), ["n1"], "the local GPU pins the claim to its node");
    let only_nic = one(&mut a, "n1", &claim("c", vec![request("nic", "nics", 1)])).unwrap();
    let exprs = only_nic.node_selector.unwrap().node_selector_terms[0].match_expressions.clone().unwrap();
    assert_eq!(exprs[0].key, "zone", "a network device carries its slice's selector");
}

#[test]
fn classes_pick_their_driver() {
    let mut other = node_slice("n1", vec![device("fpga-0")]);
    other.spec.driver = "fpga.example.com".into();
    other.spec.pool.name = "n1-fpga".into();
    let fpga = class("fpga", &[r#"device.driver == "fpga.example.com""#]);
    let mut a = allocator(&[other, slice("g", "n1", "n1", 1, 1, vec![gpu("gpu-0")])], &[gpu_class(), fpga]);
    let r = one(&mut a, "n1", &claim("c", vec![request("f", "fpga", 1), request("g", "gpu", 1)])).unwrap();
    let drivers: Vec<String> =
        r.devices.unwrap().results.unwrap().into_iter().map(|x| format!("{}/{}", x.driver, x.device)).collect();
    assert_eq!(drivers, ["fpga.example.com/fpga-0", "gpu.nvidia.com/gpu-0"]);
}

#[test]
fn a_class_can_exclude_shareable_devices() {
    let devices = vec![gpu("gpu-0").shareable(), gpu("gpu-1")];
    let dedicated = class("dedicated", &["device.allowMultipleAllocations == false"]);
    let mut a = allocator(&[node_slice("n1", devices)], &[dedicated]);
    assert_eq!(
        picks(&one(&mut a, "n1", &claim("c", vec![request("r", "dedicated", 1)])).unwrap()),
        pairs(&[("r", "gpu-1")])
    );
}

#[test]
fn one_shareable_device_serves_two_requests_with_two_share_ids() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0").shareable().cap("memory", "40Gi")])], &[gpu_class()]);
    let mut half = exact("gpu", 1);
    half.capacity = Some(CapacityRequirements { requests: Some([("memory".to_string(), q("20Gi"))].into()) });
    let c = claim("c", vec![request_with("a", half.clone()), request_with("b", half)]);
    let r = one(&mut a, "n1", &c).unwrap();
    let results = r.devices.unwrap().results.unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!((results[0].device.as_str(), results[1].device.as_str()), ("gpu-0", "gpu-0"));
    assert_ne!(results[0].share_id, results[1].share_id);
}

#[test]
fn capacity_with_a_first_available_subrequest() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0").shareable().cap("memory", "40Gi")])], &[gpu_class()]);
    let mut big = sub("big", "gpu", 1, &[]);
    big.capacity = Some(CapacityRequirements { requests: Some([("memory".to_string(), q("60Gi"))].into()) });
    let mut small = sub("small", "gpu", 1, &[]);
    small.capacity = Some(CapacityRequirements { requests: Some([("memory".to_string(), q("30Gi"))].into()) });
    let r = one(&mut a, "n1", &claim("c", vec![first_available("x", vec![big, small])])).unwrap();
    let res = &r.devices.unwrap().results.unwrap()[0];
    assert_eq!(res.request, "x/small");
    assert_eq!(res.consumed_capacity.as_ref().unwrap()["memory"].0, "30Gi");
}

#[test]
fn shared_counters_of_a_shareable_device_in_use_block_its_sibling() {
    let set = counter_set("gpu-0", &[("engines", "1")]);
    let devices = vec![
        device("share-a").string("mode", "a").shareable().cap("memory", "10Gi").consumes("gpu-0", &[("engines", "1")]),
        device("share-b").string("mode", "b").shareable().cap("memory", "10Gi").consumes("gpu-0", &[("engines", "1")]),
    ];
    let slices = [counter_slice("c", "n1", "n1", 2, vec![set]), slice("d", "n1", "n1", 1, 2, devices)];
    let mut a = allocator(&slices, &[gpu_class()]);
    let mut held = claim("held", vec![]);
    held.status = Some(ResourceClaimStatus {
        allocation: Some(shared_result("share-a", &[("memory", "1Gi")])),
        ..Default::default()
    });
    a.record_allocated(&held).unwrap();
    let b = claim(
        "b",
        vec![with_selectors(request("r", "gpu", 1), &[r#"device.attributes["gpu.nvidia.com"].mode == "b""#])],
    );
    let e = unsatisfiable(one(&mut a, "n1", &b));
    assert_eq!(e.requests[0].counters_exhausted, 1, "{e}");
    // share-a itself still has capacity and already pays its counters.
    let mut x = exact("gpu", 1);
    x.capacity = Some(CapacityRequirements { requests: Some([("memory".to_string(), q("9Gi"))].into()) });
    let more = claim(
        "more",
        vec![with_selectors(request_with("r", x), &[r#"device.attributes["gpu.nvidia.com"].mode == "a""#])],
    );
    assert_eq!(picks(&one(&mut a, "n1", &more).unwrap()), pairs(&[("r", "share-a")]));
}

#[test]
fn admin_access_takes_all_devices_even_when_busy() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0"), gpu("gpu-1")])], &[gpu_class()]);
    a.place(&[&claim("user", vec![request("r", "gpu", 1)])]).unwrap();
    let mut all = all_request("r", "gpu");
    if let Some(e) = all.exactly.as_mut() {
        e.admin_access = Some(true);
    }
    let r = one(&mut a, "n1", &claim("admin", vec![all])).unwrap();
    assert_eq!(picks(&r), pairs(&[("r", "gpu-0"), ("r", "gpu-1")]));
}

#[test]
fn combinations_within_a_request_are_searched() {
    // Pairs in search order: (0,1) (0,2) (0,3) (1,2) ...; only (1,3) share a group.
    let devices =
        vec![gpu("gpu-0").int("g", 0), gpu("gpu-1").int("g", 1), gpu("gpu-2").int("g", 2), gpu("gpu-3").int("g", 1)];
    let mut a = allocator(&[node_slice("n1", devices)], &[gpu_class()]);
    let c = claim_with("c", vec![request("r", "gpu", 2)], vec![match_attr("gpu.nvidia.com/g", &["r"])]);
    assert_eq!(picks(&one(&mut a, "n1", &c).unwrap()), pairs(&[("r", "gpu-1"), ("r", "gpu-3")]));
}

#[test]
fn pools_with_binding_conditions_come_last_and_conditions_are_copied() {
    let mut pending = gpu("gpu-0");
    pending.binding_conditions = Some(vec!["Attached".into()]);
    pending.binding_failure_conditions = Some(vec!["AttachFailed".into()]);
    let slices =
        [slice("a", "n1", "a-pool", 1, 1, vec![pending]), slice("b", "n1", "b-pool", 1, 1, vec![gpu("gpu-0")])];
    let mut a = allocator(&slices, &[gpu_class()]);
    let r = one(&mut a, "n1", &claim("c", vec![request("r", "gpu", 2)])).unwrap();
    let results = r.devices.unwrap().results.unwrap();
    let pools: Vec<&str> = results.iter().map(|x| x.pool.as_str()).collect();
    assert_eq!(pools, ["b-pool", "a-pool"]);
    assert_eq!(results[1].binding_conditions.as_deref(), Some(&["Attached".to_string()][..]));
    assert_eq!(results[1].binding_failure_conditions.as_deref(), Some(&["AttachFailed".to_string()][..]));
}

#[test]
fn per_device_node_selection_shapes_the_result_selector() {
    let mut s = slice("rack", "", "rack", 1, 1, vec![]);
    s.spec.node_name = None;
    s.spec.per_device_node_selection = Some(true);
    let mut local = gpu("local");
    local.node_name = Some("n1".into());
    let mut zonal = gpu("zonal");
    zonal.node_selector = Some(label_selector("zone", &["a"]));
    s.spec.devices = Some(vec![zonal, local]);
    let mut a = Allocator::new(&[s], &[gpu_class()], &[node("n1", &[("zone", "a")]), node("n2", &[("zone", "a")])]);
    let r = one(&mut a, "n2", &claim("c", vec![request("r", "gpu", 1)])).unwrap();
    assert_eq!(picks(&r), pairs(&[("r", "zonal")]));
    assert_eq!(r.node_selector.unwrap().node_selector_terms[0].match_expressions.as_ref().unwrap()[0].key, "zone");
    let r = one(&mut a, "n1", &claim("c", vec![request("r", "gpu", 2)])).unwrap();
    assert!(r.node_selector.unwrap().node_selector_terms[0].match_fields.is_some(), "the node-local device pins");
}

#[test]
fn a_bad_node_selector_in_a_slice_is_an_error() {
    let mut s = slice("bad", "", "bad", 1, 1, vec![gpu("gpu-0")]);
    s.spec.node_name = None;
    let mut sel = label_selector("zone", &["a"]);
    sel.node_selector_terms[0].match_expressions.as_mut().unwrap()[0].operator = "Near".into();
    s.spec.node_selector = Some(sel);
    let mut a = Allocator::new(&[s], &[gpu_class()], &[node("n1", &[])]);
    let err = fatal(one(&mut a, "n1", &claim("c", vec![request("r", "gpu", 1)])));
    assert!(err.to_string().contains("unknown operator \"Near\""), "{err}");
}

#[test]
fn commit_checks_its_input_and_records() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0")])], &[gpu_class()]);
    let c = claim("c", vec![request("r", "gpu", 1)]);
    let results = a.allocate("n1", &[&c]).unwrap();
    assert_eq!(a.commit(&[], &results), Err(InputError::ResultCount { claims: 0, results: 1 }));
    a.commit(&[&c], &results).unwrap();
    let e = unsatisfiable(a.allocate("n1", &[&claim("d", vec![request("r", "gpu", 1)])]));
    assert_eq!(e.requests[0].allocated, [OwnerCount { owner: "default/c".into(), devices: 1 }]);
}

#[test]
fn first_available_backtracks_to_a_lower_choice_for_a_later_request() {
    let big = r#"device.attributes["gpu.nvidia.com"].size == "big""#;
    let slices = [
        slice("a", "n1", "p1", 1, 1, vec![gpu("big-0").string("size", "big")]),
        slice("b", "n1", "p2", 1, 1, vec![gpu("small-0").string("size", "small")]),
    ];
    let mut a = allocator(&slices, &[gpu_class()]);
    let c = claim(
        "c",
        vec![
            first_available("x", vec![sub("big", "gpu", 1, &[big]), sub("any", "gpu", 1, &[])]),
            with_selectors(request("y", "gpu", 1), &[big]),
        ],
    );
    assert_eq!(picks(&one(&mut a, "n1", &c).unwrap()), pairs(&[("x/any", "small-0"), ("y", "big-0")]));
}

#[test]
fn shareable_devices_backtrack_on_capacity_and_constraints() {
    let with_memory =
        |name: &str, label: &str, memory: &str| gpu(name).string("label", label).shareable().cap("memory", memory);
    let devices = vec![with_memory("small", "v1", "2Gi"), with_memory("large", "v2", "4Gi")];
    let mut a = allocator(&[node_slice("n1", devices)], &[gpu_class()]);
    let two = || {
        let mut e = exact("gpu", 1);
        e.capacity = Some(CapacityRequirements { requests: Some([("memory".to_string(), q("2Gi"))].into()) });
        e
    };
    let c0 = claim_with(
        "c0",
        vec![request_with("a", two()), request_with("b", two())],
        vec![match_attr("gpu.nvidia.com/label", &[])],
    );
    let c1 = claim("c1", vec![request_with("a", two())]);
    let r = a.allocate("n1", &[&c0, &c1]).unwrap();
    assert_eq!(picks(&r[0]), pairs(&[("a", "large"), ("b", "large")]));
    assert_eq!(picks(&r[1]), pairs(&[("a", "small")]));
}

#[test]
fn an_all_request_and_an_exact_one_cannot_share_the_only_device() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0")])], &[gpu_class()]);
    let exact_one = claim("c1", vec![request("r", "gpu", 1)]);
    let all = claim("c0", vec![all_request("r", "gpu")]);
    let e = unsatisfiable(a.allocate("n1", &[&exact_one, &all]));
    assert_eq!(e.claim, "default/c0");
}
