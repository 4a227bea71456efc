//! Dynamic MIG: GPUs in MIG mode whose instances the driver makes at
//! prepare and removes at unprepare, published as partitionable devices
//! (KEP-4815 shared counters).
//!
//! # The model
//!
//! A GPU managed dynamically is a [`Gpu`] whose `mig` is
//! [`MigMode::Dynamic`] (holding the instances that exist right now, all of
//! them made by us for prepared claims) and whose `mig_capabilities` says
//! what the hardware can hold: every GPU-instance profile NVML reports with
//! its NVML profile id and index, slice and engine counts, and every
//! placement `{start, size}` NVML reports for it.
//!
//! # Device names
//!
//! NVIDIA's driver names dynamic MIG devices exactly as static ones, and
//! claims written for it name devices, so ours are the same:
//!
//! * one device per (profile, placement):
//!   `gpu-<parentMinor>-mig-<profile>-<giProfileId>-<placementStart>`, the
//!   profile lowered to a DNS label (`1g.10gb+me` → `1g10gb-me`), e.g.
//!   `gpu-0-mig-1g10gb-19-3`;
//! * the whole GPU: `gpu-<minor>`, as when MIG is off.
//!
//! [`parse_device_name`] reads a name back (minor, profile id, placement
//! start): all prepare needs to create the instance.
//!
//! # Counters
//!
//! One counter set per dynamic GPU, `gpu-<minor>-counter-set` (NVIDIA's
//! name), holding `memory-slice-<i>` (1 each, so overlapping placements
//! conflict), `compute-slices`, and the engines a profile takes
//! (`copy-engines`, `decoders`, `encoders`, `jpeg-engines`,
//! `ofa-engines`: the largest count any profile takes, i.e. the full-GPU
//! profile's; a kind no profile takes is left out, as a counter of 0 says
//! nothing). A MIG device consumes the memory slices its placement covers,
//! its compute slices and its engines; the whole GPU consumes everything.
//! NVIDIA also counts `multiprocessors` and `memory`: the slices already
//! decide both (no layout NVML accepts runs out of either before its
//! slices), and every counter is work for the scheduler on every device
//! it tries, so we leave them out.
//!
//! # Which GPUs are dynamic
//!
//! [`DynamicMigGpus`]: by default (`auto`) a GPU in MIG mode with no
//! instances, or whose instances are all ours (recorded by the plugin);
//! or an explicit list. A GPU with instances we did not make is never
//! dynamic: its instances are an administrator's, and dynamic GPUs have
//! unknown instances destroyed.
//!
//! # Fake inventories and fleets
//!
//! `mig: [{gpus: [0, 1], dynamic: true}]` in a fake inventory entry puts
//! those GPUs in MIG mode with no instances, with the model's profile
//! table; with the `DynamicMIG` gate they are then dynamic (`auto`). A
//! fleet file names fake inventories, so it says the same.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use super::catalog::GpuModel;
use super::model::{Gpu, Inventory, MigCapabilities, MigCapableProfile, MigDevice, MigMode, MigProfile, Placement};
use crate::names::{DeviceName, InvalidName};

/// `NVML_COMPUTE_INSTANCE_PROFILE_*` index of a compute instance of
/// `slices` compute slices (nvml.h: 1, 2, 3, 4, 7, 8, 6 slices are 0-6).
pub fn compute_instance_profile_index(slices: u32) -> Option<u32> {
    match slices {
        1 => Some(0),
        2 => Some(1),
        3 => Some(2),
        4 => Some(3),
        7 => Some(4),
        8 => Some(5),
        6 => Some(6),
        _ => None,
    }
}

impl MigCapabilities {
    /// The profile with NVML profile id `gi_profile_id`.
    pub fn profile(&self, gi_profile_id: u32) -> Option<&MigCapableProfile> {
        self.profiles.iter().find(|p| p.profile.gi_profile_id == gi_profile_id)
    }

    /// Every (profile, placement) a device is published for, in the order
    /// a first-fit scheduler should try them: smallest profiles first (by
    /// compute slices, memory slices, memory; media extensions last), so
    /// "a 2g or bigger" gets a 2g, not the 7g; and each profile's
    /// placements from the highest start down, so small instances fill the
    /// GPU from its end and leave slice 0, where the large profiles start,
    /// free longest (out-of-order placement fragmented NVIDIA's GPUs, their
    /// #933).
    pub fn devices(&self) -> impl Iterator<Item = (&MigCapableProfile, Placement)> {
        let mut profiles: Vec<&MigCapableProfile> = self.profiles.iter().collect();
        profiles.sort_by_key(|p| {
            let media = p.profile.jpeg_engines + p.profile.ofa_engines;
            (p.compute_slices, p.memory_slices, p.profile.memory_bytes, media, p.profile.gi_profile_id)
        });
        profiles.into_iter().flat_map(|p| p.placements.iter().rev().map(move |&pl| (p, pl)))
    }

    /// The GPU's counters: what the whole GPU consumes.
    pub fn counters(&self) -> BTreeMap<CounterName, u64> {
        let mut out = BTreeMap::new();
        for slice in 0..self.memory_slices {
            out.insert(CounterName::MemorySlice(slice), 1);
        }
        out.insert(CounterName::ComputeSlices, u64::from(self.compute_slices));
        for engine in Engine::ALL {
            let most = self.profiles.iter().map(|p| engine.count(&p.profile)).max().unwrap_or(0);
            if most > 0 {
                out.insert(CounterName::Engine(engine), u64::from(most));
            }
        }
        out
    }

    /// What the MIG device of `profile` at `placement` consumes. Engine
    /// kinds the GPU has no counter for (no profile takes them) are left
    /// out with them.
    pub fn consumption(&self, profile: &MigCapableProfile, placement: Placement) -> BTreeMap<CounterName, u64> {
        let mut out = BTreeMap::new();
        for slice in placement.slices() {
            out.insert(CounterName::MemorySlice(slice), 1);
        }
        out.insert(CounterName::ComputeSlices, u64::from(profile.compute_slices));
        for engine in Engine::ALL {
            let n = engine.count(&profile.profile);
            if n > 0 {
                out.insert(CounterName::Engine(engine), u64::from(n));
            }
        }
        out
    }

    /// From the embedded model table (fake inventories): the model's
    /// profiles with the NVML indices real hardware reports them under.
    pub fn from_model(model: &GpuModel) -> Option<MigCapabilities> {
        if model.mig_profiles.is_empty() {
            return None;
        }
        let mut profiles: Vec<MigCapableProfile> = model
            .mig_profiles
            .iter()
            .map(|p| MigCapableProfile {
                profile: MigProfile {
                    name: p.name.clone(),
                    gi_profile_id: p.gi_profile_id,
                    multiprocessors: p.multiprocessors,
                    copy_engines: p.copy_engines,
                    decoders: p.decoders,
                    encoders: p.encoders,
                    jpeg_engines: p.jpeg_engines,
                    ofa_engines: p.ofa_engines,
                    memory_bytes: p.memory_mib << 20,
                },
                profile_index: gpu_instance_profile_index(&p.name, p.compute_slices, p.memory_slices, model),
                compute_instance_profile_index: compute_instance_profile_index(p.compute_slices).unwrap_or(0),
                compute_slices: p.compute_slices,
                memory_slices: p.memory_slices,
                max_count: p.max_count,
                placements: p.placements().collect(),
            })
            .collect();
        profiles.sort_by_key(|p| p.profile.gi_profile_id);
        Some(MigCapabilities {
            memory_slices: model.memory_slices,
            compute_slices: model.compute_slices,
            mig_mode_switchable: mig_mode_switchable(&model.architecture_name()),
            profiles,
        })
    }
}

/// Whether MIG mode can be switched without a GPU reset: Hopper and later
/// (NVIDIA's `supportsMIGModeToggle`: architecture >= Hopper).
pub fn mig_mode_switchable(architecture: &str) -> bool {
    !matches!(architecture, "Ampere" | "Turing" | "Volta" | "Pascal" | "Maxwell" | "Kepler" | "Ada Lovelace" | "")
}

/// `NVML_GPU_INSTANCE_PROFILE_*` index of a model-table profile, as NVML
/// numbers them: `<G>g` by slice count, `+me` the REV1 variant, a 1g with
/// twice the memory (A100's `1g.10gb`) REV2, a full-GPU profile of 4
/// slices (A30's `4g.24gb`) the 4-slice one.
fn gpu_instance_profile_index(name: &str, compute_slices: u32, memory_slices: u32, model: &GpuModel) -> u32 {
    let media = name.ends_with("+me");
    match (compute_slices, media) {
        (1, true) => 7,
        (2, true) => 8,
        (1, false) if memory_slices == 2 && model.memory_slices == 8 => 9,
        (1, false) => 0,
        (2, false) => 1,
        (3, _) => 2,
        (4, _) => 3,
        (7, _) => 4,
        (8, _) => 5,
        (6, _) => 6,
        _ => 0,
    }
}

/// An engine kind a profile takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Engine {
    Copy,
    Decoder,
    Encoder,
    Jpeg,
    Ofa,
}

impl Engine {
    pub const ALL: [Engine; 5] = [Engine::Copy, Engine::Decoder, Engine::Encoder, Engine::Jpeg, Engine::Ofa];

    fn count(self, p: &MigProfile) -> u32 {
        match self {
            Engine::Copy => p.copy_engines,
            Engine::Decoder => p.decoders,
            Engine::Encoder => p.encoders,
            Engine::Jpeg => p.jpeg_engines,
            Engine::Ofa => p.ofa_engines,
        }
    }
}

/// A counter of a dynamic GPU's counter set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CounterName {
    /// `memory-slice-<i>`, value 1.
    MemorySlice(u32),
    /// `compute-slices`.
    ComputeSlices,
    /// `copy-engines`, `decoders`, `encoders`, `jpeg-engines`, `ofa-engines`.
    Engine(Engine),
}

impl fmt::Display for CounterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CounterName::MemorySlice(i) => write!(f, "memory-slice-{i}"),
            CounterName::ComputeSlices => f.write_str("compute-slices"),
            CounterName::Engine(Engine::Copy) => f.write_str("copy-engines"),
            CounterName::Engine(Engine::Decoder) => f.write_str("decoders"),
            CounterName::Engine(Engine::Encoder) => f.write_str("encoders"),
            CounterName::Engine(Engine::Jpeg) => f.write_str("jpeg-engines"),
            CounterName::Engine(Engine::Ofa) => f.write_str("ofa-engines"),
        }
    }
}

/// `gpu-<minor>-counter-set`: the counter set of a dynamic GPU (NVIDIA's name).
pub fn counter_set_name(gpu_minor: u32) -> String {
    format!("gpu-{gpu_minor}-counter-set")
}

/// A MIG profile name as it appears in a device name: dots dropped, lower
/// case, anything else not allowed in a DNS label turned into `-`, no `-`
/// at the ends (`1g.10gb+me` → `1g10gb-me`), as NVIDIA's driver does.
pub fn profile_label(profile_name: &str) -> String {
    let label: String = profile_name
        .chars()
        .filter(|&c| c != '.')
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' { c } else { '-' }
        })
        .collect();
    label.trim_matches('-').to_string()
}

/// `gpu-<parentMinor>-mig-<profile label>-<giProfileId>-<placementStart>`:
/// the name of a MIG device, static or dynamic.
pub fn mig_device_name(
    parent_minor: u32,
    profile_name: &str,
    gi_profile_id: u32,
    placement_start: u32,
) -> Result<DeviceName, InvalidName> {
    DeviceName::new(format!("gpu-{parent_minor}-mig-{}-{gi_profile_id}-{placement_start}", profile_label(profile_name)))
}

/// A device name read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParsedDeviceName {
    /// `gpu-<minor>`.
    WholeGpu { minor: u32 },
    /// `gpu-<minor>-mig-<profile label>-<giProfileId>-<placementStart>`.
    Mig { parent_minor: u32, profile_label: String, gi_profile_id: u32, placement_start: u32 },
}

/// Reads a device name of ours back; `None` when it is not one (NVIDIA's
/// regex `^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$`, and `^gpu-(\d+)$`).
pub fn parse_device_name(name: &str) -> Option<ParsedDeviceName> {
    let rest = name.strip_prefix("gpu-")?;
    let number = |s: &str| -> Option<u32> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    let Some((minor, mig)) = rest.split_once("-mig-") else {
        return number(rest).map(|minor| ParsedDeviceName::WholeGpu { minor });
    };
    let parent_minor = number(minor)?;
    let (head, start) = mig.rsplit_once('-')?;
    let (label, id) = head.rsplit_once('-')?;
    if label.is_empty() {
        return None;
    }
    Some(ParsedDeviceName::Mig {
        parent_minor,
        profile_label: label.to_string(),
        gi_profile_id: number(id)?,
        placement_start: number(start)?,
    })
}

/// A dynamic MIG device found by name on a node: what prepare creates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DynamicMigTarget<'a> {
    pub parent: &'a Gpu,
    pub capabilities: &'a MigCapabilities,
    pub profile: &'a MigCapableProfile,
    pub placement: Placement,
}

impl Inventory {
    /// The dynamic MIG device `name` on this node: its GPU (by minor), its
    /// profile (by id) and placement (by start), all checked against what
    /// the GPU offers. `None` for any other name.
    pub fn dynamic_mig_target(&self, name: &str) -> Option<DynamicMigTarget<'_>> {
        let ParsedDeviceName::Mig { parent_minor, profile_label: label, gi_profile_id, placement_start } =
            parse_device_name(name)?
        else {
            return None;
        };
        let parent = self.gpus.iter().find(|g| g.minor == parent_minor)?;
        let (capabilities, _) = parent.dynamic_mig()?;
        let profile = capabilities.profile(gi_profile_id)?;
        if profile_label(&profile.profile.name) != label {
            return None;
        }
        let placement = profile.placements.iter().copied().find(|p| p.start == placement_start)?;
        Some(DynamicMigTarget { parent, capabilities, profile, placement })
    }
}

impl Gpu {
    /// For a GPU managed dynamically: what it can hold and the instances
    /// that exist now.
    pub fn dynamic_mig(&self) -> Option<(&MigCapabilities, &[MigDevice])> {
        match (&self.mig, &self.mig_capabilities) {
            (MigMode::Dynamic(instances), Some(caps)) => Some((caps, instances)),
            _ => None,
        }
    }
}

/// Which MIG-mode GPUs the driver manages dynamically
/// (`--dynamic-mig-gpus`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DynamicMigGpus {
    /// MIG-mode GPUs with no instances, or only ours.
    #[default]
    Auto,
    /// None: every MIG-mode GPU stays as an administrator cut it.
    None,
    /// These GPUs (by minor or `GPU-` UUID), when they have no instances
    /// but ours.
    Listed(BTreeSet<GpuRef>),
}

/// A GPU named on the command line.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum GpuRef {
    Minor(u32),
    Uuid(String),
}

impl GpuRef {
    fn matches(&self, gpu: &Gpu) -> bool {
        match self {
            GpuRef::Minor(m) => gpu.minor == *m,
            GpuRef::Uuid(u) => gpu.uuid.eq_ignore_ascii_case(u),
        }
    }
}

/// A `--dynamic-mig-gpus` value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--dynamic-mig-gpus: {found:?} is not a GPU minor number or GPU- UUID; write auto, none, or a list such as 0,1,GPU-8f6e..."
)]
pub struct DynamicMigGpusError {
    pub found: String,
}

impl FromStr for DynamicMigGpus {
    type Err = DynamicMigGpusError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "" | "auto" => return Ok(DynamicMigGpus::Auto),
            "none" => return Ok(DynamicMigGpus::None),
            _ => {}
        }
        let mut listed = BTreeSet::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let gpu = if let Ok(minor) = item.parse::<u32>() {
                GpuRef::Minor(minor)
            } else if item.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("GPU-")) && item.len() > 4 {
                GpuRef::Uuid(item.to_string())
            } else {
                return Err(DynamicMigGpusError { found: item.to_string() });
            };
            listed.insert(gpu);
        }
        Ok(DynamicMigGpus::Listed(listed))
    }
}

impl fmt::Display for DynamicMigGpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DynamicMigGpus::Auto => f.write_str("auto"),
            DynamicMigGpus::None => f.write_str("none"),
            DynamicMigGpus::Listed(gpus) => {
                let items: Vec<String> = gpus
                    .iter()
                    .map(|g| match g {
                        GpuRef::Minor(m) => m.to_string(),
                        GpuRef::Uuid(u) => u.clone(),
                    })
                    .collect();
                f.write_str(&items.join(","))
            }
        }
    }
}

/// Why a selected MIG-mode GPU stays static.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftStatic {
    pub minor: u32,
    pub reason: String,
}

/// Makes the GPUs `which` selects dynamic: MIG mode on, a profile table
/// read, and no instance that `is_ours` does not claim (an instance the
/// plugin made for a prepared claim, by MIG UUID). Returns the selected
/// GPUs left static, and why, for the log. GPUs already dynamic are
/// checked the same way.
pub fn select(
    inventory: &mut Inventory,
    which: &DynamicMigGpus,
    is_ours: &dyn Fn(&MigDevice) -> bool,
) -> Vec<LeftStatic> {
    let mut left = Vec::new();
    for gpu in &mut inventory.gpus {
        let selected = match which {
            DynamicMigGpus::Auto => true,
            DynamicMigGpus::None => false,
            DynamicMigGpus::Listed(gpus) => gpus.iter().any(|g| g.matches(gpu)),
        };
        let instances = match &mut gpu.mig {
            MigMode::Disabled => {
                if matches!(which, DynamicMigGpus::Listed(_)) && selected {
                    left.push(LeftStatic { minor: gpu.minor, reason: "MIG mode is off".into() });
                }
                continue;
            }
            MigMode::Enabled(instances) | MigMode::Dynamic(instances) => std::mem::take(instances),
        };
        let foreign = instances.iter().filter(|m| !is_ours(m)).count();
        let dynamic = selected && gpu.mig_capabilities.is_some() && foreign == 0;
        if selected && !dynamic && (matches!(which, DynamicMigGpus::Listed(_)) || instances.is_empty()) {
            let reason = if gpu.mig_capabilities.is_none() {
                "NVML reported no MIG profiles for it".to_string()
            } else {
                format!("it has {foreign} MIG instance(s) the driver did not make")
            };
            left.push(LeftStatic { minor: gpu.minor, reason });
        }
        gpu.mig = if dynamic { MigMode::Dynamic(instances) } else { MigMode::Enabled(instances) };
    }
    left
}

#[cfg(test)]
#[path = "dynamic_mig_tests.rs"]
mod tests;
