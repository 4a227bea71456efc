//! Writing a prepared channel's `Ready` condition, and explaining once why
//! the API server refuses it.
//!
//! The write is retried every health pass until it lands; a failure that
//! repeats is logged once per claim and distinct error (not every pass).
//! A refusal that retrying cannot cure (RBAC, admission, validation: a 4xx
//! other than 404, 408, 409 and 429) is also told where the user looks: a
//! Warning Event on the ComputeDomain (the claim when the domain is
//! unknown), naming the claim, the HTTP status and message and the fix.
//! Without the condition the domain shows this node NotReady.

use std::collections::HashMap;
use std::sync::Mutex;

use gpu_dra_driver::compute_domain::imex::DaemonState;
use gpu_dra_driver::compute_domain::{DRIVER_NAME, api};
use k8s_openapi::api::core::v1::ObjectReference;

use super::{ConditionWriter, DomainLookup, DomainPreparer};
pub use crate::claim_status::write::{ConditionError, is_permanent};
use crate::prepare::types::ClaimSource;

/// The Event's `reason`.
pub const REFUSED_REASON: &str = "ReadyConditionRefused";

/// A Warning Event to write in `namespace`.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    pub namespace: String,
    /// The ComputeDomain (or the claim when the domain is unknown).
    pub regarding: ObjectReference,
    /// The claim, when `regarding` is the domain.
    pub related: Option<ObjectReference>,
    pub reason: &'static str,
    pub note: String,
}

/// What the Event says: which claim, the HTTP answer, what it costs and
/// the fix.
pub fn refusal_note(node: &str, claim: &str, device: &str, error: &ConditionError) -> String {
    let fix = match error {
        ConditionError::Refused { code: 403, .. } => format!(
            "Grant the node agent's service account update on resourceclaims/status and, on Kubernetes 1.36 and later, \
             associated-node:update on resourceclaims/driver for {DRIVER_NAME}; the chart does this \
             (its kubelet-plugin -compute-domains ClusterRole)."
        ),
        _ => "Find what refuses the write (an admission webhook or policy on resourceclaims/status) and let it pass."
            .to_owned(),
    };
    let answer = match error {
        ConditionError::Refused { code, reason, message, .. } => format!("HTTP {code} {reason}: {message}"),
        ConditionError::Failed(text) => text.clone(),
    };
    format!(
        "The node agent on node {node} cannot write the Ready condition of {device} on ResourceClaim {claim} \
         (status.devices): the API server refused it with {answer}. This node stays NotReady in the ComputeDomain \
         until the write succeeds; the agent retries it. {fix}"
    )
}

/// The last failed write of each claim's condition (by claim UID).
#[derive(Debug, Default)]
pub struct WriteFailures(Mutex<HashMap<String, ConditionError>>);

impl WriteFailures {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, ConditionError>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the claim's failure; `true` when it is new for the claim
    /// (log it and explain it), `false` when it repeats the last one.
    pub fn record(&self, uid: &str, error: &ConditionError) -> bool {
        self.map().insert(uid.to_owned(), error.clone()).as_ref() != Some(error)
    }

    /// Forgets the claim's failure; `true` when it had one.
    pub fn clear(&self, uid: &str) -> bool {
        self.map().remove(uid).is_some()
    }

    /// Keeps the failures of the claims `keep` accepts (the prepared ones).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.map().retain(|uid, _| keep(uid));
    }
}

/// The claim whose condition is written.
pub(crate) struct ChannelClaim<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub domain_uid: &'a str,
    pub device: &'a str,
}

impl<S: ClaimSource, D: DomainLookup, W: ConditionWriter> DomainPreparer<S, D, W> {
    /// Writes the claim's `Ready` condition; `true` when it is written.
    /// A failure is logged (and a refusal explained) once until it changes.
    pub(crate) async fn write_ready(&self, claim: &ChannelClaim<'_>, state: &DaemonState) -> bool {
        let error = match self.conditions.set_ready(claim.namespace, claim.name, claim.device, state).await {
            Ok(()) => {
                if self.write_failures.clear(claim.uid) {
                    tracing::info!(claim = %format!("{}/{}", claim.namespace, claim.name), "wrote the channel's Ready condition after earlier failures");
                }
                return true;
            }
            Err(error) => error,
        };
        let name = format!("{}/{}", claim.namespace, claim.name);
        if !self.write_failures.record(claim.uid, &error) {
            tracing::debug!(claim = name, %error, "cannot write the channel's Ready condition (again)");
            return false;
        }
        tracing::warn!(claim = name, %error, "cannot write the channel's Ready condition; retried every health pass, logged again only if the error changes");
        if let ConditionError::Refused { .. } = error {
            let explanation = self.explanation(claim, refusal_note(self.node(), &name, claim.device, &error));
            if let Err(more) = self.conditions.explain(&explanation).await {
                tracing::warn!(claim = name, error = %more, "cannot write the Event explaining the refused condition");
            }
        }
        false
    }

    /// The Event about the claim's domain (the claim when the domain is unknown).
    fn explanation(&self, claim: &ChannelClaim<'_>, note: String) -> Explanation {
        let claim_ref = ObjectReference {
            api_version: Some("resource.k8s.io/v1".into()),
            kind: Some("ResourceClaim".into()),
            namespace: Some(claim.namespace.into()),
            name: Some(claim.name.into()),
            uid: Some(claim.uid.into()),
            ..ObjectReference::default()
        };
        let domain = self.domains.find(claim.namespace, claim.domain_uid);
        let (regarding, related) = match domain {
            Some(domain) => (
                ObjectReference {
                    api_version: Some(api::API_VERSION.into()),
                    kind: Some(api::KIND.into()),
                    namespace: Some(claim.namespace.into()),
                    name: domain.metadata.name.clone(),
                    uid: domain.metadata.uid.clone(),
                    ..ObjectReference::default()
                },
                Some(claim_ref),
            ),
            None => (claim_ref, None),
        };
        Explanation { namespace: claim.namespace.to_owned(), regarding, related, reason: REFUSED_REASON, note }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: u16) -> ConditionError {
        ConditionError::Refused {
            action: "writing the status of claim default/worker-channel".into(),
            code,
            reason: "Forbidden".into(),
            message: "cannot associated-node:update resource \"resourceclaims/driver\"".into(),
        }
    }

    #[test]
    fn only_answers_a_retry_cannot_cure_are_refusals() {
        assert!([400, 401, 403, 422].into_iter().all(is_permanent));
        assert!(![404, 408, 409, 429, 500, 503].into_iter().any(is_permanent));
    }

    #[test]
    fn the_note_names_the_claim_the_answer_and_the_fix() {
        let note = refusal_note("gb200-0", "default/worker-channel", "channel-0", &refused(403));
        assert_eq!(
            note,
            "The node agent on node gb200-0 cannot write the Ready condition of channel-0 on ResourceClaim \
             default/worker-channel (status.devices): the API server refused it with HTTP 403 Forbidden: cannot \
             associated-node:update resource \"resourceclaims/driver\". This node stays NotReady in the ComputeDomain \
             until the write succeeds; the agent retries it. Grant the node agent's service account update on \
             resourceclaims/status and, on Kubernetes 1.36 and later, associated-node:update on resourceclaims/driver \
             for compute-domain.nvidia.com; the chart does this (its kubelet-plugin -compute-domains ClusterRole)."
        );
        let other = refusal_note("gb200-0", "default/worker-channel", "channel-0", &refused(422));
        assert!(other.contains("HTTP 422") && other.contains("admission webhook"), "{other}");
    }

    #[test]
    fn a_failure_is_new_once_per_claim_and_error() {
        let failures = WriteFailures::default();
        assert!(failures.record("a", &refused(403)));
        assert!(!failures.record("a", &refused(403)));
        assert!(failures.record("b", &refused(403)), "another claim");
        assert!(failures.record("a", &ConditionError::Failed("connection refused".into())), "another error");
        assert!(failures.clear("a"));
        assert!(!failures.clear("a"));
        assert!(failures.record("a", &refused(403)), "failing again after a success");
        failures.retain(|uid| uid == "b");
        assert!(failures.record("a", &refused(403)));
        assert!(!failures.record("b", &refused(403)));
    }
}
