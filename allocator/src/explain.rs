//! Why claims do not fit, as data with a `Display` that reads like a senior
//! engineer's answer: which request failed, how many devices the class and
//! each selector matched, where the rest went (allocated to whom, tainted,
//! capacity or counters used up), which constraint could not be met with
//! which values, and which pools were skipped.
//!
//! Built only on failure (see `diagnose`), so the counting here costs
//! nothing on the happy path. Reused by `simulate` and the controller.

use std::fmt;

use super::why::SelectorBreakdown;

/// How many devices a request wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    Count(i64),
    All,
}

/// Matching devices already in use, grouped by the claim holding them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerCount {
    /// `namespace/name` of the claim, or `this pod's other requests` for
    /// devices taken earlier in the same allocation.
    pub owner: String,
    pub devices: usize,
}

/// Owners not listed by name: how many claims hold how many devices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OtherOwners {
    pub claims: usize,
    pub devices: usize,
}

/// A matching device excluded by a taint the request does not tolerate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaintedDevice {
    /// `<driver>/<pool>/<device>`.
    pub device: String,
    /// `key=value:Effect`.
    pub taint: String,
}

/// A matching shareable device that cannot take the request's capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityShortfall {
    /// `<driver>/<pool>/<device>`.
    pub device: String,
    /// Which capacity, and the amounts (`memory: 30Gi requested, 20Gi of
    /// 80Gi left`).
    pub reason: String,
}

/// A matching device blocked by a shared counter other devices used up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterShortfall {
    /// `<driver>/<pool>/<device>`.
    pub device: String,
    /// `<counter set>/<counter>`: the first counter it needs that is used up.
    pub counter: String,
}

/// How many owners an explanation lists by name.
pub const MAX_OWNERS: usize = 10;

/// What one request (or `firstAvailable` subrequest) saw on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestReport {
    /// `req` or `req/sub`.
    pub request: String,
    pub class: String,
    pub wanted: Wanted,
    /// Devices visible to the node (complete, valid pools) before any selector.
    pub visible: usize,
    /// Devices passing all of the class's selectors.
    pub class_matches: usize,
    /// Devices passing class selector #i and every one before it.
    pub class_selectors: Vec<usize>,
    /// Devices passing request selector #i, every one before it and the class.
    pub request_selectors: Vec<usize>,
    /// Devices on which a selector failed to evaluate while explaining
    /// (the search itself turns such failures into errors).
    pub selector_errors: usize,
    /// Matching devices in use, by owner, most devices first (at most
    /// [`MAX_OWNERS`]; the rest are summed in `other_owners`).
    pub allocated: Vec<OwnerCount>,
    /// Owners beyond the first [`MAX_OWNERS`].
    pub other_owners: OtherOwners,
    /// Matching devices whose taints the request does not tolerate.
    pub tainted: Vec<TaintedDevice>,
    /// Matching shareable devices without enough capacity left for the request.
    pub capacity_exhausted: usize,
    /// The first few of them, with the capacity that is short.
    pub capacity_shortfalls: Vec<CapacityShortfall>,
    /// Matching devices whose shared counters are used up by other devices.
    pub counters_exhausted: usize,
    /// The first few of them, with the counter that is used up.
    pub counter_shortfalls: Vec<CounterShortfall>,
    /// Matching devices that are usable right now.
    pub available: usize,
    /// The first request selector that matched nothing, broken down: which
    /// clause leaves nothing and what to fix (see `why`).
    pub selector_breakdown: Option<(usize, SelectorBreakdown)>,
}

impl RequestReport {
    /// All devices passing class and request selectors.
    pub fn matching(&self) -> usize {
        self.request_selectors.last().copied().unwrap_or(self.class_matches)
    }

    /// Whether this request could be met if it were alone.
    pub fn satisfiable_alone(&self) -> bool {
        match self.wanted {
            Wanted::Count(n) => usize::try_from(n).is_ok_and(|n| self.available >= n),
            Wanted::All => self.matching() > 0 && self.available == self.matching(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConstraintKind {
    MatchAttribute,
    DistinctAttribute,
}

/// An attribute value and how many available candidate devices carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueCount {
    /// The value as written in the slice, or `<missing>`.
    pub value: String,
    pub devices: usize,
}

/// A constraint that, with the available devices, leaves no solution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConstraintReport {
    pub kind: ConstraintKind,
    /// Fully qualified attribute name.
    pub attribute: String,
    /// The requests it covers (empty: all).
    pub requests: Vec<String>,
    /// Values among the available candidates of the covered requests.
    pub values: Vec<ValueCount>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolProblem {
    /// Fewer slices at the highest generation than `resourceSliceCount`.
    Incomplete { slices_seen: usize, slices_expected: i64 },
    /// The pool's content is contradictory (e.g. duplicate device names).
    Invalid { reason: String },
}

/// A pool the allocator had to skip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolIssue {
    pub driver: String,
    pub pool: String,
    pub problem: PoolProblem,
}

/// Why a claim does not fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    /// `namespace/name` of the claim that could not be allocated.
    pub claim: String,
    /// The node the explanation describes (the one that came closest when
    /// several were tried); `None` when there was no node at all.
    pub node: Option<String>,
    /// How many nodes were tried.
    pub nodes_tried: usize,
    /// One report per request (per subrequest for `firstAvailable`), in claim order.
    pub requests: Vec<RequestReport>,
    /// Constraints that could not be met with the available devices.
    pub constraints: Vec<ConstraintReport>,
    /// Pools skipped because incomplete or invalid.
    pub pools: Vec<PoolIssue>,
    /// Anything else worth saying (e.g. counters shared between requests).
    pub notes: Vec<String>,
}

fn plural(n: usize, one: &str, many: &str) -> String {
    if n == 1 { format!("{n} {one}") } else { format!("{n} {many}") }
}

impl fmt::Display for Wanted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Count(1) => f.write_str("1 device"),
            Self::Count(n) => write!(f, "{n} devices"),
            Self::All => f.write_str("all matching devices"),
        }
    }
}

impl fmt::Display for RequestReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request {} wants {}: ", self.request, self.wanted)?;
        write!(
            f,
            "class {} matches {} of {} visible",
            self.class,
            plural(self.class_matches, "device", "devices"),
            self.visible
        )?;
        for (i, n) in self.class_selectors.iter().enumerate() {
            if self.class_selectors.len() > 1 {
                write!(f, " (class selector #{i} leaves {n})")?;
            }
        }
        for (i, n) in self.request_selectors.iter().enumerate() {
            write!(f, "; selector #{i} matches {n}")?;
            if let Some((_, b)) = self.selector_breakdown.as_ref().filter(|(s, _)| *s == i) {
                write!(f, "{b}")?;
            }
        }
        let matching = self.matching();
        let in_use: usize = self.allocated.iter().map(|o| o.devices).sum::<usize>() + self.other_owners.devices;
        if matching > 0 && in_use > 0 {
            let mut owners: Vec<String> =
                self.allocated.iter().take(3).map(|o| format!("{} to {}", o.devices, o.owner)).collect();
            let hidden = self.allocated.len().saturating_sub(3) + self.other_owners.claims;
            if hidden > 0 {
                owners.push(format!("and {hidden} more claims"));
            }
            if in_use == matching && self.allocated.len() == 1 && self.other_owners.devices == 0 {
                let who = self.allocated.first().map(|o| o.owner.as_str()).unwrap_or_default();
                if matching == 1 {
                    write!(f, "; it is allocated to {who}")?;
                } else {
                    write!(f, "; all {matching} are allocated to {who}")?;
                }
            } else if self.allocated.len() == 1 && self.other_owners.devices == 0 {
                let who = self.allocated.first().map(|o| o.owner.as_str()).unwrap_or_default();
                write!(f, "; {in_use} allocated to {who}")?;
            } else {
                write!(f, "; {in_use} allocated ({})", owners.join(", "))?;
            }
        }
        if !self.tainted.is_empty() {
            let list: Vec<String> =
                self.tainted.iter().take(3).map(|t| format!("{} ({})", t.device, t.taint)).collect();
            let more = self.tainted.len().saturating_sub(3);
            write!(
                f,
                "; {} not tolerated: {}",
                plural(self.tainted.len(), "has a taint", "have taints"),
                list.join(", ")
            )?;
            if more > 0 {
                write!(f, " and {more} more")?;
            }
        }
        if self.capacity_exhausted > 0 {
            write!(f, "; {} without enough capacity left", plural(self.capacity_exhausted, "device", "devices"))?;
            let list: Vec<String> =
                self.capacity_shortfalls.iter().map(|s| format!("{} ({})", s.device, s.reason)).collect();
            if !list.is_empty() {
                write!(f, ": {}", list.join(", "))?;
            }
            let more = self.capacity_exhausted.saturating_sub(list.len());
            if more > 0 && !list.is_empty() {
                write!(f, " and {more} more")?;
            }
        }
        if self.counters_exhausted > 0 {
            write!(
                f,
                "; {} blocked by shared counters (overlapping partitions in use)",
                plural(self.counters_exhausted, "device", "devices")
            )?;
            let list: Vec<String> =
                self.counter_shortfalls.iter().map(|s| format!("{} ({} used up)", s.device, s.counter)).collect();
            if !list.is_empty() {
                write!(f, ": {}", list.join(", "))?;
            }
            let more = self.counters_exhausted.saturating_sub(list.len());
            if more > 0 && !list.is_empty() {
                write!(f, " and {more} more")?;
            }
        }
        if self.selector_errors > 0 {
            write!(f, "; selectors failed on {}", plural(self.selector_errors, "device", "devices"))?;
        }
        write!(f, "; {} available", self.available)
    }
}

impl fmt::Display for ConstraintReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            ConstraintKind::MatchAttribute => "matchAttribute",
            ConstraintKind::DistinctAttribute => "distinctAttribute",
        };
        let scope = if self.requests.is_empty() { "all requests".to_string() } else { self.requests.join(", ") };
        write!(f, "{kind} {} over {scope} cannot be met", self.attribute)?;
        if self.values.is_empty() {
            return f.write_str(": no available device has the attribute");
        }
        let values: Vec<String> = self.values.iter().map(|v| format!("{} on {}", v.value, v.devices)).collect();
        write!(f, "; available devices have {}", values.join(", "))
    }
}

impl fmt::Display for PoolIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.problem {
            PoolProblem::Incomplete { slices_seen, slices_expected } => write!(
                f,
                "pool {}/{} skipped: incomplete, {slices_seen} of {slices_expected} slices at its newest generation",
                self.driver, self.pool
            ),
            PoolProblem::Invalid { reason } => {
                write!(f, "pool {}/{} skipped: invalid: {reason}", self.driver, self.pool)
            }
        }
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "claim {} cannot be allocated", self.claim)?;
        match &self.node {
            Some(node) if self.nodes_tried > 1 => write!(f, " on any of {} nodes (closest: {node})", self.nodes_tried)?,
            Some(node) => write!(f, " on node {node}")?,
            None => f.write_str(": no node to place it on")?,
        }
        let failing: Vec<&RequestReport> = self.requests.iter().filter(|r| !r.satisfiable_alone()).collect();
        let shown = if failing.is_empty() { self.requests.iter().collect() } else { failing };
        for r in shown {
            write!(f, "; {r}")?;
        }
        for c in &self.constraints {
            write!(f, "; {c}")?;
        }
        for p in &self.pools {
            write!(f, "; {p}")?;
        }
        for n in &self.notes {
            write!(f, "; {n}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(allocated: Vec<OwnerCount>, other: OtherOwners) -> RequestReport {
        RequestReport {
            request: "gpu".into(),
            class: "gpu.nvidia.com".into(),
            wanted: Wanted::Count(1),
            visible: 64,
            class_matches: 64,
            class_selectors: vec![64],
            request_selectors: vec![8],
            selector_errors: 0,
            allocated,
            other_owners: other,
            tainted: vec![],
            capacity_exhausted: 0,
            capacity_shortfalls: vec![],
            counters_exhausted: 0,
            counter_shortfalls: vec![],
            available: 0,
            selector_breakdown: None,
        }
    }

    #[test]
    fn one_owner_of_everything_reads_naturally() {
        let r = report(vec![OwnerCount { owner: "default/train-0".into(), devices: 8 }], OtherOwners::default());
        assert_eq!(
            r.to_string(),
            "request gpu wants 1 device: class gpu.nvidia.com matches 64 devices of 64 visible; selector #0 matches 8; \
             all 8 are allocated to default/train-0; 0 available"
        );
        assert!(!r.satisfiable_alone());
    }

    #[test]
    fn many_owners_are_summarised() {
        let owners = (0..4).map(|i| OwnerCount { owner: format!("default/c{i}"), devices: 2 }).collect();
        let r = report(owners, OtherOwners { claims: 5, devices: 0 });
        let text = r.to_string();
        assert!(
            text.contains("8 allocated (2 to default/c0, 2 to default/c1, 2 to default/c2, and 6 more claims)"),
            "{text}"
        );
    }

    #[test]
    fn explanation_lists_failing_requests_constraints_and_pools() {
        let e = Explanation {
            claim: "default/x".into(),
            node: Some("n7".into()),
            nodes_tried: 10,
            requests: vec![report(vec![], OtherOwners::default())],
            constraints: vec![ConstraintReport {
                kind: ConstraintKind::MatchAttribute,
                attribute: "gpu.nvidia.com/nvlinkGroup".into(),
                requests: vec!["a".into(), "b".into()],
                values: vec![ValueCount { value: "0".into(), devices: 1 }],
            }],
            pools: vec![PoolIssue {
                driver: "gpu.nvidia.com".into(),
                pool: "n7".into(),
                problem: PoolProblem::Incomplete { slices_seen: 1, slices_expected: 2 },
            }],
            notes: vec![],
        };
        let text = e.to_string();
        assert!(
            text.starts_with("claim default/x cannot be allocated on any of 10 nodes (closest: n7); request gpu"),
            "{text}"
        );
        assert!(
            text.contains(
                "matchAttribute gpu.nvidia.com/nvlinkGroup over a, b cannot be met; available devices have 0 on 1"
            ),
            "{text}"
        );
        assert!(
            text.ends_with("pool gpu.nvidia.com/n7 skipped: incomplete, 1 of 2 slices at its newest generation"),
            "{text}"
        );
    }
}
