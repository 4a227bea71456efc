//! Telling a user once why the API server refuses a claim's status write:
//! the failures remembered per claim (a repeat is not logged again), and a
//! Warning Event for a refusal that retrying cannot cure (RBAC, admission,
//! validation), naming the claim, the HTTP answer, what it costs and the
//! fix. ComputeDomain channels and GPU claims both use it; they differ in
//! what a missing condition costs and which role grants the write.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;

use super::write::ConditionError;
use crate::observe::telemetry::idle_events::REPORTING_CONTROLLER;

/// The Event's `reason`.
pub const REFUSED_REASON: &str = "ReadyConditionRefused";

/// A Warning Event to write in `namespace`.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    pub namespace: String,
    /// What the user looks at (a ComputeDomain, or the claim).
    pub regarding: ObjectReference,
    /// The claim, when `regarding` is something else.
    pub related: Option<ObjectReference>,
    pub reason: &'static str,
    pub note: String,
}

/// What a refused write costs and who grants it, for the note.
#[derive(Debug, Clone, Copy)]
pub struct Stakes<'a> {
    /// The driver whose `resourceclaims/driver` grant the write needs.
    pub driver: &'a str,
    /// Where the chart grants it (the ClusterRole, in words).
    pub role: &'a str,
    /// What the user sees while the condition is missing.
    pub cost: &'a str,
}

/// What the Event says: which claim and devices, the HTTP answer, what it
/// costs and the fix.
pub fn refusal_note(node: &str, claim: &str, devices: &str, error: &ConditionError, stakes: &Stakes<'_>) -> String {
    let fix = match error {
        error if unauthorized(error) => format!(
            "Grant the node agent's service account update on resourceclaims/status and, on Kubernetes 1.36 and later, \
             associated-node:update on resourceclaims/driver for {}; the chart does this ({}).",
            stakes.driver, stakes.role
        ),
        _ => "Find what refuses the write (an admission webhook or policy on resourceclaims/status) and let it pass."
            .to_owned(),
    };
    let answer = match error {
        ConditionError::Refused { code, reason, message, .. } => format!("HTTP {code} {reason}: {message}"),
        ConditionError::Failed(text) => text.clone(),
    };
    format!(
        "The node agent on node {node} cannot write the Ready condition of {devices} on ResourceClaim {claim} \
         (status.devices): the API server refused it with {answer}. {} {fix}",
        stakes.cost
    )
}

/// Whether `error` is the authorizer's refusal: a 403, or the 422 with
/// which Kubernetes 1.36+ refuses a change of `status.devices` its writer
/// may not make (the granular check runs in the status strategy's
/// validation, so it answers `field.Forbidden` "changing status.devices
/// requires resource=\"resourceclaims/driver\"…" as an Invalid status:
/// `AuthorizedForDeviceStatus` in `pkg/registry/resource/utils.go`, seen
/// from the real 1.37 server in `real_cluster_claim_status`).
pub fn unauthorized(error: &ConditionError) -> bool {
    match error {
        ConditionError::Refused { code: 403, .. } => true,
        ConditionError::Refused { code: 422, message, .. } => message.contains("resourceclaims/driver"),
        _ => false,
    }
}

/// A reference to the claim `namespace/name` with `uid`.
pub fn claim_reference(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("resource.k8s.io/v1".into()),
        kind: Some("ResourceClaim".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid: Some(uid.into()),
        ..ObjectReference::default()
    }
}

/// The last failed write of each claim (by claim UID).
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

/// Writes `explanation` as an `events.k8s.io/v1` Warning from the agent
/// on `node`, named after what it is about and the time (an Event's note
/// cannot change, so each explanation is new).
pub async fn post_event(client: &kube::Client, node: &str, explanation: &Explanation) -> Result<(), EventError> {
    let stamp = k8s_openapi::jiff::Timestamp::now();
    let about = explanation.regarding.name.as_deref().unwrap_or("claim");
    let name = format!("{about}.{:x}", stamp.as_nanosecond());
    let event = Event {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(explanation.namespace.clone()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(stamp)),
        reporting_controller: Some(REPORTING_CONTROLLER.into()),
        reporting_instance: Some(format!("{REPORTING_CONTROLLER}-{node}")),
        action: Some("WriteReadyCondition".into()),
        reason: Some(explanation.reason.into()),
        type_: Some("Warning".into()),
        note: Some(explanation.note.clone()),
        regarding: Some(explanation.regarding.clone()),
        related: explanation.related.clone(),
        ..Event::default()
    };
    let api: Api<Event> = Api::namespaced(client.clone(), &explanation.namespace);
    api.create(&PostParams::default(), &event).await.map_err(|source| EventError { name, source })?;
    Ok(())
}

/// The API server did not take an explaining Event; the message is cut to
/// what a log line and a condition hold.
#[derive(Debug, thiserror::Error)]
#[error("{}", gpu_dra_driver::claim_status::bounded_message(&format!("creating Event {name}: {source}")))]
pub struct EventError {
    pub name: String,
    pub source: kube::Error,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: u16) -> ConditionError {
        ConditionError::Refused {
            action: "writing the status of claim default/train".into(),
            code,
            reason: "Forbidden".into(),
            message: "cannot associated-node:update resource \"resourceclaims/driver\"".into(),
        }
    }

    const GPU: Stakes<'static> = Stakes {
        driver: "gpu.nvidia.com",
        role: "its kubelet-plugin ClusterRole",
        cost: "The claim's devices are prepared; only their status is missing.",
    };

    #[test]
    fn the_note_names_the_claim_the_answer_and_the_fix() {
        let note = refusal_note("node-a", "default/train", "gpu-0, gpu-1", &refused(403), &GPU);
        assert!(note.starts_with("The node agent on node node-a cannot write the Ready condition of gpu-0, gpu-1"));
        assert!(note.contains("HTTP 403 Forbidden") && note.contains("resourceclaims/driver for gpu.nvidia.com"));
        assert!(note.contains("its kubelet-plugin ClusterRole") && note.contains("only their status is missing"));
        let mut invalid = refused(422);
        if let ConditionError::Refused { message, .. } = &mut invalid {
            *message = "denied by policy".into();
        }
        let other = refusal_note("node-a", "default/train", "gpu-0", &invalid, &GPU);
        assert!(other.contains("HTTP 422") && other.contains("admission webhook"), "{other}");
    }

    #[test]
    fn the_granular_check_answers_422_and_is_an_authorization_refusal() {
        // As the real 1.37 server words it.
        let message = "ResourceClaim.resource.k8s.io \"train\" is invalid: status.devices: Forbidden: changing \
                       status.devices requires resource=\"resourceclaims/driver\", verb=\"[associated-node:update \
                       arbitrary-node:update]\" permission: ...";
        let error = ConditionError::Refused {
            action: "writing".into(),
            code: 422,
            reason: "Invalid".into(),
            message: message.into(),
        };
        assert!(unauthorized(&error) && unauthorized(&refused(403)));
        let note = refusal_note("node-a", "default/train", "gpu-0", &error, &GPU);
        assert!(note.contains("associated-node:update on resourceclaims/driver for gpu.nvidia.com"), "{note}");
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
