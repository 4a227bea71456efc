//! `kubectl gpu fit -f claims.yaml`: would these claims (templates, pods)
//! fit the cluster now, beside what is already allocated; where, and if
//! not, why.

use std::collections::HashSet;
use std::path::PathBuf;

use anyhow::Result;
use gpu_dra_controller::manifests::{self, Manifest};

use crate::explain::{self, ClusterInput, Outcome};
use crate::output::Cell;

const NAMESPACED: [&str; 3] = ["ResourceClaim", "ResourceClaimTemplate", "Pod"];

/// Reads `files`, giving namespaced objects without one `namespace`.
pub fn read(files: &[PathBuf], namespace: &str) -> Result<Vec<Manifest>> {
    let mut out = Vec::new();
    manifests::read_each(files, &mut |m: Manifest| {
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
