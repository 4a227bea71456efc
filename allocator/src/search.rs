//! The backtracking search, as upstream's `allocateOne`/`allocateDevice`:
//! claims in order, requests in order, devices of a request in search order
//! (combinations, not permutations: the next device of the same request
//! starts after the previous one), `firstAvailable` alternatives in order,
//! and the first complete solution wins.
//!
//! A device is checked cheapest first: busy (dedicated elsewhere or picked
//! in this search), selectors (cached), counters, taints, constraints,
//! capacity. An `All` request must take every matching device on the node
//! (a constraint that rejects one is an error, as upstream). Exceeding 32
//! results backtracks to alternatives that need fewer devices.
//!
//! Deliberate differences: counters picked for a device are released when
//! that pick is undone for any reason (upstream leaks them on a taint
//! mismatch and for shareable devices), and the search gives up after a
//! step budget instead of the scheduler's 10 s filter timeout, reporting
//! the node as not fitting.

use std::collections::HashMap;
use std::sync::Arc;

use super::budget::Meter;
use super::capacity::{self, Consumed, Take};
use super::constraints::Constraint;
use super::counters::{self, CounterUse};
use super::counting;
use super::error::FatalError;
use super::index::Fleet;
use super::request::{ClaimPlan, MAX_RESULTS, Mode};
use super::selectors::{Origin, SelectorCache, Verdict};
use super::state::AllocatedState;
use super::taints;

/// Steps (device attempts) one node's search may take before giving up.
pub(crate) const STEP_BUDGET: u64 = 2_000_000;

/// One device picked for a request.
#[derive(Debug, Clone)]
pub(crate) struct Pick {
    pub(crate) device: u32,
    pub(crate) request: usize,
    pub(crate) alt: usize,
    /// Capacity taken on a shareable device (None for dedicated ones).
    pub(crate) take: Option<Take>,
    /// This pick added the device's counters to the search's use.
    counted: bool,
}

/// A solution: per claim, its picks and the chosen alternative per request.
#[derive(Debug, Clone)]
pub(crate) struct Solution {
    pub(crate) picks: Vec<Vec<Pick>>,
    pub(crate) chosen: Vec<Vec<usize>>,
}

/// Why a search stopped without a plain yes/no.
#[derive(Debug)]
pub(crate) enum Stop {
    Fatal(FatalError),
    /// More than 32 results would be needed on this path.
    MaxSize,
    /// The node's step budget ran out.
    Budget,
    /// The call's budget ran out.
    Spent,
}

impl From<FatalError> for Stop {
    fn from(e: FatalError) -> Self {
        Stop::Fatal(e)
    }
}

/// The outcome of searching one node.
#[derive(Debug)]
pub(crate) enum NodeOutcome {
    Fits(Solution),
    NoFit {
        gave_up: bool,
    },
    /// The call's budget ran out before this node was decided.
    Undecided,
}

pub(crate) struct Search<'s, 'c> {
    fleet: &'s Fleet,
    selectors: &'s mut SelectorCache,
    state: &'s AllocatedState,
    plans: &'s [ClaimPlan<'c>],
    /// Candidates per [claim][request][alternative]; for `All` exactly the devices to take.
    candidates: Vec<Vec<Vec<Arc<[u32]>>>>,
    constraints: Vec<Vec<Constraint>>,
    /// Device → claims that take it (dedicated) in this search.
    taking: HashMap<u32, Vec<usize>>,
    capacity: HashMap<u32, Consumed>,
    counters: CounterUse,
    picks: Vec<Vec<Pick>>,
    chosen: Vec<Vec<usize>>,
    steps: u64,
    meter: &'s mut Meter,
}

/// Prepares and runs the search of `plans` on one node.
pub(crate) fn search_node(
    fleet: &Fleet,
    selectors: &mut SelectorCache,
    state: &AllocatedState,
    plans: &[ClaimPlan<'_>],
    node: &str,
    meter: &mut Meter,
) -> Result<NodeOutcome, FatalError> {
    if !meter.step() || !meter.check_clock() {
        return Ok(NodeOutcome::Undecided);
    }
    let position = fleet.node_position(node);
    let view = fleet.view(node);
    if let Some(e) = &view.error {
        return Err(FatalError::InvalidSlice { message: format!("node selection for node {node}: {e}") });
    }
    let mut candidates = Vec::with_capacity(plans.len());
    for plan in plans {
        let mut per_request = Vec::with_capacity(plan.requests.len());
        let mut min_total = 0usize;
        for request in &plan.requests {
            let mut per_alt = Vec::with_capacity(request.alternatives.len());
            let mut min_devices = usize::MAX;
            for (a, alt) in request.alternatives.iter().enumerate() {
                let list = selectors.candidates(fleet, alt.set, position, &view.devices);
                let list = match alt.mode {
                    Mode::Count(n) => {
                        min_devices = min_devices.min(n);
                        list
                    }
                    Mode::All => {
                        if let Some(&p) = view.problem_pools.first()
                            && let Some(pool) = fleet.pool(p)
                        {
                            return Err(FatalError::PoolNotReady {
                                claim: plan.name.clone(),
                                request: request.result_name(a),
                                driver: pool.driver.to_string(),
                                pool: pool.name.to_string(),
                                problem: match &pool.problem {
                                    Some(super::explain::PoolProblem::Incomplete { .. }) => {
                                        "is currently being updated (incomplete)".to_string()
                                    }
                                    Some(super::explain::PoolProblem::Invalid { reason }) => {
                                        format!("is currently invalid: {reason}")
                                    }
                                    None => String::new(),
                                },
                            });
                        }
                        let mut all = Vec::new();
                        for &d in list.iter() {
                            match selectors.verdict(fleet, alt.set, d) {
                                Verdict::Match => {}
                                Verdict::NoMatch => continue,
                                Verdict::Error { origin, index, compile, message } => {
                                    return Err(cel_error(
                                        fleet,
                                        plan,
                                        request.result_name(a),
                                        alt.class,
                                        d,
                                        origin,
                                        index,
                                        compile,
                                        message,
                                    ));
                                }
                            }
                            if let Some(dev) = fleet.device(d) {
                                let shareable = dev.allow_multiple_allocations;
                                if (shareable || alt.capacity.is_some())
                                    && capacity::take(alt.capacity, dev, state.consumed(d)).is_err()
                                {
                                    continue;
                                }
                            }
                            all.push(d);
                        }
                        min_devices = min_devices.min(all.len());
                        all.into()
                    }
                };
                per_alt.push(list);
            }
            min_total = min_total.saturating_add(if min_devices == usize::MAX { 0 } else { min_devices });
            per_request.push(per_alt);
        }
        if min_total > MAX_RESULTS {
            return Err(FatalError::TooManyResults { claim: plan.name.clone(), results: min_total, max: MAX_RESULTS });
        }
        candidates.push(per_request);
    }
    if counting::ruled_out(fleet, selectors, state, plans, &candidates) {
        return Ok(NodeOutcome::NoFit { gave_up: false });
    }
    let mut search = Search {
        fleet,
        selectors,
        state,
        plans,
        candidates,
        constraints: plans.iter().map(|p| p.constraints.clone()).collect(),
        taking: HashMap::new(),
        capacity: HashMap::new(),
        counters: CounterUse::default(),
        picks: vec![Vec::new(); plans.len()],
        chosen: plans.iter().map(|p| vec![0; p.requests.len()]).collect(),
        steps: 0,
        meter,
    };
    match search.one(0, 0, None, 0, 0) {
        Ok(true) => Ok(NodeOutcome::Fits(Solution { picks: search.picks, chosen: search.chosen })),
        Ok(false) | Err(Stop::MaxSize) => Ok(NodeOutcome::NoFit { gave_up: false }),
        Err(Stop::Budget) => Ok(NodeOutcome::NoFit { gave_up: true }),
        Err(Stop::Spent) => Ok(NodeOutcome::Undecided),
        Err(Stop::Fatal(e)) => Err(e),
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn cel_error(
    fleet: &Fleet,
    plan: &ClaimPlan<'_>,
    request: String,
    class: &k8s_openapi::api::resource::v1::DeviceClass,
    device: u32,
    origin: Origin,
    index: usize,
    compile: bool,
    message: String,
) -> FatalError {
    let source_ref = match origin {
        Origin::Class => format!("class {}", class.metadata.name.as_deref().unwrap_or_default()),
        Origin::Request => format!("request {request}"),
    };
    if compile {
        FatalError::CelCompile { claim: plan.name.clone(), source_ref, index, message }
    } else {
        let hint = message
            .strip_prefix("No such key: ")
            .and_then(|key| super::why::missing_key_hint(key.trim(), fleet.device(device)?));
        let message = match hint {
            Some(h) => format!("{message}; {h}"),
            None => message,
        };
        FatalError::CelRuntime { claim: plan.name.clone(), source_ref, index, device: fleet.describe(device), message }
    }
}

impl Search<'_, '_> {
    fn busy(&self, d: u32) -> bool {
        self.state.is_taken(d) || self.taking.get(&d).is_some_and(|c| !c.is_empty())
    }

    fn taking_for(&self, d: u32, claim: usize) -> bool {
        self.taking.get(&d).is_some_and(|c| c.contains(&claim))
    }

    /// Allocates device number `k` of request `r` of claim `c` (alternative
    /// `sub` when inside a `firstAvailable` request), trying candidates from
    /// `start` on; `Ok(true)` when everything after it got allocated too.
    fn one(&mut self, c: usize, r: usize, sub: Option<usize>, k: usize, start: usize) -> Result<bool, Stop> {
        self.steps += 1;
        if self.steps > STEP_BUDGET {
            return Err(Stop::Budget);
        }
        if !self.meter.step() {
            return Err(Stop::Spent);
        }
        let plans = self.plans;
        let Some(plan) = plans.get(c) else { return Ok(true) };
        let Some(request) = plan.requests.get(r) else {
            return match self.one(c + 1, 0, None, 0, 0) {
                // Another solution for this claim may use fewer devices.
                Err(Stop::MaxSize) => Ok(false),
                other => other,
            };
        };
        if sub.is_none() && request.first_available {
            let mut all_exceeded = true;
            for a in 0..request.alternatives.len() {
                match self.one(c, r, Some(a), 0, 0) {
                    Err(Stop::MaxSize) => continue,
                    Err(e) => return Err(e),
                    Ok(true) => return Ok(true),
                    Ok(false) => all_exceeded = false,
                }
            }
            return if all_exceeded { Err(Stop::MaxSize) } else { Ok(false) };
        }
        let a = sub.unwrap_or(0);
        let Some(alt) = request.alternatives.get(a) else { return Ok(false) };
        let list = self.candidates.get(c).and_then(|x| x.get(r)).and_then(|x| x.get(a)).cloned().unwrap_or_default();
        let needed = match alt.mode {
            Mode::Count(n) => n,
            Mode::All => {
                if list.is_empty() {
                    return Ok(false);
                }
                list.len()
            }
        };
        if k >= needed {
            if let Some(slot) = self.chosen.get_mut(c).and_then(|x| x.get_mut(r)) {
                *slot = a;
            }
            return self.one(c, r + 1, None, 0, 0);
        }
        let picked = self.picks.get(c).map_or(0, Vec::len);
        if picked + needed - k > MAX_RESULTS {
            return Err(Stop::MaxSize);
        }
        if alt.mode == Mode::All {
            let Some(&d) = list.get(k) else { return Ok(false) };
            if !self.take(c, r, a, d, true)? {
                return Ok(false);
            }
            let result = self.one(c, r, sub, k + 1, 0);
            if !matches!(result, Ok(true)) {
                self.untake(c);
            }
            return result;
        }
        for i in start..list.len() {
            let Some(&d) = list.get(i) else { break };
            if alt.admin && self.taking_for(d, c) {
                continue;
            }
            if !alt.admin && self.busy(d) {
                continue;
            }
            match self.selectors.verdict(self.fleet, alt.set, d) {
                Verdict::Match => {}
                Verdict::NoMatch => continue,
                Verdict::Error { origin, index, compile, message } => {
                    let name = request.result_name(a);
                    return Err(Stop::Fatal(cel_error(
                        self.fleet, plan, name, alt.class, d, origin, index, compile, message,
                    )));
                }
            }
            if !self.take(c, r, a, d, false)? {
                continue;
            }
            match self.one(c, r, sub, k + 1, i + 1) {
                Ok(true) => return Ok(true),
                Ok(false) => self.untake(c),
                Err(e) => {
                    self.untake(c);
                    return Err(e);
                }
            }
        }
        Ok(false)
    }

    /// `allocateDevice`: checks and records one pick; `Ok(false)` if the
    /// device cannot be used here.
    fn take(&mut self, c: usize, r: usize, a: usize, d: u32, must: bool) -> Result<bool, Stop> {
        let fleet = self.fleet;
        let plans = self.plans;
        let (Some(plan), Some(dev), Some(dref), Some(pool)) =
            (plans.get(c), fleet.device(d), fleet.device_ref(d), fleet.pool_of(d))
        else {
            return Ok(false);
        };
        let Some(request) = plan.requests.get(r) else { return Ok(false) };
        let Some(alt) = request.alternatives.get(a) else { return Ok(false) };
        let shareable = dev.allow_multiple_allocations;
        if !shareable && alt.admin && self.taking_for(d, c) {
            return Ok(false);
        }
        if !alt.admin && self.busy(d) {
            return Ok(false);
        }
        // A shareable device whose capacity is in use consumes its counters already.
        let capacity_in_use = self.state.consumed(d).is_some() || self.capacity.contains_key(&d);
        let counts_counters = !(shareable && capacity_in_use);
        let mut counted = false;
        let consumption = fleet.consumption(d);
        if counts_counters && !consumption.is_empty() {
            let Some(pc) = fleet.pool_counters(dref.pool) else { return Ok(false) };
            if counters::fits(pc, dref.pool, consumption, &self.state.counters, &self.counters).is_err() {
                return Ok(false);
            }
            self.counters.add(dref.pool, consumption);
            counted = true;
        }
        let undo_counters = |s: &mut Self| {
            if counted {
                s.counters.sub(dref.pool, consumption);
            }
        };
        if taints::blocking_taint(dev, alt.tolerations).is_some() {
            undo_counters(self);
            return Ok(false);
        }
        let sub_name = alt.sub;
        let mut added = 0;
        let mut rejected = false;
        if let Some(constraints) = self.constraints.get_mut(c) {
            for constraint in constraints.iter_mut() {
                if !constraint.add(request.name, sub_name, dev, &pool.driver) {
                    rejected = true;
                    break;
                }
                added += 1;
            }
            if rejected {
                for constraint in constraints.iter_mut().take(added) {
                    constraint.remove(request.name, sub_name);
                }
            }
        }
        if rejected {
            undo_counters(self);
            if must {
                return Err(Stop::Fatal(FatalError::ConstraintWithAll {
                    claim: plan.name.clone(),
                    request: request.result_name(a),
                    device: fleet.describe(d),
                }));
            }
            return Ok(false);
        }
        let mut take = None;
        if shareable || alt.capacity.is_some() {
            let mut used = self.state.consumed(d).cloned().unwrap_or_default();
            if let Some(extra) = self.capacity.get(&d) {
                for (k, v) in extra {
                    let e = used.entry(k.clone()).or_default();
                    *e = e.saturating_add(*v);
                }
            }
            match capacity::take(alt.capacity, dev, Some(&used)) {
                Ok(t) => {
                    if shareable {
                        capacity::add(self.capacity.entry(d).or_default(), &t);
                        take = Some(t);
                    }
                }
                Err(_) => {
                    if let Some(constraints) = self.constraints.get_mut(c) {
                        for constraint in constraints.iter_mut() {
                            constraint.remove(request.name, sub_name);
                        }
                    }
                    undo_counters(self);
                    return Ok(false);
                }
            }
        }
        if !shareable {
            self.taking.entry(d).or_default().push(c);
        }
        if let Some(p) = self.picks.get_mut(c) {
            p.push(Pick { device: d, request: r, alt: a, take, counted });
        }
        Ok(true)
    }

    /// Undoes the last pick of claim `c`.
    fn untake(&mut self, c: usize) {
        let Some(pick) = self.picks.get_mut(c).and_then(Vec::pop) else { return };
        let fleet = self.fleet;
        let plans = self.plans;
        let Some(request) = plans.get(c).and_then(|p| p.requests.get(pick.request)) else { return };
        let sub = request.alternatives.get(pick.alt).and_then(|a| a.sub);
        if let Some(constraints) = self.constraints.get_mut(c) {
            for constraint in constraints.iter_mut() {
                constraint.remove(request.name, sub);
            }
        }
        match &pick.take {
            Some(t) => {
                if let Some(total) = self.capacity.get_mut(&pick.device) {
                    capacity::sub(total, t);
                    if total.values().all(|v| *v == dra_cel::quantity::Quantity::ZERO) {
                        self.capacity.remove(&pick.device);
                    }
                }
            }
            None => {
                if let Some(claims) = self.taking.get_mut(&pick.device)
                    && let Some(pos) = claims.iter().rposition(|&x| x == c)
                {
                    claims.remove(pos);
                }
            }
        }
        if pick.counted
            && let Some(dref) = fleet.device_ref(pick.device)
        {
            self.counters.sub(dref.pool, fleet.consumption(pick.device));
        }
    }
}
