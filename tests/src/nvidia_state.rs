//! NVIDIA's DRA kubelet plugin state (kubernetes-sigs/dra-driver-nvidia-gpu,
//! `cmd/gpu-kubelet-plugin`) as its releases wrote it, for the tests of our
//! plugin adopting it: the checkpoint
//! `/var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json` and the claim
//! CDI specs `/var/run/cdi/k8s.gpu.nvidia.com-claim_<claimUID>.yaml`.
//!
//! The bytes come from the Go program in `tests/nvidia-state/` (NVIDIA's
//! checkpoint layouts re-declared per release, the kubelet's checksum
//! package, the CNCF CDI library; its `main.go` documents each format and
//! where it was read), built by its `build.sh` into the per-machine cache
//! on first use (about 80 s of CPU cold, then milliseconds). Needs Go and
//! the Go module proxy.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde::Serialize;

use crate::workspace_root;

/// Where NVIDIA's plugin keeps its checkpoint.
pub const NVIDIA_CHECKPOINT_PATH: &str = "/var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json";
/// Where NVIDIA's plugin writes its claim CDI specs.
pub const NVIDIA_CDI_DIR: &str = "/var/run/cdi";
/// The kind of NVIDIA's claim CDI specs.
pub const NVIDIA_CLAIM_CDI_KIND: &str = "k8s.gpu.nvidia.com/claim";

/// A checkpoint layout, named by the first NVIDIA release that wrote it
/// (declaration order is release order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NvidiaFormat {
    /// v25.3.0..v25.3.2: one checksum, `v1` only, completed claims only.
    V25_3,
    /// v25.8.0, v25.8.1: `v2` (claim states, own checksum) beside `v1`.
    V25_8,
    /// v25.12.0: claim name/namespace, MIG as `concrete`, vfio devices.
    V25_12,
    /// v0.4.0: `nodeBootID`, device ShareID/Metadata, PCI bus IDs.
    V0_4,
    /// v0.4.1: `configState.timeSliceApplied`.
    V0_4_1,
    /// main after v0.4.1 (unreleased): `mpsApplied`, `mpsControlDaemonID`
    /// omitted when empty.
    Main,
}

impl NvidiaFormat {
    /// Every format, oldest first.
    pub fn all() -> [NvidiaFormat; 6] {
        [Self::V25_3, Self::V25_8, Self::V25_12, Self::V0_4, Self::V0_4_1, Self::Main]
    }

    /// The newest layout: NVIDIA's current code ([`NvidiaFormat::Main`]; the
    /// newest release is [`NvidiaFormat::V0_4_1`]).
    pub fn latest() -> NvidiaFormat {
        Self::Main
    }

    /// The generator's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V25_3 => "v25.3",
            Self::V25_8 => "v25.8",
            Self::V25_12 => "v25.12",
            Self::V0_4 => "v0.4",
            Self::V0_4_1 => "v0.4.1",
            Self::Main => "main",
        }
    }

    /// Whether the file records claim states (PrepareStarted) in a `v2`
    /// section with its own checksum.
    pub fn has_states(self) -> bool {
        self >= Self::V25_8
    }

    /// Whether claims carry name and namespace, MIG devices their
    /// MigLiveTuple (`concrete`), and vfio devices exist.
    pub fn is_v25_12_or_later(self) -> bool {
        self >= Self::V25_12
    }

    /// Whether `nodeBootID`, a device's ShareID and Metadata, a MIG parent's
    /// and a vfio device's PCI bus ID can be written.
    pub fn is_v0_4_or_later(self) -> bool {
        self >= Self::V0_4
    }

    /// File mode of the claim CDI specs this release wrote: the CDI cache's
    /// temporary file (0600) until v25.8, nvcdi's `spec.Save` (0644) after.
    pub fn cdi_spec_mode(self) -> u32 {
        if self >= Self::V25_12 { 0o644 } else { 0o600 }
    }
}

impl std::fmt::Display for NvidiaFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A claim's `checkpointState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum NvidiaClaimState {
    PrepareCompleted,
    /// From v25.8; NVIDIA leaves such claims out of `v1`.
    PrepareStarted,
}

/// A claim NVIDIA prepared, or whose preparation it started.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NvidiaClaim {
    pub uid: String,
    /// v25.12 on; NVIDIA sets name and namespace on PrepareStarted entries
    /// only (the PrepareCompleted entry drops them).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub state: NvidiaClaimState,
    /// A resource.k8s.io/v1 ResourceClaimStatus (NVIDIA stores the claim's
    /// status at prepare time); none: `{}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
    pub groups: Vec<NvidiaGroup>,
}

/// A PreparedDeviceGroup: devices sharing one config.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NvidiaGroup {
    #[serde(rename = "mpsControlDaemonID")]
    pub mps_control_daemon_id: String,
    /// v0.4.1 on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_slice_applied: Option<bool>,
    /// main only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mps_applied: Option<bool>,
    pub devices: Vec<NvidiaDevice>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NvidiaDeviceKind {
    Gpu,
    Mig,
    /// v25.12 on.
    Vfio,
}

/// One prepared device: what NVIDIA records about it and its
/// kubeletplugin.Device (requests, pool, device name, CDI IDs).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NvidiaDevice {
    pub kind: NvidiaDeviceKind,
    /// gpu, vfio.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// vfio, v0.4 on.
    #[serde(rename = "pciBusID", skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// mig.
    #[serde(rename = "migUUID", skip_serializing_if = "Option::is_none")]
    pub mig_uuid: Option<String>,
    /// mig, v25.12 on (required there), with `parent_minor`, `gi_id`, `ci_id`.
    #[serde(rename = "parentUUID", skip_serializing_if = "Option::is_none")]
    pub parent_uuid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_minor: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gi_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ci_id: Option<u32>,
    /// mig, v0.4 on.
    #[serde(rename = "parentPCIBusID", skip_serializing_if = "Option::is_none")]
    pub parent_pci_bus_id: Option<String>,
    /// None: written as null.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<Vec<String>>,
    pub pool: String,
    pub device: String,
    /// None: written as null.
    #[serde(rename = "cdiDeviceIDs", skip_serializing_if = "Option::is_none")]
    pub cdi_device_ids: Option<Vec<String>>,
    /// v0.4 on.
    #[serde(rename = "shareID", skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// v0.4 on: a kubeletplugin.DeviceMetadata
    /// (`{"Attributes":{..},"NetworkData":{..}}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
}

impl NvidiaClaim {
    /// A claim `namespace`/`name` whose devices NVIDIA prepared (one group,
    /// no MPS). NVIDIA does not record the name of a prepared claim: see
    /// [`NvidiaClaim::as_recorded_by`].
    pub fn completed(uid: &str, namespace: &str, name: &str, devices: Vec<NvidiaDevice>) -> Self {
        Self {
            uid: uid.to_string(),
            name: name.to_string(),
            namespace: namespace.to_string(),
            state: NvidiaClaimState::PrepareCompleted,
            status: None,
            groups: vec![NvidiaGroup::new(devices)],
        }
    }

    /// A claim whose preparation of `devices` NVIDIA started and did not
    /// finish (v25.8 on). NVIDIA records such a claim without its devices
    /// (and from v25.12 with its name): see [`NvidiaClaim::as_recorded_by`].
    pub fn started(uid: &str, namespace: &str, name: &str, devices: Vec<NvidiaDevice>) -> Self {
        Self { state: NvidiaClaimState::PrepareStarted, ..Self::completed(uid, namespace, name, devices) }
    }

    /// The same claim with these device groups.
    pub fn with_groups(mut self, groups: Vec<NvidiaGroup>) -> Self {
        self.groups = groups;
        self
    }

    pub fn with_status(mut self, status: serde_json::Value) -> Self {
        self.status = Some(status);
        self
    }

    /// This claim as `format`'s release records it, or None if it leaves no
    /// trace: Prepare writes a PrepareCompleted entry with status and
    /// devices but no name or namespace, and a PrepareStarted entry (v25.8
    /// on) with status, name and namespace (v25.12 on) but no devices; v25.3
    /// writes a claim once prepared only. Fields a release's types lack are
    /// dropped (a MIG device's MigLiveTuple before v25.12, the v0.4 and later
    /// fields). A vfio device is kept: releases before v25.12 could not
    /// prepare one, the generator refuses it.
    pub fn as_recorded_by(&self, format: NvidiaFormat) -> Option<Self> {
        let mut c = self.clone();
        match c.state {
            NvidiaClaimState::PrepareCompleted => {
                c.name.clear();
                c.namespace.clear();
            }
            NvidiaClaimState::PrepareStarted if !format.has_states() => return None,
            NvidiaClaimState::PrepareStarted => {
                c.groups.clear();
                if !format.is_v25_12_or_later() {
                    c.name.clear();
                    c.namespace.clear();
                }
            }
        }
        for g in &mut c.groups {
            if format < NvidiaFormat::V0_4_1 {
                g.time_slice_applied = None;
            }
            if format < NvidiaFormat::Main {
                g.mps_applied = None;
            }
            for d in &mut g.devices {
                if !format.is_v0_4_or_later() {
                    d.pci_bus_id = None;
                    d.parent_pci_bus_id = None;
                    d.share_id = None;
                    d.metadata = None;
                }
                if !format.is_v25_12_or_later() && d.kind == NvidiaDeviceKind::Mig {
                    d.parent_uuid = None;
                    d.parent_minor = None;
                    d.gi_id = None;
                    d.ci_id = None;
                }
            }
        }
        Some(c)
    }
}

impl NvidiaGroup {
    /// A group without MPS or time-slicing state.
    pub fn new(devices: Vec<NvidiaDevice>) -> Self {
        Self { devices, ..Self::default() }
    }

    pub fn with_mps(mut self, control_daemon_id: &str) -> Self {
        self.mps_control_daemon_id = control_daemon_id.to_string();
        self
    }
}

impl NvidiaDevice {
    fn base(kind: NvidiaDeviceKind, request: &str, pool: &str, device: &str, cdi_id: &str) -> Self {
        Self {
            kind,
            uuid: None,
            pci_bus_id: None,
            mig_uuid: None,
            parent_uuid: None,
            parent_minor: None,
            gi_id: None,
            ci_id: None,
            parent_pci_bus_id: None,
            requests: Some(vec![request.to_string()]),
            pool: pool.to_string(),
            device: device.to_string(),
            cdi_device_ids: Some(vec![cdi_id.to_string()]),
            share_id: None,
            metadata: None,
        }
    }

    /// A whole GPU `device` (e.g. `gpu-0`) of `pool` (the node name),
    /// allocated for `request`, with one CDI ID (NVIDIA's claim spec device,
    /// see [`claim_cdi_id`]).
    pub fn gpu(uuid: &str, request: &str, pool: &str, device: &str, cdi_id: &str) -> Self {
        Self { uuid: Some(uuid.to_string()), ..Self::base(NvidiaDeviceKind::Gpu, request, pool, device, cdi_id) }
    }

    /// A MIG device; from v25.12 on NVIDIA also records its MigLiveTuple,
    /// see [`NvidiaDevice::live`].
    pub fn mig(mig_uuid: &str, request: &str, pool: &str, device: &str, cdi_id: &str) -> Self {
        Self {
            mig_uuid: Some(mig_uuid.to_string()),
            ..Self::base(NvidiaDeviceKind::Mig, request, pool, device, cdi_id)
        }
    }

    /// A GPU prepared for VFIO passthrough (v25.12 on).
    pub fn vfio(uuid: &str, request: &str, pool: &str, device: &str, cdi_id: &str) -> Self {
        Self { uuid: Some(uuid.to_string()), ..Self::base(NvidiaDeviceKind::Vfio, request, pool, device, cdi_id) }
    }

    /// A MIG device's MigLiveTuple: its parent GPU, GPU and compute
    /// instance (required from v25.12, dropped before).
    pub fn live(mut self, parent_uuid: &str, parent_minor: u32, gi_id: u32, ci_id: u32) -> Self {
        self.parent_uuid = Some(parent_uuid.to_string());
        self.parent_minor = Some(parent_minor);
        self.gi_id = Some(gi_id);
        self.ci_id = Some(ci_id);
        self
    }

    /// Other CDI IDs (v25.3 and v25.8 wrote two: the base spec's
    /// `k8s.gpu.nvidia.com/device=<name>` and, with container edits, the
    /// claim spec's; later releases the claim spec's or none).
    pub fn cdi_ids(mut self, ids: &[&str]) -> Self {
        self.cdi_device_ids = Some(ids.iter().map(ToString::to_string).collect());
        self
    }
}

/// The CDI ID NVIDIA gives a claim's device:
/// `k8s.gpu.nvidia.com/claim=<claim uid>-<device name>`.
pub fn claim_cdi_id(claim_uid: &str, device: &str) -> String {
    format!("{NVIDIA_CLAIM_CDI_KIND}={claim_uid}-{device}")
}

/// The file name of a claim's CDI spec in [`NVIDIA_CDI_DIR`].
pub fn cdi_spec_file_name(claim_uid: &str) -> String {
    format!("k8s.gpu.nvidia.com-claim_{claim_uid}.yaml")
}

/// Path of the generator, building it first if the cache lacks this
/// version of its sources.
pub fn nvidia_state_bin() -> Result<PathBuf, String> {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    if let Some(path) = BUILT.get() {
        return Ok(path.clone());
    }
    let script = workspace_root().join("tests/nvidia-state/build.sh");
    let output = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "{} failed ({}): the NVIDIA state generator needs Go (>= 1.26) and the Go module proxy",
            script.display(),
            output.status
        ));
    }
    let path = stdout
        .lines()
        .find_map(|l| l.strip_prefix("nvidia-state-bin="))
        .map(PathBuf::from)
        .ok_or_else(|| format!("{} printed no nvidia-state-bin= line: {stdout}", script.display()))?;
    if !path.is_file() {
        return Err(format!("{} is missing after the build", path.display()));
    }
    Ok(BUILT.get_or_init(|| path).clone())
}

/// Runs the generator with `args`, feeding `stdin`; its stdout, or an error
/// with its stderr.
fn generate(args: &[&str], stdin: &[u8]) -> Result<Vec<u8>, String> {
    let bin = nvidia_state_bin()?;
    let mut child = Command::new(&bin)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawning {}: {e}", bin.display()))?;
    let mut pipe = child.stdin.take().expect("stdin is piped");
    let input = stdin.to_vec();
    let writer = std::thread::spawn(move || pipe.write_all(&input));
    let output = child.wait_with_output().map_err(|e| format!("waiting for {}: {e}", bin.display()))?;
    let written = writer.join().expect("the stdin writer");
    if !output.status.success() {
        return Err(format!(
            "nvidia-state {} ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim_end()
        ));
    }
    written.map_err(|e| format!("writing the input of nvidia-state {}: {e}", args.join(" ")))?;
    Ok(output.stdout)
}

/// The generator's input for a checkpoint.
pub fn checkpoint_input(boot_id: &str, claims: &[NvidiaClaim]) -> Vec<u8> {
    #[derive(Serialize)]
    struct Input<'a> {
        #[serde(rename = "bootID", skip_serializing_if = "str::is_empty")]
        boot_id: &'a str,
        claims: &'a [NvidiaClaim],
    }
    serde_json::to_vec(&Input { boot_id, claims }).expect("the input serializes")
}

/// The checkpoint file `format`'s release writes on a node booted as
/// `boot_id` ("" for none) where these claims were prepared: each claim as
/// [`NvidiaClaim::as_recorded_by`] that release, the boot ID from v0.4 on.
/// Errors (the generator's stderr) for what the release cannot have
/// written, e.g. a vfio device before v25.12 or a MIG device without its
/// MigLiveTuple from v25.12.
pub fn try_checkpoint(format: NvidiaFormat, boot_id: &str, claims: &[NvidiaClaim]) -> Result<Vec<u8>, String> {
    let recorded: Vec<NvidiaClaim> = claims.iter().filter_map(|c| c.as_recorded_by(format)).collect();
    let boot_id = if format.is_v0_4_or_later() { boot_id } else { "" };
    checkpoint_exact(format, boot_id, &recorded)
}

/// [`try_checkpoint`], panicking with the generator's error.
pub fn checkpoint(format: NvidiaFormat, boot_id: &str, claims: &[NvidiaClaim]) -> Vec<u8> {
    try_checkpoint(format, boot_id, claims).unwrap_or_else(|e| panic!("{e}"))
}

/// The checkpoint file holding exactly these claims in `format`'s layout,
/// nothing adapted: a field the layout cannot hold is an error naming it.
pub fn checkpoint_exact(format: NvidiaFormat, boot_id: &str, claims: &[NvidiaClaim]) -> Result<Vec<u8>, String> {
    generate(&["checkpoint", "--format", format.as_str()], &checkpoint_input(boot_id, claims))
}

/// Verifies a checkpoint's checksum(s) as some NVIDIA release does when it
/// reads the file (its types, re-marshaled, the newest release first): a
/// self-check of generated files, which a changed byte fails.
pub fn verify(checkpoint: &[u8]) -> Result<(), String> {
    generate(&["verify", "--format", "any"], checkpoint).map(drop)
}

/// Verifies a checkpoint's checksum(s) as `format`'s release does.
/// [`NvidiaFormat::Main`] (NVIDIA's HEAD) rejects every older file holding a
/// group without MPS: it writes that configState as `{}`, they wrote
/// `{"mpsControlDaemonID":""}`.
pub fn verify_as(format: NvidiaFormat, checkpoint: &[u8]) -> Result<(), String> {
    generate(&["verify", "--format", format.as_str()], checkpoint).map(drop)
}

/// Writes a CDI spec, given as JSON (a specs-go Spec; an empty
/// `cdiVersion` becomes the minimum the spec needs), to `path` (a `.yaml`
/// file) as `format`'s release wrote its claim specs: the CNCF CDI
/// library's WriteSpec, mode [`NvidiaFormat::cdi_spec_mode`]. Errors carry
/// the generator's stderr (e.g. the library's validation).
pub fn try_write_cdi_yaml(format: NvidiaFormat, spec_json: &[u8], path: &Path) -> Result<(), String> {
    let out = path.to_str().ok_or_else(|| format!("{} is not UTF-8", path.display()))?;
    generate(&["cdi-yaml", "--format", format.as_str(), "--out", out], spec_json).map(drop)
}

/// [`try_write_cdi_yaml`], panicking with the generator's error.
pub fn write_cdi_yaml_as(format: NvidiaFormat, spec_json: &[u8], path: &Path) {
    try_write_cdi_yaml(format, spec_json, path).unwrap_or_else(|e| panic!("{e}"))
}

/// [`write_cdi_yaml_as`] as NVIDIA's current code ([`NvidiaFormat::latest`])
/// writes it.
pub fn write_cdi_yaml(spec_json: &[u8], path: &Path) {
    write_cdi_yaml_as(NvidiaFormat::latest(), spec_json, path)
}
