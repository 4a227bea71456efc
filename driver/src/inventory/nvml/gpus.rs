//! Walking NVML's devices into the inventory model: identity, memory,
//! topology (PCIe root, NUMA node, NVLink peers) and fabric clique per GPU.
//!
//! Forgiving per GPU: a GPU whose identity NVML cannot report is skipped
//! with a warning, a lost GPU is kept with [`Fault::Lost`] so health
//! handling can taint it, and optional facts degrade to `None`.

use std::collections::BTreeMap;
use std::path::Path;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{NVML_GPU_FABRIC_STATE_COMPLETED, nvmlReturn_enum_NVML_SUCCESS};

use super::error::{GpuError, NvmlDiscoveryError};
use super::ext::{self, GpuFabricInfo, NvLinkRemoteDeviceType};
use super::procfs::{self, MigMinors};
use super::{mig, names};
use crate::inventory::model::{AddressingMode, CliqueId, Fault, Gpu, Inventory, MigMode};
use crate::inventory::nvlink::{self, LinkPeer};
use crate::inventory::pci::PciBusId;
use crate::version::Semver;

/// `NVML_NVLINK_MAX_LINKS` of NVML 13's nvml.h (nvml-wrapper-sys 0.10 says
/// 18). Drivers answer `InvalidArg` for links a GPU does not have.
const NVLINK_MAX_LINKS: u32 = 36;

/// Reads the whole node from an initialized NVML.
pub(super) fn inventory(nvml: &Nvml, proc_root: &Path, sys_root: &Path) -> Result<Inventory, NvmlDiscoveryError> {
    let query = |what: &'static str| move |error: NvmlError| NvmlDiscoveryError::Query { what, error };
    let raw_driver = nvml.sys_driver_version().map_err(query("driver version"))?;
    let driver_version = Semver::normalize(&raw_driver)
        .map_err(|_| NvmlDiscoveryError::InvalidVersion { what: "driver version", value: raw_driver.clone() })?;
    let raw_cuda = nvml.sys_cuda_driver_version().map_err(query("CUDA driver version"))?;
    let cuda_driver_version = names::cuda_driver_version(raw_cuda).ok_or_else(|| {
        NvmlDiscoveryError::InvalidVersion { what: "CUDA driver version", value: raw_cuda.to_string() }
    })?;
    let device_majors = procfs::read_device_majors(proc_root);
    let mig_minors = procfs::read_mig_minors(proc_root);

    let count = nvml.device_count().map_err(query("GPU count"))?;
    let mut found = Vec::new();
    for index in 0..count {
        let device = match nvml.device_by_index(index) {
            Ok(device) => device,
            Err(error) => {
                tracing::warn!(index, %error, "skipping GPU: NVML cannot open it");
                continue;
            }
        };
        if let Some(gpu) = read_gpu(&device, index, sys_root, &mig_minors) {
            found.push((gpu, device));
        }
    }
    assign_nvlink_groups(&mut found);

    let mut gpus: Vec<Gpu> = found.into_iter().map(|(gpu, _)| gpu).collect();
    gpus.sort_by_key(|gpu| gpu.minor);
    Ok(Inventory { driver_version, cuda_driver_version, device_majors, gpus })
}

/// One GPU, or `None` (logged) when it must be skipped.
fn read_gpu(device: &Device<'_>, index: u32, sys_root: &Path, mig_minors: &MigMinors) -> Option<Gpu> {
    let uuid = match device.uuid() {
        Ok(uuid) => uuid,
        Err(error) => {
            tracing::warn!(index, %error, "skipping GPU: NVML cannot report its UUID");
            return None;
        }
    };
    let minor = match device.minor_number() {
        Ok(minor) => minor,
        Err(error) => {
            tracing::warn!(index, %uuid, %error, "skipping GPU: NVML cannot report its minor number");
            return None;
        }
    };
    let mut gpu = Gpu::new(index, minor, uuid);
    match fill_gpu(&mut gpu, device, sys_root, mig_minors) {
        Ok(()) => Some(gpu),
        Err(GpuError::Lost) => {
            tracing::warn!(index, minor, uuid = %gpu.uuid, "NVML reports the GPU as lost; keeping it with a Lost fault");
            // Whatever was read before the loss stays; the rest are placeholders.
            gpu.mig = MigMode::Disabled;
            gpu.mig_capabilities = None;
            gpu.clique = None;
            gpu.faults.push(Fault::Lost);
            Some(gpu)
        }
        Err(GpuError::Failed { what, error }) => {
            tracing::warn!(index, minor, uuid = %gpu.uuid, what, %error, "skipping GPU: NVML cannot report a required property");
            None
        }
    }
}

fn fill_gpu(gpu: &mut Gpu, device: &Device<'_>, sys_root: &Path, mig_minors: &MigMinors) -> Result<(), GpuError> {
    let pci = device.pci_info().map_err(|e| GpuError::nvml("PCI info", e))?;
    let bus_id =
        PciBusId::parse(&pci.bus_id).map_err(|e| GpuError::Failed { what: "PCI bus id", error: e.to_string() })?;
    gpu.pci_bus_id = Some(bus_id);
    gpu.product_name = device.name().map_err(|e| GpuError::nvml("product name", e))?;
    gpu.brand = spelled(device.brand().map(|b| b.as_c()), names::brand_name, "brand", gpu.minor)?;
    gpu.architecture =
        spelled(device.architecture().map(|a| a.as_c()), names::architecture_name, "architecture", gpu.minor)?;
    let cc = device.cuda_compute_capability().map_err(|e| GpuError::nvml("CUDA compute capability", e))?;
    gpu.cuda_compute_capability = names::compute_capability(cc.major, cc.minor);
    gpu.memory_bytes = match device.memory_info() {
        Ok(memory) => memory.total,
        // vGPU guests; NVIDIA's driver then omits the memory capacity.
        Err(NvmlError::NotSupported) => {
            tracing::warn!(minor = gpu.minor, "NVML does not report the GPU's memory; using 0");
            0
        }
        Err(error) => return Err(GpuError::nvml("memory info", error)),
    };
    gpu.pcie_root = procfs::read_pcie_root(sys_root, &bus_id);
    gpu.iommu_group = procfs::read_iommu_group(sys_root, &bus_id);
    gpu.numa_node = numa_node(device, sys_root, &bus_id, gpu.minor);
    let mig = mig::read(device, gpu.minor, &gpu.architecture, gpu.memory_bytes, mig_minors)?;
    gpu.mig = mig.mode;
    gpu.mig_capabilities = mig.capabilities;
    gpu.clique = match ext::gpu_fabric_info(device) {
        Ok(info) => clique_from_fabric(&info),
        Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => None,
        Err(NvmlError::GpuLost) => return Err(GpuError::Lost),
        Err(error) => {
            tracing::warn!(minor = gpu.minor, %error, "NVML cannot report GPU fabric info; no clique");
            None
        }
    };
    gpu.addressing_mode = match ext::addressing_mode(device) {
        Ok(code) => AddressingMode::from_nvml(code),
        Err(NvmlError::GpuLost) => return Err(GpuError::Lost),
        Err(_) => None,
    };
    Ok(())
}

/// NVIDIA's spelling of an enum NVML reports (brand, architecture): codes
/// nvml-wrapper does not know still get a name, and an unreadable value is
/// `Unknown` rather than a reason to skip the GPU, unless the GPU is lost.
fn spelled(
    code: Result<u32, NvmlError>,
    name: fn(u32) -> &'static str,
    what: &'static str,
    minor: u32,
) -> Result<String, GpuError> {
    match code {
        Ok(code) | Err(NvmlError::UnexpectedVariant(code)) => Ok(name(code).to_string()),
        Err(NvmlError::GpuLost) => Err(GpuError::Lost),
        Err(error) => {
            tracing::debug!(minor, %error, what, "NVML cannot report it; using Unknown");
            Ok(name(u32::MAX).to_string())
        }
    }
}

/// The NUMA node of the GPU's PCI function from sysfs, as NVIDIA's driver
/// reads it. NVML's `nvmlDeviceGetNumaNodeId` answers a different question
/// (the node of GPU memory on coherent systems such as GH200), so it is
/// asked only when sysfs cannot be read.
fn numa_node(device: &Device<'_>, sys_root: &Path, bus_id: &PciBusId, minor: u32) -> Option<u32> {
    match procfs::read_numa_node(sys_root, bus_id) {
        Ok(node) => node,
        Err(sysfs_error) => match device.numa_node_id() {
            Ok(node) => Some(node),
            Err(error) => {
                tracing::debug!(minor, %sysfs_error, %error, "NUMA node unknown");
                None
            }
        },
    }
}

/// A clique only for a GPU whose fabric registration completed successfully
/// with a real cluster UUID (go-nvlib's `IsFabricAttached`).
fn clique_from_fabric(info: &GpuFabricInfo) -> Option<CliqueId> {
    let attached = u32::from(info.state) == NVML_GPU_FABRIC_STATE_COMPLETED
        && info.status == nvmlReturn_enum_NVML_SUCCESS
        && info.cluster_uuid != [0; 16];
    attached.then(|| CliqueId { cluster_uuid: uuid::Uuid::from_bytes(info.cluster_uuid), clique: info.clique_id })
}

/// Fills `nvlink_group` from the active NVLinks of every healthy GPU.
fn assign_nvlink_groups(found: &mut [(Gpu, Device<'_>)]) {
    let healthy = |gpu: &Gpu| !gpu.faults.contains(&Fault::Lost);
    let local: BTreeMap<PciBusId, u32> = found
        .iter()
        .filter(|(gpu, _)| healthy(gpu))
        .filter_map(|(gpu, _)| Some((gpu.pci_bus_id?, gpu.minor)))
        .collect();
    let links: BTreeMap<u32, Vec<LinkPeer>> = found
        .iter()
        .filter(|(gpu, _)| healthy(gpu))
        .map(|(gpu, device)| (gpu.minor, nvlink_peers(device, gpu.minor, &local)))
        .collect();
    let groups = nvlink::groups(&links);
    for (gpu, _) in found.iter_mut() {
        gpu.nvlink_group = groups.get(&gpu.minor).copied();
    }
}

/// The far ends of a GPU's active NVLinks.
fn nvlink_peers(device: &Device<'_>, minor: u32, local: &BTreeMap<PciBusId, u32>) -> Vec<LinkPeer> {
    let mut peers = Vec::new();
    for link in 0..NVLINK_MAX_LINKS {
        let nvlink = device.link_wrapper_for(link);
        match nvlink.is_active() {
            Ok(true) => {}
            Ok(false) | Err(NvmlError::NotSupported | NvmlError::InvalidArg) => continue,
            Err(error) => {
                tracing::debug!(minor, link, %error, "cannot read NVLink state; ignoring the link");
                continue;
            }
        }
        let kind = ext::nvlink_remote_device_type(device, link)
            .inspect_err(|error| tracing::debug!(minor, link, %error, "NVLink remote device type unknown"))
            .ok();
        let remote = match nvlink.remote_pci_info() {
            Ok(pci) => PciBusId::parse(&pci.bus_id)
                .inspect_err(|error| tracing::debug!(minor, link, %error, "NVLink remote PCI bus id unreadable"))
                .ok(),
            Err(error) => {
                tracing::debug!(minor, link, %error, "NVLink remote PCI info unknown");
                None
            }
        };
        match classify_peer(kind, remote, local) {
            Some(peer) => peers.push(peer),
            None => tracing::debug!(minor, link, "NVLink to a GPU of unknown address; ignoring the link"),
        }
    }
    peers
}

/// The far end of an active link: a local GPU when its PCI address is one of
/// ours, otherwise a switch-like endpoint named by its address (`nvswitch`
/// when unknown), through which every GPU linked to it reaches the others.
/// A link to a GPU whose address is unknown names nothing and is dropped.
fn classify_peer(
    kind: Option<NvLinkRemoteDeviceType>,
    remote: Option<PciBusId>,
    local: &BTreeMap<PciBusId, u32>,
) -> Option<LinkPeer> {
    if let Some(&minor) = remote.as_ref().and_then(|bus| local.get(bus))
        && kind != Some(NvLinkRemoteDeviceType::Switch)
    {
        return Some(LinkPeer::Gpu(minor));
    }
    match (kind, remote) {
        (_, Some(bus)) => Some(LinkPeer::Switch(bus.to_string())),
        (Some(NvLinkRemoteDeviceType::Gpu), None) => None,
        (_, None) => Some(LinkPeer::Switch("nvswitch".to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bus(s: &str) -> PciBusId {
        PciBusId::parse(s).unwrap()
    }

    #[test]
    fn peers_are_local_gpus_or_switches() {
        use NvLinkRemoteDeviceType as T;
        let local = BTreeMap::from([(bus("0000:18:00.0"), 0), (bus("0000:2a:00.0"), 1)]);
        assert_eq!(classify_peer(Some(T::Gpu), Some(bus("0000:2a:00.0")), &local), Some(LinkPeer::Gpu(1)));
        // The type query failing does not hide a peer we can place by address.
        assert_eq!(classify_peer(None, Some(bus("00000000:18:00.0")), &local), Some(LinkPeer::Gpu(0)));
        assert_eq!(
            classify_peer(Some(T::Switch), Some(bus("0000:c5:00.0")), &local),
            Some(LinkPeer::Switch("0000:c5:00.0".into()))
        );
        assert_eq!(classify_peer(Some(T::Switch), None, &local), Some(LinkPeer::Switch("nvswitch".into())));
        assert_eq!(classify_peer(Some(T::Unknown(9)), None, &local), Some(LinkPeer::Switch("nvswitch".into())));
        // A GPU we did not enumerate still connects the GPUs linked to it.
        assert_eq!(
            classify_peer(Some(T::Gpu), Some(bus("0000:99:00.0")), &local),
            Some(LinkPeer::Switch("0000:99:00.0".into()))
        );
        assert_eq!(classify_peer(Some(T::Gpu), None, &local), None);
    }

    #[test]
    fn clique_needs_a_completed_registration() {
        let done = GpuFabricInfo {
            cluster_uuid: *uuid::Uuid::from_u128(0xabc).as_bytes(),
            status: nvmlReturn_enum_NVML_SUCCESS,
            clique_id: 7,
            state: NVML_GPU_FABRIC_STATE_COMPLETED as u8,
        };
        let clique = clique_from_fabric(&done).unwrap();
        assert_eq!(clique.to_string(), "00000000-0000-0000-0000-000000000abc.7");
        assert_eq!(clique_from_fabric(&GpuFabricInfo { state: 2, ..done }), None);
        assert_eq!(clique_from_fabric(&GpuFabricInfo { status: 3, ..done }), None);
        assert_eq!(clique_from_fabric(&GpuFabricInfo { cluster_uuid: [0; 16], ..done }), None);
    }
}
