use std::sync::Arc;

use super::*;
use crate::observe::telemetry::{DeviceIdentity, IdleReport, MigIdentity, PodRef};

fn gpu(minor: u32) -> DeviceIdentity {
    DeviceIdentity {
        device: format!("gpu-{minor}"),
        uuid: format!("GPU-{minor:08}"),
        gpu_minor: minor,
        model: "NVIDIA H100 80GB HBM3".into(),
        pci_bus_id: Some(format!("00000000:{minor:02}:00.0")),
        mig: None,
    }
}

fn mig() -> DeviceIdentity {
    DeviceIdentity {
        device: "gpu-1-mig-1g10gb-19-0".into(),
        uuid: "MIG-aaaa".into(),
        gpu_minor: 1,
        model: "NVIDIA A100-SXM4-80GB".into(),
        pci_bus_id: None,
        mig: Some(MigIdentity { profile: "1g.10gb".into(), gpu_instance_id: 9, parent_uuid: "GPU-parent".into() }),
    }
}

fn busy() -> DeviceSample {
    DeviceSample {
        gpu_utilization_percent: Some(87.0),
        memory_utilization_percent: Some(40.0),
        memory_used_bytes: Some(2 * 1024 * 1024 * 1024),
        memory_total_bytes: Some(80 * 1024 * 1024 * 1024),
        power_watts: Some(350.5),
        temperature_celsius: Some(61.0),
        sm_clock_mhz: Some(1980.0),
        ecc_corrected_errors: Some(3),
        ecc_uncorrected_errors: Some(0),
    }
}

fn holder() -> Arc<ClaimHolder> {
    Arc::new(ClaimHolder {
        namespace: "team-a".into(),
        name: "trainer-gpus".into(),
        uid: "uid-1".into(),
        pods: ["trainer-0", "trainer-1"].map(|n| PodRef { name: n.into(), uid: format!("uid-{n}") }).to_vec(),
    })
}

fn snapshot() -> Snapshot {
    Snapshot {
        devices: vec![
            DeviceReading { identity: gpu(0), sample: busy(), xids: vec![], faulty: false, holders: vec![holder()] },
            DeviceReading { identity: gpu(2), sample: busy(), xids: vec![43, 79], faulty: true, holders: vec![] },
            DeviceReading {
                identity: mig(),
                // What NVML gives for a MIG device: memory, no utilization.
                sample: DeviceSample {
                    memory_used_bytes: Some(1024 * 1024 * 1024),
                    memory_total_bytes: Some(10 * 1024 * 1024 * 1024),
                    ..DeviceSample::default()
                },
                xids: vec![],
                faulty: false,
                holders: vec![],
            },
        ],
        prepared_claims: 1,
        idle: vec![],
        sample_seconds: Some(0.004),
        ..Snapshot::default()
    }
}

const CX: Context<'static> = Context { naming: Naming::Native, hostname: "node-a", driver: "gpu.nvidia.com" };
const DCGM: Context<'static> = Context { naming: Naming::Dcgm, hostname: "node-a", driver: "gpu.nvidia.com" };

fn family<'a>(families: &'a [Family], name: &str) -> &'a Family {
    families.iter().find(|f| f.name == name).unwrap_or_else(|| panic!("no family {name}"))
}

fn label<'a>(row: &'a Row, key: &str) -> Option<&'a str> {
    row.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

#[test]
fn every_named_family_is_emitted_in_order_in_both_namings() {
    for cx in [CX, DCGM] {
        let names: Vec<&str> = families(&snapshot(), &cx).iter().map(|f| f.name).collect();
        assert_eq!(names, metric_names(cx.naming));
        let empty: Vec<&str> = families(&Snapshot::default(), &cx).iter().map(|f| f.name).collect();
        assert_eq!(empty, metric_names(cx.naming), "a family with no rows still names itself");
    }
}

#[test]
fn a_held_device_carries_its_claim_and_pods() {
    let fams = families(&snapshot(), &CX);
    let util = family(&fams, "gpu_dra_device_gpu_utilization_percent");
    let row = util.rows.iter().find(|r| label(r, "device") == Some("gpu-0")).unwrap();
    assert_eq!(row.value, 87.0);
    assert_eq!(label(row, "uuid"), Some("GPU-00000000"));
    assert_eq!(label(row, "model"), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(label(row, "claim_namespace"), Some("team-a"));
    assert_eq!(label(row, "claim_name"), Some("trainer-gpus"));
    assert_eq!(label(row, "claim_uid"), Some("uid-1"));
    assert_eq!(label(row, "pods"), Some("trainer-0,trainer-1"));
    let free = util.rows.iter().find(|r| label(r, "device") == Some("gpu-2")).unwrap();
    assert_eq!(label(free, "claim_name"), None, "no claim labels on a free device");
    assert_eq!(family(&fams, "gpu_dra_device_sm_clock_hertz").rows[0].value, 1.98e9);
    assert_eq!(family(&fams, "gpu_dra_device_memory_free_bytes").rows[0].value, 78.0 * 1024.0 * 1024.0 * 1024.0);
}

#[test]
fn what_nvml_cannot_give_is_not_published() {
    let fams = families(&snapshot(), &CX);
    for name in ["gpu_dra_device_gpu_utilization_percent", "gpu_dra_device_power_watts"] {
        assert!(
            family(&fams, name).rows.iter().all(|r| label(r, "device") != Some("gpu-1-mig-1g10gb-19-0")),
            "{name}: no zero for the MIG device"
        );
    }
    let used = family(&fams, "gpu_dra_device_memory_used_bytes");
    let row = used.rows.iter().find(|r| label(r, "device") == Some("gpu-1-mig-1g10gb-19-0")).unwrap();
    assert_eq!(label(row, "mig_profile"), Some("1g.10gb"));
    assert_eq!(label(row, "parent_uuid"), Some("GPU-parent"));
    assert_eq!(row.value, 1024.0 * 1024.0 * 1024.0);
}

#[test]
fn node_families_count_claims_allocations_faults() {
    let fams = families(&snapshot(), &CX);
    assert_eq!(family(&fams, "gpu_dra_prepared_claims").rows[0].value, 1.0);
    assert_eq!(family(&fams, "gpu_dra_allocated_devices").rows[0].value, 1.0);
    assert_eq!(family(&fams, "gpu_dra_faulty_devices").rows[0].value, 1.0);
    assert_eq!(family(&fams, "gpu_dra_idle_claims").rows[0].value, 0.0);
    assert_eq!(family(&fams, "gpu_dra_telemetry_sample_seconds").rows[0].value, 0.004);
    let xids = family(&fams, "gpu_dra_device_xid_errors");
    assert_eq!(xids.rows.iter().find(|r| label(r, "device") == Some("gpu-2")).unwrap().value, 2.0);
}

#[test]
fn an_idle_claim_is_a_series_with_its_average() {
    let mut s = snapshot();
    s.idle.push(IdleReport {
        claim: holder(),
        devices: vec!["gpu-0".into()],
        average_percent: 1.5,
        window_seconds: 1800,
    });
    let fams = families(&s, &CX);
    assert_eq!(family(&fams, "gpu_dra_idle_claims").rows[0].value, 1.0);
    let row = &family(&fams, "gpu_dra_claim_idle_utilization_percent").rows[0];
    assert_eq!(row.value, 1.5);
    assert_eq!(label(row, "claim_name"), Some("trainer-gpus"));
    assert_eq!(label(row, "devices"), Some("gpu-0"));
    assert_eq!(label(row, "window_seconds"), Some("1800"));
}

#[test]
fn dcgm_naming_has_its_names_units_and_one_series_per_pod() {
    let fams = families(&snapshot(), &DCGM);
    let util = family(&fams, "DCGM_FI_DEV_GPU_UTIL");
    let held: Vec<&Row> = util.rows.iter().filter(|r| label(r, "gpu") == Some("0")).collect();
    assert_eq!(held.len(), 2, "one series per pod");
    let pods: Vec<&str> = held.iter().filter_map(|r| label(r, "pod")).collect();
    assert_eq!(pods, ["trainer-0", "trainer-1"]);
    let row = held[0];
    assert_eq!(label(row, "UUID"), Some("GPU-00000000"));
    assert_eq!(label(row, "device"), Some("nvidia0"));
    assert_eq!(label(row, "modelName"), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(label(row, "Hostname"), Some("node-a"));
    assert_eq!(label(row, "namespace"), Some("team-a"));
    assert_eq!(label(row, "dra_claim_name"), Some("trainer-gpus"));
    assert_eq!(label(row, "dra_device_name"), Some("gpu-0"));
    assert_eq!(label(row, "dra_driver_name"), Some("gpu.nvidia.com"));
    assert_eq!(label(row, "dra_pool_name"), Some("node-a"));
    assert_eq!(family(&fams, "DCGM_FI_DEV_FB_USED").rows[0].value, 2048.0, "MiB");
    assert_eq!(family(&fams, "DCGM_FI_DEV_SM_CLOCK").rows[0].value, 1980.0, "MHz");
    let xid = family(&fams, "DCGM_FI_DEV_XID_ERRORS");
    assert_eq!(xid.rows.iter().find(|r| label(r, "gpu") == Some("2")).unwrap().value, 79.0, "the last XID");
    let mig_row =
        family(&fams, "DCGM_FI_DEV_FB_USED").rows.iter().find(|r| label(r, "GPU_I_PROFILE").is_some()).unwrap();
    assert_eq!(label(mig_row, "UUID"), Some("GPU-parent"), "dcgm-exporter names the parent GPU");
    assert_eq!(label(mig_row, "GPU_I_ID"), Some("9"));
}
