use super::*;
use crate::inventory::catalog::Catalog;
use crate::inventory::test_support::{gpu, inventory, mig};

fn caps(model: &str) -> MigCapabilities {
    MigCapabilities::from_model(Catalog::embedded().unwrap().model(model).unwrap()).unwrap()
}

fn dynamic_gpu(minor: u32, model: &str) -> Gpu {
    let mut g = gpu(minor);
    g.mig = MigMode::Dynamic(vec![]);
    g.mig_capabilities = Some(caps(model));
    g
}

#[test]
fn names_follow_nvidia_and_parse_back() {
    assert_eq!(mig_device_name(3, "1g.10gb+me", 20, 0).unwrap().as_str(), "gpu-3-mig-1g10gb-me-20-0");
    assert_eq!(mig_device_name(0, "7g.80gb", 0, 0).unwrap().as_str(), "gpu-0-mig-7g80gb-0-0");
    assert_eq!(
        parse_device_name("gpu-3-mig-1g10gb-me-20-0"),
        Some(ParsedDeviceName::Mig {
            parent_minor: 3,
            profile_label: "1g10gb-me".into(),
            gi_profile_id: 20,
            placement_start: 0
        })
    );
    assert_eq!(parse_device_name("gpu-12"), Some(ParsedDeviceName::WholeGpu { minor: 12 }));
    for bad in [
        "gpu-",
        "gpu-a",
        "gpu-1-mig-",
        "gpu-1-mig-19-0",
        "gpu-1-mig-x-1-",
        "gpu--mig-1g-19-0",
        "vfio-0",
        "gpu-1-mig-1g-+1-0",
    ] {
        assert_eq!(parse_device_name(bad), None, "{bad}");
    }
    assert_eq!(counter_set_name(4), "gpu-4-counter-set");
}

#[test]
fn every_name_of_every_model_parses_back_to_its_device() {
    let catalog = Catalog::embedded().unwrap();
    for (key, model) in &catalog.models {
        let Some(c) = MigCapabilities::from_model(model) else { continue };
        let mut g = gpu(5);
        g.mig = MigMode::Dynamic(vec![]);
        g.mig_capabilities = Some(c.clone());
        let inv = inventory(vec![g]);
        for (profile, placement) in c.devices() {
            let name = mig_device_name(5, &profile.profile.name, profile.profile.gi_profile_id, placement.start)
                .unwrap_or_else(|e| panic!("{key}: {e}"));
            let target = inv.dynamic_mig_target(name.as_str()).unwrap_or_else(|| panic!("{key}: {name}"));
            assert_eq!((target.profile, target.placement), (profile, placement), "{key}: {name}");
        }
    }
}

#[test]
fn counters_cover_slices_compute_and_engines() {
    let a100 = caps("A100-SXM4-40GB");
    let names: Vec<String> = a100.counters().keys().map(ToString::to_string).collect();
    assert_eq!(
        names,
        [
            "memory-slice-0",
            "memory-slice-1",
            "memory-slice-2",
            "memory-slice-3",
            "memory-slice-4",
            "memory-slice-5",
            "memory-slice-6",
            "memory-slice-7",
            "compute-slices",
            "copy-engines",
            "decoders",
            "jpeg-engines",
            "ofa-engines"
        ],
        "no encoders on an A100: no counter of 0"
    );
    assert_eq!(a100.counters()[&CounterName::ComputeSlices], 7);
    let three_g = a100.profiles.iter().find(|p| p.profile.name == "3g.20gb").unwrap();
    let used = a100.consumption(three_g, Placement { start: 4, size: 4 });
    assert_eq!(used[&CounterName::MemorySlice(4)], 1);
    assert!(!used.contains_key(&CounterName::MemorySlice(3)));
    assert_eq!(used[&CounterName::ComputeSlices], 3);
    assert_eq!(used[&CounterName::Engine(Engine::Decoder)], 2);
}

#[test]
fn nvml_profile_indices_of_the_model_tables() {
    let a100 = caps("A100-SXM4-40GB");
    let index =
        |c: &MigCapabilities, name: &str| c.profiles.iter().find(|p| p.profile.name == name).unwrap().profile_index;
    assert_eq!(index(&a100, "1g.5gb"), 0);
    assert_eq!(index(&a100, "1g.5gb+me"), 7);
    assert_eq!(index(&a100, "1g.10gb"), 9);
    assert_eq!(index(&a100, "2g.10gb"), 1);
    assert_eq!(index(&a100, "3g.20gb"), 2);
    assert_eq!(index(&a100, "4g.20gb"), 3);
    assert_eq!(index(&a100, "7g.40gb"), 4);
    let a30 = caps("A30-24GB");
    assert_eq!(index(&a30, "2g.12gb+me"), 8);
    assert_eq!(index(&a30, "4g.24gb"), 3);
    assert_eq!(a30.memory_slices, 4);
    assert!(!a30.mig_mode_switchable && !a100.mig_mode_switchable);
    assert!(caps("H100-80GB").mig_mode_switchable && caps("B200-180GB").mig_mode_switchable);
    let seven = a100.profile(0).unwrap();
    assert_eq!((seven.compute_slices, seven.compute_instance_profile_index), (7, 4));
}

#[test]
fn a_dynamic_gpu_publishes_every_profile_and_placement() {
    let inv = inventory(vec![dynamic_gpu(0, "H100-80GB"), dynamic_gpu(1, "A100-SXM4-40GB")]);
    let names: Vec<String> = inv.published_devices().iter().map(|d| d.name().unwrap().to_string()).collect();
    // H100: the whole GPU (MIG mode switchable) + 7+7+4+3+2+1+1 devices; A100: 25, no whole GPU.
    assert_eq!(names.len(), 1 + 25 + 25);
    assert_eq!(names[0], "gpu-0-mig-1g10gb-19-6", "smallest profile first, from the GPU's end");
    assert_eq!(names[25], "gpu-0", "the whole GPU after its MIG devices");
    assert_eq!(
        names[26..30],
        ["gpu-1-mig-1g5gb-19-6", "gpu-1-mig-1g5gb-19-5", "gpu-1-mig-1g5gb-19-4", "gpu-1-mig-1g5gb-19-3"]
    );
    assert_eq!(names[50], "gpu-1-mig-7g40gb-0-0");
    assert!(names.contains(&"gpu-0-mig-1g10gb-19-6".to_string()));
    assert!(names.contains(&"gpu-1-mig-7g40gb-0-0".to_string()));
    assert!(!names.contains(&"gpu-1".to_string()), "an A100 in MIG mode does not offer the whole GPU");
    assert!(inv.dynamic_mig_target("gpu-1-mig-3g20gb-9-4").is_some());
    assert!(inv.dynamic_mig_target("gpu-1-mig-3g20gb-9-2").is_none(), "no placement at 2");
    assert!(inv.dynamic_mig_target("gpu-1-mig-4g20gb-9-0").is_none(), "label and id disagree");
    assert!(inv.dynamic_mig_target("gpu-7-mig-3g20gb-9-0").is_none(), "no GPU 7");
}

#[test]
fn selection_by_default_takes_empty_mig_gpus_and_ours() {
    let with_admin_instances = {
        let mut g = dynamic_gpu(1, "H100-80GB");
        g.mig = MigMode::Enabled(vec![mig("3g.40gb", 9, 0, 4)]);
        g
    };
    let with_ours = {
        let mut g = dynamic_gpu(2, "H100-80GB");
        g.mig = MigMode::Enabled(vec![mig("1g.10gb", 19, 3, 1)]);
        g
    };
    let empty = {
        let mut g = dynamic_gpu(3, "H100-80GB");
        g.mig = MigMode::Enabled(vec![]);
        g
    };
    let mut inv = inventory(vec![gpu(0), with_admin_instances, with_ours, empty]);
    let ours_uuid = mig("1g.10gb", 19, 3, 1).uuid;
    let left = select(&mut inv, &DynamicMigGpus::Auto, &|m| m.uuid == ours_uuid);
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(inv.gpus[0].mig, MigMode::Disabled);
    assert!(matches!(inv.gpus[1].mig, MigMode::Enabled(ref m) if m.len() == 1), "an admin's instances stay static");
    assert!(matches!(inv.gpus[2].mig, MigMode::Dynamic(ref m) if m.len() == 1));
    assert!(matches!(inv.gpus[3].mig, MigMode::Dynamic(ref m) if m.is_empty()));

    let mut listed = inv.clone();
    let left = select(&mut listed, &"1,3".parse().unwrap(), &|_| false);
    assert_eq!(left, [LeftStatic { minor: 1, reason: "it has 1 MIG instance(s) the driver did not make".into() }]);
    assert!(matches!(listed.gpus[2].mig, MigMode::Enabled(_)), "not listed: static again");
    assert!(matches!(listed.gpus[3].mig, MigMode::Dynamic(_)));

    let mut none = inv.clone();
    select(&mut none, &DynamicMigGpus::None, &|_| true);
    assert!(none.gpus.iter().all(|g| !matches!(g.mig, MigMode::Dynamic(_))));
}

#[test]
fn selection_flag_syntax() {
    assert_eq!("".parse::<DynamicMigGpus>().unwrap(), DynamicMigGpus::Auto);
    assert_eq!("none".parse::<DynamicMigGpus>().unwrap(), DynamicMigGpus::None);
    let listed: DynamicMigGpus = "0, GPU-8f6e1c2a-0000-0000-0000-000000000001".parse().unwrap();
    assert_eq!(listed.to_string(), "0,GPU-8f6e1c2a-0000-0000-0000-000000000001");
    let err = "0,gpu7".parse::<DynamicMigGpus>().unwrap_err().to_string();
    assert!(err.contains("\"gpu7\" is not a GPU minor number"), "{err}");
    // A multi-byte character across the prefix is refused, not a panic.
    assert!("GPUé-0".parse::<DynamicMigGpus>().is_err());
}
