//! The shipped DeviceClasses are valid `resource.k8s.io/v1` objects whose
//! selectors name our driver and the `type` values our slices publish.

use integration_tests::workspace_root;
use k8s_openapi::api::resource::v1::DeviceClass;

#[test]
fn shipped_classes_parse_and_match_published_types() {
    let dir = workspace_root().join("deviceclasses");
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let class: DeviceClass = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let name = class.metadata.name.clone().unwrap();
        assert_eq!(path.file_stem().unwrap().to_str(), Some(name.as_str()), "file named after the class");
        let selectors = class.spec.unwrap().selectors.unwrap();
        let expr = &selectors[0].cel.as_ref().unwrap().expression;
        let (driver, wanted_type) = match name.as_str() {
            "gpu.nvidia.com" => ("gpu.nvidia.com", "'gpu'"),
            "compute-domain-daemon.nvidia.com" => ("compute-domain.nvidia.com", "'daemon'"),
            "compute-domain-default-channel.nvidia.com" => ("compute-domain.nvidia.com", "'channel'"),
            "vfio.gpu.nvidia.com" => ("gpu.nvidia.com", "'vfio'"),
            _ => ("gpu.nvidia.com", "'mig'"),
        };
        assert!(expr.contains(&format!("device.driver == '{driver}'")), "{expr}");
        assert!(expr.contains(&format!(".type == {wanted_type}")), "{expr}");
        seen.push(name);
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            "compute-domain-daemon.nvidia.com",
            "compute-domain-default-channel.nvidia.com",
            "gpu.nvidia.com",
            "mig.nvidia.com",
            "vfio.gpu.nvidia.com"
        ]
    );
}

/// The narrower classes an admin might add (`deviceclasses/narrower/`,
/// documented in its README) select what their names say, evaluated with
/// the driver's CEL on what the example inventories publish.
#[test]
fn narrower_classes_select_what_they_say() {
    use dra_cel::{CelDevice, SelectorEnv};
    use integration_tests::{kubelet_plugin, run, stdout_ok};
    use k8s_openapi::api::resource::v1::{Device, ResourceSlice};

    let env = SelectorEnv::new();
    let root = workspace_root();
    let mut devices: Vec<Device> = Vec::new();
    for entry in std::fs::read_dir(root.join("examples/inventories")).unwrap() {
        let path = entry.unwrap().path();
        let out = run(
            kubelet_plugin(),
            &["print-slices", "--node-name", "n", "--fake-inventory", path.to_str().unwrap(), "-o", "json"],
            None,
        );
        let list: serde_json::Value = serde_json::from_str(&stdout_ok(&out)).unwrap();
        let slices: Vec<ResourceSlice> = serde_json::from_value(list["items"].clone()).unwrap();
        devices.extend(slices.into_iter().flat_map(|s| s.spec.devices.unwrap_or_default()));
    }
    let attribute = |d: &Device, key: &str| d.attributes.as_ref().and_then(|a| a.get(key)).cloned();
    let is_gpu = |d: &Device| attribute(d, "type").and_then(|a| a.string).as_deref() == Some("gpu");
    let memory_gib = |d: &Device| {
        let q = &d.capacity.as_ref().unwrap()["memory"].value.0;
        q.strip_suffix("Gi").and_then(|n| n.parse::<u64>().ok()).unwrap_or(0)
    };
    type Expected<'a> = Box<dyn Fn(&Device) -> bool + 'a>;
    let expectations: [(&str, Expected); 3] = [
        (
            "gpu-h100",
            Box::new(|d| is_gpu(d) && attribute(d, "productName").and_then(|a| a.string).unwrap().contains("H100")),
        ),
        ("gpu-40gi", Box::new(|d| is_gpu(d) && memory_gib(d) >= 40)),
        ("gpu-nvlink", Box::new(|d| is_gpu(d) && attribute(d, "nvlinkGroup").is_some())),
    ];
    for (name, expected) in expectations {
        let path = root.join(format!("deviceclasses/narrower/{name}.yaml"));
        let class: DeviceClass = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(class.metadata.name.as_deref(), Some(name));
        let expression = &class.spec.unwrap().selectors.unwrap()[0].cel.clone().unwrap().expression;
        let selector = env.compile(expression).unwrap_or_else(|e| panic!("{name}: {e}"));
        let (mut matched, mut refused) = (0, 0);
        for device in &devices {
            let cel = CelDevice::new("gpu.nvidia.com", device).unwrap();
            let matches = selector.matches(&cel).unwrap_or_else(|e| panic!("{name} on {}: {e}", device.name));
            assert_eq!(matches, expected(device), "{name} on {} ({:?})", device.name, device.attributes);
            if matches { matched += 1 } else { refused += 1 }
        }
        assert!(matched > 0 && refused > 0, "{name}: {matched} matched, {refused} refused: not a narrowing");
    }
}
