use std::collections::BTreeMap;
use std::path::Path;

use gpu_dra_driver::names::{ClaimUid, DeviceName};
use gpu_dra_driver::opaque_config::{self, DeviceKind, ResultToConfigure};
use serde_json::json;

use super::lifecycle::limit_commands;
use super::*;
use crate::prepare::test_support::{claim_config, two_gpu_inventory};
use crate::state::checkpoint::test_support::record;

const UID: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";

fn device(name: &str, consumed: &[(&str, &str)]) -> PlannedDevice {
    PlannedDevice {
        request: "gpu".into(),
        pool: "node-a".into(),
        device: DeviceName::new(name).unwrap(),
        is_mig: name.contains("mig"),
        admin_access: false,
        share_id: (!consumed.is_empty()).then(|| "s-1".into()),
        consumed_capacity: consumed.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
    }
}

fn daemon_for(
    planned: &[PlannedDevice],
    config: Option<serde_json::Value>,
    gates: &str,
) -> Result<Option<MpsDaemon>, String> {
    let gates: FeatureGates = gates.parse().unwrap();
    let configs: Vec<_> = config.into_iter().map(claim_config).collect();
    let results: Vec<ResultToConfigure<'_>> = planned
        .iter()
        .map(|d| ResultToConfigure {
            request: &d.request,
            device: &d.device,
            kind: if d.is_mig { DeviceKind::Mig } else { DeviceKind::Gpu },
        })
        .collect();
    let resolved =
        opaque_config::resolve(&gpu_dra_driver::names::DriverName::nvidia_default(), &configs, &results, &gates)
            .map_err(|e| e.to_string())?;
    plan_daemon(&ClaimUid::new(UID).unwrap(), planned, &resolved, &two_gpu_inventory(), &gates, Path::new("/state/mps"))
        .map_err(|e| e.to_string())
}

fn mps(config: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": config}})
}

#[test]
fn an_mps_config_becomes_one_daemon_with_nvidias_commands() {
    let inventory = two_gpu_inventory();
    let (g0, g2) = (inventory.gpus[0].uuid.clone(), inventory.gpus[2].uuid.clone());
    let planned = [device("gpu-0", &[]), device("gpu-2", &[])];
    let config = mps(json!({"defaultActiveThreadPercentage": 40, "defaultPinnedDeviceMemoryLimit": "10Gi",
                            "defaultPerDevicePinnedMemoryLimit": {"1": "1500Mi"}}));
    let daemon = daemon_for(&planned, Some(config), "MPSSupport=true").unwrap().unwrap();
    assert_eq!(daemon.root, Path::new("/state/mps").join(UID));
    assert_eq!(daemon.devices, ["gpu-0", "gpu-2"]);
    assert_eq!(daemon.visible, [g0.clone(), g2.clone()]);
    assert_eq!(daemon.gpus, daemon.visible);
    assert_eq!(
        limit_commands(&daemon),
        [
            "set_default_active_thread_percentage 40".to_owned(),
            format!("set_default_device_pinned_mem_limit {g0} 10240M"),
            format!("set_default_device_pinned_mem_limit {g2} 1500M"),
        ]
    );
    // No MPS anywhere: no daemon.
    assert_eq!(daemon_for(&planned, None, "MPSSupport=true").unwrap(), None);
}

#[test]
fn a_mig_device_is_visible_by_its_own_uuid_and_its_parent_changes_mode() {
    let inventory = two_gpu_inventory();
    let mig =
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}});
    let daemon = daemon_for(&[device("gpu-1-mig-1g10gb-19-0", &[])], Some(mig), "MPSSupport=true").unwrap().unwrap();
    assert!(daemon.visible[0].starts_with("MIG-"), "{:?}", daemon.visible);
    assert_eq!(daemon.gpus, [inventory.gpus[1].uuid.clone()]);
    assert!(limit_commands(&daemon).is_empty());
}

#[test]
fn a_share_is_enforced_by_what_it_consumed() {
    let g0 = two_gpu_inventory().gpus[0].uuid.clone();
    let share = [device("gpu-0", &[("memory", "10Gi"), (SM_PERCENT, "30")])];
    let daemon = daemon_for(&share, None, "MPSSupport=true").unwrap().unwrap();
    assert_eq!(
        limit_commands(&daemon),
        [
            "set_default_active_thread_percentage 30".to_owned(),
            format!("set_default_device_pinned_mem_limit {g0} 10240M")
        ]
    );
    // Rounded down to whole MiB; a config may lower the share, not raise it.
    let share = [device("gpu-0", &[("memory", "1536001Ki")])];
    let daemon = daemon_for(&share, Some(mps(json!({"defaultPinnedDeviceMemoryLimit": "40Gi"}))), "MPSSupport=true");
    assert_eq!(daemon.unwrap().unwrap().pinned_limits[0].mib, 1500);
    let daemon = daemon_for(&share, Some(mps(json!({"defaultPinnedDeviceMemoryLimit": "1Gi"}))), "MPSSupport=true");
    assert_eq!(daemon.unwrap().unwrap().pinned_limits[0].mib, 1024);
    let share = [device("gpu-0", &[(SM_PERCENT, "30")])];
    for (configured, applied) in [(50, 30), (20, 20)] {
        let config = mps(json!({"defaultActiveThreadPercentage": configured}));
        let daemon = daemon_for(&share, Some(config), "MPSSupport=true").unwrap().unwrap();
        assert_eq!(daemon.active_thread_percentage, Some(applied));
    }
}

#[test]
fn refusals_say_what_to_change() {
    let share = [device("gpu-0", &[("memory", "10Gi")])];
    let err = daemon_for(&share, None, "").unwrap_err();
    assert!(err.contains("nor the MPSSupport feature gate is on") && err.contains("gpu-0"), "{err}");
    assert!(daemon_for(&share, None, "ConsumableCapacity=true").unwrap().is_some(), "a share implies MPS");
    let err = daemon_for(&[device("gpu-0", &[(SM_PERCENT, "150")])], None, "MPSSupport=true").unwrap_err();
    assert!(err.contains("smPercent 150 is not a whole percentage"), "{err}");
    let config = mps(json!({"defaultPerDevicePinnedMemoryLimit": {"3": "1Gi"}}));
    let err = daemon_for(&[device("gpu-0", &[])], Some(config), "MPSSupport=true").unwrap_err();
    assert!(
        err.starts_with("status.allocation.devices.config[0].opaque.parameters.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.3:"),
        "{err}"
    );
    let err = daemon_for(&[device("gpu-0", &[])], Some(mps(json!({}))), "").unwrap_err();
    assert!(err.contains(r#"the "MPSSupport" feature gate is not enabled"#), "{err}");
    let two = [device("gpu-0", &[(SM_PERCENT, "20")]), device("gpu-2", &[(SM_PERCENT, "30")])];
    let err = daemon_for(&two, None, "MPSSupport=true").unwrap_err();
    assert!(err.contains("one MPS daemon with one percentage"), "{err}");
}

#[test]
fn container_edits_are_nvidias() {
    let daemon = daemon_for(&[device("gpu-0", &[])], Some(mps(json!({}))), "MPSSupport=true").unwrap().unwrap();
    let edits = serde_json::to_value(container_edits(&daemon)).unwrap();
    let root = format!("/state/mps/{UID}");
    assert_eq!(
        edits,
        json!({
            "env": ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"],
            "mounts": [
                {"hostPath": format!("{root}/pipe"), "containerPath": "/tmp/nvidia-mps", "options": ["rw", "nosuid", "nodev", "bind"]},
                {"hostPath": format!("{root}/shm"), "containerPath": "/dev/shm", "options": ["rw", "nosuid", "nodev", "bind"]},
            ],
        })
    );
}

#[test]
fn the_last_daemon_on_a_gpu_resets_it_and_mps_excludes_time_slicing() {
    let with_daemon = |uid: &str, gpu: &str| {
        let mut r = record(uid, &["gpu-0"]);
        r.mps = Some(MpsDaemon {
            root: "/x".into(),
            devices: vec!["gpu-0".into()],
            visible: vec![gpu.into()],
            gpus: vec![gpu.into()],
            active_thread_percentage: None,
            pinned_limits: vec![],
            process: None,
        });
        r
    };
    let (a, b) = (with_daemon("a", "GPU-0"), with_daemon("b", "GPU-0"));
    assert!(gpus_to_reset(&a, [&a, &b].into_iter()).is_empty());
    assert_eq!(gpus_to_reset(&a, [&a].into_iter()), ["GPU-0".to_owned()]);

    let err = check_compatible("c", "ns", "c", None, &["GPU-0".into()], [&a].into_iter()).unwrap_err().to_string();
    assert!(err.contains("GPU GPU-0 is MPS for ResourceClaim default/claim and would be time-sliced"), "{err}");
    let mut sliced = record("s", &["gpu-0"]);
    sliced.devices[0].time_slice = Some(crate::state::checkpoint::TimeSlice { gpu_uuid: "GPU-0".into(), interval: 1 });
    let err = check_compatible("a", "ns", "a", a.mps.as_ref(), &[], [&sliced].into_iter()).unwrap_err().to_string();
    assert!(err.contains("is time-sliced for ResourceClaim default/claim and would be MPS"), "{err}");
    assert!(check_compatible("b", "ns", "b", b.mps.as_ref(), &[], [&a].into_iter()).is_ok());
}
