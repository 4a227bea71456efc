//! The subset of the CDI spec (github.com/cncf-tags/container-device-interface,
//! `specs-go/config.go`) that our specs use, as plain serde types.

use serde::Serialize;

/// A CDI spec file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<Device>,
    #[serde(skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

/// One named device of a spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    /// Required by the schema even when empty.
    pub container_edits: ContainerEdits,
}

/// Changes a runtime makes to a container for a device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
}

impl ContainerEdits {
    pub fn is_empty(&self) -> bool {
        self.env.is_empty() && self.device_nodes.is_empty() && self.mounts.is_empty() && self.hooks.is_empty()
    }
}

/// A bind mount the runtime adds to the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    /// Never set by us: a `type` needs CDI 0.4.0.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub mount_type: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// An OCI hook the runtime runs for the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    pub hook_name: String,
    pub path: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
}

/// A device node the runtime creates in the container.
///
/// We give `type`, `major` and `minor` wherever we know them: a node
/// "minimally specified" this way is created without the runtime stat-ing
/// the host path, so a spec stays injectable even before the host's `/dev`
/// entry appears. A VFIO group's node has a minor the kernel hands out when
/// the group appears, so it is given by path alone ([`DeviceNode::from_host`]):
/// the CDI spec lets the runtime take type, major and minor from the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    pub path: String,
    #[serde(rename = "type", skip_serializing_if = "String::is_empty")]
    pub node_type: String,
    /// Negative: not given (the runtime stats the host path).
    #[serde(skip_serializing_if = "not_given")]
    pub major: i64,
    #[serde(skip_serializing_if = "not_given")]
    pub minor: i64,
}

fn not_given(n: &i64) -> bool {
    *n < 0
}

impl DeviceNode {
    /// A character device.
    pub fn char(path: impl Into<String>, major: u32, minor: u32) -> Self {
        Self { path: path.into(), node_type: "c".into(), major: major.into(), minor: minor.into() }
    }

    /// A node the runtime describes from the host's file at `path`.
    pub fn from_host(path: impl Into<String>) -> Self {
        Self { path: path.into(), node_type: String::new(), major: -1, minor: -1 }
    }
}

/// The lowest CDI version that can express `spec`, following the reference
/// library's rules (`specs-go/version.go`, and the Rust crate's
/// `version.rs`) for the fields we emit: a dot in the class needs 0.6.0,
/// device names starting with a digit need 0.5.0, a mount with a `type`
/// needs 0.4.0; hooks and mount options are valid from 0.3.0, like the
/// rest. Older runtimes accept only old versions, so we never claim more
/// than we need.
pub fn minimum_version(spec: &Spec) -> &'static str {
    let class = spec.kind.split_once('/').map_or("", |(_, class)| class);
    if class.contains('.') {
        return "0.6.0";
    }
    if spec.devices.iter().any(|d| d.name.starts_with(|c: char| c.is_ascii_digit())) {
        return "0.5.0";
    }
    let edits = spec.devices.iter().map(|d| &d.container_edits).chain([&spec.container_edits]);
    if edits.flat_map(|e| &e.mounts).any(|m| m.mount_type.as_deref().is_some_and(|t| !t.is_empty())) {
        return "0.4.0";
    }
    "0.3.0"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape_is_pinned() {
        let spec = Spec {
            cdi_version: "0.5.0".into(),
            kind: "k8s.gpu.nvidia.com/claim".into(),
            devices: vec![Device {
                name: "1b2c-gpu-0".into(),
                container_edits: ContainerEdits {
                    device_nodes: vec![DeviceNode::char("/dev/nvidia0", 195, 0)],
                    ..Default::default()
                },
            }],
            container_edits: ContainerEdits { env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()], ..Default::default() },
        };
        assert_eq!(
            serde_json::to_string(&spec).unwrap(),
            r#"{"cdiVersion":"0.5.0","kind":"k8s.gpu.nvidia.com/claim","devices":[{"name":"1b2c-gpu-0","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia0","type":"c","major":195,"minor":0}]}}],"containerEdits":{"env":["NVIDIA_VISIBLE_DEVICES=void"]}}"#
        );
    }

    #[test]
    fn minimum_versions() {
        let mut spec = Spec {
            cdi_version: String::new(),
            kind: "vendor.com/claim".into(),
            devices: vec![],
            container_edits: ContainerEdits::default(),
        };
        assert_eq!(minimum_version(&spec), "0.3.0");
        spec.devices.push(Device { name: "a-gpu-0".into(), container_edits: ContainerEdits::default() });
        assert_eq!(minimum_version(&spec), "0.3.0");
        spec.devices.push(Device { name: "0a-gpu-0".into(), container_edits: ContainerEdits::default() });
        assert_eq!(minimum_version(&spec), "0.5.0");
        spec.kind = "vendor.com/my.class".into();
        assert_eq!(minimum_version(&spec), "0.6.0");
        spec.kind = "vendor.com/claim".into();
        spec.devices.pop();
        let mount = |t: Option<&str>| Mount {
            host_path: "/a".into(),
            container_path: "/a".into(),
            mount_type: t.map(Into::into),
            options: vec!["ro".into()],
        };
        spec.container_edits.mounts.push(mount(None));
        spec.container_edits.hooks.push(Hook { hook_name: "createContainer".into(), path: "/h".into(), args: vec![] });
        assert_eq!(minimum_version(&spec), "0.3.0", "options and hooks are 0.3.0");
        spec.devices[0].container_edits.mounts.push(mount(Some("bind")));
        assert_eq!(minimum_version(&spec), "0.4.0");
    }
}
