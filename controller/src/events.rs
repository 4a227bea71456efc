//! Explanations as `events.k8s.io/v1` Events: one per object and answer,
//! deduplicated, replaced when the answer changes, deleted when the claim
//! is allocated; writes rate-limited.
//!
//! An Event's `reason` and `note` cannot change once written (the
//! apiserver's `ValidateEventUpdate`), so a new answer is a new Event (named
//! after the object and a hash of the answer) and the old one is deleted.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use dra_allocator::{AllocateError, FatalError};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};

use crate::leadership::{WriteError, Writes};

/// The `reportingController` of our events.
pub const REPORTING_CONTROLLER: &str = "gpu.nvidia.com/controller";
/// events.k8s.io caps `note` at 1 KiB.
const NOTE_MAX_BYTES: usize = 1024;

/// Why a claim cannot be allocated now, as an event says it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Verdict {
    /// `Unsatisfiable`, `SelectorError` for a CEL error, or `Undecided`
    /// when the search ran out of its budget.
    pub reason: &'static str,
    pub note: String,
}

impl Verdict {
    pub fn of(error: &AllocateError) -> Verdict {
        match error {
            AllocateError::Unsatisfiable(explanation) => {
                Verdict { reason: "Unsatisfiable", note: explanation.to_string() }
            }
            AllocateError::Fatal(fatal @ (FatalError::CelCompile { .. } | FatalError::CelRuntime { .. })) => {
                Verdict { reason: "SelectorError", note: fatal.to_string() }
            }
            AllocateError::Fatal(fatal) => Verdict { reason: "Unsatisfiable", note: fatal.to_string() },
            undecided @ AllocateError::Undecided { .. } => Verdict { reason: "Undecided", note: undecided.to_string() },
        }
    }
}

/// What an event is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Regarding {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// A token bucket: `rate` writes per second, up to `burst` at once.
#[derive(Debug)]
pub struct RateLimit {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl RateLimit {
    pub fn new(rate: f64, burst: f64) -> Self {
        RateLimit { rate, burst, tokens: burst, last: Instant::now() }
    }

    /// Waits until a write may go.
    pub async fn acquire(&mut self) {
        loop {
            let now = Instant::now();
            self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * self.rate).min(self.burst);
            self.last = now;
            if self.tokens >= 1.0 {
                self.tokens -= 1.0;
                return;
            }
            tokio::time::sleep(Duration::from_secs_f64((1.0 - self.tokens) / self.rate)).await;
        }
    }
}

pub struct EventWriter {
    client: Client,
    /// Every write checks leadership and is bounded in time.
    writes: Writes,
    instance: String,
    /// The event written for each object, and its answer.
    written: HashMap<Regarding, (String, Verdict)>,
    limit: RateLimit,
}

impl EventWriter {
    /// Writes at most `qps` events per second, `5 × qps` at once.
    pub fn new(client: Client, instance: &str, qps: f64, writes: Writes) -> Self {
        let qps = qps.max(0.1);
        EventWriter {
            client,
            writes,
            instance: instance.to_owned(),
            written: HashMap::new(),
            limit: RateLimit::new(qps, qps * 5.0),
        }
    }

    /// Makes `verdict` the object's event; nothing when it already is.
    /// Returns whether an event was written.
    pub async fn ensure(&mut self, regarding: &Regarding, verdict: &Verdict) -> Result<bool, WriteError> {
        if self.written.get(regarding).is_some_and(|(_, v)| v == verdict) {
            return Ok(false);
        }
        self.clear(regarding).await?;
        let name = event_name(regarding, verdict);
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(regarding.namespace.clone()),
                ..Default::default()
            },
            event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            reporting_controller: Some(REPORTING_CONTROLLER.to_owned()),
            reporting_instance: Some(self.instance.clone()),
            action: Some("Allocate".to_owned()),
            reason: Some(verdict.reason.to_owned()),
            type_: Some("Warning".to_owned()),
            note: Some(truncate(&verdict.note, NOTE_MAX_BYTES)),
            regarding: Some(ObjectReference {
                api_version: Some(regarding.api_version.to_owned()),
                kind: Some(regarding.kind.to_owned()),
                namespace: Some(regarding.namespace.clone()),
                name: Some(regarding.name.clone()),
                uid: Some(regarding.uid.clone()),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.limit.acquire().await;
        let api: Api<Event> = Api::namespaced(self.client.clone(), &regarding.namespace);
        match self.writes.run(api.create(&PostParams::default(), &event)).await {
            Ok(_) => {}
            // Written by an earlier leader: the same answer, keep it.
            Err(error) if error.is_conflict() => {}
            Err(error) => return Err(error),
        }
        self.written.insert(regarding.clone(), (name, verdict.clone()));
        Ok(true)
    }

    /// Deletes the object's event, if this controller wrote one.
    /// A failed delete keeps the entry, so a later pass retries it.
    pub async fn clear(&mut self, regarding: &Regarding) -> Result<(), WriteError> {
        let Some((name, _)) = self.written.get(regarding).cloned() else { return Ok(()) };
        self.limit.acquire().await;
        let api: Api<Event> = Api::namespaced(self.client.clone(), &regarding.namespace);
        match self.writes.run(api.delete(&name, &DeleteParams::default())).await {
            Ok(_) => {}
            Err(error) if error.is_not_found() => {}
            Err(error) => return Err(error),
        }
        self.written.remove(regarding);
        Ok(())
    }

    /// Objects with an event, for clearing those no longer explained.
    pub fn regarding(&self) -> Vec<Regarding> {
        self.written.keys().cloned().collect()
    }
}

/// `<object>.<hash of the answer>`, within the 253 bytes of a name.
fn event_name(regarding: &Regarding, verdict: &Verdict) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    regarding.uid.hash(&mut hasher);
    verdict.hash(&mut hasher);
    let base: String = regarding.name.chars().take(230).collect();
    format!("{base}.{:016x}", hasher.finish())
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max - 3;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_answer_and_notes_fit() {
        let regarding = Regarding {
            api_version: "resource.k8s.io/v1",
            kind: "ResourceClaim",
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u".into(),
        };
        let a = Verdict { reason: "Unsatisfiable", note: "x".into() };
        let b = Verdict { reason: "Unsatisfiable", note: "y".into() };
        assert_ne!(event_name(&regarding, &a), event_name(&regarding, &b));
        assert!(event_name(&regarding, &a).starts_with("c."));
        let long = "é".repeat(1000);
        let cut = truncate(&long, NOTE_MAX_BYTES);
        assert!(cut.len() <= NOTE_MAX_BYTES && cut.ends_with("..."));
    }
}
