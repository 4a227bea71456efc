//! Rules a node out by counting, before the backtracking search: a request
//! for more devices than the node has usable matching ones, or a pod's
//! requests wanting more distinct devices than they match together, cannot
//! fit whatever the order of picks. Without it, 17 one-device requests on a
//! 16-device node make the search try every assignment of 16 devices to the
//! first 16 requests before the 17th fails (its step budget runs out first).
//!
//! A device is "usable" for an alternative when the search would accept it
//! as a first pick given only what is already allocated: not taken by
//! another claim (admin access ignores that), not blocked by a taint, its
//! own counters fit what is left of its pool's, its capacity fits what is
//! left on the device. Every one of these only gets harder as the search
//! picks more, so a count below what is wanted is a proof, and the first
//! solution of the search (when there is one) is unchanged.
//!
//! Devices of a class that selectors failed on are never counted away: the
//! search must reach them and report the error, as upstream does.

use std::sync::Arc;

use super::capacity;
use super::counters::{self, CounterUse};
use super::index::Fleet;
use super::request::{Alternative, ClaimPlan, Mode};
use super::selectors::{SelectorCache, Verdict};
use super::state::AllocatedState;
use super::taints;

/// Candidates per [claim][request][alternative], as the search holds them.
pub(crate) type Candidates = [Vec<Vec<Arc<[u32]>>>];

/// Whether counting alone shows that `plans` cannot fit on the node whose
/// candidates these are.
pub(crate) fn ruled_out(
    fleet: &Fleet,
    selectors: &mut SelectorCache,
    state: &AllocatedState,
    plans: &[ClaimPlan<'_>],
    candidates: &Candidates,
) -> bool {
    let requests: usize = plans.iter().map(|p| p.requests.len()).sum();
    // Distinct devices the non-admin requests of the pod need together, and
    // those they could use; `None` once a shareable device makes the sum
    // meaningless (it can serve several requests).
    let mut needed_together = 0usize;
    let mut usable_together: Option<Vec<u32>> = (requests > 1).then(Vec::new);
    for (plan, per_request) in plans.iter().zip(candidates) {
        for (request, per_alt) in plan.requests.iter().zip(per_request) {
            let mut least: Option<usize> = None;
            let mut admin = false;
            for (alt, list) in request.alternatives.iter().zip(per_alt) {
                admin |= alt.admin;
                let (needed, usable) = match alt.mode {
                    // `All` lists hold exactly the devices to take; the search
                    // meets them in order (a constraint error included).
                    Mode::All => (list.len(), list.to_vec()),
                    Mode::Count(n) if n > list.len() => continue,
                    Mode::Count(n) if n > 1 || usable_together.is_some() => {
                        let usable = usable_devices(fleet, state, alt, list);
                        if usable.len() < n {
                            continue;
                        }
                        (n, usable)
                    }
                    Mode::Count(n) => (n, Vec::new()),
                };
                least = Some(least.map_or(needed, |l| l.min(needed)));
                if let Some(together) = usable_together.as_mut() {
                    if usable.iter().any(|&d| fleet.device(d).is_some_and(|dev| dev.allow_multiple_allocations)) {
                        usable_together = None;
                    } else if !alt.admin {
                        together.extend_from_slice(&usable);
                    }
                }
            }
            match least {
                None => return no_selector_errors(fleet, selectors, plans, candidates),
                Some(n) if !admin => needed_together = needed_together.saturating_add(n),
                Some(_) => {}
            }
        }
    }
    if let Some(mut together) = usable_together {
        together.sort_unstable();
        together.dedup();
        if needed_together > together.len() {
            return no_selector_errors(fleet, selectors, plans, candidates);
        }
    }
    false
}

/// The devices of `list` the alternative could take first, in order.
fn usable_devices(fleet: &Fleet, state: &AllocatedState, alt: &Alternative<'_>, list: &[u32]) -> Vec<u32> {
    let none = CounterUse::default();
    list.iter()
        .copied()
        .filter(|&d| {
            let Some(dev) = fleet.device(d) else { return false };
            if !alt.admin && state.is_taken(d) {
                return false;
            }
            if taints::blocking_taint(dev, alt.tolerations).is_some() {
                return false;
            }
            let shareable = dev.allow_multiple_allocations;
            let consumption = fleet.consumption(d);
            // A shareable device in use already holds its counters.
            let holds_counters = shareable && state.consumed(d).is_some();
            if !consumption.is_empty() && !holds_counters {
                let fits = fleet.device_ref(d).is_some_and(|r| {
                    fleet
                        .pool_counters(r.pool)
                        .is_some_and(|pc| counters::fits(pc, r.pool, consumption, &state.counters, &none).is_ok())
                });
                if !fits {
                    return false;
                }
            }
            !((shareable || alt.capacity.is_some()) && capacity::take(alt.capacity, dev, state.consumed(d)).is_err())
        })
        .collect()
}

/// True unless a selector fails on one of the candidates: then the search
/// must run, to report that error where it meets it.
fn no_selector_errors(
    fleet: &Fleet,
    selectors: &mut SelectorCache,
    plans: &[ClaimPlan<'_>],
    candidates: &Candidates,
) -> bool {
    for (plan, per_request) in plans.iter().zip(candidates) {
        for (request, per_alt) in plan.requests.iter().zip(per_request) {
            for (alt, list) in request.alternatives.iter().zip(per_alt) {
                if list.iter().any(|&d| matches!(selectors.verdict(fleet, alt.set, d), Verdict::Error { .. })) {
                    return false;
                }
            }
        }
    }
    true
}
