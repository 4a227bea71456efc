//! `--fleet`: nodes with labels and fake inventories, published with the
//! plugin's own [`SliceBuilder`], so `simulate` sees exactly the slices the
//! nodes would publish.
//!
//! ```yaml
//! nodes:                         # or the list itself at the top level
//!   - name: dgx-1
//!     labels: {topology.kubernetes.io/zone: a}
//!     inventory: ../inventories/dgx-h100.yaml   # relative to this file
//!   - name: a100-1
//!     inventory:                 # or the inventory inline
//!       gpus: [{model: A100-SXM4-80GB, count: 4}]
//!     featureGates: ConsumableCapacity=true   # this node's plugin's gates
//! featureGates: ""               # every other node's (wrapped form only)
//! consumableShares: "4"          # --consumable-shares, with ConsumableShares
//! ```
//!
//! `featureGates` is the plugin's `--feature-gates`, for what the slices
//! show of it (`ConsumableCapacity`: GPUs shareable by memory). Only
//! publishing is simulated, so gates the plugin would refuse to start with
//! alone (ConsumableCapacity without MPSSupport) are taken here.

use std::collections::BTreeMap;
use std::path::Path;

use gpu_dra_driver::feature_gates::{FeatureGateError, FeatureGates, Gate};
use gpu_dra_driver::inventory::dynamic_mig::{self, DynamicMigGpus};
use gpu_dra_driver::inventory::{Inventory, fake};
use gpu_dra_driver::names::{DriverName, InvalidName, NodeName};
use gpu_dra_driver::slices::SliceBuilder;
use gpu_dra_driver::slices::consumable_shares::{InvalidSharesMode, SharesMode};
use gpu_dra_driver::slices::served::{GatedField, NotServed};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{MapAccess, SeqAccess, Visitor};

/// Generation of the pools a fleet publishes: a freshly started plugin's.
const GENERATION: i64 = 1;

/// The whole file: the wrapped form or the bare list, told apart by shape
/// (an untagged enum would only say that neither matched).
#[derive(Debug)]
enum FleetFile {
    Wrapped(Wrapped),
    List(Vec<FleetNode>),
}

impl<'de> Deserialize<'de> for FleetFile {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Shape;
        impl<'de> Visitor<'de> for Shape {
            type Value = FleetFile;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a mapping with `nodes:` (and optionally `featureGates:`), or a list of nodes")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<FleetFile, A::Error> {
                Vec::deserialize(SeqAccessDeserializer::new(seq)).map(FleetFile::List)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<FleetFile, A::Error> {
                Wrapped::deserialize(MapAccessDeserializer::new(map)).map(FleetFile::Wrapped)
            }
        }
        deserializer.deserialize_any(Shape)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wrapped {
    nodes: Vec<FleetNode>,
    #[serde(default, rename = "featureGates")]
    feature_gates: Option<String>,
    #[serde(default, rename = "consumableShares")]
    consumable_shares: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FleetNode {
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    inventory: InventoryRef,
    #[serde(default, rename = "featureGates")]
    feature_gates: Option<String>,
    #[serde(default, rename = "consumableShares")]
    consumable_shares: Option<String>,
}

/// A node's inventory: a file (a string) or the inventory itself (a mapping).
#[derive(Debug)]
enum InventoryRef {
    Path(String),
    Inline(serde_yaml_ng::Value),
}

impl<'de> Deserialize<'de> for InventoryRef {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Shape;
        impl<'de> Visitor<'de> for Shape {
            type Value = InventoryRef;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("the path of a fake inventory file, or an inventory mapping such as {gpus: [{model: H100-80GB, count: 8}]}")
            }
            fn visit_str<E: serde::de::Error>(self, path: &str) -> Result<InventoryRef, E> {
                Ok(InventoryRef::Path(path.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<InventoryRef, A::Error> {
                serde_yaml_ng::Value::deserialize(MapAccessDeserializer::new(map)).map(InventoryRef::Inline)
            }
        }
        deserializer.deserialize_any(Shape)
    }
}

/// The fleet's nodes and the slices they publish.
#[derive(Debug, Default)]
pub struct Fleet {
    pub nodes: Vec<Node>,
    pub slices: Vec<ResourceSlice>,
    /// The fleet-wide `featureGates` (the node agents' and so the webhook's).
    pub gates: FeatureGates,
    /// Fields the plugins would have published but left devices out for
    /// instead, the server not serving them (taints of faulty GPUs).
    pub withheld_for: NotServed,
}

/// A fleet file simulate cannot use: where (the file, or `at`: the file
/// and the node entry), what is wrong and the fix where there is one.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("{path}: cannot read the fleet file")]
    Read {
        path: String,
        #[source]
        error: std::io::Error,
    },
    #[error("{origin}: {error}")]
    TooDeep { origin: String, error: gpu_dra_driver::nesting::TooDeep },
    /// `problem` is the YAML reader's, on one line, with node paths named
    /// `nodes[i]`.
    #[error(
        "{origin}: malformed fleet file: {problem}; fix: write `nodes:` as a list of {{name, labels, inventory}} \
         entries (see examples/fleets/)"
    )]
    Malformed { origin: String, problem: String },
    #[error("{at}: name: {error}")]
    Name { at: String, error: InvalidName },
    #[error("{at}: node {name} is listed twice; fix: give each node a distinct name")]
    Twice { at: String, name: String },
    #[error("{at}: {error}")]
    Slices { at: String, error: gpu_dra_driver::slices::SliceError },
    #[error("{at}: {error}")]
    Shares { at: String, error: InvalidSharesMode },
    #[error("{at}: {error}; fix: write gates as the plugin's --feature-gates, e.g. ConsumableCapacity=true")]
    Gates { at: String, error: FeatureGateError },
    /// A node's inventory cannot be read; `problem` says why, with the
    /// field and fix where the inventory's reader gives them.
    #[error("{at}: inventory: {problem}")]
    Inventory { at: String, problem: String },
}

/// Reads the fleet file at `path`, its slices as the plugins publish them
/// to an API server that drops `not_served` (they withhold faulty GPUs
/// where taints are not served, dynamic MIG devices where counters are not).
pub fn load(path: &Path, not_served: NotServed) -> Result<Fleet, FleetError> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).map_err(|error| FleetError::Read { path: shown.to_string(), error })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    parse_serving(&text, &shown.to_string(), dir, not_served)
}

/// Parses fleet YAML read from `origin`; inventory paths are relative to `dir`.
#[cfg(test)]
pub fn parse(text: &str, origin: &str, dir: &Path) -> Result<Fleet, FleetError> {
    parse_serving(text, origin, dir, NotServed::none())
}

/// [`parse`] for an API server that drops `not_served`.
pub fn parse_serving(text: &str, origin: &str, dir: &Path, not_served: NotServed) -> Result<Fleet, FleetError> {
    let text = gpu_dra_driver::safe_yaml::prepare(text)
        .map_err(|error| FleetError::TooDeep { origin: origin.to_owned(), error })?;
    let file: FleetFile = serde_yaml_ng::from_str(&text).map_err(|e| FleetError::Malformed {
        origin: origin.to_owned(),
        // The bare list's items are the nodes: `.[3]` is `nodes[3]`.
        problem: e.to_string().replace('\n', " ").replacen(
            ".[",
            "nodes[",
            usize::from(e.to_string().starts_with(".[")),
        ),
    })?;
    let (nodes, fleet_gates, fleet_shares) = match file {
        FleetFile::Wrapped(w) => (w.nodes, w.feature_gates, w.consumable_shares),
        FleetFile::List(l) => (l, None, None),
    };
    let fleet_gates = gates(fleet_gates.as_deref(), &format!("{origin}: featureGates"))?;
    let fleet_shares = shares_mode(fleet_shares.as_deref(), &format!("{origin}: consumableShares"))?;
    let mut fleet = Fleet { gates: fleet_gates, ..Fleet::default() };
    let mut names = std::collections::HashSet::new();
    // Inventory files by path, read and parsed once however many nodes use them.
    let mut files: std::collections::HashMap<std::path::PathBuf, fake::FakeInventory> = Default::default();
    for (i, n) in nodes.iter().enumerate() {
        let at = format!("{origin}: nodes[{i}] ({})", n.name);
        let node = NodeName::new(n.name.clone()).map_err(|error| FleetError::Name { at: at.clone(), error })?;
        if !names.insert(n.name.clone()) {
            return Err(FleetError::Twice { at, name: n.name.clone() });
        }
        let mut inventory = inventory(&n.inventory, &node, dir, &at, &mut files)?;
        let node_gates = match &n.feature_gates {
            Some(text) => gates(Some(text), &format!("{at}: featureGates"))?,
            None => fleet_gates,
        };
        // As the plugin's default --dynamic-mig-gpus=auto selects them.
        if node_gates.enabled(Gate::DynamicMig) {
            dynamic_mig::select(&mut inventory, &DynamicMigGpus::Auto, &|_| false);
        }
        let node_shares = match &n.consumable_shares {
            Some(text) => shares_mode(Some(text), &format!("{at}: consumableShares"))?,
            None => fleet_shares,
        };
        let builder = SliceBuilder::new(DriverName::nvidia_default(), node)
            .with_gates(node_gates)
            .with_consumable_shares(node_gates, node_shares)
            .serving(&not_served);
        // What the plugin leaves out for a field the server drops: known
        // from its slices as a serving server would get them (built once,
        // and only when such a field is dropped).
        let withholding: Vec<GatedField> = [GatedField::Taints, GatedField::SharedCounters]
            .into_iter()
            .filter(|f| not_served.contains(*f) && !fleet.withheld_for.contains(*f))
            .collect();
        if !withholding.is_empty()
            && let Ok(all) = builder.clone().serving(&NotServed::none()).build(&inventory, GENERATION)
        {
            for field in withholding.into_iter().filter(|f| all.iter().any(|s| f.used_in(&s.spec))) {
                fleet.withheld_for.insert(field);
            }
        }
        let slices =
            builder.build(&inventory, GENERATION).map_err(|error| FleetError::Slices { at: at.clone(), error })?;
        fleet.slices.extend(slices);
        let mut labels = n.labels.clone();
        // The kubelet sets this label on every node; selectors often use it.
        labels.entry("kubernetes.io/hostname".to_string()).or_insert_with(|| n.name.clone());
        fleet.nodes.push(Node {
            metadata: ObjectMeta { name: Some(n.name.clone()), labels: Some(labels), ..Default::default() },
            ..Default::default()
        });
    }
    Ok(fleet)
}

/// NVIDIA's `--consumable-shares` mode (used with the `ConsumableShares`
/// gate); disabled when absent.
fn shares_mode(text: Option<&str>, at: &str) -> Result<SharesMode, FleetError> {
    text.unwrap_or_default().parse().map_err(|error| FleetError::Shares { at: at.to_owned(), error })
}

/// Gates written as `--feature-gates` takes them; none when absent.
fn gates(text: Option<&str>, at: &str) -> Result<FeatureGates, FleetError> {
    text.unwrap_or_default().parse().map_err(|error| FleetError::Gates { at: at.to_owned(), error })
}

fn inventory(
    source: &InventoryRef,
    node: &NodeName,
    dir: &Path,
    at: &str,
    files: &mut std::collections::HashMap<std::path::PathBuf, fake::FakeInventory>,
) -> Result<Inventory, FleetError> {
    match source {
        InventoryRef::Path(p) => {
            let path = dir.join(p);
            let file = match files.entry(path) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let loaded = fake::FakeInventory::load(e.key()).map_err(|e| inventory_error(at, e))?;
                    e.insert(loaded)
                }
            };
            file.for_node(node).map_err(|e| inventory_error(at, e))
        }
        InventoryRef::Inline(value) => {
            let text = serde_yaml_ng::to_string(value).map_err(|e| inventory_error(at, e))?;
            fake::parse(&text, node).map_err(|(field, problem, fix)| {
                let field = if field.is_empty() { String::new() } else { format!("{field}: ") };
                inventory_error(at, format!("{field}{problem}; fix: {fix}"))
            })
        }
    }
}

fn inventory_error(at: &str, problem: impl std::fmt::Display) -> FleetError {
    FleetError::Inventory { at: at.to_owned(), problem: problem.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_fleet_file_says_so_and_why() {
        let error = load(Path::new("/nonexistent/fleet.yaml"), NotServed::none()).unwrap_err();
        assert_eq!(error.to_string(), "/nonexistent/fleet.yaml: cannot read the fleet file");
        // Wrapped at the binary's edge, the I/O error follows as before.
        let shown = format!("{:#}", anyhow::Error::from(error));
        assert!(shown.starts_with("/nonexistent/fleet.yaml: cannot read the fleet file: "), "{shown}");
    }

    #[test]
    fn nodes_publish_their_slices_with_labels() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("inv.yaml"), "gpus: [{model: H100-80GB, count: 2}]\n").unwrap();
        let fleet = parse(
            "nodes:\n- name: b\n  labels: {zone: z1}\n  inventory: inv.yaml\n\
             - name: a\n  inventory: {gpus: [{model: A100-SXM4-40GB, count: 1}]}\n",
            "fleet.yaml",
            dir.path(),
        )
        .unwrap();
        let names: Vec<_> = fleet.nodes.iter().filter_map(|n| n.metadata.name.as_deref()).collect();
        assert_eq!(names, ["b", "a"]);
        let labels = fleet.nodes[0].metadata.labels.as_ref().unwrap();
        assert_eq!(labels.get("zone").map(String::as_str), Some("z1"));
        assert_eq!(labels.get("kubernetes.io/hostname").map(String::as_str), Some("b"));
        let devices: Vec<usize> = fleet.slices.iter().map(|s| s.spec.devices.as_ref().map_or(0, Vec::len)).collect();
        assert_eq!(devices, [2, 1]);
        assert_eq!(fleet.slices[1].spec.node_name.as_deref(), Some("a"));
    }

    #[test]
    fn consumable_shares_apply_with_their_gate_to_the_fleet_or_one_node() {
        let dir = tempfile::tempdir().unwrap();
        let fleet = parse(
            "featureGates: ConsumableShares=true\nconsumableShares: '4'\nnodes:\n\
             - {name: four, inventory: {gpus: [{model: H100-80GB, count: 1}]}}\n\
             - {name: two, consumableShares: '2', inventory: {gpus: [{model: H100-80GB, count: 1}]}}\n\
             - {name: plain, featureGates: '', inventory: {gpus: [{model: H100-80GB, count: 1}]}}\n",
            "fleet.yaml",
            dir.path(),
        )
        .unwrap();
        let shares: Vec<Option<String>> = fleet
            .slices
            .iter()
            .map(|s| {
                let device = &s.spec.devices.as_ref().unwrap()[0];
                device.capacity.as_ref().unwrap().get("shares").map(|c| c.value.0.clone())
            })
            .collect();
        assert_eq!(shares, [Some("4".into()), Some("2".into()), None]);
        let err = parse("consumableShares: half\nnodes: []\n", "f.yaml", dir.path()).unwrap_err().to_string();
        assert!(err.starts_with("f.yaml: consumableShares: --consumable-shares \"half\" is not a mode"), "{err}");
    }

    #[test]
    fn feature_gates_apply_to_the_fleet_or_one_node() {
        let dir = tempfile::tempdir().unwrap();
        let fleet = parse(
            "featureGates: ConsumableCapacity=true\nnodes:\n\
             - {name: shared, inventory: {gpus: [{model: H100-80GB, count: 1}]}}\n\
             - {name: dedicated, featureGates: '', inventory: {gpus: [{model: H100-80GB, count: 1}]}}\n",
            "fleet.yaml",
            dir.path(),
        )
        .unwrap();
        let shared: Vec<Option<bool>> =
            fleet.slices.iter().map(|s| s.spec.devices.as_ref().unwrap()[0].allow_multiple_allocations).collect();
        assert_eq!(shared, [Some(true), None]);
        let err = parse("featureGates: Halves=true\nnodes: []\n", "f.yaml", dir.path()).unwrap_err().to_string();
        assert!(err.starts_with("f.yaml: featureGates: unknown feature gate \"Halves\""), "{err}");
        let err = parse(
            "- {name: x, featureGates: MPSSupport, inventory: {gpus: [{model: H100-80GB}]}}\n",
            "f.yaml",
            dir.path(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("f.yaml: nodes[0] (x): featureGates: \"MPSSupport\" is not NAME=true|false"), "{err}");
    }

    #[test]
    fn shape_errors_name_the_field_found_and_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let err = parse("3\n", "f.yaml", dir.path()).unwrap_err().to_string();
        assert_eq!(
            err,
            "f.yaml: malformed fleet file: invalid type: integer `3`, expected a mapping with `nodes:` (and optionally \
             `featureGates:`), or a list of nodes; fix: write `nodes:` as a list of {name, labels, inventory} entries \
             (see examples/fleets/)"
        );
        let err = parse("nodes:\n- {name: x, inventroy: a.yaml}\n", "f.yaml", dir.path()).unwrap_err().to_string();
        assert!(err.starts_with("f.yaml: malformed fleet file: nodes[0]: unknown field `inventroy`, expected one of `name`, `labels`, `inventory`, `featureGates`"), "{err}");
        let err = parse("- {name: x, inventory: 3}\n", "f.yaml", dir.path()).unwrap_err().to_string();
        assert!(err.starts_with("f.yaml: malformed fleet file: nodes[0].inventory: invalid type: integer `3`, expected the path of a fake inventory file, or an inventory mapping"), "{err}");
        let fleet =
            parse("- {name: \"\\ud83d\\ude00\", inventory: {gpus: [{model: H100-80GB}]}}\n", "f.yaml", dir.path());
        let err = fleet.unwrap_err().to_string();
        assert!(err.starts_with("f.yaml: nodes[0] (\u{1f600}): name: "), "read, then refused as a node name: {err}");
    }

    #[test]
    fn errors_name_the_node_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let err = parse("- name: x\n  inventory: {gpus: [{model: Z1, count: 1}]}\n", "f.yaml", dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("f.yaml: nodes[0] (x): inventory: gpus[0].model: unknown GPU model"), "{err}");
        let err = parse("- name: x\n  inventory: none.yaml\n", "f.yaml", dir.path()).unwrap_err().to_string();
        assert!(err.contains("none.yaml: cannot read the file"), "{err}");
        let err = parse("nodes: 3\n", "f.yaml", dir.path()).unwrap_err().to_string();
        assert!(
            err.starts_with("f.yaml: malformed fleet file: nodes: invalid type: integer `3`, expected a sequence"),
            "{err}"
        );
        let err = parse("- {name: x, inventory: {gpus: [{model: H100-80GB}]}}\n- {name: x, inventory: {gpus: [{model: H100-80GB}]}}\n", "f.yaml", dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("listed twice"), "{err}");
    }
}
