//! Facts about GPU models (memory, architecture, MIG profiles and their
//! placements), embedded in the binary for fake inventories.
//!
//! Real hardware is always read through NVML; this table only lets a fake
//! inventory describe a plausible node by model name.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::Deserialize;

use super::model::Placement;

const EMBEDDED: &str = include_str!("../../data/gpu-models.json");

/// All known models by key (e.g. `H100-80GB`).
#[derive(Debug, Deserialize)]
pub struct Catalog {
    pub models: BTreeMap<String, GpuModel>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuModel {
    pub product_name: String,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Lower case in the data (`hopper`); see [`GpuModel::architecture_name`].
    pub architecture: String,
    pub cuda_compute_capability: String,
    pub pci_device_id: String,
    pub memory_slices: u32,
    pub compute_slices: u32,
    #[serde(default)]
    pub mig_profiles: Vec<CatalogMigProfile>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CatalogMigProfile {
    pub name: String,
    pub gi_profile_id: u32,
    pub max_count: u32,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    pub multiprocessors: u32,
    pub compute_slices: u32,
    pub memory_slices: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpeg_engines: u32,
    pub ofa_engines: u32,
    /// `[start, size]` pairs in memory-slice units.
    pub placements: Vec<[u32; 2]>,
}

/// The embedded table could not be read: a build defect, reported rather
/// than panicking.
#[derive(Debug, Clone, thiserror::Error)]
#[error("embedded GPU model table is corrupt: {0}")]
pub struct CatalogError(String);

impl Catalog {
    /// The table shipped in this binary, parsed once.
    pub fn embedded() -> Result<&'static Catalog, CatalogError> {
        static CATALOG: OnceLock<Result<Catalog, String>> = OnceLock::new();
        CATALOG
            .get_or_init(|| serde_json::from_str(EMBEDDED).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| CatalogError(e.clone()))
    }

    pub fn model(&self, key: &str) -> Option<&GpuModel> {
        self.models.get(key)
    }

    /// Model keys, for error messages that list the choices.
    pub fn model_keys(&self) -> Vec<&str> {
        self.models.keys().map(String::as_str).collect()
    }
}

impl GpuModel {
    /// The architecture as NVIDIA's driver publishes it (`Hopper`).
    /// As NVML names it: each word capitalized (`Hopper`, `Ada Lovelace`).
    pub fn architecture_name(&self) -> String {
        let word = |w: &str| {
            let mut chars = w.chars();
            chars.next().map(|first| first.to_uppercase().chain(chars).collect::<String>()).unwrap_or_default()
        };
        self.architecture.split(' ').map(word).collect::<Vec<_>>().join(" ")
    }

    pub fn mig_profile(&self, name: &str) -> Option<&CatalogMigProfile> {
        self.mig_profiles.iter().find(|p| p.name == name)
    }

    pub fn mig_profile_names(&self) -> Vec<&str> {
        self.mig_profiles.iter().map(|p| p.name.as_str()).collect()
    }
}

impl CatalogMigProfile {
    pub fn placements(&self) -> impl Iterator<Item = Placement> + '_ {
        self.placements.iter().map(|&[start, size]| Placement { start, size })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_table_parses_and_is_consistent() {
        let catalog = Catalog::embedded().unwrap();
        assert!(catalog.model("H100-80GB").is_some());
        assert!(catalog.model("A100-SXM4-80GB").is_some());
        for (key, model) in &catalog.models {
            assert!(!model.product_name.is_empty(), "{key}");
            for p in &model.mig_profiles {
                assert!(p.max_count >= 1, "{key} {}", p.name);
                for pl in p.placements() {
                    assert_eq!(pl.size, p.memory_slices, "{key} {} placement size", p.name);
                    assert!(pl.start + pl.size <= model.memory_slices, "{key} {} placement", p.name);
                }
                assert!(p.compute_slices <= model.compute_slices, "{key} {}", p.name);
            }
        }
    }

    /// NVML names profiles by go-nvlib's formula from their memory and the
    /// GPU's: the table's memory must give the table's names, or a node
    /// read through NVML would publish other device names than its fake
    /// inventory.
    #[test]
    fn profile_names_follow_from_their_memory() {
        use crate::inventory::nvml::names::mig_memory_gb;
        let catalog = Catalog::embedded().unwrap();
        for (key, model) in &catalog.models {
            for p in &model.mig_profiles {
                let gb = mig_memory_gb(p.memory_mib, model.memory_mib << 20);
                let base = p.name.split(['+', '-']).next().unwrap();
                assert_eq!(base, format!("{}g.{gb}gb", p.compute_slices), "{key}: {} has {} MiB", p.name, p.memory_mib);
            }
        }
    }

    #[test]
    fn architecture_is_capitalized_like_nvidia() {
        let catalog = Catalog::embedded().unwrap();
        assert_eq!(catalog.model("H100-80GB").unwrap().architecture_name(), "Hopper");
        assert_eq!(catalog.model("B200-180GB").unwrap().architecture_name(), "Blackwell");
        assert_eq!(catalog.model("L40S-48GB").unwrap().architecture_name(), "Ada Lovelace", "as NVML names it");
        for key in ["L4-24GB", "L40S-48GB", "T4-16GB", "A10-24GB"] {
            assert!(catalog.model(key).unwrap().mig_profiles.is_empty(), "{key} has no MIG");
        }
        for key in ["H100-NVL-94GB", "GH200-96GB"] {
            assert!(catalog.model(key).unwrap().mig_profile("1g.12gb").is_some(), "{key}");
        }
    }
}
