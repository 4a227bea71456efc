//! Allocator cases: basic picks, backtracking, constraints, prioritized
//! lists, `All`, pools and errors. Written from the upstream semantics
//! (allocator_testing.go's cases) with our own data.

use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim, ResourceSlice};

use super::test_support::*;
use super::*;

pub(super) const GPU: &str = r#"device.attributes["gpu.nvidia.com"].type == "gpu""#;

pub(super) fn allocator(slices: &[ResourceSlice], classes: &[DeviceClass]) -> Allocator {
    Allocator::new(slices, classes, &[]).with_share_ids(Box::new(SequentialShareIds::new()))
}

/// (request, device) pairs of a result.
pub(super) fn picks(r: &AllocationResult) -> Vec<(String, String)> {
    r.devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .map(|rs| rs.iter().map(|x| (x.request.clone(), x.device.clone())).collect())
        .unwrap_or_default()
}

pub(super) fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

pub(super) fn one(a: &mut Allocator, node: &str, c: &ResourceClaim) -> Result<AllocationResult, AllocateError> {
    a.allocate(node, &[c]).map(|mut v| v.remove(0))
}

pub(super) fn unsatisfiable(r: Result<impl std::fmt::Debug, AllocateError>) -> Explanation {
    match r {
        Err(AllocateError::Unsatisfiable(e)) => *e,
        other => panic!("expected unsatisfiable, got {other:?}"),
    }
}

pub(super) fn fatal(r: Result<impl std::fmt::Debug, AllocateError>) -> FatalError {
    match r {
        Err(AllocateError::Fatal(e)) => e,
        other => panic!("expected a fatal error, got {other:?}"),
    }
}

fn gpu(name: &str) -> k8s_openapi::api::resource::v1::Device {
    device(name).string("type", "gpu")
}

#[test]
fn simple_claim_gets_the_first_device_and_is_pinned_to_the_node() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0"), gpu("gpu-1")])], &[gpu_class()]);
    let r = one(&mut a, "n1", &claim("c", vec![request("r", "gpu", 1)])).unwrap();
    let res = &r.devices.as_ref().unwrap().results.as_ref().unwrap()[0];
    assert_eq!(
        (res.request.as_str(), res.driver.as_str(), res.pool.as_str(), res.device.as_str()),
        ("r", DRIVER, "n1", "gpu-0")
    );
    assert!(res.admin_access.is_none() && res.share_id.is_none() && res.consumed_capacity.is_none());
    let term = &r.node_selector.as_ref().unwrap().node_selector_terms[0];
    let field = &term.match_fields.as_ref().unwrap()[0];
    assert_eq!((field.key.as_str(), field.operator.as_str()), ("metadata.name", "In"));
    assert_eq!(field.values.as_deref().unwrap(), ["n1"]);
}

#[test]
fn devices_of_other_nodes_are_not_visible() {
    let mut a = allocator(&[node_slice("n2", vec![gpu("gpu-0")])], &[gpu_class()]);
    let e = unsatisfiable(one(&mut a, "n1", &claim("c", vec![request("r", "gpu", 1)])));
    assert_eq!(e.requests[0].visible, 0);
    assert_eq!(e.node.as_deref(), Some("n1"));
}

#[test]
fn backtracking_across_requests() {
    // "any" takes the large device first; "large" then has none, so the
    // search must go back and give "any" the small one.
    let devices = vec![gpu("a-large").string("size", "large"), gpu("b-small").string("size", "small")];
    let mut a = allocator(&[node_slice("n1", devices)], &[gpu_class()]);
    let c = claim(
        "c",
        vec![
            request("any", "gpu", 1),
            with_selectors(request("large", "gpu", 1), &[r#"device.attributes["gpu.nvidia.com"].size == "large""#]),
        ],
    );
    assert_eq!(picks(&one(&mut a, "n1", &c).unwrap()), pairs(&[("any", "b-small"), ("large", "a-large")]));
}

#[test]
fn backtracking_across_claims_of_one_pod() {
    let devices = vec![gpu("a-large").string("size", "large"), gpu("b-small").string("size", "small")];
    let mut a = allocator(&[node_slice("n1", devices)], &[gpu_class()]);
    let c0 = claim("c0", vec![request("any", "gpu", 1)]);
    let c1 = claim(
        "c1",
        vec![with_selectors(request("large", "gpu", 1), &[r#"device.attributes["gpu.nvidia.com"].size == "large""#])],
    );
    let r = a.allocate("n1", &[&c0, &c1]).unwrap();
    assert_eq!(picks(&r[0]), pairs(&[("any", "b-small")]));
    assert_eq!(picks(&r[1]), pairs(&[("large", "a-large")]));
}

#[test]
fn not_enough_devices_is_explained_with_counts() {
    let mut a = allocator(
        &[node_slice("n1", vec![gpu("gpu-0"), gpu("gpu-1"), device("nic-0").string("type", "nic")])],
        &[gpu_class()],
    );
    let e = unsatisfiable(one(&mut a, "n1", &claim("c", vec![with_selectors(request("r", "gpu", 3), &[GPU])])));
    let r = &e.requests[0];
    assert_eq!((r.visible, r.class_matches, r.request_selectors.clone(), r.available), (3, 3, vec![2], 2));
    assert_eq!(r.wanted, Wanted::Count(3));
    let text = e.to_string();
    assert!(text.contains("request r wants 3 devices"), "{text}");
    assert!(text.contains("class gpu matches 3 devices of 3 visible; selector #0 matches 2"), "{text}");
}

/// Node `n1` with `gpu-<i>` in NVLink group `groups[i]`, for the constraint tests.
fn nvlink_node(groups: &[i64]) -> Allocator {
    let devices = groups.iter().enumerate().map(|(i, &g)| gpu(&format!("gpu-{i}")).int("nvlinkGroup", g)).collect();
    allocator(&[node_slice("n1", devices)], &[gpu_class()])
}

#[test]
fn match_attribute_across_requests_backtracks_to_a_shared_value() {
    let mut a = nvlink_node(&[0, 1, 1]);
    let c = claim_with(
        "c",
        vec![request("a", "gpu", 1), request("b", "gpu", 1)],
        vec![match_attr("gpu.nvidia.com/nvlinkGroup", &["a", "b"])],
    );
    assert_eq!(picks(&one(&mut a, "n1", &c).unwrap()), pairs(&[("a", "gpu-1"), ("b", "gpu-2")]));
}

#[test]
fn match_attribute_scoped_to_listed_requests_only() {
    let mut a = nvlink_node(&[0, 1, 1]);
    let c = claim_with(
        "c",
        vec![request("free", "gpu", 1), request("pair", "gpu", 2)],
        vec![match_attr("gpu.nvidia.com/nvlinkGroup", &["pair"])],
    );
    assert_eq!(
        picks(&one(&mut a, "n1", &c).unwrap()),
        pairs(&[("free", "gpu-0"), ("pair", "gpu-1"), ("pair", "gpu-2")])
    );
}

#[test]
fn unmet_match_attribute_is_explained_with_values() {
    let devices = vec![gpu("gpu-0").int("nvlinkGroup", 0), gpu("gpu-1").int("nvlinkGroup", 1), gpu("gpu-2")];
    let mut a = allocator(&[node_slice("n1", devices)], &[gpu_class()]);
    let c = claim_with("c", vec![request("pair", "gpu", 2)], vec![match_attr("gpu.nvidia.com/nvlinkGroup", &[])]);
    let e = unsatisfiable(one(&mut a, "n1", &c));
    assert_eq!(e.constraints.len(), 1);
    let values: Vec<(String, usize)> = e.constraints[0].values.iter().map(|v| (v.value.clone(), v.devices)).collect();
    assert_eq!(values, [("0".to_string(), 1), ("1".to_string(), 1), ("<missing>".to_string(), 1)]);
    let text = e.to_string();
    assert!(text.contains("matchAttribute gpu.nvidia.com/nvlinkGroup over all requests cannot be met"), "{text}");
}

#[test]
fn distinct_attribute_spreads_devices() {
    let devices = vec![gpu("gpu-0").int("numa", 0), gpu("gpu-1").int("numa", 0), gpu("gpu-2").int("numa", 1)];
    let mut a = allocator(&[node_slice("n1", devices)], &[gpu_class()]);
    let c = claim_with(
        "c",
        vec![request("a", "gpu", 1), request("b", "gpu", 1)],
        vec![distinct_attr("gpu.nvidia.com/numa", &[])],
    );
    assert_eq!(picks(&one(&mut a, "n1", &c).unwrap()), pairs(&[("a", "gpu-0"), ("b", "gpu-2")]));
    let three = claim_with("c3", vec![request("a", "gpu", 3)], vec![distinct_attr("gpu.nvidia.com/numa", &[])]);
    unsatisfiable(one(&mut a, "n1", &three));
}

#[test]
fn first_available_falls_back_in_order_and_names_the_subrequest() {
    let devices = vec![gpu("gpu-0").string("model", "a100"), gpu("gpu-1").string("model", "a100")];
    let mut a = allocator(&[node_slice("n1", devices)], &[gpu_class()]);
    let c = claim(
        "c",
        vec![first_available(
            "train",
            vec![
                sub("h100", "gpu", 1, &[r#"device.attributes["gpu.nvidia.com"].model == "h100""#]),
                sub("a100", "gpu", 2, &[r#"device.attributes["gpu.nvidia.com"].model == "a100""#]),
            ],
        )],
    );
    assert_eq!(picks(&one(&mut a, "n1", &c).unwrap()), pairs(&[("train/a100", "gpu-0"), ("train/a100", "gpu-1")]));
}

#[test]
fn first_available_with_constraint_on_a_subrequest() {
    let mut a = nvlink_node(&[0, 1, 2]);
    // "two" cannot be met with one group, so "one" is used; the constraint
    // names only "x/two" and does not apply to "x/one".
    let c = claim_with(
        "c",
        vec![first_available("x", vec![sub("two", "gpu", 2, &[]), sub("one", "gpu", 1, &[])])],
        vec![match_attr("gpu.nvidia.com/nvlinkGroup", &["x/two"])],
    );
    assert_eq!(picks(&one(&mut a, "n1", &c).unwrap()), pairs(&[("x/one", "gpu-0")]));
}

#[test]
fn all_mode_takes_every_matching_device() {
    let devices = vec![gpu("gpu-0"), device("nic-0").string("type", "nic"), gpu("gpu-1")];
    let mut a = allocator(&[node_slice("n1", devices)], &[gpu_class()]);
    let c = claim("c", vec![with_selectors(all_request("all", "gpu"), &[GPU])]);
    assert_eq!(picks(&one(&mut a, "n1", &c).unwrap()), pairs(&[("all", "gpu-0"), ("all", "gpu-1")]));
}

#[test]
fn all_mode_fails_when_one_is_busy_or_none_match() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0"), gpu("gpu-1")])], &[gpu_class()]);
    let first = claim("first", vec![request("r", "gpu", 1)]);
    a.place(&[&first]).unwrap();
    let e = unsatisfiable(one(&mut a, "n1", &claim("c", vec![all_request("all", "gpu")])));
    assert_eq!(e.requests[0].allocated, [OwnerCount { owner: "default/first".into(), devices: 1 }]);
    let none = claim(
        "none",
        vec![with_selectors(all_request("all", "gpu"), &[r#"device.attributes["gpu.nvidia.com"].type == "tpu""#])],
    );
    unsatisfiable(one(&mut a, "n1", &none));
}

#[test]
fn all_mode_with_an_incomplete_pool_is_an_error() {
    let slices = [node_slice("n1", vec![gpu("gpu-0")]), slice("half", "n1", "other", 1, 2, vec![gpu("x-0")])];
    let mut a = allocator(&slices, &[gpu_class()]);
    let err = fatal(one(&mut a, "n1", &claim("c", vec![all_request("all", "gpu")])));
    assert!(matches!(&err, FatalError::PoolNotReady { pool, .. } if pool == "other"), "{err}");
    // An exact count still allocates from the complete pool.
    assert_eq!(picks(&one(&mut a, "n1", &claim("c", vec![request("r", "gpu", 1)])).unwrap()), pairs(&[("r", "gpu-0")]));
}

#[test]
fn all_mode_with_a_constraint_that_rejects_a_device_is_an_error() {
    let mut a = nvlink_node(&[0, 1]);
    let c = claim_with("c", vec![all_request("all", "gpu")], vec![match_attr("gpu.nvidia.com/nvlinkGroup", &[])]);
    let err = fatal(one(&mut a, "n1", &c));
    assert!(err.to_string().contains("cannot add device gpu.nvidia.com/n1/gpu-1"), "{err}");
}

#[test]
fn incomplete_and_invalid_pools_are_skipped_and_explained() {
    let slices = [
        slice("p1-a", "n1", "p1", 1, 2, vec![gpu("gpu-0")]),
        slice("p2-a", "n1", "p2", 1, 2, vec![gpu("gpu-0")]),
        slice("p2-b", "n1", "p2", 1, 2, vec![gpu("gpu-0")]),
    ];
    let mut a = allocator(&slices, &[gpu_class()]);
    let e = unsatisfiable(one(&mut a, "n1", &claim("c", vec![request("r", "gpu", 1)])));
    assert_eq!(e.pools.len(), 2);
    let text = e.to_string();
    assert!(text.contains("pool gpu.nvidia.com/p1 skipped: incomplete, 1 of 2 slices"), "{text}");
    assert!(text.contains("pool gpu.nvidia.com/p2 skipped: invalid: duplicate device name gpu-0"), "{text}");
}

#[test]
fn only_the_newest_pool_generation_is_used() {
    let slices = [
        slice("old", "n1", "n1", 1, 1, vec![gpu("gpu-0"), gpu("gpu-1")]),
        slice("new", "n1", "n1", 2, 1, vec![gpu("gpu-1")]),
    ];
    let mut a = allocator(&slices, &[gpu_class()]);
    assert_eq!(picks(&one(&mut a, "n1", &claim("c", vec![request("r", "gpu", 1)])).unwrap()), pairs(&[("r", "gpu-1")]));
    unsatisfiable(one(&mut a, "n1", &claim("c", vec![request("r", "gpu", 2)])));
}

#[test]
fn too_many_results_is_an_error() {
    let devices: Vec<_> = (0..40).map(|i| gpu(&format!("gpu-{i}"))).collect();
    let mut a = allocator(&[node_slice("n1", devices)], &[gpu_class()]);
    let err = fatal(one(&mut a, "n1", &claim("c", vec![request("a", "gpu", 32), request("b", "gpu", 1)])));
    assert_eq!(err, FatalError::TooManyResults { claim: "default/c".into(), results: 33, max: 32 });
    assert_eq!(one(&mut a, "n1", &claim("c", vec![request("a", "gpu", 32)])).map(|r| picks(&r).len()), Ok(32));
    // A first alternative over the limit falls back to one that fits.
    let c = claim("c", vec![first_available("x", vec![sub("many", "gpu", 33, &[]), sub("few", "gpu", 1, &[])])]);
    assert_eq!(picks(&one(&mut a, "n1", &c).unwrap()), pairs(&[("x/few", "gpu-0")]));
}

#[test]
fn unknown_class_and_malformed_claims_are_errors() {
    let mut a = allocator(&[node_slice("n1", vec![gpu("gpu-0")])], &[gpu_class()]);
    let err = fatal(one(&mut a, "n1", &claim("c", vec![request("r", "nope", 1)])));
    assert!(matches!(&err, FatalError::ClassNotFound { class, .. } if class == "nope"), "{err}");
    let mut bad = request("r", "gpu", 1);
    if let Some(e) = bad.exactly.as_mut() {
        e.allocation_mode = Some("Some".into());
    }
    let err = fatal(one(&mut a, "n1", &claim("c", vec![bad])));
    assert!(err.to_string().contains("spec.devices.requests[0].exactly.allocationMode"), "{err}");
    let mut empty = match_attr("x/y", &[]);
    empty.match_attribute = None;
    let err = fatal(one(&mut a, "n1", &claim_with("c", vec![request("r", "gpu", 1)], vec![empty])));
    assert!(err.to_string().contains("empty constraint"), "{err}");
}
