//! `simulate`: would these claims fit this fleet, which devices would they
//! get, and if not, why not, with no cluster at all.
//!
//! Data flow: manifests (`-f`) → [`inputs`] (typed objects with origins) →
//! [`workload`] (pods' claims instantiated, grouped per pod, checked against
//! the apiserver's claim rules) → [`engine`] (the driver's allocator, unit by
//! unit) → [`output`]. `--fleet` adds nodes whose slices come from the
//! plugin's own slice builder ([`fleet`]).

mod claim_rules;
mod engine;
mod fleet;
mod inputs;
mod node_match;
mod output;
mod versions;
mod workload;

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use clap::ValueEnum;

use crate::manifests;

/// Output format of `simulate`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    #[default]
    Table,
    Json,
    Yaml,
}

/// Runs the simulation. Returns an error (exit 1) for input that cannot be
/// understood; claims that do not fit are results, not errors.
pub fn run(
    files: &[PathBuf],
    fleet_file: Option<&Path>,
    format: Format,
    out: &mut impl Write,
    note: &mut impl Write,
) -> Result<()> {
    let mut inputs = inputs::sort(manifests::read_all(files)?, note)?;
    if let Some(path) = fleet_file {
        let fleet = fleet::load(path)?;
        for node in fleet.nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            if let Some(dup) = inputs.nodes.iter().find(|n| n.object.metadata.name.as_deref() == Some(name.as_str())) {
                bail!("{}: node {name} is also defined in {}; fix: define each node once", path.display(), dup.origin);
            }
            inputs.nodes.push(inputs::Located { origin: path.display().to_string(), object: node });
        }
        inputs.slices.extend(fleet.slices);
    }
    let class_names: Vec<String> = inputs.classes.iter().filter_map(|c| c.object.metadata.name.clone()).collect();
    let workload = workload::build(&inputs, &|name| class_names.iter().any(|c| c == name))?;
    if workload.claims.is_empty() {
        writeln!(note, "no ResourceClaim, ResourceClaimTemplate or Pod with resourceClaims found")?;
    }
    let classes: Vec<_> = inputs.classes.into_iter().map(|c| c.object).collect();
    let nodes: Vec<_> = inputs.nodes.into_iter().map(|n| n.object).collect();
    let outcomes = engine::allocate(&workload, &inputs.slices, &classes, &nodes)?;
    match format {
        Format::Table => output::table(out, &workload.claims, &outcomes),
        Format::Json => output::json(out, &workload.claims, &outcomes),
        Format::Yaml => output::yaml(out, &workload.claims, &outcomes),
    }
}

#[cfg(test)]
mod tests;
