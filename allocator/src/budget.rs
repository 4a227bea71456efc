//! A bound on one call's searching: across the nodes it tries and the
//! explanation's re-searches, so that a claim whose search would explode
//! gets a clear "not decided within N" instead of holding its caller (and
//! whatever lock the caller holds) for minutes. Each node's search keeps its
//! own step budget besides (past it, that node counts as not fitting).
//!
//! The deadline is the allocator's only clock read, taken every
//! [`CHECK_EVERY`] steps and at each node, and only when a time is given.

use std::time::{Duration, Instant};

/// How much one call may search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SearchBudget {
    /// Search steps (device attempts, plus one per node tried).
    pub steps: u64,
    /// Wall-clock time from the start of the call.
    pub time: Option<Duration>,
}

impl SearchBudget {
    /// A time bound (and no step bound).
    pub fn time(time: Duration) -> Self {
        SearchBudget { steps: u64::MAX, time: Some(time) }
    }

    /// A step bound (and no clock).
    pub fn steps(steps: u64) -> Self {
        SearchBudget { steps, time: None }
    }
}

impl std::fmt::Display for SearchBudget {
    /// `2s`, `1000000 steps`, or `2s and 1000000 steps`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.time, self.steps) {
            (Some(t), u64::MAX) => write!(f, "{t:?}"),
            (Some(t), steps) => write!(f, "{t:?} and {steps} steps"),
            (None, steps) => write!(f, "{steps} steps"),
        }
    }
}

/// Steps between two looks at the clock (a step is ~0.3 µs).
const CHECK_EVERY: u32 = 1024;

/// What is left of a [`SearchBudget`] during a call.
#[derive(Debug)]
pub(crate) struct Meter {
    steps_left: u64,
    deadline: Option<Instant>,
    until_check: u32,
    spent: bool,
}

impl Meter {
    pub(crate) fn unlimited() -> Self {
        Meter { steps_left: u64::MAX, deadline: None, until_check: CHECK_EVERY, spent: false }
    }

    pub(crate) fn start(budget: Option<SearchBudget>) -> Self {
        let Some(budget) = budget else { return Self::unlimited() };
        Meter {
            steps_left: budget.steps,
            deadline: budget.time.and_then(|t| Instant::now().checked_add(t)),
            until_check: CHECK_EVERY,
            spent: false,
        }
    }

    /// Spends one step; false once the budget is gone (and from then on).
    #[inline]
    pub(crate) fn step(&mut self) -> bool {
        if self.spent || self.steps_left == 0 {
            self.spent = true;
            return false;
        }
        self.steps_left -= 1;
        self.until_check -= 1;
        if self.until_check == 0 {
            self.until_check = CHECK_EVERY;
            return self.check_clock();
        }
        true
    }

    /// Looks at the clock now (at each node, whatever the step count).
    pub(crate) fn check_clock(&mut self) -> bool {
        if let Some(deadline) = self.deadline
            && Instant::now() >= deadline
        {
            self.spent = true;
        }
        !self.spent
    }

    pub(crate) fn spent(&self) -> bool {
        self.spent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_run_out_and_stay_out() {
        let mut meter = Meter::start(Some(SearchBudget::steps(3)));
        assert!(meter.step() && meter.step() && meter.step());
        assert!(!meter.step());
        assert!(meter.spent() && !meter.check_clock());
        assert!(Meter::unlimited().step());
    }

    #[test]
    fn a_past_deadline_stops_at_the_next_look() {
        let mut meter = Meter::start(Some(SearchBudget::time(Duration::ZERO)));
        assert!(!meter.check_clock());
        assert!(!meter.step());
        assert_eq!(SearchBudget::time(Duration::from_secs(2)).to_string(), "2s");
        assert_eq!(SearchBudget::steps(10).to_string(), "10 steps");
    }
}
