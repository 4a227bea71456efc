//! Sorting the objects read from `-f` into the kinds `simulate` uses, in
//! their real `resource.k8s.io/v1` / `v1` shapes, each remembering where it
//! was read. Workloads (Deployment, ReplicaSet, StatefulSet, Job, CronJob)
//! become the pods their controllers would create ([`controllers`]). Other
//! kinds are skipped with a note so users can feed their real manifests; an
//! object of a used kind that cannot be read is an error naming the file
//! and the object.

use std::collections::HashMap;
use std::io::Write;

use dra_allocator::AllocatorBuilder;
use dra_allocator::{TaintRule, TaintRuleError};
use gpu_dra_driver::slices::served::NotServed;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, DeviceTaintRule, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;

use super::controllers::{self, ExpandError, Workload};
use super::keys::{DEFAULT_NAMESPACE, key};
use super::versions;
use crate::manifests::Manifest;

/// An object and where it came from (`file` or `file#doc`).
#[derive(Debug, Clone)]
pub struct Located<T> {
    pub origin: String,
    pub object: T,
}

/// A pod: written as one, or made by a workload's controller.
#[derive(Debug, Clone)]
pub struct PodInput {
    pub origin: String,
    pub object: Pod,
    /// `Deployment ns/name` for a pod a workload's controller makes.
    pub workload: Option<String>,
}

/// Claims, templates and pods in input order: the order claims are allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    Claim(usize),
    Template(usize),
    Pod(usize),
}

/// Everything `simulate` reads from `-f`.
#[derive(Debug, Default)]
pub struct Inputs {
    /// The slices, compacted into the allocator's fleet as they were read.
    pub slices: AllocatorBuilder,
    pub classes: Vec<Located<DeviceClass>>,
    pub claims: Vec<Located<ResourceClaim>>,
    pub templates: Vec<Located<ResourceClaimTemplate>>,
    pub pods: Vec<PodInput>,
    pub nodes: Vec<Located<Node>>,
    pub order: Vec<Item>,
    /// Fields the simulated API server dropped from some slice.
    pub dropped: NotServed,
}

impl Inputs {
    /// Adds a slice as an API server that drops `not_served` stores it
    /// (and a scheduler with those gates off reads it).
    pub fn add_slice(&mut self, slice: &ResourceSlice, not_served: NotServed) {
        let used: Vec<_> = not_served.iter().filter(|f| f.used_in(&slice.spec)).collect();
        if used.is_empty() {
            self.slices.add_slice(slice);
            return;
        }
        for field in used {
            self.dropped.insert(field);
        }
        let stored = ResourceSlice { metadata: slice.metadata.clone(), spec: not_served.strip(&slice.spec) };
        self.slices.add_slice(&stored);
    }
}

/// An object simulate cannot take: where it was read, which object, what
/// is wrong and the fix.
#[derive(Debug, thiserror::Error)]
pub enum InputsError {
    /// Writing a note failed.
    #[error(transparent)]
    Note(#[from] std::io::Error),
    #[error(
        "{origin}: {kind} {name:?}: apiVersion {api:?} is not supported; fix: write it as {want_api} (v1beta1 and \
         v1beta2 are converted too)"
    )]
    UnsupportedApi { origin: String, kind: String, name: String, api: String, want_api: String },
    /// A field does not decode (boxed: the largest by far).
    #[error(transparent)]
    Undecodable(Box<Undecodable>),
    #[error("{origin}: {kind} without metadata.name; fix: give it a name")]
    Unnamed { origin: String, kind: String },
    #[error("{origin}: {kind} {id} is defined twice (first in {first}); fix: remove one or rename it")]
    Twice { origin: String, kind: String, id: String, first: String },
    #[error("{origin}: DeviceTaintRule: {error}")]
    TaintRule { origin: String, error: TaintRuleError },
    /// A workload whose pods cannot be made; `workload` is its kind and key.
    #[error("{origin}: {workload}: {error}")]
    Expand { origin: String, workload: String, error: ExpandError },
    #[error("{origin}: Pod {id} would exist twice (first in {first}); fix: rename the workload or the pod")]
    PodTwice { origin: String, id: String, first: String },
}

/// A field that does not decode: its path, what was found and what it takes
/// (`allowed`), and the `kubectl explain` path of its schema.
#[derive(Debug, thiserror::Error)]
#[error(
    "{origin}: {kind} {name:?}: cannot be read as {want_api} {kind}: {path}: {allowed}; fix that field (what it \
     takes: kubectl explain {schema})"
)]
pub struct Undecodable {
    pub origin: String,
    pub kind: String,
    pub name: String,
    pub want_api: String,
    pub path: String,
    pub allowed: String,
    pub schema: String,
}

fn decode<T: DeserializeOwned>(m: &Manifest, want_api: &str) -> Result<T, InputsError> {
    let api = m.api_version();
    if api != want_api {
        return Err(InputsError::UnsupportedApi {
            origin: m.origin.clone(),
            kind: m.kind().to_owned(),
            name: m.name().to_owned(),
            api: api.to_owned(),
            want_api: want_api.to_owned(),
        });
    }
    m.decode().map_err(|e| {
        InputsError::Undecodable(Box::new(Undecodable {
            origin: m.origin.clone(),
            kind: m.kind().to_owned(),
            name: m.name().to_owned(),
            want_api: want_api.to_owned(),
            schema: explain_path(m.kind(), &e.path),
            allowed: allowed(&e.message),
            path: e.path,
        }))
    })
}

/// k8s-openapi's structs expect their type's name ("expected DeviceClaim"):
/// said as what the field takes, an object.
fn allowed(message: &str) -> String {
    match message.rsplit_once(", expected ") {
        Some((found, name))
            if !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric())
                && name.starts_with(|c: char| c.is_ascii_uppercase()) =>
        {
            format!("{found}, expected a mapping (a {name} object)")
        }
        _ => message.to_string(),
    }
}

/// `kind.field.field` for `kubectl explain`, list indices left out.
fn explain_path(kind: &str, path: &str) -> String {
    let mut out = format!("{}.", kind.to_lowercase());
    let mut depth = 0usize;
    for c in path.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out.trim_end_matches('.').to_string()
}

/// Namespaced objects get the default namespace when they name none, so
/// every later step sees `namespace/name`.
fn default_namespace(meta: &mut ObjectMeta) {
    if meta.namespace.as_deref().is_none_or(str::is_empty) {
        meta.namespace = Some(DEFAULT_NAMESPACE.to_string());
    }
}

fn require_name(m: &Manifest) -> Result<(), InputsError> {
    match m.given_name() {
        Some(n) if !n.is_empty() => Ok(()),
        _ => Err(InputsError::Unnamed { origin: m.origin.clone(), kind: m.kind().to_owned() }),
    }
}

/// Sorts `manifests` by kind; notes skipped kinds on `note`.
#[cfg(test)]
pub fn sort(manifests: Vec<Manifest>, note: &mut impl Write) -> Result<Inputs, InputsError> {
    let mut sorter = Sorter::default();
    for m in manifests {
        sorter.add(m, note)?;
    }
    Ok(sorter.finish())
}

/// Sorts objects by kind as they are read: slices go into the allocator's
/// fleet at once (and are dropped), the rest is kept typed.
#[derive(Debug, Default)]
pub struct Sorter {
    inputs: Inputs,
    /// What the simulated API server drops from a slice it is given.
    not_served: NotServed,
    /// kind + namespace/name -> origin, to refuse duplicates.
    seen: HashMap<(String, String), String>,
}

impl Sorter {
    /// A sorter for an API server that drops `not_served` from slices.
    pub fn serving(not_served: NotServed) -> Self {
        Sorter { not_served, ..Default::default() }
    }

    pub fn finish(self) -> Inputs {
        self.inputs
    }

    /// Takes a DeviceTaintRule already read and checked.
    pub fn add_taint_rule(&mut self, rule: TaintRule) {
        self.inputs.slices.add_taint_rule(rule);
    }

    /// Takes one object; notes a skipped kind on `note`.
    pub fn add(&mut self, m: Manifest, note: &mut impl Write) -> Result<(), InputsError> {
        const RESOURCE: &str = "resource.k8s.io/v1";
        let inputs = &mut self.inputs;
        let kind = m.kind().to_string();
        let workload_api = controllers::KINDS.iter().find(|(k, _)| *k == kind).map(|(_, api)| *api);
        if workload_api.is_none()
            && !matches!(
                kind.as_str(),
                "ResourceSlice"
                    | "DeviceClass"
                    | "DeviceTaintRule"
                    | "ResourceClaim"
                    | "ResourceClaimTemplate"
                    | "Pod"
                    | "Node"
            )
        {
            writeln!(note, "{}: skipping {} {:?}: not used by simulate", m.origin, kind, m.name())?;
            return Ok(());
        }
        require_name(&m)?;
        let namespaced =
            workload_api.is_some() || matches!(kind.as_str(), "ResourceClaim" | "ResourceClaimTemplate" | "Pod");
        let ns = m.namespace().filter(|n| !n.is_empty());
        let id = if namespaced { key(ns, m.name()) } else { m.name().to_string() };
        if let Some(first) = self.seen.insert((kind.clone(), id.clone()), m.origin.clone()) {
            return Err(InputsError::Twice { origin: m.origin.clone(), kind, id, first });
        }
        let origin = m.origin.clone();
        let m = if versions::convertible(m.api_version()) { m.converted(|o| versions::to_v1(&kind, o)) } else { m };
        let m = &m;
        match kind.as_str() {
            "ResourceSlice" => {
                let slice: ResourceSlice = decode(m, RESOURCE)?;
                inputs.add_slice(&slice, self.not_served);
            }
            "DeviceClass" => inputs.classes.push(Located { origin, object: decode(m, RESOURCE)? }),
            "DeviceTaintRule" => {
                let rule: DeviceTaintRule = decode(m, RESOURCE)?;
                let rule = TaintRule::from_api(&rule)
                    .map_err(|error| InputsError::TaintRule { origin: origin.clone(), error })?;
                inputs.slices.add_taint_rule(rule);
            }
            "ResourceClaim" => {
                let mut object: ResourceClaim = decode(m, RESOURCE)?;
                default_namespace(&mut object.metadata);
                inputs.order.push(Item::Claim(inputs.claims.len()));
                inputs.claims.push(Located { origin, object });
            }
            "ResourceClaimTemplate" => {
                let mut object: ResourceClaimTemplate = decode(m, RESOURCE)?;
                default_namespace(&mut object.metadata);
                inputs.order.push(Item::Template(inputs.templates.len()));
                inputs.templates.push(Located { origin, object });
            }
            "Pod" => {
                let mut object: Pod = decode(m, "v1")?;
                default_namespace(&mut object.metadata);
                inputs.order.push(Item::Pod(inputs.pods.len()));
                inputs.pods.push(PodInput { origin, object, workload: None });
            }
            "Node" => inputs.nodes.push(Located { origin, object: decode(m, "v1")? }),
            _ => {
                let api = workload_api.unwrap_or_default();
                let mut workload = match kind.as_str() {
                    "Deployment" => Workload::Deployment(Box::new(decode(m, api)?)),
                    "ReplicaSet" => Workload::ReplicaSet(Box::new(decode(m, api)?)),
                    "StatefulSet" => Workload::StatefulSet(Box::new(decode(m, api)?)),
                    "Job" => Workload::Job(Box::new(decode(m, api)?)),
                    _ => Workload::CronJob(Box::new(decode(m, api)?)),
                };
                default_namespace(workload.meta_mut());
                let pods = workload.pods().map_err(|error| InputsError::Expand {
                    origin: origin.clone(),
                    workload: workload.describe(),
                    error,
                })?;
                for controlled in pods {
                    self.add_pod(&origin, controlled)?;
                }
            }
        }
        Ok(())
    }

    /// A pod a workload's controller makes, refused if its name is taken.
    fn add_pod(&mut self, origin: &str, controlled: controllers::ControlledPod) -> Result<(), InputsError> {
        let id = key(
            controlled.pod.metadata.namespace.as_deref(),
            controlled.pod.metadata.name.as_deref().unwrap_or_default(),
        );
        let origin = format!("{origin} ({})", controlled.workload);
        if let Some(first) = self.seen.insert(("Pod".to_string(), id.clone()), origin.clone()) {
            return Err(InputsError::PodTwice { origin, id, first });
        }
        let inputs = &mut self.inputs;
        inputs.order.push(Item::Pod(inputs.pods.len()));
        inputs.pods.push(PodInput { origin, object: controlled.pod, workload: Some(controlled.workload) });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifests::parse_into;

    fn sort_text(text: &str) -> (Result<Inputs, InputsError>, String) {
        let mut manifests = Vec::new();
        parse_into("in.yaml", text, &mut manifests).unwrap();
        let mut note = Vec::new();
        let inputs = sort(manifests, &mut note);
        (inputs, String::from_utf8(note).unwrap())
    }

    #[test]
    fn kinds_are_sorted_in_order_and_others_skipped() {
        let (inputs, note) = sort_text(
            "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: web}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: []}\n---\n\
             apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c, namespace: ml}\nspec: {}\n",
        );
        let inputs = inputs.unwrap();
        assert_eq!(inputs.order, [Item::Pod(0), Item::Claim(0)]);
        assert_eq!(inputs.pods[0].object.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(inputs.claims[0].object.metadata.namespace.as_deref(), Some("ml"));
        assert_eq!(inputs.claims[0].origin, "in.yaml#3");
        assert!(note.contains("in.yaml: skipping DaemonSet \"web\""), "{note}");
    }

    #[test]
    fn wrong_version_and_duplicates_name_file_and_object() {
        let (inputs, _) =
            sort_text("apiVersion: resource.k8s.io/v1alpha3\nkind: ResourceClaim\nmetadata: {name: c}\nspec: {}\n");
        let err = inputs.unwrap_err().to_string();
        assert!(err.starts_with("in.yaml: ResourceClaim \"c\": apiVersion \"resource.k8s.io/v1alpha3\""), "{err}");

        let claim = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c}\n";
        let (inputs, _) = sort_text(&format!("{claim}---\n{claim}"));
        let err = inputs.unwrap_err().to_string();
        assert!(err.contains("in.yaml#2: ResourceClaim default/c is defined twice (first in in.yaml)"), "{err}");
    }

    #[test]
    fn unreadable_fields_are_errors() {
        let (inputs, _) = sort_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {resourceClaims: 3}\n");
        let err = inputs.unwrap_err().to_string();
        assert_eq!(
            err,
            "in.yaml: Pod \"p\": cannot be read as v1 Pod: spec.resourceClaims: invalid type: integer `3`, expected a \
             sequence; fix that field (what it takes: kubectl explain pod.spec.resourceClaims)"
        );
        let (inputs, _) = sort_text(
            "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c}\n\
             spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com, count: many}}]}}\n",
        );
        let err = inputs.unwrap_err().to_string();
        assert_eq!(
            err,
            "in.yaml: ResourceClaim \"c\": cannot be read as resource.k8s.io/v1 ResourceClaim: \
             spec.devices.requests[0].exactly.count: invalid type: string \"many\", expected i64; fix that field \
             (what it takes: kubectl explain resourceclaim.spec.devices.requests.exactly.count)"
        );
        let (inputs, _) = sort_text(
            "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c}\nspec: {devices: gpu}\n",
        );
        let err = inputs.unwrap_err().to_string();
        assert!(err.contains(": spec.devices: invalid type: string \"gpu\", expected a mapping (a DeviceClaim object); fix that field"), "{err}");
    }
}
