//! Per-claim CDI specs: how a prepared claim's devices reach its containers.
//!
//! Each prepared claim gets one transient spec of kind
//! `k8s.<driver>/claim` (NVIDIA's `k8s.gpu.nvidia.com/claim`), holding one
//! CDI device per allocated device named `<claimUID>-<deviceName>`. The
//! kubelet passes the qualified names to the runtime, which creates the
//! device nodes in the container.

pub mod spec;

use crate::driver_root::DriverFiles;
use crate::inventory::{Inventory, PublishedDevice};
use crate::names::{ClaimUid, DeviceName, DriverName};
pub use spec::{ContainerEdits, DeviceNode, Hook, Mount, Spec};

/// Options of the driver's file mounts: read-only, no setuid, no devices.
pub const DRIVER_MOUNT_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "bind"];

/// What every claim's spec adds from the node's driver installation (found
/// at start by [`crate::driver_root::discover`]): its files as read-only
/// bind mounts, `nvidia-cdi-hook` hooks that link sonames, enable CUDA's
/// forward compatibility and update the container's ld cache (NVIDIA's
/// order), and control devices such as `nvidia-modeset`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverEdits {
    pub mounts: Vec<Mount>,
    pub hooks: Vec<Hook>,
    pub device_nodes: Vec<DeviceNode>,
}

impl DriverEdits {
    /// Edits for `files`; without `hook` (the host path of
    /// `nvidia-cdi-hook`) the links and the ld cache are left to the image.
    pub fn new(files: &DriverFiles, hook: Option<&str>) -> Self {
        let mounts = files
            .mounts
            .iter()
            .map(|m| Mount {
                host_path: m.host_path.clone(),
                container_path: m.container_path.clone(),
                mount_type: None,
                options: DRIVER_MOUNT_OPTIONS.iter().map(|o| o.to_string()).collect(),
            })
            .collect();
        let mut hooks = Vec::new();
        if let Some(path) = hook {
            let hook = |args: Vec<String>| Hook { hook_name: "createContainer".into(), path: path.to_string(), args };
            if !files.links.is_empty() {
                let mut args = vec!["nvidia-cdi-hook".to_string(), "create-symlinks".to_string()];
                for (target, link) in &files.links {
                    args.push("--link".into());
                    args.push(format!("{target}::{link}"));
                }
                hooks.push(hook(args));
            }
            if let Some(version) = &files.cuda_compat_host_version {
                // CUDA forward compatibility: the hook links the image's
                // compat libraries (/usr/local/cuda/compat) first when
                // they are newer than the host's driver.
                hooks.push(hook(vec![
                    "nvidia-cdi-hook".into(),
                    "enable-cuda-compat".into(),
                    format!("--host-driver-version={version}"),
                ]));
            }
            if !files.library_dirs.is_empty() {
                let mut args = vec!["nvidia-cdi-hook".to_string(), "update-ldcache".to_string()];
                for dir in &files.library_dirs {
                    args.push("--folder".into());
                    args.push(dir.clone());
                }
                hooks.push(hook(args));
            }
        }
        let device_nodes = files
            .control_devices
            .iter()
            .map(|(path, minor)| DeviceNode::char(path.clone(), NVIDIA_MAJOR, *minor))
            .collect();
        DriverEdits { mounts, hooks, device_nodes }
    }

    /// The same edits without the hooks named in `disabled` (the
    /// `nvidia-cdi-hook` subcommand, e.g. `enable-cuda-compat`, for a
    /// node whose hook binary predates it).
    pub fn without_hooks(mut self, disabled: &[String]) -> Self {
        self.hooks.retain(|h| h.args.get(1).is_none_or(|name| !disabled.contains(name)));
        self
    }
}

/// The `nvidia-cdi-hook` subcommands specs may carry.
pub const HOOK_NAMES: &[&str] = &["create-symlinks", "enable-cuda-compat", "update-ldcache"];

/// `/dev/nvidia<minor>` and `/dev/nvidiactl` share this fixed major.
pub const NVIDIA_MAJOR: u32 = 195;
/// `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: u32 = 255;
/// CDI class of per-claim specs.
pub const CLAIM_CLASS: &str = "claim";
/// Tells the legacy NVIDIA container runtime hook to do nothing: the devices
/// come from CDI, not from its own device selection.
pub const VISIBLE_DEVICES_VOID: &str = "NVIDIA_VISIBLE_DEVICES=void";

/// A claim's spec with where to write it and the ids to hand the kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSpec {
    pub spec: Spec,
    /// `<vendor>-claim_<claimUID>.json`, the reference library's transient
    /// spec name, so tools like `cdi list` attribute it correctly.
    pub file_name: String,
    /// Fully qualified CDI device id for each requested device, in order.
    pub device_ids: Vec<(DeviceName, String)>,
}

impl ClaimSpec {
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec_pretty(&self.spec)
    }

    /// The CDI id of one device of the claim.
    pub fn device_id(&self, device: &DeviceName) -> Option<&str> {
        self.device_ids.iter().find(|(d, _)| d == device).map(|(_, id)| id.as_str())
    }
}

/// Why a claim's spec cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CdiError {
    #[error("device {0} is not on this node (not in its GPU inventory)")]
    UnknownDevice(DeviceName),
    #[error(
        "/proc/devices has no nvidia-uvm entry, so /dev/nvidia-uvm cannot be given to containers: load the nvidia-uvm kernel module (nvidia-modprobe -u -c=0)"
    )]
    UvmNotLoaded,
    #[error(
        "MIG device {0} needs /dev/nvidia-caps, but /proc/devices has no nvidia-caps entry: load the nvidia driver with MIG support"
    )]
    CapsNotLoaded(DeviceName),
    #[error(
        "MIG device {0} has no access capability in /proc/driver/nvidia-caps/mig-minors: check that the MIG instance still exists (nvidia-smi mig -lgi)"
    )]
    MissingMigCaps(DeviceName),
    /// A dynamic MIG device names a profile and placement, not an
    /// instance: prepare creates the instance and writes the spec for it.
    #[error("dynamic MIG device {0} has no MIG instance yet: the instance is created when the claim is prepared")]
    NotCreated(DeviceName),
    #[error("a claim needs at least one device")]
    NoDevices,
}

/// The VFIO container (the IOMMU API): `/dev/vfio/vfio`, misc device
/// 10:196 (`VFIO_MINOR` in the kernel's `include/linux/miscdevice.h`). It
/// grants nothing alone: a VM reaches a device only through its group's
/// node (Documentation/driver-api/vfio.rst).
pub const VFIO_CONTAINER: &str = "/dev/vfio/vfio";
const MISC_MAJOR: u32 = 10;
const VFIO_MINOR: u32 = 196;

/// `/dev/vfio/<group>`, the node the kernel makes for an IOMMU group once
/// every device of it is bound to a VFIO driver.
pub fn vfio_group_node(group: u32) -> String {
    format!("/dev/vfio/{group}")
}

/// CDI vendor of our specs: `k8s.<driver>`.
pub fn vendor(driver: &DriverName) -> String {
    format!("k8s.{driver}")
}

/// The file name of a claim's spec: `<vendor>-claim_<claimUID>.json`, the
/// reference library's transient spec name.
pub fn claim_spec_file_name(driver: &DriverName, claim: &ClaimUid) -> String {
    format!("{}-{CLAIM_CLASS}_{claim}.json", vendor(driver))
}

/// The file name NVIDIA's plugin gives a claim's spec:
/// `<vendor>-claim_<claimUID>.yaml` (`writeSpec` in their
/// `cmd/gpu-kubelet-plugin/cdi.go`), with the same kind and device names as
/// ours; kept for the claims our plugin adopts from theirs.
pub fn nvidia_claim_spec_file_name(driver: &DriverName, claim: &ClaimUid) -> String {
    format!("{}-{CLAIM_CLASS}_{claim}.yaml", vendor(driver))
}

/// The prefix shared by all claim spec file names of `driver`; start-up
/// uses it to find spec files no checkpoint record owns.
pub fn claim_spec_file_prefix(driver: &DriverName) -> String {
    format!("{}-{CLAIM_CLASS}_", vendor(driver))
}

/// Builds the spec that gives `devices` of `claim` to its containers.
pub fn claim_spec(
    driver: &DriverName,
    inventory: &Inventory,
    driver_edits: &DriverEdits,
    claim: &ClaimUid,
    devices: &[DeviceName],
) -> Result<ClaimSpec, CdiError> {
    if devices.is_empty() {
        return Err(CdiError::NoDevices);
    }
    let found: Vec<(&DeviceName, PublishedDevice<'_>)> = devices
        .iter()
        .map(|name| Ok((name, inventory.find_device(name).ok_or_else(|| CdiError::UnknownDevice(name.clone()))?)))
        .collect::<Result<_, CdiError>>()?;
    // A GPU passed through is bound to vfio-pci: it needs none of the
    // nvidia driver's devices, files or hooks.
    let nvidia = found.iter().any(|(_, d)| !matches!(d, PublishedDevice::Vfio(_)));
    let vfio = found.iter().any(|(_, d)| matches!(d, PublishedDevice::Vfio(_)));
    let uvm = if nvidia { Some(inventory.device_majors.nvidia_uvm.ok_or(CdiError::UvmNotLoaded)?) } else { None };
    let vendor = vendor(driver);
    let kind = format!("{vendor}/{CLAIM_CLASS}");
    let mut cdi_devices: Vec<spec::Device> = Vec::new();
    let mut device_ids = Vec::new();
    for (name, device) in &found {
        let name = *name;
        if device_ids.iter().any(|(d, _)| d == name) {
            continue;
        }
        let cdi_name = format!("{claim}-{name}");
        device_ids.push((name.clone(), format!("{kind}={cdi_name}")));
        cdi_devices.push(spec::Device {
            name: cdi_name,
            container_edits: ContainerEdits {
                device_nodes: device_nodes(inventory, name, device)?,
                ..Default::default()
            },
        });
    }
    let mut container_edits = match uvm {
        Some(uvm) => ContainerEdits {
            env: vec![VISIBLE_DEVICES_VOID.to_string()],
            device_nodes: [
                DeviceNode::char("/dev/nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR),
                DeviceNode::char("/dev/nvidia-uvm", uvm, 0),
                DeviceNode::char("/dev/nvidia-uvm-tools", uvm, 1),
            ]
            .into_iter()
            .chain(driver_edits.device_nodes.iter().cloned())
            .collect(),
            mounts: driver_edits.mounts.clone(),
            hooks: driver_edits.hooks.clone(),
        },
        None => ContainerEdits { env: vec![VISIBLE_DEVICES_VOID.to_string()], ..Default::default() },
    };
    if vfio {
        container_edits.device_nodes.push(DeviceNode::char(VFIO_CONTAINER, MISC_MAJOR, VFIO_MINOR));
    }
    let mut spec = Spec { cdi_version: String::new(), kind, devices: cdi_devices, container_edits };
    spec.cdi_version = spec::minimum_version(&spec).to_string();
    Ok(ClaimSpec { spec, file_name: claim_spec_file_name(driver, claim), device_ids })
}

fn device_nodes(
    inventory: &Inventory,
    name: &DeviceName,
    device: &PublishedDevice<'_>,
) -> Result<Vec<DeviceNode>, CdiError> {
    if let PublishedDevice::DynamicMig { .. } = device {
        return Err(CdiError::NotCreated(name.clone()));
    }
    if let PublishedDevice::Vfio(gpu) = device {
        let group = gpu.iommu_group.ok_or_else(|| CdiError::UnknownDevice(name.clone()))?;
        return Ok(vec![DeviceNode::from_host(vfio_group_node(group))]);
    }
    let gpu = device.gpu();
    let mut nodes = vec![DeviceNode::char(format!("/dev/nvidia{}", gpu.minor), NVIDIA_MAJOR, gpu.minor)];
    if let PublishedDevice::Mig { mig, .. } = device {
        let major = inventory.device_majors.nvidia_caps.ok_or_else(|| CdiError::CapsNotLoaded(name.clone()))?;
        let caps = mig.caps.ok_or_else(|| CdiError::MissingMigCaps(name.clone()))?;
        for minor in [caps.gpu_instance, caps.compute_instance] {
            nodes.push(DeviceNode::char(format!("/dev/nvidia-caps/nvidia-cap{minor}"), major, minor));
        }
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::MigMode;
    use crate::inventory::test_support::{gpu, inventory, mig};

    fn uid() -> ClaimUid {
        ClaimUid::new("0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a").unwrap()
    }

    fn dn(s: &str) -> DeviceName {
        DeviceName::new(s).unwrap()
    }

    fn node_paths(d: &spec::Device) -> Vec<&str> {
        d.container_edits.device_nodes.iter().map(|n| n.path.as_str()).collect()
    }

    #[test]
    fn gpu_claim_spec() {
        let inv = inventory(vec![gpu(0), gpu(3)]);
        let s = claim_spec(
            &DriverName::nvidia_default(),
            &inv,
            &DriverEdits::default(),
            &uid(),
            &[dn("gpu-3"), dn("gpu-0"), dn("gpu-3")],
        )
        .unwrap();
        assert_eq!(s.file_name, "k8s.gpu.nvidia.com-claim_0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a.json");
        assert_eq!(s.spec.kind, "k8s.gpu.nvidia.com/claim");
        assert_eq!(s.spec.cdi_version, "0.5.0", "the claim UID starts with a digit");
        assert_eq!(s.device_ids.len(), 2, "duplicates collapse");
        assert_eq!(
            s.device_id(&dn("gpu-3")),
            Some("k8s.gpu.nvidia.com/claim=0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a-gpu-3")
        );
        assert_eq!(node_paths(&s.spec.devices[0]), ["/dev/nvidia3"]);
        let common = &s.spec.container_edits;
        assert_eq!(common.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
        let paths: Vec<_> = common.device_nodes.iter().map(|n| (n.path.as_str(), n.major, n.minor)).collect();
        assert_eq!(
            paths,
            [("/dev/nvidiactl", 195, 255), ("/dev/nvidia-uvm", 235, 0), ("/dev/nvidia-uvm-tools", 235, 1)]
        );
        assert!(common.device_nodes.iter().all(|n| n.node_type == "c"));
    }

    #[test]
    fn a_vfio_claim_gets_its_group_and_the_container_and_nothing_of_the_nvidia_driver() {
        let mut g = gpu(0);
        g.iommu_group = Some(42);
        let mut inv = inventory(vec![g]);
        inv.device_majors.nvidia_uvm = None;
        let edits =
            DriverEdits { device_nodes: vec![DeviceNode::char("/dev/nvidia-modeset", 195, 254)], ..Default::default() };
        let spec = claim_spec(&DriverName::nvidia_default(), &inv, &edits, &uid(), &[dn("gpu-vfio-0")]).unwrap();
        assert_eq!(node_paths(&spec.spec.devices[0]), ["/dev/vfio/42"]);
        let json = serde_json::to_value(&spec.spec.devices[0].container_edits.device_nodes[0]).unwrap();
        assert_eq!(json, serde_json::json!({"path": "/dev/vfio/42"}), "the runtime stats the group's node");
        let common = &spec.spec.container_edits;
        let paths: Vec<&str> = common.device_nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(paths, ["/dev/vfio/vfio"]);
        assert_eq!((common.device_nodes[0].major, common.device_nodes[0].minor), (10, 196));
        assert!(common.mounts.is_empty() && common.hooks.is_empty());
        assert_eq!(common.env, [VISIBLE_DEVICES_VOID]);
        let mut no_group = inv.clone();
        no_group.gpus[0].iommu_group = None;
        assert!(claim_spec(&DriverName::nvidia_default(), &no_group, &edits, &uid(), &[dn("gpu-vfio-0")]).is_err());
    }

    #[test]
    fn letter_first_uids_need_only_030() {
        let inv = inventory(vec![gpu(0)]);
        let uid = ClaimUid::new("ab4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a").unwrap();
        let s = claim_spec(&DriverName::nvidia_default(), &inv, &DriverEdits::default(), &uid, &[dn("gpu-0")]).unwrap();
        assert_eq!(s.spec.cdi_version, "0.3.0");
    }

    #[test]
    fn mig_claim_spec_adds_cap_nodes() {
        let mut parent = gpu(1);
        parent.mig = MigMode::Enabled(vec![mig("1g.10gb", 19, 2, 1)]);
        let inv = inventory(vec![parent]);
        let s = claim_spec(
            &DriverName::nvidia_default(),
            &inv,
            &DriverEdits::default(),
            &uid(),
            &[dn("gpu-1-mig-1g10gb-19-2")],
        )
        .unwrap();
        assert_eq!(
            node_paths(&s.spec.devices[0]),
            ["/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"]
        );
        assert_eq!(s.spec.devices[0].container_edits.device_nodes[1].major, 236);
    }

    #[test]
    fn errors_name_the_problem() {
        let driver = DriverName::nvidia_default();
        let mut inv = inventory(vec![gpu(0)]);
        assert_eq!(
            claim_spec(&driver, &inv, &DriverEdits::default(), &uid(), &[dn("gpu-9")]),
            Err(CdiError::UnknownDevice(dn("gpu-9")))
        );
        assert_eq!(claim_spec(&driver, &inv, &DriverEdits::default(), &uid(), &[]), Err(CdiError::NoDevices));
        inv.device_majors.nvidia_uvm = None;
        assert_eq!(
            claim_spec(&driver, &inv, &DriverEdits::default(), &uid(), &[dn("gpu-0")]),
            Err(CdiError::UvmNotLoaded)
        );

        let mut parent = gpu(1);
        let mut m = mig("1g.10gb", 19, 0, 1);
        m.caps = None;
        parent.mig = MigMode::Enabled(vec![m]);
        let inv = inventory(vec![parent]);
        let name = dn("gpu-1-mig-1g10gb-19-0");
        assert_eq!(
            claim_spec(&driver, &inv, &DriverEdits::default(), &uid(), std::slice::from_ref(&name)),
            Err(CdiError::MissingMigCaps(name))
        );
    }

    #[test]
    fn other_driver_names_change_the_vendor() {
        let inv = inventory(vec![gpu(0)]);
        let driver = DriverName::new("gpu.example.com").unwrap();
        let s = claim_spec(&driver, &inv, &DriverEdits::default(), &uid(), &[dn("gpu-0")]).unwrap();
        assert_eq!(s.spec.kind, "k8s.gpu.example.com/claim");
        assert!(s.file_name.starts_with("k8s.gpu.example.com-claim_"));
    }

    #[test]
    fn driver_files_become_read_only_mounts_and_hooks() {
        use crate::driver_root::{DriverFiles, DriverMount};
        let files = DriverFiles {
            mounts: vec![DriverMount {
                host_path: "/run/nvidia/driver/usr/lib64/libcuda.so.580.95.05".into(),
                container_path: "/usr/lib64/libcuda.so.580.95.05".into(),
            }],
            links: vec![
                ("libcuda.so.580.95.05".into(), "/usr/lib64/libcuda.so.1".into()),
                ("libcuda.so.1".into(), "/usr/lib64/libcuda.so".into()),
            ],
            library_dirs: vec!["/usr/lib64".into()],
            control_devices: vec![("/dev/nvidia-modeset".into(), 254)],
            cuda_compat_host_version: Some("580.95.05".into()),
        };
        let edits = DriverEdits::new(&files, Some("/var/lib/kubelet/plugins/gpu.nvidia.com/nvidia-cdi-hook"));
        let inv = inventory(vec![gpu(0)]);
        let uid = ClaimUid::new("ab4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a").unwrap();
        let s = claim_spec(&DriverName::nvidia_default(), &inv, &edits, &uid, &[dn("gpu-0")]).unwrap();
        assert_eq!(s.spec.cdi_version, "0.3.0", "mount options and hooks need no newer version");
        let json = serde_json::to_value(&s.spec.container_edits).unwrap();
        assert_eq!(
            json["mounts"][0],
            serde_json::json!({
                "hostPath": "/run/nvidia/driver/usr/lib64/libcuda.so.580.95.05",
                "containerPath": "/usr/lib64/libcuda.so.580.95.05",
                "options": ["ro", "nosuid", "nodev", "bind"]
            })
        );
        assert_eq!(
            json["hooks"][0]["args"],
            serde_json::json!([
                "nvidia-cdi-hook",
                "create-symlinks",
                "--link",
                "libcuda.so.580.95.05::/usr/lib64/libcuda.so.1",
                "--link",
                "libcuda.so.1::/usr/lib64/libcuda.so"
            ])
        );
        assert_eq!(
            json["hooks"][1]["args"],
            serde_json::json!(["nvidia-cdi-hook", "enable-cuda-compat", "--host-driver-version=580.95.05"])
        );
        assert_eq!(
            json["hooks"][2]["args"],
            serde_json::json!(["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib64"])
        );
        assert_eq!(json["hooks"][0]["hookName"], "createContainer");
        // A node whose hook predates forward compatibility leaves it out.
        let older = edits.clone().without_hooks(&["enable-cuda-compat".to_string()]);
        assert_eq!(older.hooks.len(), 2);
        assert!(older.hooks.iter().all(|h| h.args[1] != "enable-cuda-compat"));
        assert_eq!(json["deviceNodes"][3]["path"], "/dev/nvidia-modeset");
        // Without the hook binary: mounts only.
        assert!(DriverEdits::new(&files, None).hooks.is_empty());
    }
}
