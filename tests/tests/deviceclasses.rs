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
        assert!(expr.contains("device.driver == 'gpu.nvidia.com'"), "{expr}");
        let wanted_type = if name == "gpu.nvidia.com" { "'gpu'" } else { "'mig'" };
        assert!(expr.contains(&format!(".type == {wanted_type}")), "{expr}");
        seen.push(name);
    }
    seen.sort();
    assert_eq!(seen, ["gpu.nvidia.com", "mig.nvidia.com"]);
}
