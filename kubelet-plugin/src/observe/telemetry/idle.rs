//! Idle claims, pure: a claim whose devices' average GPU utilization over
//! the idle window stayed under the threshold is idle; it is busy again as
//! soon as one sample reaches the threshold (and then needs a whole new
//! window to be idle again). A claim is judged only on a fully covered
//! window and only when every one of its devices has a utilization reading
//! (NVML has none for MIG devices): no reading, no verdict.
//!
//! Time is a monotonic [`Duration`] the caller passes, so tests need no
//! clock.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use super::readings::{ClaimHolder, IdleReport};

/// At most this many samples are kept per claim (a 30-minute window at a
/// 1 s interval); older ones only shorten the average, never the coverage.
const MAX_SAMPLES: usize = 2048;

/// When a claim counts as idle.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IdlePolicy {
    /// Average GPU utilization, percent, under which a claim is idle.
    pub threshold_percent: f64,
    pub window: Duration,
}

/// One claim's utilization at one sampling pass.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimLoad {
    pub claim: Arc<ClaimHolder>,
    pub devices: Vec<String>,
    /// The mean of its devices' GPU utilization; `None` when any device has
    /// no reading.
    pub utilization_percent: Option<f64>,
}

/// A change to announce.
#[derive(Debug, Clone, PartialEq)]
pub enum IdleChange {
    BecameIdle(IdleReport),
    /// Busy again, or no longer judged (no reading): the warning goes.
    Cleared {
        claim: Arc<ClaimHolder>,
        devices: Vec<String>,
    },
    /// Unprepared while flagged.
    Gone {
        claim: Arc<ClaimHolder>,
        devices: Vec<String>,
    },
}

#[derive(Debug)]
struct Window {
    claim: Arc<ClaimHolder>,
    devices: Vec<String>,
    /// Since when samples cover the claim without a gap in judgement.
    since: Duration,
    samples: VecDeque<(Duration, f64)>,
    idle: Option<IdleReport>,
}

impl Window {
    fn average(&self) -> Option<f64> {
        if self.samples.is_empty() {
            return None;
        }
        #[allow(clippy::cast_precision_loss)]
        let n = self.samples.len() as f64;
        Some(self.samples.iter().map(|(_, u)| u).sum::<f64>() / n)
    }
}

/// Windows of every prepared claim, by UID.
#[derive(Debug)]
pub struct IdleTracker {
    policy: IdlePolicy,
    windows: HashMap<String, Window>,
}

impl IdleTracker {
    pub fn new(policy: IdlePolicy) -> Self {
        Self { policy, windows: HashMap::new() }
    }

    /// One sampling pass at `now` over the claims prepared now; returns the
    /// changes, sorted by claim.
    pub fn observe(&mut self, now: Duration, loads: Vec<ClaimLoad>) -> Vec<IdleChange> {
        let mut changes = Vec::new();
        let present: std::collections::HashSet<String> = loads.iter().map(|l| l.claim.uid.clone()).collect();
        let gone: Vec<String> = self.windows.keys().filter(|uid| !present.contains(*uid)).cloned().collect();
        for uid in gone {
            if let Some(w) = self.windows.remove(&uid)
                && w.idle.is_some()
            {
                changes.push(IdleChange::Gone { claim: w.claim, devices: w.devices });
            }
        }
        for load in loads {
            let window = self.windows.entry(load.claim.uid.clone()).or_insert_with(|| Window {
                claim: load.claim.clone(),
                devices: load.devices.clone(),
                since: now,
                samples: VecDeque::new(),
                idle: None,
            });
            // Pods come and go on a claim: keep the latest.
            window.claim = load.claim;
            window.devices = load.devices;
            if let Some(change) = self.policy.step(window, now, load.utilization_percent) {
                changes.push(change);
            }
        }
        changes.sort_by(|a, b| key(a).cmp(key(b)));
        changes
    }

    /// The claims flagged idle now, sorted.
    pub fn idle(&self) -> Vec<IdleReport> {
        let mut out: Vec<IdleReport> = self.windows.values().filter_map(|w| w.idle.clone()).collect();
        out.sort_by(|a, b| a.claim.cmp(&b.claim));
        out
    }
}

fn key(change: &IdleChange) -> &ClaimHolder {
    match change {
        IdleChange::BecameIdle(r) => &r.claim,
        IdleChange::Cleared { claim, .. } | IdleChange::Gone { claim, .. } => claim,
    }
}

impl IdlePolicy {
    fn step(&self, w: &mut Window, now: Duration, utilization: Option<f64>) -> Option<IdleChange> {
        let Some(u) = utilization else {
            // No reading: no verdict, and coverage starts again.
            w.samples.clear();
            w.since = now;
            return w.idle.take().map(|_| IdleChange::Cleared { claim: w.claim.clone(), devices: w.devices.clone() });
        };
        if w.idle.is_some() {
            if u >= self.threshold_percent {
                w.samples.clear();
                w.since = now;
                w.idle = None;
                return Some(IdleChange::Cleared { claim: w.claim.clone(), devices: w.devices.clone() });
            }
            return None;
        }
        w.samples.push_back((now, u));
        let start = now.saturating_sub(self.window);
        while w.samples.front().is_some_and(|(t, _)| *t < start) || w.samples.len() > MAX_SAMPLES {
            w.samples.pop_front();
        }
        let covered = now.saturating_sub(w.since) >= self.window;
        let average = w.average()?;
        if covered && average < self.threshold_percent {
            let report = IdleReport {
                claim: w.claim.clone(),
                devices: w.devices.clone(),
                average_percent: average,
                window_seconds: self.window.as_secs(),
            };
            w.idle = Some(report.clone());
            return Some(IdleChange::BecameIdle(report));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str) -> Arc<ClaimHolder> {
        Arc::new(ClaimHolder {
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            pods: vec![super::super::PodRef { name: format!("{name}-pod"), uid: format!("uid-{name}-pod") }],
        })
    }

    fn load(name: &str, u: Option<f64>) -> ClaimLoad {
        ClaimLoad { claim: claim(name), devices: vec!["gpu-0".into()], utilization_percent: u }
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn tracker() -> IdleTracker {
        IdleTracker::new(IdlePolicy { threshold_percent: 5.0, window: secs(60) })
    }

    #[test]
    fn a_claim_under_the_threshold_for_a_whole_window_is_idle_once() {
        let mut t = tracker();
        for s in (0..60).step_by(10) {
            assert_eq!(t.observe(secs(s), vec![load("a", Some(2.0))]), vec![], "window not covered at {s}s");
        }
        let changes = t.observe(secs(60), vec![load("a", Some(4.0))]);
        let [IdleChange::BecameIdle(report)] = changes.as_slice() else { panic!("{changes:?}") };
        assert_eq!(report.claim.name, "a");
        assert_eq!(report.devices, ["gpu-0"]);
        assert_eq!(report.window_seconds, 60);
        assert!((report.average_percent - 16.0 / 7.0).abs() < 1e-9, "{}", report.average_percent);
        assert_eq!(t.observe(secs(70), vec![load("a", Some(1.0))]), vec![], "announced once");
        assert_eq!(t.idle().len(), 1);
    }

    #[test]
    fn the_average_decides_and_a_busy_sample_clears_and_restarts_the_window() {
        let mut t = tracker();
        // One spike keeps the average over the threshold.
        for (s, u) in [(0, 0.0), (20, 30.0), (40, 0.0), (60, 0.0)] {
            assert_eq!(t.observe(secs(s), vec![load("a", Some(u))]), vec![]);
        }
        assert_eq!(t.observe(secs(80), vec![load("a", Some(0.0))]), vec![], "the spike is still in the window");
        // The spike leaves the window at 90 s: idle.
        assert!(matches!(t.observe(secs(90), vec![load("a", Some(0.0))])[..], [IdleChange::BecameIdle(_)]));
        let changes = t.observe(secs(100), vec![load("a", Some(50.0))]);
        assert!(matches!(&changes[..], [IdleChange::Cleared { claim, .. }] if claim.name == "a"), "{changes:?}");
        assert!(t.idle().is_empty());
        // A new full window is needed before it is idle again.
        for s in [110, 130, 150] {
            assert_eq!(t.observe(secs(s), vec![load("a", Some(0.0))]), vec![]);
        }
        assert!(matches!(t.observe(secs(160), vec![load("a", Some(0.0))])[..], [IdleChange::BecameIdle(_)]));
    }

    #[test]
    fn no_reading_no_verdict() {
        let mut t = tracker();
        for s in (0..=120).step_by(10) {
            assert_eq!(t.observe(secs(s), vec![load("mig", None)]), vec![]);
        }
        // Idle, then the reading disappears: the warning is withdrawn.
        for s in (130..=190).step_by(10) {
            t.observe(secs(s), vec![load("a", Some(0.0))]);
        }
        assert_eq!(t.idle().len(), 1);
        assert!(matches!(t.observe(secs(200), vec![load("a", None)])[..], [IdleChange::Cleared { .. }]));
    }

    #[test]
    fn an_unprepared_idle_claim_is_gone_and_others_are_independent() {
        let mut t = tracker();
        for s in (0..=60).step_by(10) {
            t.observe(secs(s), vec![load("a", Some(0.0)), load("b", Some(90.0))]);
        }
        assert_eq!(t.idle().iter().map(|r| r.claim.name.as_str()).collect::<Vec<_>>(), ["a"]);
        let changes = t.observe(secs(70), vec![load("b", Some(90.0))]);
        assert!(matches!(&changes[..], [IdleChange::Gone { claim, .. }] if claim.name == "a"), "{changes:?}");
        assert!(t.idle().is_empty());
    }
}
