//! Dynamic MIG end to end in the library: a fake node of each MIG model,
//! its slices as the plugin publishes them with `DynamicMIG` for 1.34 and
//! 1.37, checked by the apiserver's rules and by the allocator: every
//! profile and placement is offered, and no two devices whose instances
//! could not coexist on the GPU can be allocated together.

use std::collections::BTreeSet;

use dra_allocator::test_support::claim_with;
use dra_allocator::{AllocateError, Allocator, Explanation};
use gpu_dra_driver::feature_gates::FeatureGates;
use gpu_dra_driver::inventory::dynamic_mig::{self, DynamicMigGpus};
use gpu_dra_driver::inventory::{Inventory, Placement, fake};
use gpu_dra_driver::inventory::{MigCapabilities, MigCapableProfile};
use gpu_dra_driver::names::{DriverName, NodeName};
use gpu_dra_driver::slices::{ServerRules, SliceBuilder, validate_slice_for};
use integration_tests::claim_fixtures::shipped_device_class;
use k8s_openapi::api::resource::v1::{
    AllocationResult, CELDeviceSelector, DeviceAllocationResult, DeviceClass, DeviceConstraint, DeviceRequest,
    DeviceRequestAllocationResult, DeviceSelector, ExactDeviceRequest, ResourceClaim, ResourceClaimStatus,
    ResourceSlice,
};

const MODELS: [&str; 6] = ["A100-SXM4-40GB", "A100-SXM4-80GB", "A30-24GB", "H100-80GB", "H200-141GB", "B200-180GB"];
const RULES: [ServerRules; 2] = [ServerRules { minor: 34 }, ServerRules { minor: 37 }];
const NODE: &str = "node-a";
const DRIVER: &str = "gpu.nvidia.com";

fn dynamic_node(model: &str, count: u32) -> Inventory {
    let yaml = format!("gpus: [{{model: {model}, count: {count}, mig: [{{dynamic: true}}]}}]");
    let mut inv = fake::parse(&yaml, &NodeName::new(NODE).unwrap()).unwrap_or_else(|e| panic!("{e:?}"));
    let left = dynamic_mig::select(&mut inv, &DynamicMigGpus::Auto, &|_| false);
    assert!(left.is_empty(), "{left:?}");
    inv
}

fn slices(inv: &Inventory, rules: ServerRules) -> Vec<ResourceSlice> {
    let gates: FeatureGates = "DynamicMIG=true".parse().unwrap();
    SliceBuilder::new(DriverName::nvidia_default(), NodeName::new(NODE).unwrap())
        .with_gates(gates)
        .for_server(rules)
        .build(inv, 1)
        .unwrap_or_else(|e| panic!("1.{}: {e}", rules.minor))
}

fn classes() -> Vec<DeviceClass> {
    vec![shipped_device_class("mig.nvidia.com"), shipped_device_class("gpu.nvidia.com")]
}

fn selector(cel: &str) -> DeviceSelector {
    DeviceSelector { cel: Some(CELDeviceSelector { expression: cel.into() }) }
}

fn request(name: &str, class: &str, count: i64, cel: Option<&str>) -> DeviceRequest {
    DeviceRequest {
        name: name.into(),
        exactly: Some(ExactDeviceRequest {
            device_class_name: class.into(),
            count: Some(count),
            allocation_mode: Some("ExactCount".into()),
            selectors: cel.map(|c| vec![selector(c)]),
            ..Default::default()
        }),
        first_available: None,
    }
}

fn profile_is(name: &str) -> String {
    format!("device.attributes['{DRIVER}'].profile == '{name}'")
}

/// A claim holding `device`, as if the scheduler had allocated it.
fn holding(device: &str) -> ResourceClaim {
    let mut c = claim_with(&format!("holds-{device}"), vec![request("r", "mig.nvidia.com", 1, None)], vec![]);
    c.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(vec![DeviceRequestAllocationResult {
                    request: "r".into(),
                    driver: DRIVER.into(),
                    pool: NODE.into(),
                    device: device.into(),
                    ..Default::default()
                }]),
                config: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    c
}

fn unsatisfiable(result: Result<Vec<AllocationResult>, AllocateError>) -> Box<Explanation> {
    match result {
        Err(AllocateError::Unsatisfiable(e)) => e,
        other => panic!("expected no fit, got {other:?}"),
    }
}

fn picked(results: &[AllocationResult]) -> Vec<(String, String)> {
    results
        .iter()
        .flat_map(|r| r.devices.iter().flat_map(|d| d.results.iter().flatten()))
        .map(|r| (r.request.clone(), r.device.clone()))
        .collect()
}

/// What the hardware allows: two instances coexist when their memory
/// slices do not overlap and the GPU has the compute slices and engine
/// units for both (each profile's engines are its own).
fn coexist(caps: &MigCapabilities, a: (&MigCapableProfile, Placement), b: (&MigCapableProfile, Placement)) -> bool {
    let whole = caps.profiles.iter().max_by_key(|p| p.compute_slices).unwrap();
    let engines = |p: &MigCapableProfile| {
        let p = &p.profile;
        [p.copy_engines, p.decoders, p.encoders, p.jpeg_engines, p.ofa_engines]
    };
    let (ea, eb, total) = (engines(a.0), engines(b.0), engines(whole));
    !a.1.overlaps(b.1)
        && a.0.compute_slices + b.0.compute_slices <= caps.compute_slices
        && (0..5).all(|i| ea[i] + eb[i] <= total[i])
}

#[test]
fn slices_offer_every_profile_and_placement_and_pass_the_apiserver_rules() {
    for model in MODELS {
        let inv = dynamic_node(model, 8);
        let caps = inv.gpus[0].mig_capabilities.clone().unwrap();
        let mut expected = BTreeSet::new();
        for g in &inv.gpus {
            if caps.mig_mode_switchable {
                expected.insert(format!("gpu-{}", g.minor));
            }
            for (p, pl) in caps.devices() {
                expected.insert(
                    dynamic_mig::mig_device_name(g.minor, &p.profile.name, p.profile.gi_profile_id, pl.start)
                        .unwrap()
                        .to_string(),
                );
            }
        }
        for rules in RULES {
            let slices = slices(&inv, rules);
            for s in &slices {
                let errors = validate_slice_for(s, rules);
                assert!(errors.is_empty(), "{model} 1.{}: {:?}: {errors:?}", rules.minor, s.metadata.name);
            }
            let names: BTreeSet<String> =
                slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).map(|d| d.name.clone()).collect();
            assert_eq!(names, expected, "{model} 1.{}", rules.minor);
            let sets: usize = slices.iter().map(|s| s.spec.shared_counters.as_ref().map_or(0, Vec::len)).sum();
            assert_eq!(sets, 8, "{model}: one counter set per GPU");
            // The fewest slices the release allows (see slices::partitionable).
            let per_gpu = expected.len() / 8;
            let counters = caps.counters().len();
            let want = if rules.minor >= 35 {
                1 + (8 * per_gpu).div_ceil(64)
            } else {
                8_usize.div_ceil((32 / counters).min(64 / per_gpu))
            };
            if model == "H100-80GB" {
                assert_eq!((per_gpu, counters, want), (26, 13, if rules.minor >= 35 { 5 } else { 4 }));
            }
            assert_eq!(slices.len(), want, "{model} 1.{}", rules.minor);
            // Dynamic devices have no uuid until prepared, and say their placement only in counters.
            let dev = slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).find(|d| d.name.contains("-mig-"));
            let dev = dev.unwrap();
            assert!(!dev.attributes.as_ref().unwrap().contains_key("uuid"), "{model}");
            assert!(dev.attributes.as_ref().unwrap().contains_key("parentUUID"), "{model}");
        }
    }
}

/// With one device of GPU 0 held, exactly the devices whose instances could
/// coexist with it remain allocatable: overlapping placements (and the
/// whole GPU) are refused by the counters, nothing the hardware allows is.
#[test]
fn counters_let_together_exactly_what_the_gpu_can_hold() {
    for model in MODELS {
        let inv = dynamic_node(model, 1);
        let gpu = &inv.gpus[0];
        let caps = gpu.mig_capabilities.clone().unwrap();
        for rules in RULES {
            let slices = slices(&inv, rules);
            let mut devices: Vec<(String, Option<(&MigCapableProfile, Placement)>)> =
                caps.devices().map(|(p, pl)| (mig_name(p, pl), Some((p, pl)))).collect();
            if caps.mig_mode_switchable {
                devices.push(("gpu-0".into(), None));
            }
            let mut a = Allocator::new(&slices, &classes(), &[]);
            for (held, held_mig) in &devices {
                a.record_allocated(&holding(held)).unwrap();
                for profile in &caps.profiles {
                    let asked = claim_with(
                        "probe",
                        vec![request("r", "mig.nvidia.com", 8, Some(&profile_is(&profile.profile.name)))],
                        vec![],
                    );
                    let e = unsatisfiable(a.allocate(NODE, &[&asked]));
                    let want = profile
                        .placements
                        .iter()
                        .filter(|&&pl| {
                            held_mig.is_some_and(|h| mig_name(profile, pl) != *held && coexist(&caps, h, (profile, pl)))
                        })
                        .count();
                    assert_eq!(
                        e.requests[0].available, want,
                        "{model} 1.{}: {held} held, {} left: {e}",
                        rules.minor, profile.profile.name
                    );
                }
                if held_mig.is_some() {
                    let whole = claim_with("whole", vec![request("g", "gpu.nvidia.com", 1, None)], vec![]);
                    assert!(a.allocate(NODE, &[&whole]).is_err(), "{model}: {held} held, whole GPU refused");
                }
                a.release(&holding(held)).unwrap();
            }
        }
    }
}

fn mig_name(p: &MigCapableProfile, pl: Placement) -> String {
    dynamic_mig::mig_device_name(0, &p.profile.name, p.profile.gi_profile_id, pl.start).unwrap().to_string()
}

/// Every profile can fill its GPU up to its instance count at once (a
/// counter set too small, e.g. too few decoders, would refuse this).
#[test]
fn every_profile_fits_its_instance_count() {
    for model in MODELS {
        let inv = dynamic_node(model, 1);
        let caps = inv.gpus[0].mig_capabilities.clone().unwrap();
        for rules in RULES {
            let slices = slices(&inv, rules);
            for p in &caps.profiles {
                let n = p.max_count.min(p.placements.len() as u32);
                let mut a = Allocator::new(&slices, &classes(), &[]);
                let c = claim_with(
                    "fill",
                    vec![request("r", "mig.nvidia.com", n.into(), Some(&profile_is(&p.profile.name)))],
                    vec![],
                );
                let got = a.allocate(NODE, &[&c]).unwrap_or_else(|e| panic!("{model}: {n} x {}: {e}", p.profile.name));
                assert_eq!(picked(&got).len(), n as usize);
            }
        }
    }
}

/// 4g + 2g + 1g on one GPU: one request per profile, the same parent GPU.
#[test]
fn four_two_one_on_one_gpu_at_disjoint_placements() {
    for (model, four, two, one) in [
        ("A100-SXM4-40GB", "4g.20gb", "2g.10gb", "1g.5gb"),
        ("H100-80GB", "4g.40gb", "2g.20gb", "1g.10gb"),
        ("B200-180GB", "4g.90gb", "2g.45gb", "1g.23gb"),
    ] {
        let inv = dynamic_node(model, 2);
        for rules in RULES {
            let mut a = Allocator::new(&slices(&inv, rules), &classes(), &[]);
            let same_gpu =
                DeviceConstraint { match_attribute: Some(format!("{DRIVER}/parentUUID")), ..Default::default() };
            let c = claim_with(
                "421",
                vec![
                    request("four", "mig.nvidia.com", 1, Some(&profile_is(four))),
                    request("two", "mig.nvidia.com", 1, Some(&profile_is(two))),
                    request("one", "mig.nvidia.com", 1, Some(&profile_is(one))),
                ],
                vec![same_gpu],
            );
            let got = picked(&a.allocate(NODE, &[&c]).unwrap_or_else(|e| panic!("{model}: {e}")));
            let targets: Vec<_> = got.iter().map(|(_, d)| inv.dynamic_mig_target(d).unwrap()).collect();
            assert!(targets.iter().all(|t| t.parent.minor == targets[0].parent.minor), "{model}: {got:?}");
            for (i, x) in targets.iter().enumerate() {
                for y in &targets[i + 1..] {
                    assert!(!x.placement.overlaps(y.placement), "{model}: {got:?}");
                }
            }
        }
    }
}

/// 7g takes the whole GPU; a 1g after it is refused, and the explanation
/// names a counter that is used up.
#[test]
fn seven_g_then_one_g_is_refused_naming_the_counter() {
    for (model, seven, one) in [("A100-SXM4-40GB", "7g.40gb", "1g.5gb"), ("H100-80GB", "7g.80gb", "1g.10gb")] {
        let inv = dynamic_node(model, 1);
        for rules in RULES {
            let mut a = Allocator::new(&slices(&inv, rules), &classes(), &[]);
            let big = claim_with("big", vec![request("r", "mig.nvidia.com", 1, Some(&profile_is(seven)))], vec![]);
            let placed = a.place(&[&big]).unwrap_or_else(|e| panic!("{model}: {e}"));
            assert_eq!(
                picked(&placed.allocations),
                [("r".to_string(), format!("gpu-0-mig-{}-0-0", seven.replace('.', "")))]
            );
            let small = claim_with("small", vec![request("r", "mig.nvidia.com", 1, Some(&profile_is(one)))], vec![]);
            let e = unsatisfiable(a.allocate(NODE, &[&small]));
            let text = e.to_string();
            assert!(text.contains("blocked by shared counters"), "{text}");
            assert!(text.contains("(gpu-0-counter-set/") && text.contains(" used up)"), "{text}");
        }
    }
}
