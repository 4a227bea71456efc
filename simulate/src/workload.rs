//! From pods, claims and templates to what gets allocated, the way
//! Kubernetes' resourceclaim controller and scheduler see it:
//! - a pod's `resourceClaimTemplateName` entry becomes one claim for that
//!   pod, named `<pod>-<entry>` (upstream adds a random suffix and records
//!   the entry in the `resource.kubernetes.io/pod-claim-name` annotation; we
//!   keep the name predictable and set the annotation too), with the
//!   template's labels and annotations and the pod's namespace;
//! - a `resourceClaimName` entry uses that claim; a claim shared by several
//!   pods is allocated once, with the first pod that uses it;
//! - all claims of a pod form one unit: allocated together, on one node;
//! - a claim or template no pod references is allocated on its own (a
//!   template instantiated once, named after the template);
//! - a pod asking for extended resources a DeviceClass serves gets the
//!   scheduler's special claim for them ([`super::extended`]), allocated
//!   with its other claims.
//!
//! Claims without a UID get a deterministic one, so output is reproducible.

use std::collections::{BTreeMap, HashMap, HashSet};

use gpu_dra_driver::k8s_format::{FormatError, check_dns1123_label, check_dns1123_subdomain};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::claim_rules;
use super::extended;
use super::inputs::{Inputs, Item, PodInput};
use super::keys::key;
use super::options::Source;

/// A workload that cannot be built: where it was read, what broke, and the
/// fix where there is one. `at` is a pod entry's place (`FILE: Pod NS/NAME:
/// spec.resourceClaims[J]`).
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// A claim's or template's spec breaks the apiserver's rules.
    #[error("{origin}: {kind} {key}: {error}")]
    Rules { origin: String, kind: &'static str, key: String, error: claim_rules::RuleError },
    #[error(
        "{origin}: ResourceClaim {key} would exist twice; fix: rename the claim or the pod entry that generates it"
    )]
    Twice { origin: String, key: String },
    #[error("{at}.name: {name:?}: {error}")]
    EntryName { at: String, name: String, error: FormatError },
    #[error("{at}.name: duplicate entry {name:?}; fix: give each entry its own name")]
    DuplicateEntry { at: String, name: String },
    /// The entry names a claim or template not among the inputs; `problem`
    /// says so as the input's source words it.
    #[error("{at}: {problem}")]
    Missing { at: String, problem: String },
    #[error("{at}: generated claim name {name:?}: {error}; fix: shorten the pod or entry name")]
    GeneratedName { at: String, name: String, error: FormatError },
    #[error("{at}: must set exactly one of resourceClaimName and resourceClaimTemplateName")]
    NotOneSource { at: String },
}

/// Annotation the resourceclaim controller puts on generated claims.
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

/// Namespace of the v5 UUIDs given to claims and pods without one.
const UID_NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x3f6e_0a52_94c1_4b8e_a0d7_52c4_e81b_9d36);

/// One claim of the simulation.
#[derive(Debug, Clone)]
pub struct SimClaim {
    pub claim: ResourceClaim,
    /// `namespace/name`.
    pub key: String,
    /// Already allocated in the input: in use, not allocated again.
    pub preallocated: bool,
    /// Where the claim (or the pod or template that made it) was read.
    pub origin: String,
    /// `namespace/name` of the pod it was made for or first used by.
    pub pod: Option<String>,
    /// The workload that made that pod (`Deployment ns/name`).
    pub workload: Option<String>,
}

/// Claims allocated together: a pod's, or a lone claim.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unit {
    /// `namespace/name` of the pod, if any.
    pub pod: Option<String>,
    /// Claims to allocate now (indices into [`Workload::claims`]).
    pub claims: Vec<usize>,
    /// Claims of the pod allocated earlier (shared or preallocated): the
    /// unit must land on their node.
    pub bound: Vec<usize>,
}

/// Claims in result order and the units that allocate them.
#[derive(Debug, Default)]
pub struct Workload {
    pub claims: Vec<SimClaim>,
    pub units: Vec<Unit>,
    /// What the user should know that is not a result (extended resources
    /// no class serves).
    pub notes: Vec<String>,
}

/// How pods' extended resources are served.
#[derive(Debug, Default)]
pub struct ExtendedResources {
    /// The scheduler serves them through DRA (`DRAExtendedResource`).
    pub enabled: bool,
    pub classes: extended::Classes,
}

fn uid_for(kind: &str, key: &str) -> String {
    uuid::Uuid::new_v5(&UID_NAMESPACE, format!("{kind}/{key}").as_bytes()).hyphenated().to_string()
}

fn meta_key(meta: &ObjectMeta) -> String {
    key(meta.namespace.as_deref(), meta.name.as_deref().unwrap_or_default())
}

/// Builds the workload from `inputs`; `class_missing` says what is wrong
/// with a class name that names no class; `source` words the fix for a
/// missing claim or template.
pub fn build(
    inputs: &Inputs,
    class_missing: &dyn Fn(&str) -> Option<String>,
    extended: &ExtendedResources,
    source: Source,
) -> Result<Workload, WorkloadError> {
    for c in &inputs.claims {
        claim_rules::check(c.object.spec.as_ref(), "spec", class_missing).map_err(|error| WorkloadError::Rules {
            origin: c.origin.clone(),
            kind: "ResourceClaim",
            key: meta_key(&c.object.metadata),
            error,
        })?;
    }
    for t in &inputs.templates {
        let spec = t.object.spec.as_ref().and_then(|s| s.spec.as_ref());
        claim_rules::check(spec, "spec.spec", class_missing).map_err(|error| WorkloadError::Rules {
            origin: t.origin.clone(),
            kind: "ResourceClaimTemplate",
            key: meta_key(&t.object.metadata),
            error,
        })?;
    }
    let claims_by_key: HashMap<String, usize> =
        inputs.claims.iter().enumerate().map(|(i, c)| (meta_key(&c.object.metadata), i)).collect();
    let templates_by_key: HashMap<String, usize> =
        inputs.templates.iter().enumerate().map(|(i, t)| (meta_key(&t.object.metadata), i)).collect();
    let mut referenced_claims = HashSet::new();
    let mut referenced_templates = HashSet::new();
    for p in &inputs.pods {
        for entry in p.object.spec.as_ref().and_then(|s| s.resource_claims.as_deref()).unwrap_or_default() {
            let ns = p.object.metadata.namespace.as_deref();
            if let Some(c) = entry.resource_claim_name.as_deref().and_then(|n| claims_by_key.get(&key(ns, n))) {
                referenced_claims.insert(*c);
            }
            if let Some(t) =
                entry.resource_claim_template_name.as_deref().and_then(|n| templates_by_key.get(&key(ns, n)))
            {
                referenced_templates.insert(*t);
            }
        }
    }

    let mut b = Builder { extended, w: Workload::default(), emitted: HashMap::new(), source };
    for item in &inputs.order {
        match *item {
            Item::Claim(i) if !referenced_claims.contains(&i) => {
                let Some(c) = inputs.claims.get(i) else { continue };
                let index = b.emit(c.object.clone(), &c.origin, None)?;
                b.lone(index);
            }
            Item::Template(i) if !referenced_templates.contains(&i) => {
                let Some(t) = inputs.templates.get(i) else { continue };
                let name = t.object.metadata.name.clone().unwrap_or_default();
                let claim = instantiate(&t.object, &name, t.object.metadata.namespace.as_deref(), None);
                let index = b.emit(claim, &t.origin, None)?;
                b.lone(index);
            }
            Item::Pod(i) => {
                let Some(p) = inputs.pods.get(i) else { continue };
                let unit = b.pod_unit(p, inputs, &claims_by_key, &templates_by_key)?;
                if !unit.claims.is_empty() || !unit.bound.is_empty() {
                    b.w.units.push(unit);
                }
            }
            Item::Claim(_) | Item::Template(_) => {}
        }
    }
    Ok(b.w)
}

struct Builder<'e> {
    extended: &'e ExtendedResources,
    w: Workload,
    /// Claim key -> index in `w.claims`, to refuse name clashes and share claims.
    emitted: HashMap<String, usize>,
    source: Source,
}

impl Builder<'_> {
    fn emit(&mut self, mut claim: ResourceClaim, origin: &str, pod: Option<&PodInput>) -> Result<usize, WorkloadError> {
        let k = meta_key(&claim.metadata);
        if self.emitted.contains_key(&k) {
            return Err(WorkloadError::Twice { origin: origin.to_owned(), key: k });
        }
        let preallocated = claim.status.as_ref().is_some_and(|s| s.allocation.is_some());
        if claim.metadata.uid.as_deref().is_none_or(str::is_empty) {
            claim.metadata.uid = Some(uid_for("ResourceClaim", &k));
        }
        self.w.claims.push(SimClaim {
            claim,
            key: k.clone(),
            preallocated,
            origin: origin.to_string(),
            pod: pod.map(|p| meta_key(&p.object.metadata)),
            workload: pod.and_then(|p| p.workload.clone()),
        });
        let index = self.w.claims.len() - 1;
        self.emitted.insert(k, index);
        Ok(index)
    }

    fn is_preallocated(&self, i: usize) -> bool {
        self.w.claims.get(i).is_some_and(|c| c.preallocated)
    }

    fn lone(&mut self, i: usize) {
        let unit = if self.is_preallocated(i) {
            Unit { pod: None, claims: vec![], bound: vec![i] }
        } else {
            Unit { pod: None, claims: vec![i], bound: vec![] }
        };
        self.w.units.push(unit);
    }

    fn pod_unit(
        &mut self,
        p: &PodInput,
        inputs: &Inputs,
        claims_by_key: &HashMap<String, usize>,
        templates_by_key: &HashMap<String, usize>,
    ) -> Result<Unit, WorkloadError> {
        let pod = &p.object;
        let pod_key = meta_key(&pod.metadata);
        let ns = pod.metadata.namespace.as_deref();
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let mut unit = Unit { pod: Some(pod_key.clone()), ..Unit::default() };
        let mut entry_names = HashSet::new();
        let entries = pod.spec.as_ref().and_then(|s| s.resource_claims.as_deref()).unwrap_or_default();
        for (j, entry) in entries.iter().enumerate() {
            let at = format!("{}: Pod {pod_key}: spec.resourceClaims[{j}]", p.origin);
            check_dns1123_label(&entry.name).map_err(|error| WorkloadError::EntryName {
                at: at.clone(),
                name: entry.name.clone(),
                error,
            })?;
            if !entry_names.insert(entry.name.clone()) {
                return Err(WorkloadError::DuplicateEntry { at, name: entry.name.clone() });
            }
            let index = match (entry.resource_claim_name.as_deref(), entry.resource_claim_template_name.as_deref()) {
                (Some(name), None) => {
                    let k = key(ns, name);
                    if let Some(&done) = self.emitted.get(&k) {
                        // Shared with an earlier pod: allocated (or tried) with it.
                        unit.bound.push(done);
                        continue;
                    }
                    let c = claims_by_key.get(&k).and_then(|&c| inputs.claims.get(c)).ok_or_else(|| {
                        WorkloadError::Missing {
                            at: at.clone(),
                            problem: self.source.missing("ResourceClaim", &k, "resourceClaimName"),
                        }
                    })?;
                    self.emit(c.object.clone(), &c.origin, Some(p))?
                }
                (None, Some(template)) => {
                    let k = key(ns, template);
                    let t = templates_by_key.get(&k).and_then(|&t| inputs.templates.get(t)).ok_or_else(|| {
                        WorkloadError::Missing {
                            at: at.clone(),
                            problem: self.source.missing("ResourceClaimTemplate", &k, "resourceClaimTemplateName"),
                        }
                    })?;
                    let name = format!("{pod_name}-{}", entry.name);
                    check_dns1123_subdomain(&name).map_err(|error| WorkloadError::GeneratedName {
                        at: at.clone(),
                        name: name.clone(),
                        error,
                    })?;
                    let claim = instantiate(&t.object, &name, ns, Some((pod, entry.name.as_str())));
                    self.emit(claim, &p.origin, Some(p))?
                }
                _ => return Err(WorkloadError::NotOneSource { at }),
            };
            if self.is_preallocated(index) {
                unit.bound.push(index);
            } else {
                unit.claims.push(index);
            }
        }
        if self.extended.enabled {
            let pod_uid = pod.metadata.uid.clone().unwrap_or_else(|| uid_for("Pod", &pod_key));
            let extended = extended::for_pod(pod, &pod_uid, &self.extended.classes);
            for resource in &extended.unserved {
                self.w.notes.push(format!(
                    "{}: Pod {pod_key} asks for {resource}, which no DeviceClass serves (spec.extendedResourceName \
                     or {}<class>); left to device plugins, which simulate does not model",
                    p.origin,
                    extended::IMPLICIT_PREFIX
                ));
            }
            if let Some(claim) = extended.claim {
                let index = self.emit(claim, &p.origin, Some(p))?;
                unit.claims.push(index);
            }
        }
        Ok(unit)
    }
}

/// A claim from `template`, named `name` in `namespace`; for a pod, owned by
/// it and annotated with the pod's entry name.
fn instantiate(
    template: &ResourceClaimTemplate,
    name: &str,
    namespace: Option<&str>,
    pod: Option<(&Pod, &str)>,
) -> ResourceClaim {
    let template_meta = template.spec.as_ref().and_then(|s| s.metadata.as_ref());
    let mut annotations: BTreeMap<String, String> =
        template_meta.and_then(|m| m.annotations.clone()).unwrap_or_default();
    let mut owner_references = None;
    if let Some((pod, entry)) = pod {
        annotations.insert(POD_CLAIM_NAME_ANNOTATION.to_string(), entry.to_string());
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let pod_uid = pod.metadata.uid.clone().unwrap_or_else(|| uid_for("Pod", &meta_key(&pod.metadata)));
        owner_references = Some(vec![OwnerReference {
            api_version: "v1".to_string(),
            kind: "Pod".to_string(),
            name: pod_name,
            uid: pod_uid,
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
    }
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: namespace.map(str::to_string),
            labels: template_meta.and_then(|m| m.labels.clone()),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references,
            ..Default::default()
        },
        spec: template.spec.as_ref().and_then(|s| s.spec.clone()),
        status: None,
    }
}

#[cfg(test)]
mod tests;
