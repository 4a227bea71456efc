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

use gpu_dra_driver::compute_domain::imex::DaemonState;
use gpu_dra_driver::compute_domain::{DRIVER_NAME, api};
use k8s_openapi::api::core::v1::ObjectReference;

use super::channel_claim::ChannelClaim;
use super::cluster::{ConditionWriter, DomainLookup};
use super::preparer::DomainPreparer;
use crate::claim_status::refusal::{Explanation, REFUSED_REASON, Stakes, claim_reference, refusal_note};
use crate::claim_status::write::ConditionError;
use crate::prepare::types::ClaimSource;

/// What a channel's missing condition costs, and who grants the write.
const CHANNEL: Stakes<'static> = Stakes {
    driver: DRIVER_NAME,
    role: "its kubelet-plugin -compute-domains ClusterRole",
    cost: "This node stays NotReady in the ComputeDomain until the write succeeds; the agent retries it.",
};

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
            let note = refusal_note(self.node(), &name, claim.device, &error, &CHANNEL);
            let explanation = self.explanation(claim, note);
            if let Err(more) = self.conditions.explain(&explanation).await {
                tracing::warn!(claim = name, error = %more, "cannot write the Event explaining the refused condition");
            }
        }
        false
    }

    /// The Event about the claim's domain (the claim when the domain is unknown).
    fn explanation(&self, claim: &ChannelClaim<'_>, note: String) -> Explanation {
        let claim_ref = claim_reference(claim.namespace, claim.name, claim.uid);
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
    use crate::claim_status::write::is_permanent;

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
        let note = refusal_note("gb200-0", "default/worker-channel", "channel-0", &refused(403), &CHANNEL);
        assert_eq!(
            note,
            "The node agent on node gb200-0 cannot write the Ready condition of channel-0 on ResourceClaim \
             default/worker-channel (status.devices): the API server refused it with HTTP 403 Forbidden: cannot \
             associated-node:update resource \"resourceclaims/driver\". This node stays NotReady in the ComputeDomain \
             until the write succeeds; the agent retries it. Grant the node agent's service account update on \
             resourceclaims/status and, on Kubernetes 1.36 and later, associated-node:update on resourceclaims/driver \
             for compute-domain.nvidia.com; the chart does this (its kubelet-plugin -compute-domains ClusterRole)."
        );
        let mut invalid = refused(422);
        if let ConditionError::Refused { message, .. } = &mut invalid {
            *message = "denied by policy".into();
        }
        let other = refusal_note("gb200-0", "default/worker-channel", "channel-0", &invalid, &CHANNEL);
        assert!(other.contains("HTTP 422") && other.contains("admission webhook"), "{other}");
    }
}
