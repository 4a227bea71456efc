//! The generator of NVIDIA's kubelet-plugin state (`tests/nvidia-state/`,
//! through `integration_tests::nvidia_state`): every format's checkpoint has
//! that release's shape and verifies, a tampered one does not, a field a
//! format cannot hold is refused by name, and claim CDI specs are YAML as
//! NVIDIA writes them.

use std::os::unix::fs::PermissionsExt;

use integration_tests::nvidia_state::{
    NVIDIA_CLAIM_CDI_KIND, NvidiaClaim, NvidiaDevice, NvidiaFormat, NvidiaGroup, cdi_spec_file_name, checkpoint,
    checkpoint_exact, claim_cdi_id, try_checkpoint, try_write_cdi_yaml, verify, verify_as, write_cdi_yaml,
    write_cdi_yaml_as,
};
use serde_json::{Value, json};

const BOOT_ID: &str = "0d3c9f7e-5b1a-4c2d-9e8f-123456789abc";
const A: &str = "4b6f2a8e-1111-4222-8333-444455556666";
const B: &str = "9e9e9e9e-0000-4000-8000-000000000000";

/// A prepared claim with a GPU, a MIG device and (where the release had
/// them) a vfio device, and a claim whose preparation started.
fn claims(format: NvidiaFormat) -> Vec<NvidiaClaim> {
    let mut devices = vec![
        NvidiaDevice::gpu("GPU-aaaa", "gpu", "node-a", "gpu-0", &claim_cdi_id(A, "gpu-0")),
        NvidiaDevice::mig("MIG-bbbb", "mig", "node-a", "gpu-1-mig-19-0-1", &claim_cdi_id(A, "gpu-1-mig-19-0-1"))
            .live("GPU-cccc", 1, 7, 0),
    ];
    if format.is_v25_12_or_later() {
        devices.push(NvidiaDevice::vfio("GPU-dddd", "vfio", "node-a", "gpu-2", "").cdi_ids(&[]));
    }
    let status = json!({"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}]}}});
    vec![
        NvidiaClaim::completed(A, "default", "done", devices).with_status(status),
        NvidiaClaim::started(
            B,
            "default",
            "starting",
            vec![NvidiaDevice::gpu("GPU-eeee", "gpu", "node-a", "gpu-3", "")],
        ),
    ]
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> =
        v.as_object().unwrap_or_else(|| panic!("not an object: {v}")).keys().map(String::as_str).collect();
    k.sort_unstable();
    k
}

#[test]
fn each_format_has_its_releases_shape_and_verifies() {
    for format in NvidiaFormat::all() {
        let bytes = checkpoint(format, BOOT_ID, &claims(format));
        let file: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{format}: {e}"));
        let v1_claims = &file["v1"]["preparedClaims"];
        assert_eq!(keys(v1_claims), [A], "{format}: v1 holds prepared claims only");
        let completed = &v1_claims[A];
        assert_eq!(keys(completed), ["preparedDevices", "status"], "{format}");
        let group = &completed["preparedDevices"][0];
        assert_eq!(keys(group), ["configState", "devices"], "{format}");
        let gpu = &group["devices"][0];
        assert_eq!(gpu["gpu"]["info"], json!({"uuid": "GPU-aaaa"}), "{format}");
        assert_eq!(
            gpu["gpu"]["device"],
            json!({"Requests": ["gpu"], "PoolName": "node-a", "DeviceName": "gpu-0", "CDIDeviceIDs": [claim_cdi_id(A, "gpu-0")]}),
            "{format}"
        );
        let mig = &group["devices"][1]["mig"];
        if format.is_v25_12_or_later() {
            assert_eq!(
                mig["concrete"],
                json!({"parentMinor": 1, "giId": 7, "ciId": 0, "migUUID": "MIG-bbbb", "parentUUID": "GPU-cccc"}),
                "{format}"
            );
            assert_eq!(group["devices"][2]["vfio"]["info"]["uuid"], "GPU-dddd", "{format}");
        } else {
            assert_eq!(mig["info"], json!({"uuid": "MIG-bbbb"}), "{format}");
        }
        let config = if format == NvidiaFormat::Main { json!({}) } else { json!({"mpsControlDaemonID": ""}) };
        assert_eq!(group["configState"], config, "{format}");

        if format.has_states() {
            assert_eq!(keys(&file), ["checksum", "v1", "v2"], "{format}");
            let v2 = &file["v2"];
            if format.is_v0_4_or_later() {
                assert_eq!(keys(v2), ["checksum", "nodeBootID", "preparedClaims"], "{format}");
                assert_eq!(v2["nodeBootID"], BOOT_ID, "{format}");
            } else {
                assert_eq!(keys(v2), ["checksum", "preparedClaims"], "{format}");
            }
            // As Prepare records them: the prepared claim without its name,
            // the started one without devices (with its name from v25.12).
            let prepared = &v2["preparedClaims"][A];
            assert_eq!(keys(prepared), ["checkpointState", "preparedDevices", "status"], "{format}");
            assert_eq!(prepared["checkpointState"], "PrepareCompleted", "{format}");
            let started = &v2["preparedClaims"][B];
            let want = if format.is_v25_12_or_later() {
                json!({"checkpointState": "PrepareStarted", "status": {}, "name": "starting", "namespace": "default"})
            } else {
                json!({"checkpointState": "PrepareStarted", "status": {}})
            };
            assert_eq!(*started, want, "{format}");
        } else {
            assert_eq!(keys(&file), ["checksum", "v1"], "{format}");
        }
        verify(&bytes).unwrap_or_else(|e| panic!("{format}: {e}"));
        verify_as(format, &bytes).unwrap_or_else(|e| panic!("{format}: {e}"));
    }
}

#[test]
fn a_tampered_checkpoint_fails_verify() {
    for format in NvidiaFormat::all() {
        let text = String::from_utf8(checkpoint(format, BOOT_ID, &claims(format))).unwrap();
        // A GPU UUID in every section, the JSON still valid.
        let tampered = text.replace("GPU-aaaa", "GPU-aaab");
        let err = verify(tampered.as_bytes()).expect_err("a changed UUID verifies");
        assert!(err.contains("checkpoint is corrupted"), "{format}: {err}");
        if format.has_states() {
            // Only the v2 copy changed: the v1 checksum holds, v2's fails.
            let at = tampered.rfind("GPU-aaab").unwrap();
            let only_v2 = format!("{}GPU-aaab{}", &text[..at], &text[at + "GPU-aaab".len()..]);
            let err = verify_as(format, only_v2.as_bytes()).expect_err("a changed v2 verifies");
            assert!(err.contains("v2 checksum"), "{format}: {err}");
        }
    }
}

#[test]
fn a_field_the_format_cannot_hold_is_refused_by_name() {
    let started = NvidiaClaim::started("u", "", "", Vec::new());
    let err = checkpoint_exact(NvidiaFormat::V25_3, "", &[started]).expect_err("v25.3 wrote prepared claims only");
    assert!(err.contains("claims[0].state") && err.contains("v25.3"), "{err}");

    let err = checkpoint_exact(NvidiaFormat::V25_12, BOOT_ID, &[]).expect_err("v25.12 had no boot ID");
    assert!(err.contains("bootID"), "{err}");

    let mig = NvidiaDevice::mig("MIG-1", "mig", "node-a", "mig", "").live("GPU-1", 0, 1, 0);
    let claim = NvidiaClaim::completed("u", "", "", vec![mig]);
    let err =
        checkpoint_exact(NvidiaFormat::V25_8, "", std::slice::from_ref(&claim)).expect_err("v25.8 had MIG UUIDs only");
    assert!(err.contains("claims[0].groups[0].devices[0].parentUUID"), "{err}");
    // checkpoint() records it as v25.8 did: by the MIG device's UUID.
    try_checkpoint(NvidiaFormat::V25_8, "", &[claim]).unwrap();

    // Nor could a release before v25.12 prepare a vfio device.
    let vfio = NvidiaClaim::completed("u", "", "", vec![NvidiaDevice::vfio("GPU-1", "v", "node-a", "gpu-0", "")]);
    let err = try_checkpoint(NvidiaFormat::V25_8, "", &[vfio]).expect_err("vfio in v25.8");
    assert!(err.contains("claims[0].groups[0].devices[0].kind"), "{err}");
}

#[test]
fn nvidia_main_rejects_older_files_with_a_group_without_mps() {
    let gpu = NvidiaDevice::gpu("GPU-1", "gpu", "node-a", "gpu-0", &claim_cdi_id("u", "gpu-0"));
    let without = [NvidiaClaim::completed("u", "default", "a", vec![gpu.clone()])];
    let with = [NvidiaClaim::completed("u", "default", "a", Vec::new())
        .with_groups(vec![NvidiaGroup::new(vec![gpu]).with_mps("mps-1")])];
    let released = checkpoint(NvidiaFormat::V0_4_1, "", &without);
    verify_as(NvidiaFormat::V0_4_1, &released).unwrap();
    let err = verify_as(NvidiaFormat::Main, &released).expect_err("main re-marshals configState as {}");
    assert!(err.contains("v1 checksum"), "{err}");
    verify_as(NvidiaFormat::Main, &checkpoint(NvidiaFormat::V0_4_1, "", &with)).unwrap();
    // Every release up to v0.4.1 reads a v25.3 file.
    verify_as(NvidiaFormat::V0_4_1, &checkpoint(NvidiaFormat::V25_3, "", &without)).unwrap();
}

#[test]
fn cdi_specs_are_written_as_nvidia_writes_them() {
    let spec = json!({
        "kind": NVIDIA_CLAIM_CDI_KIND,
        "devices": [{"name": format!("{A}-gpu-0"), "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [{"path": "/dev/nvidia0"}]}}],
        "containerEdits": {"env": ["NVIDIA_CTK_LIBCUDA_DIR=/usr/lib64"]},
    });
    let json = serde_json::to_vec(&spec).unwrap();
    for format in [NvidiaFormat::V25_3, NvidiaFormat::latest()] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(cdi_spec_file_name(A));
        if format == NvidiaFormat::latest() {
            write_cdi_yaml(&json, &path);
        } else {
            write_cdi_yaml_as(format, &json, &path);
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("---\n"), "{format}: {text}");
        let yaml: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{format}: {e}\n{text}"));
        assert_eq!(yaml["kind"].as_str(), Some(NVIDIA_CLAIM_CDI_KIND), "{text}");
        assert!(yaml["cdiVersion"].as_str().is_some_and(|v| !v.is_empty()), "{text}");
        assert_eq!(yaml["devices"][0]["name"].as_str(), Some(format!("{A}-gpu-0").as_str()), "{text}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, format.cdi_spec_mode(), "{format}");
    }
    let bad = serde_json::to_vec(&json!({"kind": "no-slash", "devices": []})).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let err = try_write_cdi_yaml(NvidiaFormat::latest(), &bad, &dir.path().join("x.yaml"))
        .expect_err("the CDI library validates the spec");
    assert!(err.contains("cdi-yaml"), "{err}");
}

/// The generator's own Go tests (golden layouts per release, each checksum
/// recomputed apart from the kubelet's package) run here, with `go vet`:
/// nothing else runs them.
#[test]
fn the_generators_go_tests_pass() {
    let module = integration_tests::workspace_root().join("tests/nvidia-state");
    for args in [&["vet", "./..."][..], &["test", "-count=1", "./..."][..]] {
        let output = std::process::Command::new("go")
            .args(args)
            .current_dir(&module)
            .env("GOFLAGS", "-mod=readonly")
            .env("GOTOOLCHAIN", std::env::var("GOTOOLCHAIN").unwrap_or_else(|_| "auto".into()))
            .output()
            .unwrap_or_else(|e| panic!("go {args:?}: {e} (the generator's tests need Go)"));
        assert!(
            output.status.success(),
            "go {args:?} in {}:\n{}{}",
            module.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
