//! `kubectl gpu why POD|CLAIM`: why a claim (or a pod's claims) is not
//! allocated, in simulate's words, from the cluster's own objects.

use std::collections::HashSet;

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};

use crate::explain::{self, ClusterInput, Outcome, claim_key};
use gpu_dra_driver::printable::escape;

/// What the user asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Pod(String),
    Claim(String),
    /// A bare name: a claim of that name, else a pod.
    Either(String),
}

/// `pod/NAME`, `resourceclaim/NAME` (or `claim/`, `rc/`), or `NAME`.
pub fn parse_target(arg: &str) -> Result<Target> {
    let (kind, name) = match arg.split_once('/') {
        Some((kind, name)) => (Some(kind.to_ascii_lowercase()), name),
        None => (None, arg),
    };
    if name.is_empty() || name.contains('/') {
        bail!("invalid argument {arg:?}: expected NAME, pod/NAME or resourceclaim/NAME");
    }
    Ok(match kind.as_deref() {
        None => Target::Either(name.to_string()),
        Some("pod" | "pods" | "po") => Target::Pod(name.to_string()),
        Some("resourceclaim" | "resourceclaims" | "claim" | "claims" | "rc") => Target::Claim(name.to_string()),
        Some(other) => bail!("invalid argument {arg:?}: resource type {other:?} is not a pod or a resourceclaim"),
    })
}

/// The pod as simulate should see it: entries whose claim the cluster
/// already generated name that claim; the others keep their template.
/// Returns the pod and the keys of its claims.
pub fn pod_for_simulate(pod: &Pod) -> (Pod, Vec<String>) {
    let mut pod = pod.clone();
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let generated: Vec<(String, Option<String>)> = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .map(|l| l.iter().map(|s| (s.name.clone(), s.resource_claim_name.clone())).collect())
        .unwrap_or_default();
    let mut keys = Vec::new();
    if let Some(entries) = pod.spec.as_mut().and_then(|s| s.resource_claims.as_mut()) {
        for entry in entries {
            if let Some(name) = &entry.resource_claim_name {
                keys.push(format!("{ns}/{name}"));
            } else if let Some(Some(claim)) = generated.iter().find(|(n, _)| *n == entry.name).map(|(_, c)| c) {
                entry.resource_claim_name = Some(claim.clone());
                entry.resource_claim_template_name = None;
                keys.push(format!("{ns}/{claim}"));
            } else {
                // simulate names a claim it instantiates `<pod>-<entry>`.
                keys.push(format!("{ns}/{pod_name}-{}", entry.name));
            }
        }
    }
    (pod, keys)
}

/// What `why` found: the pod (if asked about one) and its claims' outcomes.
/// `results` is simulate's answer for the cluster as it is now; `pending`
/// names the claims the cluster itself has not allocated (or not made
/// yet), so that a claim that would fit is not told as allocated.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Answer {
    pub pod: Option<String>,
    pub results: Vec<Outcome>,
    pub pending: Vec<String>,
}

fn allocated_in_cluster(claim: &ResourceClaim) -> bool {
    claim.status.as_ref().is_some_and(|s| s.allocation.is_some())
}

/// Simulates one claim against the cluster (read without it: its key
/// excepted).
pub fn why_claim(mut cluster: ClusterInput, claim: &ResourceClaim) -> Result<Answer> {
    let key = claim_key(claim);
    cluster.add("ResourceClaim", &key, claim)?;
    let results = cluster.simulate()?.into_iter().filter(|o| o.key() == key).collect();
    let pending = if allocated_in_cluster(claim) { Vec::new() } else { vec![key] };
    Ok(Answer { pod: None, results, pending })
}

/// The keys of the claims a pod's claims are (or will be): what
/// [`why_pod`]'s cluster is read without.
pub fn pod_claim_keys(pod: &Pod) -> HashSet<String> {
    pod_for_simulate(pod).1.into_iter().collect()
}

/// Simulates a pod's claims together against the cluster (read with its
/// claims' keys excepted, [`pod_claim_keys`]).
pub fn why_pod(mut cluster: ClusterInput, pod: &Pod, templates: &[ResourceClaimTemplate]) -> Result<Answer> {
    let (pod, keys) = pod_for_simulate(pod);
    let pod_key = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    );
    if keys.is_empty() {
        bail!("pod {pod_key} has no resourceClaims: it asks for no devices");
    }
    let kept = cluster.take_kept();
    for c in &kept {
        cluster.add("ResourceClaim", &claim_key(c), c)?;
    }
    let allocated: HashSet<String> = kept.iter().filter(|c| allocated_in_cluster(c)).map(claim_key).collect();
    let pending = keys.iter().filter(|k| !allocated.contains(*k)).cloned().collect();
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let uses_template = |name: &str| {
        pod.spec
            .iter()
            .flat_map(|s| s.resource_claims.iter().flatten())
            .any(|e| e.resource_claim_template_name.as_deref() == Some(name))
    };
    for t in templates {
        let name = t.metadata.name.as_deref().unwrap_or_default();
        if t.metadata.namespace.as_deref() == Some(ns) && uses_template(name) {
            cluster.add("ResourceClaimTemplate", &format!("{ns}/{name}"), t)?;
        }
    }
    cluster.add("Pod", &pod_key, &pod)?;
    let results = cluster.simulate()?.into_iter().filter(|o| keys.contains(&o.key())).collect();
    Ok(Answer { pod: Some(pod_key), results, pending })
}

/// The human answer: one line per claim.
pub fn render(answer: &Answer, paint: &crate::output::Paint) -> String {
    let mut out = String::new();
    if let Some(pod) = &answer.pod {
        out.push_str(&format!("pod {}:\n", escape(pod)));
    }
    let indent = if answer.pod.is_some() { "  " } else { "" };
    for o in &answer.results {
        let pending = answer.pending.contains(&o.key());
        let line = match (&o.reason, o.allocated) {
            (_, true) if pending => format!(
                "{}: it would fit now on {}: {} (simulated on the cluster as it is; the scheduler allocates it when it next tries)",
                paint.red("not allocated yet"),
                escape(o.node.as_deref().unwrap_or("(any node its selector admits)")),
                escape(&explain::devices(o.allocation.as_ref(), o.node.as_deref()))
            ),
            (_, true) => format!(
                "{} on {}: {}",
                paint.green("allocated"),
                escape(o.node.as_deref().unwrap_or("(any node its selector admits)")),
                escape(&explain::devices(o.allocation.as_ref(), o.node.as_deref()))
            ),
            (Some(r), false) if o.error => format!("{}: {}", paint.red("error"), escape(r)),
            (Some(r), false) => format!("{}: {}", paint.red("cannot be allocated now"), escape(r)),
            (None, false) => "not allocated".to_string(),
        };
        out.push_str(&format!("{indent}ResourceClaim {}: {line}\n", escape(&o.key())));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn targets_parse_like_kubectl() {
        assert_eq!(parse_target("pod/p").unwrap(), Target::Pod("p".into()));
        assert_eq!(parse_target("resourceclaim/c").unwrap(), Target::Claim("c".into()));
        assert_eq!(parse_target("c").unwrap(), Target::Either("c".into()));
        let e = parse_target("deployment/d").unwrap_err().to_string();
        assert!(e.contains("\"deployment/d\"") && e.contains("not a pod or a resourceclaim"), "{e}");
        assert!(parse_target("pod/").is_err());
    }

    #[test]
    fn a_pods_generated_claims_replace_its_templates() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [], "resourceClaims": [
                {"name": "gpu", "resourceClaimTemplateName": "t"},
                {"name": "pending", "resourceClaimTemplateName": "t"},
                {"name": "shared", "resourceClaimName": "s"}]},
            "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x7k2"}]}
        }))
        .unwrap();
        let (rewritten, keys) = pod_for_simulate(&pod);
        assert_eq!(keys, ["ns/p-gpu-x7k2", "ns/p-pending", "ns/s"]);
        let entries = rewritten.spec.unwrap().resource_claims.unwrap();
        assert_eq!(entries[0].resource_claim_name.as_deref(), Some("p-gpu-x7k2"));
        assert_eq!(entries[0].resource_claim_template_name, None);
        assert_eq!(entries[1].resource_claim_template_name.as_deref(), Some("t"));
    }

    #[test]
    fn a_claim_the_cluster_has_not_allocated_is_not_told_as_allocated() {
        let outcome = Outcome {
            namespace: Some("default".into()),
            name: Some("c".into()),
            allocated: true,
            node: Some("kind-worker".into()),
            allocation: None,
            error: false,
            reason: None,
        };
        let paint = crate::output::Paint { enabled: false };
        let pending = Answer { pod: None, results: vec![outcome.clone()], pending: vec!["default/c".into()] };
        let text = render(&pending, &paint);
        assert!(
            text.starts_with("ResourceClaim default/c: not allocated yet: it would fit now on kind-worker"),
            "{text}"
        );
        let allocated = Answer { pod: None, results: vec![outcome], pending: vec![] };
        assert!(render(&allocated, &paint).starts_with("ResourceClaim default/c: allocated on kind-worker"));
    }
}
