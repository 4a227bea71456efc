//! `kubectl gpu fit -f claims.yaml`: would these claims (templates, pods)
//! fit the cluster now, beside what is already allocated; where, and if
//! not, why.

use std::collections::HashSet;
use std::path::PathBuf;

use anyhow::Result;
use gpu_dra_simulate::manifests::{self, Manifest};

use crate::explain::{self, ClusterInput, Outcome};
use crate::output::Cell;

const NAMESPACED: [&str; 3] = ["ResourceClaim", "ResourceClaimTemplate", "Pod"];

/// Reads `files`, giving namespaced objects without one `namespace`.
pub fn read(files: &[PathBuf], namespace: &str) -> Result<Vec<Manifest>> {
    let mut out = Vec::new();
    manifests::read_each::<anyhow::Error>(files, &mut |m: Manifest| {
        let unnamed = m.namespace().is_none_or(str::is_empty);
        let m = match NAMESPACED.contains(&m.kind()) && unnamed {
            true => m.converted(|object| {
                if let Some(meta) = object.get_mut("metadata").and_then(|v| v.as_object_mut()) {
                    meta.insert("namespace".into(), namespace.into());
                }
            }),
            false => m,
        };
        out.push(m);
        Ok(())
    })?;
    Ok(out)
}

/// The keys of the claims `wanted` makes: a cluster claim of the same
/// name is replaced, so the cluster is read without them.
pub fn replaced(wanted: &[Manifest]) -> HashSet<String> {
    wanted
        .iter()
        .filter(|m| m.kind() == "ResourceClaim")
        .map(|m| format!("{}/{}", m.namespace().unwrap_or_default(), m.name()))
        .collect()
}

/// The warning `fit` gives when `wanted` carries an opaque config for the
/// driver: the webhook judges configs under the driver's feature gates,
/// which a client cannot read from the cluster, so `fit` assumed every gate
/// on; the webhook may still deny a config whose gate is off there.
pub fn assumed_gates(wanted: &[Manifest]) -> Option<String> {
    let configs = |spec: &serde_json::Value| {
        spec["devices"]["config"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["opaque"]["driver"].as_str() == Some(crate::nodes::DRIVER))
            .count()
    };
    let with_config: Vec<String> = wanted
        .iter()
        .filter(|m| {
            let v: serde_json::Value = m.decode().unwrap_or_default();
            configs(&v["spec"]) + configs(&v["spec"]["spec"]) > 0
        })
        .map(|m| format!("{} {}", m.kind(), m.name()))
        .collect();
    (!with_config.is_empty()).then(|| {
        format!(
            "{} carr{} a {} config: fit judged it with every feature gate of the driver on (its webhook's gates \
             cannot be read from the cluster); the webhook denies a config whose gate (MPSSupport, \
             TimeSlicingSettings, ...) is off there",
            gpu_dra_driver::printable::escape(&with_config.join(", ")),
            if with_config.len() == 1 { "ies" } else { "y" },
            crate::nodes::DRIVER
        )
    })
}

/// Simulates `wanted` after the cluster's allocations (read with the
/// [`replaced`] keys excepted); the outcomes of the claims `wanted` makes.
pub fn fit(mut cluster: ClusterInput, wanted: Vec<Manifest>) -> Result<Vec<Outcome>> {
    let cluster_claims = cluster.take_allocated();
    for m in wanted {
        cluster.add_manifest(m)?;
    }
    Ok(cluster.simulate()?.into_iter().filter(|o| !cluster_claims.contains(&o.key())).collect())
}

pub const HEADERS: [&str; 4] = ["NAMESPACE/NAME", "FITS", "NODE", "DEVICES / REASON"];

pub fn rows(outcomes: &[Outcome]) -> Vec<Vec<Cell>> {
    outcomes
        .iter()
        .map(|o| {
            let (fits, detail) = if o.allocated {
                (Cell::green("yes"), explain::devices(o.allocation.as_ref(), o.node.as_deref()))
            } else if o.error {
                (Cell::red("error"), o.reason.clone().unwrap_or_default())
            } else {
                (Cell::red("no"), o.reason.clone().unwrap_or_default())
            };
            vec![o.key().into(), fits, o.node.clone().unwrap_or_else(|| "-".into()).into(), detail.into()]
        })
        .collect()
}
