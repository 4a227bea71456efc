//! `simulate`: would these claims fit this fleet, which devices would they
//! get, and if not, why not, with no cluster at all.
//!
//! Data flow: manifests (`-f`) → [`inputs`] (typed objects with origins;
//! workloads expanded to their pods by [`controllers`]) → [`configs`]
//! (opaque configs checked as the webhook does) → [`workload`] (pods'
//! claims instantiated, extended resources turned into the scheduler's
//! claim by [`extended`], grouped per pod, checked against the apiserver's
//! claim rules) → [`engine`] (the driver's allocator, unit by unit) →
//! [`ClaimOutcome`]s, what [`evaluate`] returns → [`output`], what [`run`]
//! prints. `--fleet` adds nodes whose slices come from the plugin's own
//! slice builder ([`fleet`]). How a run is set up is [`options`]'s.
//!
//! The manifest reader ([`manifests`]) is here too: `simulate` is its main
//! reader, and the controller's `validate-slices` and `kubectl gpu fit`
//! read files with it.

mod claim_rules;
mod configs;
mod controllers;
mod engine;
mod error;
mod extended;
mod fleet;
mod inputs;
mod keys;
pub mod manifests;
mod options;
mod outcome;
mod output;
mod versions;
mod workload;

use std::io::Write;
use std::path::PathBuf;

use gpu_dra_driver::slices::served::{GatedField, NotServed};

pub use error::SimulateError;
pub use options::{Format, Options, Source};
pub use outcome::ClaimOutcome;

/// Runs the simulation and prints its outcomes in `options.format`.
/// Returns an error (exit 1) for input that cannot be understood; claims
/// that do not fit are results, not errors.
pub fn run(
    files: &[PathBuf],
    options: &Options<'_>,
    out: &mut impl Write,
    note: &mut impl Write,
) -> Result<(), SimulateError> {
    let mut phases = Phases::default();
    let outcomes = evaluate_files(files, options, &mut phases, note)?;
    print(outcomes, options, phases, out, note)
}

/// Runs the simulation: every claim's outcome, in claim order. What the
/// user should know that is not an outcome is written on `note`.
pub fn evaluate(
    files: &[PathBuf],
    options: &Options<'_>,
    note: &mut impl Write,
) -> Result<Vec<ClaimOutcome>, SimulateError> {
    evaluate_files(files, options, &mut Phases::default(), note)
}

fn evaluate_files(
    files: &[PathBuf],
    options: &Options<'_>,
    phases: &mut Phases,
    note: &mut impl Write,
) -> Result<Vec<ClaimOutcome>, SimulateError> {
    // The fleet file and the manifests are independent: the fleet's slices
    // are built on the second core while the manifests are read.
    let (read, loaded) = std::thread::scope(|scope| {
        let not_served = options.not_served;
        let fleet = options.fleet.map(|path| scope.spawn(move || fleet::load(path, not_served)));
        let mut sorter = inputs::Sorter::serving(options.not_served);
        let read = manifests::read_each::<SimulateError>(files, &mut |m| Ok(sorter.add(m, &mut *note)?))
            .map(|()| sorter.finish());
        let loaded = fleet.map(|handle| match handle.join() {
            Ok(loaded) => loaded.map_err(SimulateError::from),
            Err(_) => Err(SimulateError::FleetThread),
        });
        (read, loaded)
    });
    let mut inputs = read?;
    phases.mark("read");
    let mut gates = options.gates;
    if let (Some(path), Some(fleet)) = (options.fleet, loaded) {
        let fleet = fleet?;
        gates = gates.or(Some(fleet.gates));
        for field in fleet.withheld_for.iter() {
            inputs.dropped.insert(field);
        }
        for node in fleet.nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            if let Some(dup) = inputs.nodes.iter().find(|n| n.object.metadata.name.as_deref() == Some(name.as_str())) {
                return Err(SimulateError::DuplicateNode {
                    fleet: path.display().to_string(),
                    name,
                    origin: dup.origin.clone(),
                });
            }
            inputs.nodes.push(inputs::Located { origin: path.display().to_string(), object: node });
        }
        for slice in &fleet.slices {
            inputs.add_slice(slice, options.not_served);
        }
    }
    phases.mark("fleet");
    note_dropped(inputs.dropped, note)?;
    evaluate_inputs(inputs, options, &gates.unwrap_or_default(), phases, note)
}

/// Says once, for each field the simulated API server dropped from some
/// slice, what that release does and how to simulate a cluster that has
/// the gate on.
fn note_dropped(dropped: NotServed, note: &mut impl Write) -> Result<(), SimulateError> {
    let mut by_gate: Vec<(&str, Vec<GatedField>)> = Vec::new();
    for field in dropped.iter() {
        match by_gate.iter_mut().find(|(gate, _)| *gate == field.gate()) {
            Some((_, fields)) => fields.push(field),
            None => by_gate.push((field.gate(), vec![field])),
        }
    }
    for (gate, fields) in by_gate {
        let effect = match fields[0] {
            GatedField::Taints => "the plugins leave faulty GPUs out (untainted, a claim could be given one)",
            GatedField::AllowMultipleAllocations | GatedField::RequestPolicy => {
                "a shared device is a whole device: one claim each"
            }
            GatedField::SharedCounters => "the plugins leave dynamic MIG devices out",
            GatedField::BindingConditions | GatedField::ListAttributes | GatedField::NodeAllocatableResources => {
                "the scheduler does not see it"
            }
        };
        let names: Vec<&str> = fields.iter().map(|f| f.name()).collect();
        writeln!(
            note,
            "note: this release's API server drops the ResourceSlice field{} {} ({gate} off): {effect}; \
             simulated as such; if the cluster has the gate on, add --cluster-feature-gates {gate}=true",
            if names.len() > 1 { "s" } else { "" },
            names.join(", ")
        )?;
    }
    Ok(())
}

/// Runs the simulation on objects already in memory (e.g. read from a live
/// cluster by `kubectl gpu`), exactly as [`run`] does on files: each
/// manifest's `origin` names it in errors. `options.fleet` must be `None`.
pub fn run_manifests(
    manifests: Vec<manifests::Manifest>,
    options: &Options<'_>,
    out: &mut impl Write,
    note: &mut impl Write,
) -> Result<(), SimulateError> {
    let mut feed = Feed::default();
    for m in manifests {
        feed.add(m, &mut *note)?;
    }
    feed.run(options, out, note)
}

/// Objects handed over one at a time, as a caller reads them (`kubectl
/// gpu` reads a live cluster page by page): each slice goes into the
/// allocator's compact fleet at once, so the caller keeps no page of them.
/// [`Feed::run`] then simulates exactly as [`run_manifests`].
#[derive(Debug, Default)]
pub struct Feed {
    sorter: inputs::Sorter,
}

impl Feed {
    /// Takes one object; a kind simulate does not use is noted on `note`.
    pub fn add(&mut self, manifest: manifests::Manifest, note: &mut impl Write) -> Result<(), SimulateError> {
        Ok(self.sorter.add(manifest, note)?)
    }

    /// Takes a DeviceTaintRule already read (a live cluster's).
    pub fn add_taint_rule(&mut self, rule: dra_allocator::TaintRule) {
        self.sorter.add_taint_rule(rule);
    }

    /// Simulates what was fed and prints the outcomes. `options.fleet`
    /// must be `None`.
    pub fn run(self, options: &Options<'_>, out: &mut impl Write, note: &mut impl Write) -> Result<(), SimulateError> {
        let mut phases = Phases::default();
        let outcomes = self.evaluate_with(options, &mut phases, note)?;
        print(outcomes, options, phases, out, note)
    }

    /// Simulates what was fed: every claim's outcome, in claim order.
    /// `options.fleet` must be `None`.
    pub fn evaluate(self, options: &Options<'_>, note: &mut impl Write) -> Result<Vec<ClaimOutcome>, SimulateError> {
        self.evaluate_with(options, &mut Phases::default(), note)
    }

    fn evaluate_with(
        self,
        options: &Options<'_>,
        phases: &mut Phases,
        note: &mut impl Write,
    ) -> Result<Vec<ClaimOutcome>, SimulateError> {
        if options.fleet.is_some() {
            return Err(SimulateError::FleetNotRead);
        }
        let inputs = self.sorter.finish();
        phases.mark("read");
        evaluate_inputs(inputs, options, &options.gates.unwrap_or_default(), phases, note)
    }
}

/// The CEL environment of a run: `cel`, with Kubernetes' DRAListTypeAttributes
/// on when the driver's gate of that name says the cluster has it (the
/// driver cannot see the cluster's gates; its operator sets both alike).
fn cel_environment(
    cel: dra_cel::CelEnvironment,
    gates: &gpu_dra_driver::feature_gates::FeatureGates,
) -> dra_cel::CelEnvironment {
    let lists = gates.enabled(gpu_dra_driver::feature_gates::Gate::ListTypeAttributes);
    dra_cel::CelEnvironment { list_type_attributes: cel.list_type_attributes || lists, ..cel }
}

/// From sorted inputs to outcomes: workload, allocation.
fn evaluate_inputs(
    mut inputs: inputs::Inputs,
    options: &Options<'_>,
    gates: &gpu_dra_driver::feature_gates::FeatureGates,
    phases: &mut Phases,
    note: &mut impl Write,
) -> Result<Vec<ClaimOutcome>, SimulateError> {
    configs::check(&inputs, gates)?;
    let class_names: Vec<String> = inputs.classes.iter().filter_map(|c| c.object.metadata.name.clone()).collect();
    let extended = workload::ExtendedResources {
        enabled: options.extended_resources,
        classes: extended::Classes::new(inputs.classes.iter().map(|c| &c.object)),
    };
    let source = options.source;
    let class_missing = |name: &str| {
        (!class_names.iter().any(|c| c == name))
            .then(|| source.missing("DeviceClass", &format!("{name:?}"), "deviceClassName"))
    };
    let workload = workload::build(&inputs, &class_missing, &extended, source)?;
    for line in &workload.notes {
        writeln!(note, "{line}")?;
    }
    if workload.claims.is_empty() {
        writeln!(note, "no ResourceClaim, ResourceClaimTemplate or Pod with resourceClaims found")?;
    }
    let classes: Vec<_> = std::mem::take(&mut inputs.classes).into_iter().map(|c| c.object).collect();
    let nodes: Vec<_> = std::mem::take(&mut inputs.nodes).into_iter().map(|n| n.object).collect();
    phases.mark("workload");
    let fleet = std::mem::take(&mut inputs.slices);
    let outcomes = engine::allocate(&workload, fleet, &classes, &nodes, cel_environment(options.cel, gates))?;
    phases.mark("allocate");
    let outcomes = workload.claims.iter().zip(outcomes).map(|(c, o)| ClaimOutcome::new(c, o)).collect();
    drop_in_background((inputs, workload, classes, nodes));
    Ok(outcomes)
}

/// Prints `outcomes` in `options.format`, then (with `options.timings`) how
/// long each phase took, on `note`.
fn print(
    outcomes: Vec<ClaimOutcome>,
    options: &Options<'_>,
    mut phases: Phases,
    out: &mut impl Write,
    note: &mut impl Write,
) -> Result<(), SimulateError> {
    match options.format {
        Format::Table => output::table(out, &outcomes),
        Format::Json => output::json(out, &outcomes),
        Format::Yaml => output::yaml(out, &outcomes),
    }?;
    phases.mark("output");
    if options.timings {
        writeln!(note, "timings: {} ({} claims)", phases, outcomes.len())?;
    }
    drop_in_background(outcomes);
    Ok(())
}

/// Frees `value` on another thread. A large fleet's objects take tens of
/// milliseconds to free, and the command is about to print its result and
/// exit: the second core does it meanwhile (or the exit makes it moot).
fn drop_in_background<T: Send + 'static>(value: T) {
    if std::thread::Builder::new().name("drop".into()).spawn(move || drop(value)).is_err() {
        // No thread: freed here, as usual.
    }
}

/// Wall time per phase of a run.
#[derive(Debug)]
struct Phases {
    last: std::time::Instant,
    done: Vec<(&'static str, std::time::Duration)>,
}

impl Default for Phases {
    fn default() -> Self {
        Phases { last: std::time::Instant::now(), done: Vec::new() }
    }
}

impl Phases {
    fn mark(&mut self, phase: &'static str) {
        let now = std::time::Instant::now();
        self.done.push((phase, now - self.last));
        self.last = now;
    }
}

impl std::fmt::Display for Phases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> =
            self.done.iter().map(|(p, d)| format!("{p} {:.1} ms", d.as_secs_f64() * 1e3)).collect();
        write!(f, "{}", parts.join(", "))
    }
}

#[cfg(test)]
mod tests;
