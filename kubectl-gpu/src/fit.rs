//! `kubectl gpu fit -f claims.yaml`: would these claims (templates, pods)
//! fit the cluster now, beside what is already allocated; where, and if
//! not, why.

use std::collections::HashSet;
use std::path::PathBuf;

use anyhow::Result;
use gpu_dra_controller::manifests::{self, Manifest};

use crate::cluster::Snapshot;
use crate::explain::{self, Outcome, claim_key};

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

/// Simulates `wanted` after the cluster's allocations; the outcomes of the
/// claims `wanted` makes (a cluster claim of the same name is replaced).
pub fn fit(snapshot: &Snapshot, wanted: Vec<Manifest>) -> Result<Vec<Outcome>> {
    let key_of = |m: &Manifest| {
        let ns = m.namespace().unwrap_or_default();
        format!("{ns}/{}", m.name())
    };
    let replaced: HashSet<String> = wanted.iter().filter(|m| m.kind() == "ResourceClaim").map(key_of).collect();
    let cluster: HashSet<String> = snapshot
        .claims
        .iter()
        .filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some()))
        .map(claim_key)
        .filter(|k| !replaced.contains(k))
        .collect();
    let mut all = explain::cluster_manifests(snapshot, &replaced)?;
    all.extend(wanted);
    Ok(explain::simulate(all)?.into_iter().filter(|o| !cluster.contains(&o.key())).collect())
}

pub const HEADERS: [&str; 4] = ["NAMESPACE/NAME", "FITS", "NODE", "DEVICES / REASON"];

pub fn rows(outcomes: &[Outcome], paint: &crate::output::Paint) -> Vec<Vec<String>> {
    outcomes
        .iter()
        .map(|o| {
            let (fits, detail) = if o.allocated {
                (paint.green("yes"), explain::devices(o.allocation.as_ref(), o.node.as_deref()))
            } else if o.error {
                (paint.red("error"), o.reason.clone().unwrap_or_default())
            } else {
                (paint.red("no"), o.reason.clone().unwrap_or_default())
            };
            vec![o.key(), fits, o.node.clone().unwrap_or_else(|| "-".into()), detail]
        })
        .collect()
}
