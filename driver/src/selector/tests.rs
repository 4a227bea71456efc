use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use super::*;

const DRIVER: &str = "gpu.nvidia.com";

fn attr_string(s: &str) -> DeviceAttribute {
    DeviceAttribute { string: Some(s.to_owned()), ..Default::default() }
}

fn h100() -> Device {
    let mut attributes = BTreeMap::new();
    attributes.insert("productName".to_owned(), attr_string("H100"));
    attributes.insert("index".to_owned(), DeviceAttribute { int: Some(3), ..Default::default() });
    attributes.insert("mig".to_owned(), DeviceAttribute { bool: Some(false), ..Default::default() });
    attributes.insert(
        "driverVersion".to_owned(),
        DeviceAttribute { version: Some("550.54.15".to_owned()), ..Default::default() },
    );
    attributes.insert("resource.kubernetes.io/pcieRoot".to_owned(), attr_string("pci0000:00"));
    let mut capacity = BTreeMap::new();
    capacity
        .insert("memory".to_owned(), DeviceCapacity { value: K8sQuantity("80Gi".to_owned()), ..Default::default() });
    capacity.insert(
        "example.com/slots".to_owned(),
        DeviceCapacity { value: K8sQuantity("4".to_owned()), ..Default::default() },
    );
    Device { name: "gpu-0".to_owned(), attributes: Some(attributes), capacity: Some(capacity), ..Default::default() }
}

fn eval(expression: &str) -> Result<bool, String> {
    let env = SelectorEnv::new();
    let device = CelDevice::new(DRIVER, &h100()).map_err(|e| e.to_string())?;
    let compiled = env.compile(expression).map_err(|e| format!("compile: {e}"))?;
    compiled.matches(&device).map_err(|e| e.to_string())
}

fn holds(expression: &str) {
    assert_eq!(eval(expression), Ok(true), "{expression}");
}

#[test]
fn driver_attributes_and_capacity() {
    holds(r#"device.driver == "gpu.nvidia.com""#);
    holds(r#"device.attributes["gpu.nvidia.com"].productName == "H100""#);
    holds(r#"device.attributes["gpu.nvidia.com"].index == 3 && !device.attributes["gpu.nvidia.com"].mig"#);
    holds(r#"device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00""#);
    holds(r#"device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("40Gi"))"#);
    holds(r#"device.capacity["example.com"].slots == quantity("4")"#);
    holds("!device.allowMultipleAllocations");
}
