//! Builds an [`Explanation`] after a search failed: counts, per request and
//! alternative, what the class and each selector matched on the nodes tried
//! and where the matching devices went; finds the claim of a pod that
//! breaks the pod; blames constraints by re-running the search without
//! them; lists skipped pools. Only runs on failure.

use std::collections::{BTreeMap, HashSet};

use super::budget::Meter;
use super::capacity;
use super::compact::DeviceRecord;
use super::constraints::{self, Kind};
use super::counters::{self, CounterUse};
use super::explain::{
    CapacityShortfall, ConstraintKind, ConstraintReport, CounterShortfall, Explanation, MAX_OWNERS, OtherOwners,
    OwnerCount, PoolIssue, RequestReport, TaintedDevice, ValueCount, Wanted,
};
use super::index::Fleet;
use super::request::{Alternative, ClaimPlan, Mode};
use super::search::{self, NodeOutcome, STEP_BUDGET};
use super::selectors::{SelectorCache, SetId, Verdict};
use super::state::AllocatedState;
use super::taints;
use super::why::{self, SelectorBreakdown};

/// How many devices short of capacity an explanation names (the count says
/// how many there are).
const MAX_SHORTFALLS: usize = 3;

/// How many devices an alternative wants, for scoring nodes.
fn wanted(alt: &Alternative<'_>) -> Wanted {
    match alt.mode {
        Mode::Count(n) => Wanted::Count(i64::try_from(n).unwrap_or(i64::MAX)),
        Mode::All => Wanted::All,
    }
}

fn fits_anywhere(
    fleet: &Fleet,
    selectors: &mut SelectorCache,
    state: &AllocatedState,
    plans: &[ClaimPlan<'_>],
    nodes: &[&str],
    meter: &mut Meter,
) -> bool {
    nodes
        .iter()
        .any(|n| matches!(search::search_node(fleet, selectors, state, plans, n, meter), Ok(NodeOutcome::Fits(_))))
}

/// The explanation, and the index of the claim it is about.
pub(crate) fn explain(
    fleet: &Fleet,
    selectors: &mut SelectorCache,
    state: &AllocatedState,
    plans: &[ClaimPlan<'_>],
    nodes: &[&str],
    gave_up: bool,
    meter: &mut Meter,
) -> (usize, Explanation) {
    let mut notes = Vec::new();
    // Which claim of the pod breaks it: the first whose prefix does not fit.
    let mut culprit = 0;
    if plans.len() > 1 {
        culprit = (0..plans.len())
            .find(|&i| !fits_anywhere(fleet, selectors, state, plans.get(..=i).unwrap_or_default(), nodes, meter))
            .unwrap_or(plans.len() - 1);
        if culprit > 0
            && fits_anywhere(fleet, selectors, state, plans.get(culprit..=culprit).unwrap_or_default(), nodes, meter)
        {
            let earlier: Vec<&str> = plans.iter().take(culprit).map(|p| p.name.as_str()).collect();
            notes.push(format!(
                "it fits on its own, but not on the same node together with {} of the same pod",
                earlier.join(", ")
            ));
        }
    }
    let Some(plan) = plans.get(culprit) else {
        return (
            0,
            Explanation {
                claim: String::new(),
                node: None,
                nodes_tried: nodes.len(),
                requests: vec![],
                constraints: vec![],
                pools: vec![],
                notes,
            },
        );
    };

    let mut requests = Vec::new();
    // Per node, how near it came (summed over requests, best alternative).
    let mut scores = vec![Nearness::default(); nodes.len()];
    let mut seen_pools = HashSet::new();
    let mut pools = Vec::new();
    for node in nodes {
        let view = fleet.view(node);
        for &p in &view.problem_pools {
            if seen_pools.insert(p)
                && let (Some(pool), Some(problem)) = (fleet.pool(p), fleet.pool_problem(p))
            {
                pools.push(PoolIssue {
                    driver: pool.driver.to_string(),
                    pool: pool.name.to_string(),
                    problem: problem.clone(),
                });
            }
        }
    }
    // Requests alike (a pod's 17 one-GPU requests) are counted once.
    let mut counted: Vec<(&Alternative<'_>, RequestReport, Vec<Nearness>)> = Vec::new();
    for request in &plan.requests {
        let mut best_per_node = vec![Nearness::default(); nodes.len()];
        for (a, alt) in request.alternatives.iter().enumerate() {
            let (report, per_node) = match counted.iter().find(|(seen, _, _)| counts_alike(seen, alt)) {
                Some((_, report, per_node)) => {
                    (RequestReport { request: request.result_name(a), ..report.clone() }, per_node.clone())
                }
                None => {
                    let (report, per_node) = count(fleet, selectors, state, alt, request.result_name(a), nodes);
                    counted.push((alt, report.clone(), per_node.clone()));
                    (report, per_node)
                }
            };
            for (b, n) in best_per_node.iter_mut().zip(per_node) {
                *b = (*b).max(n);
            }
            requests.push(report);
        }
        for (s, b) in scores.iter_mut().zip(best_per_node) {
            s.add(b);
        }
    }
    let closest = scores
        .iter()
        .enumerate()
        .max_by(|(i, a), (j, b)| a.cmp(b).then(j.cmp(i)))
        .and_then(|(i, _)| nodes.get(i).copied());

    let mut constraint_reports = Vec::new();
    if let Some(node) = closest
        && !plan.constraints.is_empty()
        && requests.iter().any(RequestReport::satisfiable_alone)
    {
        constraint_reports = blame_constraints(fleet, selectors, state, plan, node, meter);
    }
    if meter.spent() {
        notes.push(
            "the search's time ran out while explaining: which claim or constraint is to blame may be incomplete"
                .to_string(),
        );
    }
    if gave_up {
        notes.push(format!(
            "the search gave up after {STEP_BUDGET} steps on a node (too many combinations); simplify the claim's constraints or counts"
        ));
    }
    let all_alone = plan.requests.iter().all(|r| {
        requests
            .iter()
            .filter(|rep| rep.request == r.name || rep.request.starts_with(&format!("{}/", r.name)))
            .any(RequestReport::satisfiable_alone)
    });
    if all_alone && constraint_reports.is_empty() && notes.is_empty() && !plan.requests.is_empty() {
        notes.push(
            "each request could be met on its own, but not all together on one node (they compete for the same devices or shared counters)"
                .to_string(),
        );
    }
    let explanation = Explanation {
        claim: plan.name.clone(),
        node: closest.map(str::to_string),
        nodes_tried: nodes.len(),
        requests,
        constraints: constraint_reports,
        pools,
        notes,
    };
    (culprit, explanation)
}

/// Whether two alternatives get the same counts (all but the name).
fn counts_alike(a: &Alternative<'_>, b: &Alternative<'_>) -> bool {
    a.set == b.set
        && a.mode == b.mode
        && a.admin == b.admin
        && a.class_exprs == b.class_exprs
        && a.exprs == b.exprs
        && a.class.metadata.name == b.class.metadata.name
        && a.tolerations == b.tolerations
        && a.capacity == b.capacity
}

/// Counts for one alternative over the nodes; also the usable count per node.
/// How near a node came to holding a request, compared in field order:
/// devices it could give (up to those wanted), then the most selectors one
/// of its devices passed, then its devices the class matched. Among nodes
/// with nothing to give, the nearest is the one with the right kind of
/// devices (a MIG request's node has MIG devices).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Nearness {
    usable: usize,
    selectors_passed: usize,
    class_matches: usize,
}

impl Nearness {
    fn add(&mut self, other: Nearness) {
        self.usable += other.usable;
        self.selectors_passed += other.selectors_passed;
        self.class_matches += other.class_matches;
    }
}

/// How many of the cumulative selector `sets` device `d` passes, stopping
/// at the first it fails. `first_time` holds, on the device's first sight
/// only, the per-set pass counts and the error count to add to, so that a
/// device seen from several nodes counts once.
fn passed(
    selectors: &mut SelectorCache,
    fleet: &Fleet,
    sets: &[SetId],
    d: u32,
    mut first_time: Option<(&mut [usize], &mut usize)>,
) -> usize {
    for (i, &set) in sets.iter().enumerate() {
        match selectors.verdict(fleet, set, d) {
            Verdict::Match => {
                if let Some(n) = first_time.as_mut().and_then(|(counts, _)| counts.get_mut(i)) {
                    *n += 1;
                }
            }
            Verdict::NoMatch => return i,
            Verdict::Error { .. } => {
                if let Some((_, errors)) = first_time {
                    *errors += 1;
                }
                return i;
            }
        }
    }
    sets.len()
}

fn count(
    fleet: &Fleet,
    selectors: &mut SelectorCache,
    state: &AllocatedState,
    alt: &Alternative<'_>,
    name: String,
    nodes: &[&str],
) -> (RequestReport, Vec<Nearness>) {
    let class_refs = &alt.class_exprs;
    let request_refs = &alt.exprs;
    let class_sets: Vec<_> = (1..=class_refs.len()).map(|i| selectors.match_set(&class_refs[..i], &[])).collect();
    let request_sets: Vec<_> =
        (1..=request_refs.len()).map(|i| selectors.match_set(class_refs, &request_refs[..i])).collect();
    let mut report = RequestReport {
        request: name,
        class: alt.class.metadata.name.clone().unwrap_or_default(),
        wanted: wanted(alt),
        visible: 0,
        class_matches: 0,
        class_selectors: vec![0; class_sets.len()],
        request_selectors: vec![0; request_sets.len()],
        selector_errors: 0,
        allocated: vec![],
        other_owners: OtherOwners::default(),
        tainted: vec![],
        capacity_exhausted: 0,
        capacity_shortfalls: vec![],
        counter_shortfalls: vec![],
        counters_exhausted: 0,
        available: 0,
        selector_breakdown: None,
    };
    let mut owners: BTreeMap<String, usize> = BTreeMap::new();
    let mut seen = HashSet::new();
    let mut class_matched: Vec<u32> = Vec::new();
    let mut per_node = Vec::with_capacity(nodes.len());
    let no_use = CounterUse::default();
    for node in nodes {
        let view = fleet.view(node);
        let (mut usable_here, mut near) = (0usize, Nearness::default());
        for &d in &view.devices {
            let first_time = seen.insert(d);
            if first_time {
                report.visible += 1;
            }
            let seen_first = first_time.then_some((&mut report.class_selectors[..], &mut report.selector_errors));
            if passed(selectors, fleet, &class_sets, d, seen_first) < class_sets.len() {
                continue;
            }
            if first_time {
                report.class_matches += 1;
                class_matched.push(d);
            }
            near.class_matches += 1;
            let seen_first = first_time.then_some((&mut report.request_selectors[..], &mut report.selector_errors));
            let request_passed = passed(selectors, fleet, &request_sets, d, seen_first);
            near.selectors_passed = near.selectors_passed.max(request_passed);
            if request_passed < request_sets.len() {
                continue;
            }
            let (Some(dev), Some(dref)) = (fleet.device(d), fleet.device_ref(d)) else {
                continue;
            };
            let shareable = dev.allow_multiple_allocations;
            if !alt.admin && state.is_taken(d) {
                if first_time {
                    for o in state.owners(d) {
                        *owners.entry(o.to_string()).or_default() += 1;
                    }
                }
                continue;
            }
            if (shareable || alt.capacity.is_some())
                && let Err(misfit) = capacity::take(alt.capacity, dev, state.consumed(d))
            {
                if first_time {
                    report.capacity_exhausted += 1;
                    if report.capacity_shortfalls.len() < MAX_SHORTFALLS {
                        report
                            .capacity_shortfalls
                            .push(CapacityShortfall { device: fleet.describe(d), reason: misfit.describe() });
                    }
                }
                continue;
            }
            // A shareable device already in use consumes its counters already.
            let counts_counters = !(shareable && state.consumed(d).is_some());
            let consumption = fleet.consumption(d);
            if counts_counters && !consumption.is_empty() {
                let misfit = match fleet.pool_counters(dref.pool) {
                    None => Some(None),
                    Some(pc) => counters::fits(pc, dref.pool, consumption, &state.counters, &no_use)
                        .err()
                        .map(|(set, counter)| Some(format!("{set}/{counter}"))),
                };
                if let Some(counter) = misfit {
                    if first_time {
                        report.counters_exhausted += 1;
                        if let Some(counter) = counter.filter(|_| report.counter_shortfalls.len() < MAX_SHORTFALLS) {
                            report.counter_shortfalls.push(CounterShortfall { device: fleet.describe(d), counter });
                        }
                    }
                    continue;
                }
            }
            if let Some(t) = taints::blocking_taint(dev, alt.tolerations) {
                if first_time {
                    report.tainted.push(TaintedDevice { device: fleet.describe(d), taint: taints::describe(t) });
                }
                continue;
            }
            report.available += usize::from(first_time);
            usable_here += 1;
        }
        let want = match alt.mode {
            Mode::Count(n) => n,
            Mode::All => usable_here,
        };
        near.usable = usable_here.min(want);
        per_node.push(near);
    }
    let mut allocated: Vec<OwnerCount> =
        owners.into_iter().map(|(owner, devices)| OwnerCount { owner, devices }).collect();
    allocated.sort_by(|a, b| b.devices.cmp(&a.devices).then(a.owner.cmp(&b.owner)));
    if allocated.len() > MAX_OWNERS {
        let rest = allocated.split_off(MAX_OWNERS);
        report.other_owners = OtherOwners { claims: rest.len(), devices: rest.iter().map(|o| o.devices).sum() };
    }
    report.allocated = allocated;
    report.selector_breakdown = break_down(fleet, selectors, &report, &request_sets, request_refs, &class_matched);
    (report, per_node)
}

/// The first request selector that matched none of the devices left by the
/// class and the selectors before it, broken down clause by clause.
fn break_down(
    fleet: &Fleet,
    selectors: &mut SelectorCache,
    report: &RequestReport,
    request_sets: &[super::selectors::SetId],
    exprs: &[&str],
    class_matched: &[u32],
) -> Option<(usize, SelectorBreakdown)> {
    let i = report.request_selectors.iter().position(|&n| n == 0)?;
    let before = if i == 0 { report.class_matches } else { *report.request_selectors.get(i - 1)? };
    if before == 0 {
        return None;
    }
    let expression = exprs.get(i)?;
    let previous = i.checked_sub(1).and_then(|p| request_sets.get(p)).copied();
    let mut base: Vec<u32> = Vec::new();
    for &d in class_matched {
        if previous.is_none_or(|set| selectors.verdict(fleet, set, d) == Verdict::Match) {
            base.push(d);
        }
    }
    let devices: Vec<(&str, &DeviceRecord)> =
        base.iter().filter_map(|&d| Some((&*fleet.pool_of(d)?.driver, fleet.device(d)?))).collect();
    let breakdown = why::breakdown(expression, &devices, |clause, k| {
        let set = selectors.match_set(&[], &[clause]);
        match base.get(k).map(|&d| selectors.verdict(fleet, set, d)) {
            Some(Verdict::Match) => Some(true),
            Some(Verdict::NoMatch) => Some(false),
            _ => None,
        }
    });
    Some((i, breakdown))
}

/// Constraints whose removal makes the claim fit on `node`; if no single
/// one does but removing all does, all of them.
fn blame_constraints(
    fleet: &Fleet,
    selectors: &mut SelectorCache,
    state: &AllocatedState,
    plan: &ClaimPlan<'_>,
    node: &str,
    meter: &mut Meter,
) -> Vec<ConstraintReport> {
    let fits_without = |selectors: &mut SelectorCache, meter: &mut Meter, drop: &dyn Fn(usize) -> bool| {
        let mut p = plan.clone();
        p.constraints =
            plan.constraints.iter().enumerate().filter(|(i, _)| !drop(*i)).map(|(_, c)| c.clone()).collect();
        matches!(
            search::search_node(fleet, selectors, state, std::slice::from_ref(&p), node, meter),
            Ok(NodeOutcome::Fits(_))
        )
    };
    let mut blamed: Vec<usize> =
        (0..plan.constraints.len()).filter(|&i| fits_without(selectors, meter, &|j| j == i)).collect();
    if blamed.is_empty() && fits_without(selectors, meter, &|_| true) {
        blamed = (0..plan.constraints.len()).collect();
    }
    let view = fleet.view(node);
    blamed
        .into_iter()
        .filter_map(|i| plan.constraints.get(i))
        .map(|c| {
            let mut values: BTreeMap<String, usize> = BTreeMap::new();
            let mut seen = HashSet::new();
            for request in &plan.requests {
                for alt in &request.alternatives {
                    if !c.covers(request.name, alt.sub) {
                        continue;
                    }
                    for &d in &view.devices {
                        if !seen.insert(d)
                            || selectors.verdict(fleet, alt.set, d) != Verdict::Match
                            || (!alt.admin && state.is_taken(d))
                        {
                            continue;
                        }
                        let (Some(dev), Some(pool)) = (fleet.device(d), fleet.pool_of(d)) else { continue };
                        let v = constraints::shown_value(dev, &pool.driver, &c.attribute, c.uses_sets())
                            .unwrap_or_else(|| "<missing>".to_string());
                        *values.entry(v).or_default() += 1;
                    }
                }
            }
            ConstraintReport {
                kind: match c.kind {
                    Kind::Match => ConstraintKind::MatchAttribute,
                    Kind::Distinct => ConstraintKind::DistinctAttribute,
                },
                attribute: c.attribute.clone(),
                requests: c.requests.clone(),
                values: values.into_iter().map(|(value, devices)| ValueCount { value, devices }).collect(),
            }
        })
        .collect()
}
