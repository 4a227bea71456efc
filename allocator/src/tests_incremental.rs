//! The fleet kept up to date one object at a time: the same answers as a
//! fleet built at once, slice updates and deletions, releases, and
//! allocations that outlive a slice update or arrive before their slice.

use k8s_openapi::api::resource::v1::{ResourceClaimStatus, ResourceSlice};

use super::test_support::*;
use super::tests_core::{allocator, picks, unsatisfiable};
use super::*;

fn gpu(name: &str, product: &str) -> k8s_openapi::api::resource::v1::Device {
    device(name).string("type", "gpu").string("productName", product)
}

fn with_allocation(mut c: ResourceClaim, a: AllocationResult) -> ResourceClaim {
    c.status = Some(ResourceClaimStatus { allocation: Some(a), ..Default::default() });
    c
}

fn fleet() -> Vec<ResourceSlice> {
    let mut out = Vec::new();
    for n in ["n3", "n1", "n2"] {
        out.push(node_slice(n, vec![gpu("gpu-0", "H100"), gpu("gpu-1", "A100")]));
    }
    // A pool split over two slices, and a stale generation of another.
    out.push(slice("p-b", "n4", "p", 1, 2, vec![gpu("gpu-1", "H100")]));
    out.push(slice("p-a", "n4", "p", 1, 2, vec![gpu("gpu-0", "H100")]));
    out.push(slice("old", "n5", "q", 1, 1, vec![gpu("gpu-9", "H100")]));
    out.push(slice("new", "n5", "q", 2, 1, vec![gpu("gpu-0", "A100")]));
    out
}

fn h100(name: &str) -> ResourceClaim {
    claim(
        name,
        vec![with_selectors(request("r", "gpu", 1), &[r#"device.attributes["gpu.nvidia.com"].productName == "H100""#])],
    )
}

fn placements(a: &mut Allocator, claims: usize) -> Vec<String> {
    (0..claims)
        .map(|i| match a.place(&[&h100(&format!("c{i}"))]) {
            Ok(p) => format!("{} {:?}", p.node, picks(&p.allocations[0])),
            Err(e) => format!("error: {e}"),
        })
        .collect()
}

#[test]
fn built_one_slice_at_a_time_it_answers_as_built_at_once() {
    let slices = fleet();
    let mut at_once = allocator(&slices, &[gpu_class()]);
    for order in [vec![0, 1, 2, 3, 4, 5, 6], vec![6, 5, 4, 3, 2, 1, 0], vec![3, 0, 6, 1, 5, 2, 4]] {
        let mut built = allocator(&[], &[gpu_class()]);
        for i in order {
            built.apply_slice(&slices[i]);
        }
        assert_eq!(built.nodes(), at_once.nodes());
        assert_eq!(built.stats(), at_once.stats());
        let mut fresh = allocator(&slices, &[gpu_class()]);
        assert_eq!(placements(&mut built, 7), placements(&mut fresh, 7));
    }
    assert_eq!(at_once.stats(), FleetStats { nodes: 5, slices: 7, devices: 9 });
    assert_eq!(placements(&mut at_once, 6).len(), 6);
}

#[test]
fn an_updated_slice_changes_what_selectors_see() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0", "A100")])], &[gpu_class()]);
    unsatisfiable(a.allocate_first_fit(None, &[&h100("c")]));
    a.apply_slice(&node_slice("n1", vec![gpu("gpu-0", "H100")]));
    assert_eq!(a.place(&[&h100("c")]).unwrap().node, "n1", "cached verdicts of the old device are not reused");
}

#[test]
fn a_deleted_slice_takes_its_devices_and_node_away() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0", "H100")])], &[gpu_class()]);
    a.remove_slice("n1-slice");
    assert_eq!(a.stats(), FleetStats { nodes: 0, slices: 0, devices: 0 });
    unsatisfiable(a.allocate_first_fit(None, &[&h100("c")]));
    a.remove_slice("no-such-slice");
}

#[test]
fn a_released_claim_gives_its_device_back() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0", "H100")])], &[gpu_class()]);
    let first = a.place(&[&h100("first")]).unwrap();
    unsatisfiable(a.allocate_first_fit(None, &[&h100("second")]));
    a.release(&with_allocation(h100("first"), first.allocations[0].clone())).unwrap();
    assert_eq!(a.place(&[&h100("second")]).unwrap().node, "n1");
    // Releasing a claim that does not hold the device changes nothing.
    a.release(&with_allocation(h100("first"), first.allocations[0].clone())).unwrap();
    unsatisfiable(a.allocate_first_fit(None, &[&h100("third")]));
}

#[test]
fn counters_in_use_come_back_on_release() {
    let gpu_set = counter_set("gpu-0", &[("memory", "80Gi")]);
    let slices = vec![
        counter_slice("counters", "n1", "n1", 2, vec![gpu_set]),
        slice(
            "devices",
            "n1",
            "n1",
            1,
            2,
            vec![
                device("whole").string("type", "gpu").consumes("gpu-0", &[("memory", "80Gi")]),
                device("half").string("type", "gpu").consumes("gpu-0", &[("memory", "40Gi")]),
            ],
        ),
    ];
    let mut a = allocator(&slices, &[gpu_class()]);
    let whole = claim("whole", vec![request("r", "gpu", 1)]);
    let w = a.place(&[&whole]).unwrap();
    assert_eq!(picks(&w.allocations[0]), pairs_of("r", "whole"));
    let half = claim("half", vec![request("r", "gpu", 1)]);
    let e = unsatisfiable(a.allocate_first_fit(None, &[&half]));
    assert!(e.to_string().contains("counter"), "{e}");
    a.release(&with_allocation(whole, w.allocations[0].clone())).unwrap();
    assert_eq!(picks(&a.place(&[&half]).unwrap().allocations[0]), pairs_of("r", "whole"), "both fit again");
}

fn pairs_of(request: &str, device: &str) -> Vec<(String, String)> {
    vec![(request.to_string(), device.to_string())]
}

#[test]
fn an_allocation_survives_an_update_of_its_slice() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0", "H100"), gpu("gpu-1", "H100")])], &[gpu_class()]);
    let first = a.place(&[&h100("first")]).unwrap();
    assert_eq!(picks(&first.allocations[0]), pairs_of("r", "gpu-0"));
    // The driver republishes the node with gpu-0 changed: still taken.
    a.apply_slice(&node_slice("n1", vec![gpu("gpu-0", "H100").int("numa", 1), gpu("gpu-1", "H100")]));
    assert_eq!(picks(&a.place(&[&h100("second")]).unwrap().allocations[0]), pairs_of("r", "gpu-1"));
    // gpu-0 leaves and comes back: still taken by the first claim.
    a.apply_slice(&node_slice("n1", vec![gpu("gpu-1", "H100")]));
    a.apply_slice(&node_slice("n1", vec![gpu("gpu-0", "H100"), gpu("gpu-1", "H100")]));
    let e = unsatisfiable(a.allocate_first_fit(None, &[&h100("third")]));
    assert!(e.to_string().contains("default/first"), "{e}");
}

#[test]
fn an_allocation_seen_before_its_slice_counts_when_the_slice_arrives() {
    let mut a = allocator(&[], &[gpu_class()]);
    let result = allocation(vec![device_result("gpu-0")]);
    a.record_allocated(&with_allocation(h100("early"), result)).unwrap();
    a.apply_slice(&node_slice("n1", vec![gpu("gpu-0", "H100")]));
    let e = unsatisfiable(a.allocate_first_fit(None, &[&h100("late")]));
    assert!(e.to_string().contains("default/early"), "{e}");
}

#[test]
fn node_labels_can_change() {
    let mut shared = slice("net", "", "fabric", 1, 1, vec![gpu("nic-0", "H100")]);
    shared.spec.node_name = None;
    shared.spec.node_selector = Some(label_selector("zone", &["a"]));
    let mut a = allocator(&[shared], &[gpu_class()]);
    a.set_node(&node("n1", &[("zone", "b")]));
    unsatisfiable(a.allocate_first_fit(None, &[&h100("c")]));
    a.set_node(&node("n1", &[("zone", "a")]));
    assert_eq!(a.place(&[&h100("c")]).unwrap().node, "n1");
}

#[test]
fn many_updates_reuse_device_numbers_without_losing_allocations() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0", "H100"), gpu("gpu-1", "H100")])], &[gpu_class()]);
    a.place(&[&h100("first")]).unwrap();
    let devices: Vec<_> = (0..3000).map(|i| gpu(&format!("gpu-{i}"), "H100")).collect();
    // Retired numbers are reused by the next update.
    for _ in 0..4 {
        a.apply_slice(&node_slice("n1", devices.clone()));
    }
    assert_eq!(a.stats().devices, 3000);
    assert!(a.fleet.device_numbers() <= 6000, "numbers are reused, not piled up");
    let p = a.place(&[&h100("second")]).unwrap();
    assert_eq!(picks(&p.allocations[0]), pairs_of("r", "gpu-1"), "gpu-0 is still taken");
}

#[test]
fn released_signatures_are_reused_with_fresh_answers() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0", "A100")])], &[gpu_class()]);
    let wants = |product: &str| {
        let expression = format!(r#"device.attributes["gpu.nvidia.com"].productName == "{product}""#);
        claim("c", vec![with_selectors(request("r", "gpu", 1), &[expression.as_str()])])
    };
    assert!(a.allocate("n1", &[&wants("A100")]).is_ok());
    // A100 → H100 → B200: the A100 signature's number is free by the third
    // version and reused; nothing cached for A100 may leak into B200.
    a.apply_slice(&node_slice("n1", vec![gpu("gpu-0", "H100")]));
    assert!(a.allocate("n1", &[&wants("H100")]).is_ok());
    a.apply_slice(&node_slice("n1", vec![gpu("gpu-0", "B200")]));
    unsatisfiable(a.allocate("n1", &[&wants("A100")]));
    unsatisfiable(a.allocate("n1", &[&wants("H100")]));
    assert!(a.allocate("n1", &[&wants("B200")]).is_ok());
    assert!(a.fleet.signature_count() <= 2, "numbers are reused, not piled up");
}

#[test]
fn an_in_place_update_keeps_numbers_and_sums_changed_draws_again() {
    let gpu_set = counter_set("gpu-0", &[("memory", "80Gi")]);
    let devices = |a_draws: &str| {
        slice(
            "devices",
            "n1",
            "n1",
            1,
            2,
            vec![
                device("a").string("type", "gpu").consumes("gpu-0", &[("memory", a_draws)]),
                device("b").string("type", "gpu").consumes("gpu-0", &[("memory", "40Gi")]),
            ],
        )
    };
    let counters = counter_slice("counters", "n1", "n1", 2, vec![gpu_set]);
    let mut a = allocator(&[counters, devices("40Gi")], &[gpu_class()]);
    let first = claim("first", vec![request("r", "gpu", 1)]);
    assert_eq!(picks(&a.place(&[&first]).unwrap().allocations[0]), pairs_of("r", "a"));
    let numbers = a.fleet.device_numbers();
    // The same devices, `a` now drawing the whole GPU: b no longer fits.
    a.apply_slice(&devices("80Gi"));
    assert_eq!(a.fleet.device_numbers(), numbers, "the same devices keep their numbers");
    let second = claim("second", vec![request("r", "gpu", 1)]);
    let e = unsatisfiable(a.allocate_first_fit(None, &[&second]));
    assert!(e.to_string().contains("counter"), "{e}");
    // Back to 40Gi: b fits again.
    a.apply_slice(&devices("40Gi"));
    assert_eq!(picks(&a.place(&[&second]).unwrap().allocations[0]), pairs_of("r", "b"));
}

#[test]
fn an_in_place_update_with_a_bad_draw_makes_the_pool_invalid() {
    let counters = counter_slice("counters", "n1", "n1", 2, vec![counter_set("gpu-0", &[("memory", "80Gi")])]);
    let devices = |set: &str| {
        slice("devices", "n1", "n1", 1, 2, vec![device("a").string("type", "gpu").consumes(set, &[("memory", "40Gi")])])
    };
    let mut a = allocator(&[counters, devices("gpu-0")], &[gpu_class()]);
    let c = claim("c", vec![request("r", "gpu", 1)]);
    assert!(a.allocate("n1", &[&c]).is_ok());
    a.apply_slice(&devices("gpu-9"));
    let e = unsatisfiable(a.allocate_first_fit(None, &[&c]));
    assert!(e.to_string().contains("gpu-9"), "{e}");
    a.apply_slice(&devices("gpu-0"));
    assert!(a.allocate("n1", &[&c]).is_ok(), "valid again");
}
