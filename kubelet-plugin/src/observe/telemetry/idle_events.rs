//! Idle-claim warnings as `events.k8s.io/v1` Events on the claim and on
//! each pod reserving it; deleted when the claim is busy again or
//! unprepared. Nothing is evicted: the Event tells the owner, the metric
//! tells the platform team.
//!
//! An Event's note cannot change once written, so each idle spell is a new
//! Event (named after the object and the spell) and the old one goes.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};

use super::idle::IdleChange;
use super::readings::{ClaimHolder, IdleReport};

/// The Events' `reason`.
pub const REASON: &str = "GpuClaimIdle";
/// The Events' `reportingController`.
pub const REPORTING_CONTROLLER: &str = "gpu.nvidia.com/kubelet-plugin";

/// What one idle spell says, on the claim and on each of its pods.
pub fn note(report: &IdleReport, threshold_percent: f64) -> String {
    let c = &report.claim;
    format!(
        "ResourceClaim {}/{} holds {} {} at an average GPU utilization of {:.1}% over the last {} \
         (idle threshold {}%); nothing is evicted: if the GPUs are not needed, delete the pod{} to free them",
        c.namespace,
        c.name,
        if report.devices.len() == 1 { "device" } else { "devices" },
        report.devices.join(", "),
        report.average_percent,
        window_text(report.window_seconds),
        threshold_percent,
        if c.pods.len() == 1 { "" } else { "s" },
    )
}

/// `30m`, `2h`, `45s`, `1h30m`: the window as Kubernetes writes durations.
pub fn window_text(seconds: u64) -> String {
    let (h, m, s) = (seconds / 3600, seconds % 3600 / 60, seconds % 60);
    let mut out = String::new();
    for (n, unit) in [(h, "h"), (m, "m"), (s, "s")] {
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    if out.is_empty() { "0s".into() } else { out }
}

/// The objects an idle claim's Events are about: the claim, then its pods.
pub fn regarding(claim: &ClaimHolder) -> Vec<ObjectReference> {
    let object = |api_version: &str, kind: &str, name: &str, uid: &str| ObjectReference {
        api_version: Some(api_version.into()),
        kind: Some(kind.into()),
        namespace: Some(claim.namespace.clone()),
        name: Some(name.into()),
        uid: Some(uid.into()),
        ..Default::default()
    };
    std::iter::once(object("resource.k8s.io/v1", "ResourceClaim", &claim.name, &claim.uid))
        .chain(claim.pods.iter().map(|p| object("v1", "Pod", &p.name, &p.uid)))
        .collect()
}

/// Writes and deletes the Events; remembers what it wrote, by claim UID.
pub struct IdleEvents {
    client: Client,
    node: String,
    threshold_percent: f64,
    written: HashMap<String, Vec<(String, String)>>,
    spell: u64,
}

impl IdleEvents {
    pub fn new(client: Client, node: &str, threshold_percent: f64) -> Self {
        Self { client, node: node.to_owned(), threshold_percent, written: HashMap::new(), spell: 0 }
    }

    /// Applies the changes of one pass; failures are logged (the next
    /// change retries nothing: an Event is advice, not state).
    pub async fn apply(&mut self, changes: Vec<IdleChange>) {
        for change in changes {
            match change {
                IdleChange::BecameIdle(report) => {
                    tracing::warn!(claim = %format!("{}/{}", report.claim.namespace, report.claim.name),
                        devices = %report.devices.join(","), average = report.average_percent, "claim idle");
                    self.write(&report).await;
                }
                IdleChange::Cleared { claim, .. } | IdleChange::Gone { claim, .. } => {
                    tracing::info!(claim = %format!("{}/{}", claim.namespace, claim.name), "claim no longer idle");
                    self.clear(&claim.uid).await;
                }
            }
        }
    }

    async fn write(&mut self, report: &IdleReport) {
        self.clear(&report.claim.uid).await;
        self.spell += 1;
        let note = note(report, self.threshold_percent);
        let stamp = k8s_openapi::jiff::Timestamp::now();
        let mut names = Vec::new();
        for object in regarding(&report.claim) {
            let namespace = report.claim.namespace.clone();
            let name = format!(
                "{}.gpu-idle-{}-{:x}{:x}",
                object.name.as_deref().unwrap_or_default(),
                report.claim.uid.chars().take(8).collect::<String>(),
                stamp.as_second(),
                self.spell
            );
            let event = Event {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(namespace.clone()),
                    ..Default::default()
                },
                event_time: Some(MicroTime(stamp)),
                reporting_controller: Some(REPORTING_CONTROLLER.into()),
                reporting_instance: Some(format!("{REPORTING_CONTROLLER}-{}", self.node)),
                action: Some("Monitor".into()),
                reason: Some(REASON.into()),
                type_: Some("Warning".into()),
                note: Some(note.clone()),
                regarding: Some(object),
                ..Default::default()
            };
            let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
            match api.create(&PostParams::default(), &event).await {
                Ok(_) => names.push((namespace, name)),
                Err(error) => tracing::warn!(%error, event = %name, "cannot write the idle-claim Event"),
            }
        }
        self.written.insert(report.claim.uid.clone(), names);
    }

    async fn clear(&mut self, uid: &str) {
        let Some(names) = self.written.remove(uid) else { return };
        for (namespace, name) in names {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => tracing::warn!(%error, event = %name, "cannot delete the idle-claim Event"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::observe::telemetry::PodRef;

    fn report(pods: &[&str], devices: &[&str]) -> IdleReport {
        IdleReport {
            claim: Arc::new(ClaimHolder {
                namespace: "team-a".into(),
                name: "notebook-gpu".into(),
                uid: "0123456789".into(),
                pods: pods.iter().map(|p| PodRef { name: (*p).into(), uid: format!("uid-{p}") }).collect(),
            }),
            devices: devices.iter().map(|d| (*d).into()).collect(),
            average_percent: 1.234,
            window_seconds: 1800,
        }
    }

    #[test]
    fn the_note_names_the_devices_the_average_and_the_window() {
        assert_eq!(
            note(&report(&["notebook"], &["gpu-0", "gpu-1"]), 5.0),
            "ResourceClaim team-a/notebook-gpu holds devices gpu-0, gpu-1 at an average GPU utilization of 1.2% \
             over the last 30m (idle threshold 5%); nothing is evicted: if the GPUs are not needed, delete the pod \
             to free them"
        );
        assert!(note(&report(&["a", "b"], &["gpu-0"]), 5.0).contains("holds device gpu-0 at"));
        assert_eq!(window_text(5400), "1h30m");
        assert_eq!(window_text(45), "45s");
        assert_eq!(window_text(0), "0s");
    }

    #[test]
    fn events_go_on_the_claim_and_each_pod() {
        let objects = regarding(&report(&["p0", "p1"], &["gpu-0"]).claim);
        let kinds: Vec<(String, String, String)> = objects
            .iter()
            .map(|o| (o.kind.clone().unwrap(), o.name.clone().unwrap(), o.uid.clone().unwrap()))
            .collect();
        assert_eq!(
            kinds,
            [
                ("ResourceClaim".into(), "notebook-gpu".into(), "0123456789".into()),
                ("Pod".into(), "p0".into(), "uid-p0".into()),
                ("Pod".into(), "p1".into(), "uid-p1".into()),
            ]
        );
        assert_eq!(objects[0].api_version.as_deref(), Some("resource.k8s.io/v1"));
    }
}
