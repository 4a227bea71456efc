//! Counting rules nodes out without a search, and a call's budget turns an
//! exploding search into a clear "not decided".

use super::test_support::*;
use super::tests_core::{allocator, fatal, one, unsatisfiable};
use super::*;

fn gpus(node: &str, n: usize) -> ResourceSlice {
    node_slice(node, (0..n).map(|i| device(&format!("gpu-{i:02}")).string("type", "gpu")).collect())
}

fn one_gpu_requests(n: usize) -> Vec<k8s_openapi::api::resource::v1::DeviceRequest> {
    (0..n).map(|i| request(&format!("r{i}"), "gpu", 1)).collect()
}

/// So few steps that any real search on these nodes would run out.
fn tight() -> Option<SearchBudget> {
    Some(SearchBudget::steps(100))
}

#[test]
fn more_requests_than_a_node_has_devices_fail_without_a_search() {
    let mut a = allocator(&[gpus("n1", 16), gpus("n2", 16)], &[gpu_class()]);
    a.set_search_budget(tight());
    let e = unsatisfiable(a.allocate_first_fit(None, &[&claim("c", one_gpu_requests(17))]));
    assert_eq!(e.nodes_tried, 2);
    assert!(e.to_string().contains("not all together on one node"), "{e}");
    // Sixteen fit, on the first node, one device each in order.
    a.set_search_budget(None);
    let placed = a.allocate_first_fit(None, &[&claim("c", one_gpu_requests(16))]).unwrap();
    assert_eq!(placed.node, "n1");
    let devices: Vec<String> = placed.allocations[0]
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap()
        .iter()
        .map(|r| r.device.clone())
        .collect();
    let wanted: Vec<String> = (0..16).map(|i| format!("gpu-{i:02}")).collect();
    assert_eq!(devices, wanted);
}

#[test]
fn devices_in_use_taints_and_pods_count_too() {
    let mut a = allocator(&[gpus("n1", 4)], &[gpu_class()]);
    a.place(&[&claim("taken", vec![request("r", "gpu", 2)])]).unwrap();
    a.set_search_budget(tight());
    // Three wanted by one request, two free.
    unsatisfiable(one(&mut a, "n1", &claim("c", vec![request("r", "gpu", 3)])));
    // Two claims of a pod, three devices together, two free.
    let (x, y) = (claim("x", vec![request("r", "gpu", 1)]), claim("y", vec![request("r", "gpu", 2)]));
    unsatisfiable(a.allocate("n1", &[&x, &y]));
    // A tainted device is not usable without a toleration.
    let tainted = node_slice(
        "n2",
        vec![
            device("gpu-0").string("type", "gpu"),
            device("gpu-1").string("type", "gpu").taint("broken", None, "NoSchedule"),
        ],
    );
    let mut a = allocator(&[tainted], &[gpu_class()]);
    a.set_search_budget(tight());
    unsatisfiable(one(&mut a, "n2", &claim("c", one_gpu_requests(2))));
}

#[test]
fn a_selector_error_is_still_reported_when_counting_rules_the_node_out() {
    let mut a = allocator(&[gpus("n1", 2)], &[gpu_class()]);
    let broken = with_selectors(request("r0", "gpu", 1), &[r#"device.attributes["gpu.nvidia.com"].nope == "x""#]);
    let mut requests = one_gpu_requests(3);
    requests[0] = broken;
    let e = fatal(one(&mut a, "n1", &claim("c", requests)));
    assert!(matches!(e, FatalError::CelRuntime { .. }), "{e}");
}

#[test]
fn an_exploding_search_is_undecided_within_its_budget() {
    // Fifteen GPUs of one kind and one of another: sixteen requests that
    // must match on the kind fail only at the last pick, after trying every
    // order of the first fifteen.
    let mut devices: Vec<_> = (0..15).map(|i| device(&format!("gpu-{i:02}")).string("type", "gpu")).collect();
    devices.push(device("gpu-15").string("type", "gpu").string("kind", "b"));
    for d in devices.iter_mut().take(15) {
        *d = d.clone().string("kind", "a");
    }
    let mut a = allocator(&[node_slice("n1", devices)], &[gpu_class()]);
    a.set_search_budget(Some(SearchBudget::steps(100_000)));
    let c = claim_with("c", one_gpu_requests(16), vec![match_attr("gpu.nvidia.com/kind", &[])]);
    let e = a.allocate_first_fit(None, &[&c]).unwrap_err();
    assert!(matches!(e, AllocateError::Undecided { searched: 0, nodes: 1, .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "claim default/c: not decided within 100000 steps: 0 of 1 nodes searched, none fits so far (the claim's requests and constraints allow too many combinations to try)"
    );
    a.set_search_budget(Some(SearchBudget::time(std::time::Duration::from_millis(50))));
    let started = std::time::Instant::now();
    assert!(matches!(a.allocate_first_fit(None, &[&c]), Err(AllocateError::Undecided { .. })));
    assert!(started.elapsed() < std::time::Duration::from_secs(1), "{:?}", started.elapsed());
}
