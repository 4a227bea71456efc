//! Running `gpu-dra-controller simulate`'s engine on a cluster's objects:
//! the live slices, classes and nodes, the claims already allocated (they
//! hold their devices), and the claims in question. The reasons are
//! simulate's own text.

use gpu_dra_driver::feature_gates::{FeatureGates, Gate};
use std::collections::HashSet;

use anyhow::{Context, Result};
use gpu_dra_controller::manifests::Manifest;
use gpu_dra_controller::simulate;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};

use crate::cluster::Snapshot;

/// One claim's outcome, as simulate prints it with `-o json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub allocated: bool,
    pub node: Option<String>,
    pub allocation: Option<serde_json::Value>,
    pub error: bool,
    pub reason: Option<String>,
}

impl Outcome {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace.as_deref().unwrap_or_default(), self.name.as_deref().unwrap_or_default())
    }
}

#[derive(Deserialize)]
struct Results {
    results: Vec<Outcome>,
}

/// `namespace/name` of a claim.
pub fn claim_key(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

fn is_allocated(claim: &ResourceClaim) -> bool {
    claim.status.as_ref().is_some_and(|s| s.allocation.is_some())
}

fn manifest<T: serde::Serialize>(kind: &str, name: &str, object: &T) -> Result<Manifest> {
    let object = serde_json::to_value(object).with_context(|| format!("{kind} {name}"))?;
    Ok(Manifest::tree(format!("cluster {kind} {name}"), object))
}

/// The cluster's fleet and current allocations as simulate's input: slices,
/// classes, nodes, and every allocated claim whose key is not in `except`.
pub fn cluster_manifests(snapshot: &Snapshot, except: &HashSet<String>) -> Result<Vec<Manifest>> {
    let mut out = Vec::new();
    for s in &snapshot.slices {
        out.push(manifest("ResourceSlice", s.metadata.name.as_deref().unwrap_or_default(), s)?);
    }
    for c in &snapshot.classes {
        out.push(manifest("DeviceClass", c.metadata.name.as_deref().unwrap_or_default(), c)?);
    }
    for n in &snapshot.nodes {
        out.push(manifest("Node", n.metadata.name.as_deref().unwrap_or_default(), n)?);
    }
    for c in snapshot.claims.iter().filter(|c| is_allocated(c)) {
        let key = claim_key(c);
        if !except.contains(&key) {
            out.push(manifest("ResourceClaim", &key, c)?);
        }
    }
    Ok(out)
}

/// Wraps an object for simulate, named by `origin`.
pub fn object<T: serde::Serialize>(kind: &str, name: &str, object: &T) -> Result<Manifest> {
    manifest(kind, name, object)
}

/// Runs simulate on `manifests`; every claim's outcome, in its order.
pub fn simulate(manifests: Vec<Manifest>) -> Result<Vec<Outcome>> {
    let options = simulate::Options {
        fleet: None,
        format: simulate::Format::Json,
        timings: false,
        cel: gpu_dra_driver::selector::CelEnvironment::stored_expressions(gpu_dra_driver::selector::NEWEST_MINOR),
        // The newest release serves extended resources through classes.
        extended_resources: true,
        // Objects in the cluster were admitted by its webhook under the
        // gates it runs with, which a client cannot read: judge configs
        // with every gate on, so only a config no gate allows is refused.
        gates: Some(Gate::ALL.into_iter().fold(FeatureGates::default(), |gates, gate| gates.with(gate, true))),
    };
    let mut out = Vec::new();
    // Skipped kinds are noted; nothing the user needs here.
    let mut note = Vec::new();
    simulate::run_manifests(manifests, &options, &mut out, &mut note)?;
    let results: Results = serde_json::from_slice(&out).context("reading simulate's results")?;
    Ok(results.results)
}

/// `request=device,device ...` of an allocation (the pool shown when it is
/// not the node's).
pub fn devices(allocation: Option<&serde_json::Value>, node: Option<&str>) -> String {
    let Some(results) = allocation.and_then(|a| a.pointer("/devices/results")).and_then(|r| r.as_array()) else {
        return "-".to_string();
    };
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for r in results {
        let field = |f: &str| r.get(f).and_then(|v| v.as_str()).unwrap_or_default().to_string();
        let (request, pool, device) = (field("request"), field("pool"), field("device"));
        let shown = if Some(pool.as_str()) == node { device } else { format!("{pool}/{device}") };
        match groups.last_mut() {
            Some((last, list)) if *last == request => list.push(shown),
            _ => groups.push((request, vec![shown])),
        }
    }
    if groups.is_empty() {
        return "(none)".to_string();
    }
    groups.iter().map(|(r, l)| format!("{r}={}", l.join(","))).collect::<Vec<_>>().join(" ")
}
