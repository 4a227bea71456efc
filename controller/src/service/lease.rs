//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's
//! `leaderelection` does it: the holder renews `renewTime` every retry
//! period; a candidate takes the lease over when it has seen no renewal for
//! `leaseDurationSeconds` (by its own clock: it times how long the record
//! stayed unchanged, so clock skew between replicas does not matter); every
//! write carries the resourceVersion it read, so two candidates cannot both
//! win (the second gets 409). A leader that cannot renew within the renew
//! deadline stops leading before anyone else may take over: its
//! [`Leadership`] lapses by the clock, even while an attempt hangs on an
//! API server that never answers (each attempt is cut off too).
//!
//! Written here rather than taken from a crate: we found no maintained one
//! that follows client-go's rules (expiry timed on the candidate's own
//! clock, a renew deadline shorter than the lease), and these rules are
//! what makes two leaders impossible. It is small and tested.

use std::time::Duration;

use gpu_dra_driver::service::api_call;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use tokio::time::Instant;

use crate::leadership::Leadership;

/// How a lease is held.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    /// How long a lease holds without renewal (client-go default 15 s).
    pub duration: Duration,
    /// How long the leader keeps trying to renew before it steps down
    /// (client-go default 10 s); less than `duration`.
    pub renew_deadline: Duration,
    /// Between attempts (client-go default 2 s).
    pub retry_period: Duration,
}

impl LeaseConfig {
    pub fn new(namespace: &str, identity: &str) -> Self {
        LeaseConfig {
            name: "gpu-dra-controller".to_owned(),
            namespace: namespace.to_owned(),
            identity: identity.to_owned(),
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What a candidate remembers between attempts.
#[derive(Debug, Default)]
struct Observed {
    /// The record last read, and when it was first seen so.
    record: Option<(Option<String>, Option<MicroTime>)>,
    since: Option<Instant>,
}

/// The decision for one attempt, from the lease as read (pure).
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Nobody holds it (or it expired): take it.
    Acquire,
    /// We hold it: renew.
    Renew,
    /// Someone else holds it and renews it.
    Follow,
}

fn decide(spec: Option<&LeaseSpec>, identity: &str, unchanged_for: Duration, duration: Duration) -> Step {
    let holder = spec.and_then(|s| s.holder_identity.as_deref()).filter(|h| !h.is_empty());
    match holder {
        Some(h) if h == identity => Step::Renew,
        Some(_) if unchanged_for < duration => Step::Follow,
        _ => Step::Acquire,
    }
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// What one attempt found.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// This replica holds the lease (acquired or renewed).
    Held,
    /// Another replica holds it.
    Other,
    /// No answer, or an error: nothing learned.
    Failed,
}

/// Runs the election until the process ends, keeping `leadership` current.
/// Each attempt is cut off after half the renew deadline (client-go's
/// leader-election clients time out within the renew deadline too), so a
/// hung call leaves time for a second try before leadership lapses.
pub async fn run(api: Api<Lease>, config: LeaseConfig, leadership: Leadership) {
    let mut observed = Observed::default();
    let attempt_timeout = config.renew_deadline / 2;
    let mut was_leading = false;
    loop {
        let started = Instant::now();
        let outcome =
            tokio::time::timeout(attempt_timeout, attempt(&api, &config, &mut observed)).await.unwrap_or_else(|_| {
                tracing::debug!(timeout = ?attempt_timeout, "the lease call did not answer");
                Outcome::Failed
            });
        match outcome {
            Outcome::Held => leadership.renewed(started),
            Outcome::Other => leadership.lost(),
            // Leadership lapses by itself at the renew deadline.
            Outcome::Failed => {}
        }
        let leading = leadership.is_leading();
        if leading != was_leading {
            if leading {
                tracing::info!(identity = %config.identity, lease = %config.name, "leading");
            } else {
                tracing::warn!(identity = %config.identity, lease = %config.name, "no longer leading");
            }
            was_leading = leading;
        }
        tokio::time::sleep(config.retry_period).await;
    }
}

/// One attempt: whether this replica holds the lease after it.
async fn attempt(api: &Api<Lease>, config: &LeaseConfig, observed: &mut Observed) -> Outcome {
    let current = match api.get_opt(&config.name).await {
        Ok(current) => current,
        Err(error) => {
            tracing::debug!(error = %api_call::describe(&error), "reading the lease failed");
            return Outcome::Failed;
        }
    };
    let Some(lease) = current else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                namespace: Some(config.namespace.clone()),
                ..Default::default()
            },
            spec: Some(held_spec(None, config, true)),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Outcome::Held,
            Err(error) if api_call::is_conflict(&error) => Outcome::Other,
            Err(_) => Outcome::Failed,
        };
    };
    let record = lease.spec.as_ref().map(|s| (s.holder_identity.clone(), s.renew_time.clone()));
    if observed.record != record {
        observed.record = record;
        observed.since = Some(Instant::now());
    }
    let unchanged_for = observed.since.map_or(Duration::ZERO, |t| t.elapsed());
    let step = decide(lease.spec.as_ref(), &config.identity, unchanged_for, config.duration);
    if step == Step::Follow {
        return Outcome::Other;
    }
    let mut updated = lease.clone();
    updated.spec = Some(held_spec(lease.spec.as_ref(), config, step == Step::Acquire));
    // The resourceVersion read makes this a compare-and-swap: a candidate
    // that lost the race gets 409 and stays a follower.
    match api.replace(&config.name, &PostParams::default(), &updated).await {
        Ok(_) => Outcome::Held,
        // Another replica wrote first: it holds the lease now.
        Err(error) if api_call::is_conflict(&error) => Outcome::Other,
        Err(error) => {
            tracing::debug!(error = %api_call::describe(&error), "writing the lease failed");
            Outcome::Failed
        }
    }
}

fn held_spec(previous: Option<&LeaseSpec>, config: &LeaseConfig, acquire: bool) -> LeaseSpec {
    let mut spec = previous.cloned().unwrap_or_default();
    let now = now();
    if acquire {
        let changed_hands = spec.holder_identity.as_deref() != Some(config.identity.as_str());
        if changed_hands && previous.is_some() {
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(config.identity.clone());
        spec.acquire_time = Some(now.clone());
    }
    spec.lease_duration_seconds = Some(config.duration.as_secs() as i32);
    spec.renew_time = Some(now);
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(holder: &str) -> LeaseSpec {
        LeaseSpec { holder_identity: Some(holder.to_owned()), ..Default::default() }
    }

    #[test]
    fn a_lease_is_taken_only_when_free_or_unrenewed_for_its_duration() {
        let d = Duration::from_secs(15);
        assert_eq!(decide(None, "me", Duration::ZERO, d), Step::Acquire);
        assert_eq!(decide(Some(&held_by("")), "me", Duration::ZERO, d), Step::Acquire);
        assert_eq!(decide(Some(&held_by("me")), "me", Duration::ZERO, d), Step::Renew);
        assert_eq!(decide(Some(&held_by("other")), "me", Duration::from_secs(14), d), Step::Follow);
        assert_eq!(decide(Some(&held_by("other")), "me", Duration::from_secs(15), d), Step::Acquire);
    }

    #[test]
    fn taking_over_counts_a_transition() {
        let config = LeaseConfig::new("ns", "me");
        let spec = held_spec(Some(&held_by("other")), &config, true);
        assert_eq!((spec.holder_identity.as_deref(), spec.lease_transitions), (Some("me"), Some(1)));
        let renewed = held_spec(Some(&spec), &config, false);
        assert_eq!(renewed.lease_transitions, Some(1));
        assert_eq!(renewed.lease_duration_seconds, Some(15));
    }
}
