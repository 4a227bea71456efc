//! Sorting the objects read from `-f` into the kinds `simulate` uses, in
//! their real `resource.k8s.io/v1` / `v1` shapes, each remembering where it
//! was read. Other kinds are skipped with a note so users can feed their
//! real manifests; an object of a used kind that cannot be read is an error
//! naming the file and the object.

use std::collections::HashMap;
use std::io::Write;

use anyhow::{Result, bail};
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
    pub slices: Vec<ResourceSlice>,
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
    serde_json::from_value(m.object).map_err(|e| {
        anyhow::anyhow!("{origin}: {kind} {name:?}: cannot be read as {want_api} {kind}: {e}; fix that field")
    })
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
pub fn sort(manifests: Vec<Manifest>, note: &mut impl Write) -> Result<Inputs> {
    const RESOURCE: &str = "resource.k8s.io/v1";
    let mut inputs = Inputs::default();
    // kind + namespace/name -> origin, to refuse duplicates.
    let mut seen: HashMap<(String, String), String> = HashMap::new();
    for m in manifests {
        let kind = m.kind().to_string();
        if !matches!(
            kind.as_str(),
            "ResourceSlice" | "DeviceClass" | "ResourceClaim" | "ResourceClaimTemplate" | "Pod" | "Node"
        ) {
            writeln!(note, "{}: skipping {} {:?}: not used by simulate", m.origin, kind, m.name())?;
            continue;
        }
        require_name(&m)?;
        let namespaced = matches!(kind.as_str(), "ResourceClaim" | "ResourceClaimTemplate" | "Pod");
        let ns = m.object.pointer("/metadata/namespace").and_then(|n| n.as_str()).filter(|n| !n.is_empty());
        let id = if namespaced { key(ns, m.name()) } else { m.name().to_string() };
        if let Some(first) = seen.insert((kind.clone(), id.clone()), m.origin.clone()) {
            bail!("{}: {kind} {id} is defined twice (first in {first}); fix: remove one or rename it", m.origin);
        }
        let origin = m.origin.clone();
        let mut m = m;
        versions::to_v1(&kind, &mut m.object);
        match kind.as_str() {
            "ResourceSlice" => inputs.slices.push(decode(m, RESOURCE)?),
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
    }
    Ok(inputs)
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
        assert!(err.starts_with("in.yaml: Pod \"p\": cannot be read as v1 Pod"), "{err}");
    }
}
