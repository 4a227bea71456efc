//! NVIDIA's DRA kubelet plugin's checkpoint, read so that our plugin can
//! take over the claims it prepared (see [`crate::prepare::adopt`]).
//!
//! NVIDIA's plugin keeps one file for all claims,
//! `<plugins-dir>/gpu.nvidia.com/checkpoint.json` (`DriverPluginPath` and
//! `DriverPluginCheckpointFileBasename` in `cmd/gpu-kubelet-plugin/main.go`
//! of kubernetes-sigs/dra-driver-nvidia-gpu). Its releases wrote:
//! - v25.3: `{"checksum", "v1": {"preparedClaims": {uid: {"status",
//!   "preparedDevices"}}}}`, every claim completed;
//! - v25.8 on: the same `v1` (completed claims only, for downgrades) beside
//!   `"v2": {"checksum", "preparedClaims": {uid: {"checkpointState",
//!   "status", "preparedDevices", "name", "namespace"}}}` (`checkpointv.go`);
//!   later `v2.nodeBootID`, and MIG devices as `"concrete"` rather than
//!   `"info"` (`prepared.go`, `mig.go`).
//!
//! A completed claim carries no name or namespace, an interrupted one no
//! devices (their `Prepare` writes them that way).
//!
//! `v2` is read when present, as their `ToLatestVersion` does. Their
//! checksums hash Go's re-encoding of their structs, which only their
//! types reproduce (and their unreleased main no longer reproduces for
//! older files: it writes `configState` without `mpsControlDaemonID`);
//! they are not checked here. Instead every field that is
//! used is validated where it is used, and each claim is decoded on its
//! own: one undecodable claim is reported and costs only itself.

use std::collections::BTreeMap;

use serde::Deserialize;

/// NVIDIA's file name in their plugin directory.
pub const FILE_NAME: &str = "checkpoint.json";

/// The largest file read: their checkpoint holds every claim of the node
/// with its allocation (a few KiB each); 16 MiB is thousands of claims,
/// and a forged or runaway file is refused before it is parsed.
pub const MAX_BYTES: u64 = 16 << 20;

/// Which of their layouts the claims were read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Only `v1` (v25.3): no states, no names, no boot id.
    V1,
    /// `v2` (v25.8 on).
    V2,
}

impl Layout {
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::V1 => "v1",
            Layout::V2 => "v2",
        }
    }
}

/// What the file holds, each claim decoded on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvidiaCheckpoint {
    pub layout: Layout,
    /// `v2.nodeBootID`: the boot its claims were prepared in; `None` in
    /// files that predate it (their plugin then takes them as current).
    pub boot_id: Option<String>,
    pub claims: Vec<NvidiaClaim>,
    /// Claims whose entry does not decode: (the key, why).
    pub undecodable: Vec<(String, Undecodable)>,
}

/// Why one claim's entry does not decode; it costs only that claim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Undecodable {
    /// Serde's message (its error is neither `Clone` nor `Eq`).
    #[error("{0}")]
    Json(String),
    #[error("field `checkpointState` is {0:?}; NVIDIA's plugin writes PrepareStarted or PrepareCompleted")]
    State(Option<String>),
    #[error("preparedDevices[{group}]: devices[{device}]: {reason}")]
    Device { group: usize, device: usize, reason: &'static str },
}

/// One claim NVIDIA's plugin recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvidiaClaim {
    /// The map key: the claim's UID, not yet validated.
    pub uid: String,
    /// Empty in `v1`, which does not record them.
    pub namespace: String,
    pub name: String,
    /// `PrepareCompleted` (every `v1` claim); otherwise their prepare was
    /// interrupted and the kubelet was never told its devices.
    pub completed: bool,
    pub groups: Vec<NvidiaGroup>,
    /// `(pool, device)` of the allocation results with `adminAccess`.
    pub admin_access: Vec<(String, String)>,
}

/// A group of devices prepared with one config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvidiaGroup {
    /// `configState.mpsControlDaemonID`: the group's MPS control daemon, a
    /// Deployment their plugin made.
    pub mps_daemon: Option<String>,
    pub devices: Vec<NvidiaDevice>,
}

/// One prepared device, as their `kubeletplugin.Device` recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvidiaDevice {
    pub kind: NvidiaDeviceKind,
    pub requests: Vec<String>,
    pub pool: String,
    pub device: String,
    pub cdi_device_ids: Vec<String>,
    pub share_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvidiaDeviceKind {
    /// A whole GPU, with the UUID they recorded.
    Gpu { uuid: String },
    /// A MIG device (static or made by their DynamicMIG), with its UUID.
    Mig { uuid: String },
    /// A GPU passed through to a VM (`vfio-pci`).
    Vfio,
}

/// Why the file as a whole cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("it is not JSON of NVIDIA's checkpoint layout: {0}")]
    Json(serde_json::Error),
    #[error("it holds neither `v1` nor `v2`")]
    Empty,
}

/// Decodes the file's bytes.
pub fn decode(bytes: &[u8]) -> Result<NvidiaCheckpoint, DecodeError> {
    let file: RawFile = serde_json::from_slice(bytes).map_err(DecodeError::Json)?;
    let (layout, boot_id, entries) = match (file.v2, file.v1) {
        (Some(v2), _) => (Layout::V2, v2.node_boot_id.filter(|b| !b.is_empty()), v2.prepared_claims),
        (None, Some(v1)) => (Layout::V1, None, v1.prepared_claims),
        (None, None) => return Err(DecodeError::Empty),
    };
    let mut claims = Vec::new();
    let mut undecodable = Vec::new();
    for (uid, value) in entries.unwrap_or_default() {
        match decode_claim(layout, &uid, value) {
            Ok(claim) => claims.push(claim),
            Err(reason) => undecodable.push((uid, reason)),
        }
    }
    Ok(NvidiaCheckpoint { layout, boot_id, claims, undecodable })
}

fn decode_claim(layout: Layout, uid: &str, value: serde_json::Value) -> Result<NvidiaClaim, Undecodable> {
    let raw = RawClaim::deserialize(value).map_err(|e| Undecodable::Json(e.to_string()))?;
    let completed = match (layout, raw.checkpoint_state.as_deref()) {
        (Layout::V1, _) | (Layout::V2, Some("PrepareCompleted")) => true,
        (Layout::V2, Some("PrepareStarted")) => false,
        (Layout::V2, other) => return Err(Undecodable::State(other.map(str::to_owned))),
    };
    let groups = raw
        .prepared_devices
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(g, group)| decode_group(g, group))
        .collect::<Result<Vec<_>, _>>()?;
    let admin_access = raw
        .status
        .and_then(|s| s.allocation)
        .and_then(|a| a.devices)
        .and_then(|d| d.results)
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.admin_access == Some(true))
        .map(|r| (r.pool, r.device))
        .collect();
    Ok(NvidiaClaim {
        uid: uid.to_owned(),
        namespace: raw.namespace.unwrap_or_default(),
        name: raw.name.unwrap_or_default(),
        completed,
        groups,
        admin_access,
    })
}

fn decode_group(g: usize, group: RawGroup) -> Result<NvidiaGroup, Undecodable> {
    let devices = group
        .devices
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(d, device)| decode_device(device).map_err(|reason| Undecodable::Device { group: g, device: d, reason }))
        .collect::<Result<Vec<_>, _>>()?;
    let mps_daemon = group.config_state.and_then(|c| c.mps_control_daemon_id).filter(|id| !id.is_empty());
    Ok(NvidiaGroup { mps_daemon, devices })
}

/// The device, or which of its fields is wrong.
fn decode_device(device: RawDevice) -> Result<NvidiaDevice, &'static str> {
    let (kind, recorded) = match (device.gpu, device.mig, device.vfio) {
        (Some(gpu), None, None) => {
            let uuid = gpu.info.map(|i| i.uuid).ok_or("field `gpu.info` is missing")?;
            (NvidiaDeviceKind::Gpu { uuid }, gpu.device)
        }
        (None, Some(mig), None) => {
            let uuid = match (mig.concrete, mig.info) {
                (Some(concrete), _) => concrete.mig_uuid,
                (None, Some(info)) => info.uuid,
                (None, None) => return Err("field `mig` has neither `concrete` nor `info`"),
            };
            (NvidiaDeviceKind::Mig { uuid }, mig.device)
        }
        (None, None, Some(vfio)) => (NvidiaDeviceKind::Vfio, vfio.device),
        _ => return Err("exactly one of `gpu`, `mig` and `vfio` must be set"),
    };
    let recorded = recorded.ok_or("field `device` is missing")?;
    Ok(NvidiaDevice {
        kind,
        requests: recorded.requests.unwrap_or_default(),
        pool: recorded.pool_name,
        device: recorded.device_name,
        cdi_device_ids: recorded.cdi_device_ids.unwrap_or_default(),
        share_id: recorded.share_id.filter(|s| !s.is_empty()),
    })
}

// Their JSON, as far as it is used. Go writes a nil slice or pointer as
// `null`, hence the `Option`s; unknown fields are ignored (newer releases
// add some).

#[derive(Deserialize)]
struct RawFile {
    v1: Option<RawVersion>,
    v2: Option<RawVersion>,
}

#[derive(Deserialize)]
struct RawVersion {
    #[serde(rename = "preparedClaims")]
    prepared_claims: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(rename = "nodeBootID")]
    node_boot_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawClaim {
    checkpoint_state: Option<String>,
    status: Option<RawStatus>,
    prepared_devices: Option<Vec<RawGroup>>,
    name: Option<String>,
    namespace: Option<String>,
}

#[derive(Deserialize)]
struct RawStatus {
    allocation: Option<RawAllocation>,
}

#[derive(Deserialize)]
struct RawAllocation {
    devices: Option<RawDeviceAllocation>,
}

#[derive(Deserialize)]
struct RawDeviceAllocation {
    results: Option<Vec<RawResult>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawResult {
    #[serde(default)]
    pool: String,
    #[serde(default)]
    device: String,
    admin_access: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawGroup {
    devices: Option<Vec<RawDevice>>,
    config_state: Option<RawConfigState>,
}

#[derive(Deserialize)]
struct RawConfigState {
    #[serde(rename = "mpsControlDaemonID")]
    mps_control_daemon_id: Option<String>,
}

#[derive(Deserialize)]
struct RawDevice {
    gpu: Option<RawWithInfo>,
    mig: Option<RawMig>,
    vfio: Option<RawWithInfo>,
}

#[derive(Deserialize)]
struct RawWithInfo {
    info: Option<RawInfo>,
    device: Option<RawKubeletDevice>,
}

#[derive(Deserialize)]
struct RawMig {
    info: Option<RawInfo>,
    concrete: Option<RawConcrete>,
    device: Option<RawKubeletDevice>,
}

#[derive(Deserialize)]
struct RawInfo {
    uuid: String,
}

#[derive(Deserialize)]
struct RawConcrete {
    #[serde(rename = "migUUID")]
    mig_uuid: String,
}

/// `kubeletplugin.Device`, which has no JSON tags: Go's field names.
#[derive(Deserialize)]
struct RawKubeletDevice {
    #[serde(rename = "Requests")]
    requests: Option<Vec<String>>,
    #[serde(rename = "PoolName")]
    pool_name: String,
    #[serde(rename = "DeviceName")]
    device_name: String,
    #[serde(rename = "CDIDeviceIDs")]
    cdi_device_ids: Option<Vec<String>>,
    #[serde(rename = "ShareID")]
    share_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";

    fn gpu_device(device: &str) -> serde_json::Value {
        serde_json::json!({
            "gpu": {"info": {"uuid": "GPU-1"}, "device": {
                "Requests": ["gpu"], "PoolName": "node-a", "DeviceName": device,
                "CDIDeviceIDs": [format!("k8s.gpu.nvidia.com/claim={UID}-{device}")]}},
            "mig": null
        })
    }

    #[test]
    fn a_v1_file_has_every_claim_completed_and_no_names() {
        let file = serde_json::json!({"checksum": 1, "v1": {"preparedClaims": {UID: {
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0", "adminAccess": true}]}}},
            "preparedDevices": [{"devices": [gpu_device("gpu-0")], "configState": {"mpsControlDaemonID": ""}}]}}}});
        let cp = decode(file.to_string().as_bytes()).unwrap();
        assert_eq!((cp.layout, cp.boot_id.as_deref()), (Layout::V1, None));
        let claim = &cp.claims[0];
        assert!(claim.completed);
        assert_eq!((claim.namespace.as_str(), claim.name.as_str()), ("", ""));
        assert_eq!(claim.groups[0].mps_daemon, None);
        assert_eq!(claim.admin_access, [("node-a".to_string(), "gpu-0".to_string())]);
        let device = &claim.groups[0].devices[0];
        assert_eq!(device.kind, NvidiaDeviceKind::Gpu { uuid: "GPU-1".into() });
        assert_eq!(device.cdi_device_ids, [format!("k8s.gpu.nvidia.com/claim={UID}-gpu-0")]);
    }

    #[test]
    fn v2_is_read_before_v1_with_states_names_boot_id_and_concrete_mig() {
        let mig = serde_json::json!({"gpu": null, "mig": {
            "concrete": {"parentMinor": 0, "giId": 1, "ciId": 0, "migUUID": "MIG-7", "parentUUID": "GPU-1"},
            "device": {"Requests": null, "PoolName": "node-a", "DeviceName": "gpu-0-mig-1g10gb-19-0", "CDIDeviceIDs": null, "ShareID": "s-1"}}});
        let file = serde_json::json!({"checksum": 1, "v1": {"preparedClaims": {}}, "v2": {"checksum": 2, "nodeBootID": "boot-1",
            "preparedClaims": {
                UID: {"checkpointState": "PrepareStarted", "name": "c", "namespace": "ns",
                      "preparedDevices": [{"devices": [mig], "configState": {"mpsControlDaemonID": "abc"}}]}}}});
        let cp = decode(file.to_string().as_bytes()).unwrap();
        assert_eq!((cp.layout, cp.boot_id.as_deref()), (Layout::V2, Some("boot-1")));
        let claim = &cp.claims[0];
        assert!(!claim.completed);
        assert_eq!((claim.namespace.as_str(), claim.name.as_str()), ("ns", "c"));
        assert_eq!(claim.groups[0].mps_daemon.as_deref(), Some("abc"));
        let device = &claim.groups[0].devices[0];
        assert_eq!(device.kind, NvidiaDeviceKind::Mig { uuid: "MIG-7".into() });
        assert_eq!((device.requests.len(), device.cdi_device_ids.len()), (0, 0));
        assert_eq!(device.share_id.as_deref(), Some("s-1"));
    }

    #[test]
    fn an_undecodable_claim_costs_only_itself() {
        let file = serde_json::json!({"v2": {"preparedClaims": {
            "a": {"checkpointState": "PrepareCompleted", "preparedDevices": [{"devices": [gpu_device("gpu-0")]}]},
            "b": {"checkpointState": "Sideways"},
            "c": {"checkpointState": "PrepareCompleted", "preparedDevices": [{"devices": [{"gpu": null, "mig": null}]}]},
            "d": {"checkpointState": "PrepareCompleted", "preparedDevices": "many"}}}});
        let cp = decode(file.to_string().as_bytes()).unwrap();
        assert_eq!(cp.claims.iter().map(|c| c.uid.as_str()).collect::<Vec<_>>(), ["a"]);
        let reasons: BTreeMap<_, _> = cp.undecodable.into_iter().map(|(uid, why)| (uid, why.to_string())).collect();
        assert!(reasons["b"].contains("checkpointState"), "{reasons:?}");
        assert!(reasons["c"].contains("preparedDevices[0]: devices[0]: exactly one of"), "{reasons:?}");
        assert!(reasons.contains_key("d"));
    }

    #[test]
    fn an_undecodable_claim_says_where_and_why() {
        let file = serde_json::json!({"v2": {"preparedClaims": {
            "b": {"checkpointState": "Sideways"},
            "c": {"checkpointState": "PrepareCompleted", "preparedDevices": [{"devices": [{"gpu": null, "mig": null}]}]}}}});
        let reasons: BTreeMap<_, _> = decode(file.to_string().as_bytes()).unwrap().undecodable.into_iter().collect();
        assert_eq!(
            reasons["b"].to_string(),
            "field `checkpointState` is Some(\"Sideways\"); NVIDIA's plugin writes PrepareStarted or PrepareCompleted"
        );
        assert_eq!(
            reasons["c"].to_string(),
            "preparedDevices[0]: devices[0]: exactly one of `gpu`, `mig` and `vfio` must be set"
        );
    }

    #[test]
    fn files_that_are_not_their_layout_are_refused_whole() {
        for bad in ["", "garbage", "[]", "{}", r#"{"v2": 7}"#] {
            assert!(decode(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
