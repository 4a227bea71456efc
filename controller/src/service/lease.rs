//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's
//! `leaderelection` does it: the holder renews `renewTime` every retry
//! period; a candidate takes the lease over when it has seen no renewal for
//! `leaseDurationSeconds` (by its own clock: it times how long the record
//! stayed unchanged, so clock skew between replicas does not matter); every
//! write carries the resourceVersion it read, so two candidates cannot both
//! win (the second gets 409). A leader that cannot renew within the renew
//! deadline stops leading before anyone else may take over.
//!
//! Written here rather than taken from a crate: we found no maintained one
//! that follows client-go's rules (expiry timed on the candidate's own
//! clock, a renew deadline shorter than the lease), and these rules are
//! what makes two leaders impossible. It is small and tested.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;

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
    /// When this replica last renewed successfully as the leader.
    renewed: Option<Instant>,
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

/// Runs the election until the process ends, publishing whether this
/// replica leads on `leading`.
pub async fn run(api: Api<Lease>, config: LeaseConfig, leading: watch::Sender<bool>) {
    let mut observed = Observed::default();
    loop {
        let is_leader = attempt(&api, &config, &mut observed).await;
        // Step down when renewals failed for the renew deadline.
        let still =
            is_leader || observed.renewed.is_some_and(|t| t.elapsed() < config.renew_deadline && *leading.borrow());
        if *leading.borrow() != still {
            if still {
                tracing::info!(identity = %config.identity, lease = %config.name, "leading");
            } else {
                tracing::warn!(identity = %config.identity, lease = %config.name, "no longer leading");
            }
            let _ = leading.send(still);
        }
        tokio::time::sleep(config.retry_period).await;
    }
}

/// One attempt: true when this replica holds the lease after it.
async fn attempt(api: &Api<Lease>, config: &LeaseConfig, observed: &mut Observed) -> bool {
    let current = match api.get_opt(&config.name).await {
        Ok(current) => current,
        Err(error) => {
            tracing::debug!(%error, "reading the lease failed");
            return false;
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
            Ok(_) => {
                observed.renewed = Some(Instant::now());
                true
            }
            Err(_) => false,
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
        return false;
    }
    let mut updated = lease.clone();
    updated.spec = Some(held_spec(lease.spec.as_ref(), config, step == Step::Acquire));
    // The resourceVersion read makes this a compare-and-swap: a candidate
    // that lost the race gets 409 and stays a follower.
    match api.replace(&config.name, &PostParams::default(), &updated).await {
        Ok(_) => {
            observed.renewed = Some(Instant::now());
            true
        }
        Err(error) => {
            tracing::debug!(%error, "writing the lease failed");
            false
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
