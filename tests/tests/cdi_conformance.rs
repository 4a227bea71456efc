//! Every CDI spec we generate is accepted by the CNCF's own Rust CDI library
//! (`container-device-interface`, the project's port of the Go reference):
//! it parses and validates the file, its minimum version equals the
//! `cdiVersion` we emitted, and injecting each device into an OCI spec gives
//! the container exactly the device nodes we meant.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use container_device_interface::cache::new_cache;
use container_device_interface::spec::read_spec;
use container_device_interface::spec_dirs::with_spec_dirs;
use container_device_interface::version::minimum_required_version;
use gpu_dra_driver::cdi::{self, ClaimSpec};
use gpu_dra_driver::inventory::fake;
use gpu_dra_driver::names::{ClaimUid, DeviceName, DriverName, NodeName};
use integration_tests::{example_inventories, kubelet_plugin, run, stdout_ok};

const CLAIM_UIDS: [&str; 2] = ["0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a", "c7d1e2f3-0a4b-4c5d-8e6f-708192a3b4c5"];

/// Device nodes a container received: (path, major, minor).
type Nodes = BTreeSet<(String, i64, i64)>;

/// Checks one spec file with the CNCF library; returns the device nodes the
/// container gets for each CDI id.
fn check_with_cncf_library(dir: &Path, file: &Path, emitted_version: &str, ids: &[String]) -> Vec<(String, Nodes)> {
    let spec = read_spec(&file.to_path_buf(), 0).unwrap_or_else(|e| panic!("{}: rejected: {e:#}", file.display()));
    let minimum = minimum_required_version(&spec.cdi_spec).unwrap();
    assert_eq!(minimum.to_string(), emitted_version, "{}: cdiVersion is not the minimum", file.display());

    let cache = new_cache(vec![with_spec_dirs(&[dir.to_str().unwrap()])]);
    let mut cache = cache.lock().unwrap();
    let mut results = Vec::new();
    for id in ids {
        let mut oci = oci_spec::runtime::Spec::default();
        cache
            .inject_devices(Some(&mut oci), vec![id.clone()])
            .unwrap_or_else(|e| panic!("{}: injecting {id}: {e}", file.display()));
        let linux = oci.linux().as_ref().expect("injection adds linux devices");
        let nodes = linux
            .devices()
            .as_ref()
            .expect("device nodes")
            .iter()
            .map(|d| (d.path().display().to_string(), d.major(), d.minor()))
            .collect();
        let env = oci.process().as_ref().and_then(|p| p.env().clone()).unwrap_or_default();
        assert!(env.iter().any(|e| e == "NVIDIA_VISIBLE_DEVICES=void"), "{id}: env {env:?}");
        results.push((id.clone(), nodes));
    }
    results
}

/// `print-cdi` for the A100 MIG example node, with `flags`.
fn print_cdi_a100(flags: &[&str]) -> std::process::Output {
    let inventory = integration_tests::workspace_root().join("examples/inventories/a100-mig.yaml");
    let mut args = vec!["print-cdi", "--node-name", "node-a", "--fake-inventory", inventory.to_str().unwrap()];
    args.extend(flags);
    run(kubelet_plugin(), &args, None)
}

fn write_spec(dir: &Path, spec: &ClaimSpec) -> PathBuf {
    let path = dir.join(&spec.file_name);
    std::fs::write(&path, spec.to_json().unwrap()).unwrap();
    path
}

#[test]
fn every_device_of_every_example_passes_the_cncf_library() {
    let driver = DriverName::nvidia_default();
    let node = NodeName::new("node-a").unwrap();
    let mut checked = 0;
    for inventory_file in example_inventories() {
        let inventory = fake::load(&inventory_file, &node).unwrap();
        let names: Vec<DeviceName> = inventory.published_devices().iter().map(|d| d.name().unwrap()).collect();
        for uid in CLAIM_UIDS {
            let claim = ClaimUid::new(uid).unwrap();
            // One claim per device, and one claim holding all of them.
            let mut claims: Vec<Vec<DeviceName>> = names.iter().map(|n| vec![n.clone()]).collect();
            claims.push(names.clone());
            for devices in claims {
                let dir = tempfile::tempdir().unwrap();
                let spec =
                    cdi::claim_spec(&driver, &inventory, &cdi::DriverEdits::default(), &claim, &devices).unwrap();
                let file = write_spec(dir.path(), &spec);
                let ids: Vec<String> = spec.device_ids.iter().map(|(_, id)| id.clone()).collect();
                let injected = check_with_cncf_library(dir.path(), &file, &spec.spec.cdi_version, &ids);
                for ((device, _), (_, nodes)) in spec.device_ids.iter().zip(&injected) {
                    let gpu = inventory.find_device(device).unwrap().gpu();
                    let dev = format!("/dev/nvidia{}", gpu.minor);
                    assert!(nodes.contains(&(dev.clone(), 195, gpu.minor.into())), "{device}: {nodes:?}");
                    assert!(nodes.contains(&("/dev/nvidiactl".into(), 195, 255)), "{device}: {nodes:?}");
                    assert!(nodes.iter().any(|(p, _, m)| p == "/dev/nvidia-uvm" && *m == 0), "{device}: {nodes:?}");
                    assert!(
                        nodes.iter().any(|(p, _, m)| p == "/dev/nvidia-uvm-tools" && *m == 1),
                        "{device}: {nodes:?}"
                    );
                    let caps = nodes.iter().filter(|(p, _, _)| p.starts_with("/dev/nvidia-caps/")).count();
                    let is_mig = device.as_str().contains("-mig-");
                    assert_eq!(caps, if is_mig { 2 } else { 0 }, "{device}: {nodes:?}");
                    // No other GPU leaks into the container.
                    let gpus = nodes
                        .iter()
                        .filter(|(p, _, _)| p.trim_start_matches("/dev/nvidia").parse::<u32>().is_ok())
                        .count();
                    assert_eq!(gpus, 1, "{device}: {nodes:?}");
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 40, "checked {checked} specs");
}

#[test]
fn print_cdi_output_passes_the_cncf_library() {
    let dir = tempfile::tempdir().unwrap();
    let inventory = integration_tests::workspace_root().join("examples/inventories/a100-mig.yaml");
    let out = run(
        kubelet_plugin(),
        &[
            "print-cdi",
            "--node-name",
            "node-a",
            "--fake-inventory",
            inventory.to_str().unwrap(),
            "--claim-uid",
            CLAIM_UIDS[0],
            "--device",
            "gpu-0-mig-1g10gb-19-3",
            "--device",
            "gpu-3",
        ],
        None,
    );
    let json = stdout_ok(&out);
    let notes = String::from_utf8(out.stderr.clone()).unwrap();
    let file_name = format!("k8s.gpu.nvidia.com-claim_{}.json", CLAIM_UIDS[0]);
    assert!(notes.contains(&format!("would write /var/run/cdi/{file_name}")), "{notes}");
    let file = dir.path().join(&file_name);
    std::fs::write(&file, &json).unwrap();
    let emitted: serde_json::Value = serde_json::from_str(&json).unwrap();
    let ids: Vec<String> = ["gpu-0-mig-1g10gb-19-3", "gpu-3"]
        .iter()
        .map(|d| format!("k8s.gpu.nvidia.com/claim={}-{d}", CLAIM_UIDS[0]))
        .collect();
    for id in &ids {
        assert!(notes.contains(id.as_str()), "{notes}");
    }
    let injected = check_with_cncf_library(dir.path(), &file, emitted["cdiVersion"].as_str().unwrap(), &ids);
    let mig_nodes = &injected[0].1;
    assert!(mig_nodes.contains(&("/dev/nvidia0".to_string(), 195, 0)), "{mig_nodes:?}");
    assert_eq!(mig_nodes.iter().filter(|(p, _, _)| p.starts_with("/dev/nvidia-caps/nvidia-cap")).count(), 2);
    assert!(injected[1].1.contains(&("/dev/nvidia3".to_string(), 195, 3)));
}

#[test]
fn the_library_rejects_what_it_should() {
    // Guard against a vacuous check: a spec claiming too low a version, and
    // one with an unknown field, are refused by the same calls used above.
    let dir = tempfile::tempdir().unwrap();
    let low = r#"{"cdiVersion":"0.3.0","kind":"k8s.gpu.nvidia.com/claim","devices":[{"name":"0b4f-gpu-0","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia0","type":"c","major":195,"minor":0}]}}]}"#;
    let file = dir.path().join("low.json");
    std::fs::write(&file, low).unwrap();
    let err = read_spec(&file, 0).unwrap_err();
    assert!(format!("{err:#}").contains("at least v0.5.0"), "{err:#}");
    let unknown = low.replace("\"major\"", "\"majr\"").replace("0.3.0", "0.5.0");
    std::fs::write(&file, unknown).unwrap();
    assert!(read_spec(&file, 0).is_err());
}

/// `print-cdi` of claim `CLAIM_UIDS[1]` on the A100 node whose driver is
/// at `root`, mounted at `/run/nvidia/driver` on the host, with the hook at
/// `hook`; `extra` names the devices and the rest.
fn print_from_driver_root(root: &Path, hook: &str, extra: &[&str]) -> String {
    let mut flags = vec![
        "--driver-root",
        root.to_str().unwrap(),
        "--host-driver-root",
        "/run/nvidia/driver",
        "--nvidia-cdi-hook-path",
        hook,
        "--claim-uid",
        CLAIM_UIDS[1],
    ];
    flags.extend(extra);
    stdout_ok(&print_cdi_a100(&flags))
}

/// A claim's spec for a node whose driver is installed at a (fake) driver
/// root: `print-cdi --driver-root` gives it, the CNCF library injects it,
/// and the container gets exactly the driver's files, read-only, and the
/// two `nvidia-cdi-hook` hooks.
#[test]
fn driver_root_files_reach_the_container_through_the_cncf_library() {
    use gpu_dra_driver::driver_root::fake_tree::{self, LIBDIR};
    let version = "570.172.08"; // a100-mig.yaml's driverVersion
    let root = tempfile::tempdir().unwrap();
    fake_tree::build(
        root.path(),
        version,
        &[
            ("libcuda.so", "libcuda.so.1"),
            ("libnvidia-ml.so", "libnvidia-ml.so.1"),
            ("libnvidia-ptxjitcompiler.so", "libnvidia-ptxjitcompiler.so.1"),
        ],
    )
    .unwrap();
    let hook = "/var/lib/kubelet/plugins/gpu.nvidia.com/nvidia-cdi-hook";
    let print = |device: &str| print_from_driver_root(root.path(), hook, &["--device", device]);
    let files: Vec<String> = [
        format!("/{LIBDIR}/libcuda.so.{version}"),
        format!("/{LIBDIR}/libnvidia-ml.so.{version}"),
        format!("/{LIBDIR}/libnvidia-ptxjitcompiler.so.{version}"),
        format!("/lib/firmware/nvidia/{version}/gsp_ga10x.bin"),
        format!("/lib/firmware/nvidia/{version}/gsp_tu10x.bin"),
        "/usr/bin/nvidia-smi".to_string(),
        "/usr/bin/nvidia-cuda-mps-control".to_string(),
        "/run/nvidia-persistenced/socket".to_string(),
    ]
    .to_vec();
    for device in ["gpu-3", "gpu-0-mig-1g10gb-19-3"] {
        let dir = tempfile::tempdir().unwrap();
        let json = print(device);
        let file = dir.path().join(format!("k8s.gpu.nvidia.com-claim_{}.json", CLAIM_UIDS[1]));
        std::fs::write(&file, &json).unwrap();
        let emitted: serde_json::Value = serde_json::from_str(&json).unwrap();
        let id = format!("k8s.gpu.nvidia.com/claim={}-{device}", CLAIM_UIDS[1]);
        let cdi_version = emitted["cdiVersion"].as_str().unwrap();
        check_with_cncf_library(dir.path(), &file, cdi_version, std::slice::from_ref(&id));
        let cache = new_cache(vec![with_spec_dirs(&[dir.path().to_str().unwrap()])]);
        let mut oci = oci_spec::runtime::Spec::default();
        oci.set_mounts(Some(Vec::new()));
        cache.lock().unwrap().inject_devices(Some(&mut oci), vec![id.clone()]).unwrap();
        let mounts: Vec<(String, String, Vec<String>)> = oci
            .mounts()
            .clone()
            .unwrap_or_default()
            .iter()
            .map(|m| {
                let source = m.source().as_ref().map(|p| p.display().to_string()).unwrap_or_default();
                (source, m.destination().display().to_string(), m.options().clone().unwrap_or_default())
            })
            .collect();
        let expected: Vec<(String, String, Vec<String>)> = files
            .iter()
            .map(|f| {
                (
                    format!("/run/nvidia/driver{f}"),
                    f.clone(),
                    ["ro", "nosuid", "nodev", "bind"].map(String::from).to_vec(),
                )
            })
            .collect();
        let mut got = mounts.clone();
        got.sort();
        let mut want = expected.clone();
        want.sort();
        assert_eq!(got, want, "{device}: exactly the driver's files, read-only, from the host's driver root");
        let hooks = oci.hooks().clone().expect("hooks");
        let create: Vec<Vec<String>> = hooks
            .create_container()
            .clone()
            .unwrap_or_default()
            .iter()
            .map(|h| h.args().clone().unwrap_or_default())
            .collect();
        let d = format!("/{LIBDIR}");
        assert_eq!(
            create,
            [
                vec![
                    "nvidia-cdi-hook".to_string(),
                    "create-symlinks".into(),
                    "--link".into(),
                    format!("libcuda.so.{version}::{d}/libcuda.so.1"),
                    "--link".into(),
                    format!("libcuda.so.1::{d}/libcuda.so"),
                    "--link".into(),
                    format!("libnvidia-ml.so.{version}::{d}/libnvidia-ml.so.1"),
                    "--link".into(),
                    format!("libnvidia-ml.so.1::{d}/libnvidia-ml.so"),
                    "--link".into(),
                    format!("libnvidia-ptxjitcompiler.so.{version}::{d}/libnvidia-ptxjitcompiler.so.1"),
                    "--link".into(),
                    format!("libnvidia-ptxjitcompiler.so.1::{d}/libnvidia-ptxjitcompiler.so"),
                ],
                vec![
                    "nvidia-cdi-hook".to_string(),
                    "enable-cuda-compat".into(),
                    format!("--host-driver-version={version}"),
                ],
                vec!["nvidia-cdi-hook".to_string(), "update-ldcache".into(), "--folder".into(), d.clone()],
            ],
            "{device}"
        );
    }
}

/// Mounts and create-container hook arguments the CNCF library injects
/// for CDI device `id` of the spec in `json`.
fn injected(json: &str, id: &str) -> (Vec<(String, String)>, Vec<Vec<String>>) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(format!("k8s.gpu.nvidia.com-claim_{}.json", CLAIM_UIDS[1]));
    std::fs::write(&file, json).unwrap();
    let emitted: serde_json::Value = serde_json::from_str(json).unwrap();
    check_with_cncf_library(dir.path(), &file, emitted["cdiVersion"].as_str().unwrap(), &[id.to_string()]);
    let cache = new_cache(vec![with_spec_dirs(&[dir.path().to_str().unwrap()])]);
    let mut oci = oci_spec::runtime::Spec::default();
    oci.set_mounts(Some(Vec::new()));
    cache.lock().unwrap().inject_devices(Some(&mut oci), vec![id.to_string()]).unwrap();
    let mounts = oci
        .mounts()
        .clone()
        .unwrap_or_default()
        .iter()
        .map(|m| {
            (
                m.source().as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                m.destination().display().to_string(),
            )
        })
        .collect();
    let hooks = oci.hooks().clone().and_then(|h| h.create_container().clone()).unwrap_or_default();
    (mounts, hooks.iter().map(|h| h.args().clone().unwrap_or_default()).collect())
}

/// A root with the video and graphics sets and a CUDA `compat/`
/// directory: the container gets what NVIDIA's toolkit gives for it
/// (every library of the driver version, the EGL/Vulkan/OpenCL files where
/// its loaders look, X.Org's modules) and the forward-compatibility hook;
/// `--driver-capabilities` narrows the sets and `--disable-cdi-hooks`
/// leaves a hook out.
#[test]
fn video_graphics_and_cuda_compat_reach_the_container_as_nvidia_gives_them() {
    use gpu_dra_driver::driver_root::fake_tree::{self, LIBDIR};
    let version = "570.172.08";
    let root = tempfile::tempdir().unwrap();
    fake_tree::build_complete(root.path(), version).unwrap();
    let id = format!("k8s.gpu.nvidia.com/claim={}-gpu-3", CLAIM_UIDS[1]);
    let print = |extra: &[&str]| {
        print_from_driver_root(root.path(), "/usr/bin/nvidia-cdi-hook", &[&["--device", "gpu-3"], extra].concat())
    };
    let d = format!("/{LIBDIR}");
    let (mounts, hooks) = injected(&print(&[]), &id);
    for container in [
        format!("{d}/libnvcuvid.so.{version}"),
        format!("{d}/libnvidia-encode.so.{version}"),
        format!("{d}/vdpau/libvdpau_nvidia.so.{version}"),
        format!("{d}/libGLX_nvidia.so.{version}"),
        format!("{d}/libnvidia-egl-wayland.so.1.1.19"),
        "/usr/share/glvnd/egl_vendor.d/10_nvidia.json".to_string(),
        "/etc/vulkan/icd.d/nvidia_icd.json".to_string(),
        "/etc/OpenCL/vendors/nvidia.icd".to_string(),
        "/usr/lib/xorg/modules/drivers/nvidia_drv.so".to_string(),
    ] {
        let mount = mounts.iter().find(|(_, c)| *c == container);
        let (source, _) = mount.unwrap_or_else(|| panic!("{container} not injected: {mounts:#?}"));
        assert!(source.starts_with("/run/nvidia/driver/"), "{source}: the host's view of the driver root");
    }
    assert!(!mounts.iter().any(|(s, _)| s.contains("/compat/")), "the image's compat libraries stay the image's");
    let names: Vec<&str> = hooks.iter().map(|h| h[1].as_str()).collect();
    assert_eq!(names, ["create-symlinks", "enable-cuda-compat", "update-ldcache"]);
    assert_eq!(hooks[1][2], format!("--host-driver-version={version}"));
    assert!(hooks[2].contains(&format!("{d}/vdpau")), "VDPAU's directory in the ld cache: {:?}", hooks[2]);

    let (mounts, hooks) = injected(
        &print(&["--driver-capabilities", "compute,utility", "--disable-cdi-hooks", "enable-cuda-compat"]),
        &id,
    );
    assert!(mounts.iter().any(|(_, c)| *c == format!("{d}/libcuda.so.{version}")));
    assert!(
        !mounts.iter().any(|(_, c)| c.contains("nvcuvid") || c.contains("GLX") || c.contains("vulkan")),
        "{mounts:#?}"
    );
    assert!(hooks.iter().all(|h| h[1] != "enable-cuda-compat"), "{hooks:?}");

    let out = print_cdi_a100(&["--driver-capabilities", "display", "--claim-uid", CLAIM_UIDS[1], "--device", "gpu-3"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("driver capability \"display\" is unknown"), "{stderr}");
}

#[test]
fn a_driver_root_without_libcuda_stops_print_cdi_with_the_fix() {
    let root = tempfile::tempdir().unwrap();
    let out = print_cdi_a100(&[
        "--driver-root",
        root.path().to_str().unwrap(),
        "--claim-uid",
        CLAIM_UIDS[1],
        "--device",
        "gpu-3",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("libcuda.so") && err.contains(&*root.path().to_string_lossy()) && err.contains("--driver-root"),
        "{err}"
    );
}
