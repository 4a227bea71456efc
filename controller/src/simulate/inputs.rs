//! Sorting the objects read from `-f` into the kinds `simulate` uses, in
//! their real `resource.k8s.io/v1` / `v1` shapes, each remembering where it
//! was read. Other kinds are skipped with a note so users can feed their
//! real manifests; an object of a used kind that cannot be read is an error
//! naming the file and the object.

use std::collections::HashMap;
use std::io::Write;

use anyhow::{Result, bail};
use gpu_dra_driver::allocator::AllocatorBuilder;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use serde::de::DeserializeOwned;

use super::versions;
use crate::manifests::Manifest;

/// Namespace of namespaced objects that do not name one, as `kubectl apply`.
pub const DEFAULT_NAMESPACE: &str = "default";

/// An object and where it came from (`file` or `file#doc`).
#[derive(Debug, Clone)]
pub struct Located<T> {
    pub origin: String,
    pub object: T,
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
    pub pods: Vec<Located<Pod>>,
    pub nodes: Vec<Located<Node>>,
    pub order: Vec<Item>,
}

/// `namespace/name` of a namespaced object (namespace defaulted).
pub fn key(namespace: Option<&str>, name: &str) -> String {
    format!("{}/{name}", namespace.unwrap_or(DEFAULT_NAMESPACE))
}

fn decode<T: DeserializeOwned>(m: Manifest, want_api: &str) -> Result<T> {
    let api = m.object.get("apiVersion").and_then(|v| v.as_str()).unwrap_or("");
    if api != want_api {
        bail!(
            "{}: {} {:?}: apiVersion {api:?} is not supported; fix: write it as {want_api} (v1beta1 and v1beta2 are converted too)",
            m.origin,
            m.kind(),
            m.name()
        );
    }
    let (origin, kind, name) = (m.origin.clone(), m.kind().to_string(), m.name().to_string());
    serde_path_to_error::deserialize(m.object).map_err(|e| {
        let path = e.path().to_string();
        let schema = explain_path(&kind, &path);
        anyhow::anyhow!(
            "{origin}: {kind} {name:?}: cannot be read as {want_api} {kind}: {path}: {}; fix that field (what it \
             takes: kubectl explain {schema})",
            allowed(&e.into_inner().to_string())
        )
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
fn default_namespace(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    if meta.namespace.as_deref().is_none_or(str::is_empty) {
        meta.namespace = Some(DEFAULT_NAMESPACE.to_string());
    }
}

fn require_name(m: &Manifest) -> Result<()> {
    match m.object.pointer("/metadata/name").and_then(|n| n.as_str()) {
        Some(n) if !n.is_empty() => Ok(()),
        _ => bail!("{}: {} without metadata.name; fix: give it a name", m.origin, m.kind()),
    }
}

/// Sorts `manifests` by kind; notes skipped kinds on `note`.
#[cfg(test)]
pub fn sort(manifests: Vec<Manifest>, note: &mut impl Write) -> Result<Inputs> {
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
    /// kind + namespace/name -> origin, to refuse duplicates.
    seen: HashMap<(String, String), String>,
}

impl Sorter {
    pub fn finish(self) -> Inputs {
        self.inputs
    }

    /// Takes one object; notes a skipped kind on `note`.
    pub fn add(&mut self, m: Manifest, note: &mut impl Write) -> Result<()> {
        const RESOURCE: &str = "resource.k8s.io/v1";
        let inputs = &mut self.inputs;
        let kind = m.kind().to_string();
        if !matches!(
            kind.as_str(),
            "ResourceSlice" | "DeviceClass" | "ResourceClaim" | "ResourceClaimTemplate" | "Pod" | "Node"
        ) {
            writeln!(note, "{}: skipping {} {:?}: not used by simulate", m.origin, kind, m.name())?;
            return Ok(());
        }
        require_name(&m)?;
        let namespaced = matches!(kind.as_str(), "ResourceClaim" | "ResourceClaimTemplate" | "Pod");
        let ns = m.object.pointer("/metadata/namespace").and_then(|n| n.as_str()).filter(|n| !n.is_empty());
        let id = if namespaced { key(ns, m.name()) } else { m.name().to_string() };
        if let Some(first) = self.seen.insert((kind.clone(), id.clone()), m.origin.clone()) {
            bail!("{}: {kind} {id} is defined twice (first in {first}); fix: remove one or rename it", m.origin);
        }
        let origin = m.origin.clone();
        let mut m = m;
        versions::to_v1(&kind, &mut m.object);
        match kind.as_str() {
            "ResourceSlice" => {
                let slice: ResourceSlice = decode(m, RESOURCE)?;
                inputs.slices.add_slice(&slice);
            }
            "DeviceClass" => inputs.classes.push(Located { origin, object: decode(m, RESOURCE)? }),
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
                inputs.pods.push(Located { origin, object });
            }
            _ => inputs.nodes.push(Located { origin, object: decode(m, "v1")? }),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifests::parse_into;

    fn sort_text(text: &str) -> (Result<Inputs>, String) {
        let mut manifests = Vec::new();
        parse_into("in.yaml", text, &mut manifests).unwrap();
        let mut note = Vec::new();
        let inputs = sort(manifests, &mut note);
        (inputs, String::from_utf8(note).unwrap())
    }

    #[test]
    fn kinds_are_sorted_in_order_and_others_skipped() {
        let (inputs, note) = sort_text(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: []}\n---\n\
             apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c, namespace: ml}\nspec: {}\n",
        );
        let inputs = inputs.unwrap();
        assert_eq!(inputs.order, [Item::Pod(0), Item::Claim(0)]);
        assert_eq!(inputs.pods[0].object.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(inputs.claims[0].object.metadata.namespace.as_deref(), Some("ml"));
        assert_eq!(inputs.claims[0].origin, "in.yaml#3");
        assert!(note.contains("in.yaml: skipping Deployment \"web\""), "{note}");
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
