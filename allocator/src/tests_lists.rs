//! `matchAttribute` and `distinctAttribute` over list-typed attributes
//! (DRAListTypeAttributes): the "list-attributes-*" and "numanode-*" cases
//! of `dynamic-resource-allocation@v0.37.2`'s `allocator_testing.go`,
//! restated as data (devices, constraint, requests, outcome) and run
//! through our allocator with the gate on and off.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourceClaim};

use super::test_support::*;
use super::tests_core::{allocator, one, pairs, picks};
use super::*;
use dra_cel::CelEnvironment;

#[derive(Debug, Clone)]
enum V {
    Str(&'static str),
    Strs(&'static [&'static str]),
    Ints(&'static [i64]),
    Bools(&'static [bool]),
    Versions(&'static [&'static str]),
    /// No value field set.
    Nothing,
}

fn attribute(v: &V) -> DeviceAttribute {
    let owned = |s: &[&str]| Some(s.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
    let mut a = DeviceAttribute::default();
    match v {
        V::Str(s) => a.string = Some((*s).to_owned()),
        V::Strs(s) => a.strings = owned(s),
        V::Ints(i) => a.ints = Some(i.to_vec()),
        V::Bools(b) => a.bools = Some(b.to_vec()),
        V::Versions(s) => a.versions = owned(s),
        V::Nothing => {}
    }
    a
}

#[derive(Debug, Clone, Copy)]
enum Rule {
    Match,
    Distinct,
}

#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// (request, device) pairs.
    Picks(&'static [(&'static str, &'static str)]),
    NoFit,
    /// A fatal error mentioning this.
    Error(&'static str),
}

struct Case {
    name: &'static str,
    gate: bool,
    rule: Rule,
    /// Bare attribute name, published by the driver (`numaNode` is the
    /// standard `resource.kubernetes.io/numaNode`).
    attribute: &'static str,
    /// Requests' names and counts; `scoped`: the constraint lists them.
    requests: &'static [(&'static str, i64)],
    scoped: bool,
    devices: Vec<(&'static str, V)>,
    outcome: Outcome,
}

fn qualified(attribute: &str) -> String {
    if attribute == "numaNode" { "resource.kubernetes.io/numaNode".to_owned() } else { format!("{DRIVER}/{attribute}") }
}

fn device_with(name: &str, attribute_name: &str, v: &V) -> Device {
    let key = if attribute_name == "numaNode" { qualified(attribute_name) } else { attribute_name.to_owned() };
    Device { name: name.into(), attributes: Some(BTreeMap::from([(key, attribute(v))])), ..Default::default() }
}

fn claim_of(case: &Case) -> ResourceClaim {
    let requests = case.requests.iter().map(|(r, n)| request(r, "gpu", *n)).collect();
    let names: Vec<&str> = if case.scoped { case.requests.iter().map(|(r, _)| *r).collect() } else { vec![] };
    let constraint = match case.rule {
        Rule::Match => match_attr(&qualified(case.attribute), &names),
        Rule::Distinct => distinct_attr(&qualified(case.attribute), &names),
    };
    claim_with("c", requests, vec![constraint])
}

fn environment(gate: bool) -> CelEnvironment {
    CelEnvironment { list_type_attributes: gate, ..CelEnvironment::stored_expressions(37) }
}

/// The upstream cases (names as there; "device0..4" as upstream, listed in
/// the slice's order).
fn cases() -> Vec<Case> {
    use Outcome::*;
    use Rule::*;
    use V::*;
    let s = "stringAttribute";
    let c = |name, gate, rule, attribute, requests, devices: Vec<(&'static str, V)>, outcome| Case {
        name,
        gate,
        rule,
        attribute,
        requests,
        scoped: false,
        devices,
        outcome,
    };
    vec![
        c(
            "list-attributes-match-constaint-scalar-string-values",
            true,
            Match,
            s,
            &[("req-0", 2)],
            vec![("device-1", Str("value1")), ("device-2", Str("value1"))],
            Picks(&[("req-0", "device-1"), ("req-0", "device-2")]),
        ),
        c(
            "list-attributes-match-constaint-list-of-string-values-with-common-elements",
            true,
            Match,
            s,
            &[("req-0", 2)],
            vec![
                ("device-1", Strs(&["value1", "value2", "value3"])),
                ("device-2", Strs(&["value2", "value3", "value4"])),
            ],
            Picks(&[("req-0", "device-1"), ("req-0", "device-2")]),
        ),
        c(
            "list-attributes-match-constaint-list-of-string-values-with-partially-common-elements",
            true,
            Match,
            s,
            &[("req-0", 3)],
            vec![
                ("device-1", Strs(&["value1", "value2"])),
                ("device-2", Strs(&["value2", "value3"])),
                ("device-3", Strs(&["value3", "value1"])),
            ],
            NoFit,
        ),
        c(
            "list-attributes-match-constraint-backtrack-needs-intersection-restore",
            true,
            Match,
            s,
            &[("req-0", 3)],
            vec![
                ("device-1", Strs(&["value1", "value2"])),
                ("device-2", Strs(&["value1"])),
                ("device-3", Strs(&["value2"])),
                ("device-4", Strs(&["value2"])),
            ],
            Picks(&[("req-0", "device-1"), ("req-0", "device-3"), ("req-0", "device-4")]),
        ),
        c(
            "list-attributes-match-constaint-list-of-string-values-without-common-elements",
            true,
            Match,
            s,
            &[("req-0", 1), ("req-1", 1)],
            vec![("device-1", Strs(&["value1", "value2"])), ("device-2", Strs(&["value3", "value4"]))],
            NoFit,
        ),
        c(
            "list-attributes-match-constaint-mixed-scalar-and-list-of-string-values-with-common-elements",
            true,
            Match,
            s,
            &[("req-0", 2)],
            vec![("device-1", Str("value1")), ("device-2", Strs(&["value1", "value2"]))],
            Picks(&[("req-0", "device-1"), ("req-0", "device-2")]),
        ),
        c(
            "list-attributes-match-constaint-mixed-scalar-and-list-of-string-values-with-partially-common-elements",
            true,
            Match,
            s,
            &[("req-0", 3)],
            vec![
                ("device-1", Str("value1")),
                ("device-2", Strs(&["value1", "value2"])),
                ("device-3", Strs(&["value2", "value3"])),
            ],
            NoFit,
        ),
        c(
            "list-attributes-match-constaint-mixed-scalar-and-list-of-string-values-without-common-elements",
            true,
            Match,
            s,
            &[("req-0", 2)],
            vec![("device-1", Str("value1")), ("device-2", Strs(&["value2", "value3"]))],
            NoFit,
        ),
        c(
            "list-attributes-match-constaint-list-of-int-values-with-common-elements",
            true,
            Match,
            "numa",
            &[("req-0", 2)],
            vec![("device-1", Ints(&[0, 1, 2])), ("device-2", Ints(&[1, 2, 3]))],
            Picks(&[("req-0", "device-1"), ("req-0", "device-2")]),
        ),
        c(
            "numanode-matchattribute-overlapping-lists-are-co-placed",
            true,
            Match,
            "numaNode",
            &[("req-0", 2)],
            vec![("device-1", Ints(&[4])), ("device-2", Ints(&[4, 5, 6, 7]))],
            Picks(&[("req-0", "device-1"), ("req-0", "device-2")]),
        ),
        c(
            "numanode-matchattribute-disjoint-lists-are-not-allocated",
            true,
            Match,
            "numaNode",
            &[("req-0", 2)],
            vec![("device-1", Ints(&[0])), ("device-2", Ints(&[4, 5, 6, 7]))],
            NoFit,
        ),
        c(
            "list-attributes-match-constaint-list-of-bool-values-with-common-elements",
            true,
            Match,
            "boolAttribute",
            &[("req-0", 2)],
            vec![("device-1", Bools(&[true, false])), ("device-2", Bools(&[true]))],
            Picks(&[("req-0", "device-1"), ("req-0", "device-2")]),
        ),
        c(
            "list-attributes-match-constaint-list-of-version-values-with-common-elements",
            true,
            Match,
            "driverVersion",
            &[("req-0", 2)],
            vec![
                ("device-1", Versions(&["1.0.0", "1.1.0", "2.0.0"])),
                ("device-2", Versions(&["1.1.0", "2.0.0", "2.1.0"])),
            ],
            Picks(&[("req-0", "device-1"), ("req-0", "device-2")]),
        ),
        c(
            "list-attributes-match-constaint-with-empty-or-unknown-type",
            true,
            Match,
            s,
            &[("req-0", 2)],
            vec![("device-1", Nothing), ("device-2", Strs(&[]))],
            Error("unsupported attribute value"),
        ),
        c(
            "list-attributes-disabled-match-constraint-with-lists",
            false,
            Match,
            s,
            &[("req-0", 2)],
            vec![
                ("device-1", Strs(&["value1", "value2", "value3"])),
                ("device-2", Strs(&["value2", "value3", "value4"])),
            ],
            NoFit,
        ),
        c(
            "list-attributes-distinct-constraint-scalar-string-values-all-distinct",
            true,
            Distinct,
            s,
            &[("req-0", 2)],
            vec![("device-1", Str("value1")), ("device-2", Str("value2"))],
            Picks(&[("req-0", "device-1"), ("req-0", "device-2")]),
        ),
        c(
            "list-attributes-distinct-constraint-scalar-string-values-not-distinct",
            true,
            Distinct,
            s,
            &[("req-0", 2)],
            vec![("device-1", Str("value1")), ("device-2", Str("value1"))],
            NoFit,
        ),
        c(
            "list-attributes-distinct-constraint-single-request-count-3-not-distinct",
            true,
            Distinct,
            s,
            &[("req-0", 3)],
            vec![("device-1", Str("value1")), ("device-2", Str("value2")), ("device-3", Str("value1"))],
            NoFit,
        ),
        c(
            "list-attributes-distinct-constraint-single-request-count-3-all-distinct",
            true,
            Distinct,
            s,
            &[("req-0", 3)],
            vec![("device-1", Str("value1")), ("device-2", Str("value2")), ("device-3", Str("value3"))],
            Picks(&[("req-0", "device-1"), ("req-0", "device-2"), ("req-0", "device-3")]),
        ),
        c(
            "list-attributes-distinct-constraint-list-of-string-values-all-distinct",
            true,
            Distinct,
            s,
            &[("req-0", 2)],
            vec![
                ("device-1", Strs(&["value1", "value2"])),
                ("device-2", Strs(&["value2", "value3"])),
                ("device-3", Strs(&["value3", "value4"])),
            ],
            Picks(&[("req-0", "device-1"), ("req-0", "device-3")]),
        ),
        c(
            "list-attributes-distinct-constraint-list-of-string-values-with-common-elements",
            true,
            Distinct,
            s,
            &[("req-0", 2)],
            vec![
                ("device-1", Strs(&["value1", "value2", "value3"])),
                ("device-2", Strs(&["value2", "value4", "value5"])),
            ],
            NoFit,
        ),
        c(
            "list-attributes-distinct-constraint-mixed-scalar-and-list-all-distinct",
            true,
            Distinct,
            s,
            &[("req-0", 2)],
            vec![
                ("device-1", Str("value1")),
                ("device-2", Strs(&["value1", "value2"])),
                ("device-3", Strs(&["value2", "value3"])),
            ],
            Picks(&[("req-0", "device-1"), ("req-0", "device-3")]),
        ),
        c(
            "list-attributes-distinct-constraint-mixed-scalar-and-list-with-common-elements",
            true,
            Distinct,
            s,
            &[("req-0", 2)],
            vec![("device-1", Str("value1")), ("device-2", Strs(&["value1", "value2"]))],
            NoFit,
        ),
        c(
            "list-attributes-distinct-constraint-list-of-int-values-all-distinct",
            true,
            Distinct,
            "numa",
            &[("req-0", 2)],
            vec![("device-1", Ints(&[0, 1])), ("device-2", Ints(&[1, 2])), ("device-3", Ints(&[2, 3]))],
            Picks(&[("req-0", "device-1"), ("req-0", "device-3")]),
        ),
        c(
            "list-attributes-distinct-constraint-list-of-bool-values-all-distinct",
            true,
            Distinct,
            "boolAttribute",
            &[("req-0", 2)],
            vec![("device-1", Bools(&[true])), ("device-2", Bools(&[true, false])), ("device-3", Bools(&[false]))],
            Picks(&[("req-0", "device-1"), ("req-0", "device-3")]),
        ),
        c(
            "list-attributes-distinct-constraint-list-of-version-values-all-distinct",
            true,
            Distinct,
            "driverVersion",
            &[("req-0", 2)],
            vec![
                ("device-1", Versions(&["1.0.0", "1.1.0"])),
                ("device-2", Versions(&["1.1.0", "2.0.0"])),
                ("device-3", Versions(&["2.0.0", "2.1.0"])),
            ],
            Picks(&[("req-0", "device-1"), ("req-0", "device-3")]),
        ),
        c(
            "list-attributes-distinct-constaint-with-empty-or-unknown-type",
            true,
            Distinct,
            "driverVersion",
            &[("req-0", 2)],
            // Upstream's second device has `VersionValues: nil`: no value.
            vec![("device-1", Versions(&[])), ("device-2", Nothing)],
            Error("unsupported attribute value"),
        ),
        c(
            "list-attributes-disabled-distinct-constraint-with-lists",
            false,
            Distinct,
            s,
            &[("req-0", 2)],
            vec![
                ("device-1", Strs(&["value1", "value2", "value3"])),
                ("device-2", Strs(&["value2", "value3", "value4"])),
            ],
            NoFit,
        ),
        Case {
            name: "list-attributes-distinct-constraint-backtrack-needs-remove",
            gate: true,
            rule: Distinct,
            attribute: s,
            requests: &[("req-0", 1), ("req-1", 1), ("req-2", 1)],
            scoped: true,
            devices: vec![
                ("device-1", Strs(&["value1", "value2", "value3"])),
                ("device-2", Strs(&["value3", "value4", "value5"])),
                ("device-3", Strs(&["value1", "value2"])),
                ("device-4", Strs(&["value3", "value4"])),
                ("device-0", Strs(&["value5", "value6"])),
            ],
            outcome: Picks(&[("req-0", "device-3"), ("req-1", "device-4"), ("req-2", "device-0")]),
        },
    ]
}

/// Runs one case; the failure, if any, as text.
fn run(case: &Case) -> Result<(), String> {
    let devices: Vec<Device> = case.devices.iter().map(|(n, v)| device_with(n, case.attribute, v)).collect();
    let mut a =
        allocator(&[node_slice("node-1", devices)], &[gpu_class()]).with_cel_environment(environment(case.gate));
    let got = one(&mut a, "node-1", &claim_of(case));
    match (&got, case.outcome) {
        (Ok(r), Outcome::Picks(want)) if picks(r) == pairs(want) => Ok(()),
        (Err(AllocateError::Unsatisfiable(_)), Outcome::NoFit) => Ok(()),
        (Err(AllocateError::Fatal(e)), Outcome::Error(needle)) if e.to_string().contains(needle) => Ok(()),
        _ => Err(format!("got {got:?}")),
    }
}

#[test]
fn kubernetes_list_attribute_allocator_cases() {
    let failures: Vec<String> =
        cases().iter().filter_map(|c| run(c).err().map(|e| format!("{}: {e}", c.name))).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// With the gate off the scalar rule applies as upstream's: the first
/// covered device is taken whatever its value, so a claim for one device
/// with a list attribute fits, and a second device never matches a list.
#[test]
fn gate_off_takes_a_lone_list_device_and_matches_nothing_after_it() {
    let devices =
        vec![device_with("device-1", "numa", &V::Ints(&[0, 1])), device_with("device-2", "numa", &V::Ints(&[0, 1]))];
    let slices = [node_slice("node-1", devices)];
    let mut a = allocator(&slices, &[gpu_class()]).with_cel_environment(environment(false));
    let lone = claim_with("c", vec![request("r", "gpu", 1)], vec![match_attr("gpu.nvidia.com/numa", &[])]);
    assert_eq!(picks(&one(&mut a, "node-1", &lone).unwrap()), pairs(&[("r", "device-1")]));
    let pair = claim_with("c", vec![request("r", "gpu", 2)], vec![match_attr("gpu.nvidia.com/numa", &[])]);
    assert!(matches!(one(&mut a, "node-1", &pair), Err(AllocateError::Unsatisfiable(_))));
    let mut on = allocator(&slices, &[gpu_class()]).with_cel_environment(environment(true));
    assert_eq!(picks(&one(&mut on, "node-1", &pair).unwrap()), pairs(&[("r", "device-1"), ("r", "device-2")]));
}

/// A list attribute is explained by its values when the constraint fails.
#[test]
fn an_unmet_list_constraint_is_explained_with_the_lists() {
    let devices =
        vec![device_with("device-1", "numa", &V::Ints(&[0, 1])), device_with("device-2", "numa", &V::Ints(&[2]))];
    let mut a = allocator(&[node_slice("node-1", devices)], &[gpu_class()]).with_cel_environment(environment(true));
    let c = claim_with("c", vec![request("r", "gpu", 2)], vec![match_attr("gpu.nvidia.com/numa", &[])]);
    let Err(AllocateError::Unsatisfiable(e)) = one(&mut a, "node-1", &c) else { panic!("expected no fit") };
    let values: Vec<(String, usize)> = e.constraints[0].values.iter().map(|v| (v.value.clone(), v.devices)).collect();
    assert_eq!(values, [("2".to_string(), 1), ("[0, 1]".to_string(), 1)]);
}

/// A selector ranging over a list attribute picks devices in the search,
/// with the gate off too (a 1.37 scheduler's stored selectors).
#[test]
fn selectors_range_over_list_attributes_in_the_search() {
    let devices =
        vec![device_with("device-1", "numa", &V::Ints(&[0, 1])), device_with("device-2", "numa", &V::Ints(&[2, 3]))];
    for gate in [true, false] {
        let mut a =
            allocator(&[node_slice("node-1", devices.clone())], &[gpu_class()]).with_cel_environment(environment(gate));
        let c = claim(
            "c",
            vec![with_selectors(
                request("r", "gpu", 1),
                &[r#"device.attributes["gpu.nvidia.com"].numa.exists(n, n == 3)"#],
            )],
        );
        assert_eq!(picks(&one(&mut a, "node-1", &c).unwrap()), pairs(&[("r", "device-2")]), "gate {gate}");
    }
}
