//! How to run a simulation: the output format, the cluster simulated
//! (CEL environment, feature gates, served fields), and where the objects
//! came from.

use std::path::Path;

use clap::ValueEnum;
use gpu_dra_driver::slices::served::NotServed;

/// Output format of `simulate`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    #[default]
    Table,
    Json,
    Yaml,
}

/// How to run a simulation.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options<'a> {
    /// Nodes with fake inventories whose slices join the input.
    pub fleet: Option<&'a Path>,
    pub format: Format,
    /// Print each phase's duration on `note`.
    pub timings: bool,
    /// Which Kubernetes' CEL environment selectors are checked in.
    pub cel: dra_cel::CelEnvironment,
    /// The scheduler serves extended resources through DeviceClasses
    /// (`DRAExtendedResource`, on by default from 1.36).
    pub extended_resources: bool,
    /// The webhook's feature gates, for opaque configs; `None`: the fleet
    /// file's `featureGates` (the node agents'), or none.
    pub gates: Option<gpu_dra_driver::feature_gates::FeatureGates>,
    /// The slice fields the simulated release's API server drops (its
    /// gates off): left out of every slice, as that server stores them.
    pub not_served: NotServed,
    /// Where the objects came from, for the fix an error names.
    pub source: Source,
}

/// Where simulate's objects came from: files the user names with `-f`, or
/// a live cluster (`kubectl gpu`), where a missing object is fixed in the
/// cluster, not on a command line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Source {
    #[default]
    Files,
    Cluster,
}

impl Source {
    /// `kind` `name` (a namespace/name key, or a class name) is missing: what
    /// to say, and the fix (`field` is the reference to correct).
    pub fn missing(self, kind: &str, name: &str, field: &str) -> String {
        match self {
            Source::Files => {
                let example = if kind == "DeviceClass" { " (e.g. -f deviceclasses/)" } else { "" };
                format!("{kind} {name} is not among the inputs; fix: pass it with -f{example} or correct {field}")
            }
            Source::Cluster => {
                format!("the cluster has no {kind} {name}; fix: correct {field}, or create the {kind} in the cluster")
            }
        }
    }
}
