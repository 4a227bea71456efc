//! `gpu-kubelet-plugin print-slices` on every example inventory and on large
//! generated nodes: the slices satisfy the apiserver's rules, as checked by
//! our validator in-process and by `gpu-dra-controller validate-slices` in
//! another process.

use std::collections::BTreeSet;
use std::path::Path;

use gpu_dra_driver::slices::validate_slice;
use integration_tests::{controller, example_inventories, kubelet_plugin, run, stdout_ok};
use k8s_openapi::api::resource::v1::ResourceSlice;

fn print_slices(inventory: &Path, node: &str, format: &str) -> String {
    let out = run(
        kubelet_plugin(),
        &["print-slices", "--node-name", node, "--fake-inventory", inventory.to_str().unwrap(), "-o", format],
        None,
    );
    stdout_ok(&out)
}

fn slices_from_json(json: &str) -> Vec<ResourceSlice> {
    let list: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(list["kind"], "List");
    serde_json::from_value(list["items"].clone()).unwrap()
}

/// Invariants of one node's pool, on top of per-slice validity.
fn check_pool(slices: &[ResourceSlice], node: &str) {
    assert!(!slices.is_empty());
    let mut names = BTreeSet::new();
    for s in slices {
        let errors = validate_slice(s);
        assert!(errors.is_empty(), "{:?}: {errors:?}", s.metadata.name);
        assert_eq!(s.spec.driver, "gpu.nvidia.com");
        assert_eq!(s.spec.node_name.as_deref(), Some(node));
        assert_eq!(s.spec.pool.name, node);
        assert_eq!(s.spec.pool.generation, slices[0].spec.pool.generation);
        assert_eq!(s.spec.pool.resource_slice_count, slices.len() as i64);
        for d in s.spec.devices.iter().flatten() {
            assert!(names.insert(d.name.clone()), "device {} appears twice in the pool", d.name);
        }
    }
}

fn validate_in_other_process(yaml: &str) {
    let out = run(controller(), &["validate-slices", "-f", "-"], Some(yaml.as_bytes()));
    let report = stdout_ok(&out);
    assert!(!report.is_empty() && report.lines().all(|l| l.ends_with(": valid")), "{report}");
}

fn devices(slices: &[ResourceSlice]) -> Vec<&k8s_openapi::api::resource::v1::Device> {
    slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).collect()
}

fn attr<'a>(
    d: &'a k8s_openapi::api::resource::v1::Device,
    key: &str,
) -> Option<&'a k8s_openapi::api::resource::v1::DeviceAttribute> {
    d.attributes.as_ref().and_then(|a| a.get(key))
}

#[test]
fn every_example_inventory_gives_valid_slices() {
    let examples = example_inventories();
    assert!(examples.len() >= 4, "{examples:?}");
    for inventory in examples {
        let slices = slices_from_json(&print_slices(&inventory, "node-a", "json"));
        check_pool(&slices, "node-a");
        let yaml = print_slices(&inventory, "node-a", "yaml");
        let from_yaml: Vec<ResourceSlice> = serde_yaml_ng::Deserializer::from_str(&yaml)
            .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
            .collect();
        assert_eq!(from_yaml, slices, "{}: YAML and JSON outputs agree", inventory.display());
        validate_in_other_process(&yaml);
    }
}

fn example(name: &str) -> std::path::PathBuf {
    integration_tests::workspace_root().join("examples/inventories").join(name)
}

#[test]
fn dgx_h100_is_one_nvlink_group_of_eight() {
    let slices = slices_from_json(&print_slices(&example("dgx-h100.yaml"), "dgx-1", "json"));
    let devs = devices(&slices);
    assert_eq!(
        devs.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
        (0..8).map(|i| format!("gpu-{i}")).collect::<Vec<_>>()
    );
    for d in &devs {
        assert_eq!(attr(d, "type").unwrap().string.as_deref(), Some("gpu"));
        assert_eq!(attr(d, "nvlinkGroup").unwrap().int, Some(0));
        assert_eq!(attr(d, "productName").unwrap().string.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(d.capacity.as_ref().unwrap()["memory"].value.0, "80Gi");
    }
}

#[test]
fn a100_mig_node_publishes_instances_not_partitioned_gpus() {
    let slices = slices_from_json(&print_slices(&example("a100-mig.yaml"), "node-a", "json"));
    let devs = devices(&slices);
    let migs: Vec<_> = devs.iter().filter(|d| attr(d, "type").unwrap().string.as_deref() == Some("mig")).collect();
    let gpus: Vec<_> = devs
        .iter()
        .filter(|d| attr(d, "type").unwrap().string.as_deref() == Some("gpu"))
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(migs.len(), 10);
    assert_eq!(gpus, ["gpu-2", "gpu-3"]);
    let names: BTreeSet<_> = migs.iter().map(|d| d.name.as_str()).collect();
    assert!(names.contains("gpu-1-mig-3g40gb-9-0") && names.contains("gpu-1-mig-1g10gb-19-6"), "{names:?}");
}

#[test]
fn pcie_pairs_and_gb200_clique() {
    let slices = slices_from_json(&print_slices(&example("pcie-nvlink-pairs.yaml"), "node-a", "json"));
    let groups: Vec<_> = devices(&slices).iter().map(|d| attr(d, "nvlinkGroup").unwrap().int.unwrap()).collect();
    assert_eq!(groups, [0, 0, 2, 2]);

    let slices = slices_from_json(&print_slices(&example("gb200-clique.yaml"), "node-a", "json"));
    for d in devices(&slices) {
        assert_eq!(attr(d, "cliqueID").unwrap().string.as_deref(), Some("9b3e4c1a-0d2f-4e5b-8a6c-7d9e0f1a2b3c.1"));
        assert_eq!(attr(d, "architecture").unwrap().string.as_deref(), Some("Blackwell"));
    }
}

#[test]
fn faults_taint_devices() {
    let slices = slices_from_json(&print_slices(&example("faulty-node.yaml"), "node-a", "json"));
    let taints = |name: &str| {
        devices(&slices)
            .into_iter()
            .find(|d| d.name == name)
            .unwrap_or_else(|| panic!("no device {name}"))
            .taints
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|t| format!("{}={}:{}", t.key, t.value.unwrap_or_default(), t.effect))
            .collect::<Vec<_>>()
    };
    assert_eq!(taints("gpu-1"), Vec::<String>::new());
    assert_eq!(taints("gpu-2"), ["gpu.nvidia.com/xid=79:NoSchedule"]);
    assert_eq!(taints("gpu-3"), ["gpu.nvidia.com/gpu-lost=:NoExecute"]);
    assert_eq!(taints("gpu-0-mig-3g40gb-9-4"), ["gpu.nvidia.com/xid=94:NoSchedule"]);
    assert_eq!(taints("gpu-0-mig-3g40gb-9-0"), Vec::<String>::new());
}

fn write_inventory(dir: &Path, yaml: &str) -> std::path::PathBuf {
    let path = dir.join("inventory.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

#[test]
fn more_than_128_devices_split_into_several_slices() {
    let dir = tempfile::tempdir().unwrap();
    let inventory = write_inventory(dir.path(), "gpus: [{model: H100-80GB, count: 200}]\n");
    let slices = slices_from_json(&print_slices(&inventory, "big-node", "json"));
    check_pool(&slices, "big-node");
    let sizes: Vec<usize> = slices.iter().map(|s| s.spec.devices.as_ref().unwrap().len()).collect();
    assert_eq!(sizes, [128, 72]);
    validate_in_other_process(&print_slices(&inventory, "big-node", "yaml"));
}

#[test]
fn taints_lower_the_split_to_64() {
    // 30 A100s fully partitioned into 7 x 1g.10gb = 210 devices, one tainted.
    let dir = tempfile::tempdir().unwrap();
    let inventory = write_inventory(
        dir.path(),
        "gpus: [{model: A100-SXM4-80GB, count: 30, mig: [{instances: [1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb]}], faults: [{gpu: 29, xid: 48}]}]\n",
    );
    let slices = slices_from_json(&print_slices(&inventory, "mig-node", "json"));
    check_pool(&slices, "mig-node");
    let sizes: Vec<usize> = slices.iter().map(|s| s.spec.devices.as_ref().unwrap().len()).collect();
    assert_eq!(sizes, [64, 64, 64, 18]);
    validate_in_other_process(&print_slices(&inventory, "mig-node", "yaml"));
}

#[test]
fn generation_and_driver_name_flags() {
    let out = run(
        kubelet_plugin(),
        &[
            "print-slices",
            "--node-name",
            "n1",
            "--fake-inventory",
            example("dgx-h100.yaml").to_str().unwrap(),
            "-o",
            "json",
            "--generation",
            "7",
            "--driver-name",
            "gpu.example.com",
        ],
        None,
    );
    let slices = slices_from_json(&stdout_ok(&out));
    assert_eq!(slices[0].spec.pool.generation, 7);
    assert_eq!(slices[0].spec.driver, "gpu.example.com");
}

/// Without a fake inventory, NVML comes from the driver root's
/// `libnvidia-ml` (found through its ld.so.cache), not the loader's search:
/// here a library without NVML's symbols, so the error names that file.
#[test]
fn nvml_is_loaded_from_the_driver_root() {
    use gpu_dra_driver::driver_root::fake_tree::{self, LIBDIR};
    let root = tempfile::tempdir().unwrap();
    fake_tree::build(
        root.path(),
        "580.82.07",
        &[("libcuda.so", "libcuda.so.1"), ("libnvidia-ml.so", "libnvidia-ml.so.1")],
    )
    .unwrap();
    let out = integration_tests::run(
        integration_tests::kubelet_plugin(),
        &["print-slices", "--node-name", "node-a", "--driver-root", root.path().to_str().unwrap()],
        None,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let library = root.path().join(format!("{LIBDIR}/libnvidia-ml.so.580.82.07"));
    assert!(err.contains(&*library.to_string_lossy()) && err.contains("nvmlInit_v2"), "{err}");
}

/// `--feature-gates` (or `FEATURE_GATES`) shows what a gate changes:
/// with ConsumableCapacity every whole GPU of every example is published
/// shareable, with valid request policies; MIG devices are unchanged.
#[test]
fn consumable_capacity_shows_shareable_gpus_in_every_example() {
    for inventory in example_inventories() {
        let path = inventory.to_str().unwrap();
        let gated = |gates: &str| {
            let args = ["print-slices", "--node-name", "node-a", "--fake-inventory", path, "-o", "json"];
            let mut all = args.to_vec();
            all.extend(["--feature-gates", gates]);
            slices_from_json(&stdout_ok(&run(kubelet_plugin(), &all, None)))
        };
        let plain = gated("");
        let shared = gated("ConsumableCapacity=true");
        check_pool(&shared, "node-a");
        let yaml = print_slices_with_env(&inventory, "ConsumableCapacity=true");
        validate_in_other_process(&yaml);
        for (before, after) in devices(&plain).into_iter().zip(devices(&shared)) {
            let whole_gpu = attr(before, "type").and_then(|a| a.string.as_deref()) == Some("gpu");
            if !whole_gpu {
                assert_eq!(before, after, "{}: {} unchanged", inventory.display(), before.name);
                continue;
            }
            assert_eq!(after.allow_multiple_allocations, Some(true), "{}: {}", inventory.display(), after.name);
            let caps = after.capacity.as_ref().unwrap();
            let memory = caps["memory"].request_policy.as_ref().unwrap();
            assert_eq!(memory.valid_range.as_ref().unwrap().step.as_ref().unwrap().0, "1Gi");
            assert_eq!(caps["smPercent"].value.0, "100");
        }
    }
}

/// `print-slices -o yaml` with the gates from `FEATURE_GATES`.
fn print_slices_with_env(inventory: &Path, gates: &str) -> String {
    let out = std::process::Command::new(kubelet_plugin())
        .args(["print-slices", "--node-name", "node-a", "--fake-inventory", inventory.to_str().unwrap()])
        .env("FEATURE_GATES", gates)
        .output()
        .unwrap();
    let yaml = stdout_ok(&out);
    assert!(yaml.contains("allowMultipleAllocations: true"), "{yaml}");
    yaml
}

/// NVIDIA's `ConsumableShares` with `--consumable-shares 4`: every GPU and
/// MIG device of every example carries four shares and valid request
/// policies; the mode without the gate, or the gate without a mode, is
/// refused naming the other.
#[test]
fn nvidia_consumable_shares_publish_every_device_with_n_shares() {
    for inventory in example_inventories() {
        let path = inventory.to_str().unwrap();
        let args = ["print-slices", "--node-name", "node-a", "--fake-inventory", path, "-o", "json"];
        let mut shared = args.to_vec();
        shared.extend(["--feature-gates", "ConsumableShares=true", "--consumable-shares", "4"]);
        let slices = slices_from_json(&stdout_ok(&run(kubelet_plugin(), &shared, None)));
        check_pool(&slices, "node-a");
        for device in devices(&slices) {
            assert_eq!(device.allow_multiple_allocations, Some(true), "{}: {}", inventory.display(), device.name);
            let caps = device.capacity.as_ref().unwrap();
            assert_eq!(caps["shares"].value.0, "4", "{}: {}", inventory.display(), device.name);
            assert_eq!(caps["memory"].request_policy.as_ref().unwrap().default.as_ref().unwrap().0, "0");
        }
    }
    let path = example("dgx-h100.yaml");
    let base = ["print-slices", "--node-name", "node-a", "--fake-inventory", path.to_str().unwrap()];
    let refused = |extra: &[&str]| {
        let mut all = base.to_vec();
        all.extend(extra);
        let out = run(kubelet_plugin(), &all, None);
        assert!(!out.status.success(), "{extra:?} accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = refused(&["--consumable-shares", "memory"]);
    assert!(err.contains("--consumable-shares memory needs --feature-gates ConsumableShares=true"), "{err}");
    let err = refused(&["--feature-gates", "ConsumableShares=true"]);
    assert!(err.contains("set --consumable-shares to memory, unlimited or a number"), "{err}");
    let err = refused(&["--consumable-shares", "many"]);
    assert!(err.contains("\"many\" is not a mode"), "{err}");
}
