//! Resource pools: the slices of one (driver, pool name) at the pool's
//! highest generation, checked for completeness and consistency.
//!
//! Follows upstream `GatherPools`/`buildPool` (release-1.36 incubating):
//! - only slices with the highest `pool.generation` count (older ones are
//!   being replaced by the driver);
//! - a pool with fewer slices at that generation than `resourceSliceCount`
//!   is incomplete: nothing is allocated from it and `All` requests fail;
//! - a pool is invalid when device names repeat, counter-set names repeat,
//!   or a device consumes a counter set or counter that does not exist;
//! - slices are ordered by name and pools by (driver, pool), so first-fit
//!   picks are deterministic and drivers can steer them by naming;
//! - counter sets come from every slice of the pool: counter slices (1.35+:
//!   one slice holds devices or counters, not both) and, as 1.34 lays them
//!   out, slices holding both counter sets and the devices consuming them.
//!
//! One deliberate difference: upstream checks device names only among the
//! slices a node can see; we check all slices of the pool's generation, so a
//! pool is invalid for every node or for none.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use dra_cel::quantity::Quantity;

use super::compact::{CompactSlice, CounterDraw, SliceCounterSets};
use super::explain::PoolProblem;

/// Counter sets of a pool: set name → counter name → amount.
pub(crate) type CounterSets = BTreeMap<String, BTreeMap<String, Quantity>>;

#[derive(Debug, Clone)]
pub(crate) struct Pool {
    pub(crate) driver: Arc<str>,
    pub(crate) name: Arc<str>,
    pub(crate) problem: Option<PoolProblem>,
    /// Shared with the pool's memo while the counter slices stay the same.
    pub(crate) counter_sets: Arc<CounterSets>,
    /// Some device has binding conditions: upstream tries such pools last.
    pub(crate) binding_conditions: bool,
}

/// Keeps the newest generation of every pool and builds the pools, in
/// (driver, pool) order, with their kept slices (all pools' in one list).
#[cfg(test)]
pub(crate) fn build(all: Vec<CompactSlice>) -> (Vec<CompactSlice>, Vec<Pool>) {
    let mut newest: std::collections::HashMap<(Arc<str>, Arc<str>), i64> = Default::default();
    for s in &all {
        let g = newest.entry((Arc::clone(&s.driver), Arc::clone(&s.pool))).or_insert(s.generation);
        *g = (*g).max(s.generation);
    }
    let mut grouped: BTreeMap<(Arc<str>, Arc<str>), Vec<CompactSlice>> = BTreeMap::new();
    for s in all {
        let key = (Arc::clone(&s.driver), Arc::clone(&s.pool));
        if newest.get(&key) == Some(&s.generation) {
            grouped.entry(key).or_default().push(s);
        }
    }
    let mut kept = Vec::new();
    let mut pools = Vec::new();
    for ((driver, name), mut slices) in grouped {
        slices.sort_by(|a, b| a.name.cmp(&b.name));
        let pool = check(driver, name, &slices, &mut CheckedDraws::default(), None);
        kept.extend(slices);
        pools.push(pool);
    }
    (kept, pools)
}

/// What checking a pool found that its next check can reuse: the counter
/// sets built from its counter slices (rebuilt only when those slices
/// change), and the counter draws already found valid against them. Draws
/// are interned, so a slice republished with the same layout is checked in
/// a pointer lookup per device rather than a lookup per counter.
#[derive(Debug, Default)]
pub(crate) struct CheckedDraws {
    /// The counter slices' parsed sets `sets` was built from (held, so
    /// their addresses identify them).
    built_from: Vec<SliceCounterSets>,
    sets: Arc<CounterSets>,
    good: Vec<Arc<[CounterDraw]>>,
    addresses: HashSet<usize, foldhash::fast::RandomState>,
    /// Scratch set for the duplicate-name check, kept for its allocation.
    names: HashSet<usize, foldhash::fast::RandomState>,
}

impl CheckedDraws {
    fn is_good(&self, draws: &Arc<[CounterDraw]>) -> bool {
        self.addresses.contains(&(Arc::as_ptr(draws).cast::<u8>() as usize))
    }

    fn remember(&mut self, draws: &Arc<[CounterDraw]>) {
        if self.addresses.insert(Arc::as_ptr(draws).cast::<u8>() as usize) {
            self.good.push(Arc::clone(draws));
        }
    }
}

/// One pool from all of its slices (any generation): the pool, its kept
/// slices (newest generation, by name) and the others.
///
/// `only_changed`: the caller knows the pool was valid when last checked
/// and that of its kept slices only this one changed since, with the same
/// device names in the same order; then only that slice's devices are
/// checked again (a slice update costs its own devices, not the pool's).
pub(crate) fn assemble(
    driver: Arc<str>,
    name: Arc<str>,
    all: Vec<CompactSlice>,
    checked: &mut CheckedDraws,
    only_changed: Option<&str>,
) -> (Pool, Vec<CompactSlice>, Vec<CompactSlice>) {
    let newest = all.iter().map(|s| s.generation).max().unwrap_or_default();
    let (mut kept, other): (Vec<CompactSlice>, Vec<CompactSlice>) =
        all.into_iter().partition(|s| s.generation == newest);
    kept.sort_by(|a, b| a.name.cmp(&b.name));
    let pool = check(driver, name, &kept, checked, only_changed);
    (pool, kept, other)
}

/// The pool made of `slices` (one generation, sorted by name).
fn check(
    driver: Arc<str>,
    name: Arc<str>,
    slices: &[CompactSlice],
    checked: &mut CheckedDraws,
    only_changed: Option<&str>,
) -> Pool {
    let expected = slices.first().map_or(0, |s| s.resource_slice_count);
    let mut problem = None;
    if i64::try_from(slices.len()).ok() != Some(expected) {
        problem = Some(PoolProblem::Incomplete { slices_seen: slices.len(), slices_expected: expected });
    }
    let counter_sets = match counter_sets(slices, checked) {
        Ok(c) => c,
        Err(reason) => {
            problem.get_or_insert(PoolProblem::Invalid { reason });
            Arc::default()
        }
    };
    if problem.is_none() {
        let result = match only_changed {
            // The other slices' devices passed against these very sets, and
            // no name changed: the changed slice's draws are all to check.
            Some(changed) if Arc::ptr_eq(&checked.sets, &counter_sets) => {
                check_each_device(slices.iter().filter(|s| &*s.name == changed), &counter_sets, checked, None)
            }
            _ => check_devices(slices, &counter_sets, checked),
        };
        if let Err(reason) = result {
            problem = Some(PoolProblem::Invalid { reason });
        }
    }
    let binding_conditions = slices.iter().any(|s| s.binding_conditions);
    Pool { driver, name, problem, counter_sets, binding_conditions }
}

/// The pool's counter sets; the memo's when built from the same slices.
fn counter_sets(slices: &[CompactSlice], checked: &CheckedDraws) -> Result<Arc<CounterSets>, String> {
    let from: Vec<&SliceCounterSets> = slices.iter().filter(|s| s.has_counters()).map(|s| &s.counter_sets).collect();
    if from.len() == checked.built_from.len() && from.iter().zip(&checked.built_from).all(|(a, b)| Arc::ptr_eq(a, b)) {
        return Ok(Arc::clone(&checked.sets));
    }
    let mut sets = CounterSets::new();
    for s in slices {
        for (name, counters) in s.counter_sets.iter() {
            if sets.contains_key(name) {
                return Err(format!("duplicate counter set name {name}"));
            }
            sets.insert(name.clone(), counters.clone().map_err(|e| e.to_string())?);
        }
    }
    Ok(Arc::new(sets))
}

fn check_devices(slices: &[CompactSlice], sets: &Arc<CounterSets>, checked: &mut CheckedDraws) -> Result<(), String> {
    if !Arc::ptr_eq(&checked.sets, sets) {
        let built_from = slices.iter().filter(|s| s.has_counters()).map(|s| Arc::clone(&s.counter_sets)).collect();
        if *checked.sets == **sets {
            // Equal sets from new slices: the draws found valid stay valid.
            checked.sets = Arc::clone(sets);
            checked.built_from = built_from;
        } else {
            *checked = CheckedDraws { built_from, sets: Arc::clone(sets), ..Default::default() };
        }
    }
    // Device names are interned: equal names, one address.
    let mut names = std::mem::take(&mut checked.names);
    names.clear();
    let result = check_each_device(slices.iter(), sets, checked, Some(&mut names));
    checked.names = names;
    result
}

/// Checks the devices' draws against `sets` and, with `names`, that no
/// device name repeats.
fn check_each_device<'a>(
    slices: impl Iterator<Item = &'a CompactSlice>,
    sets: &CounterSets,
    checked: &mut CheckedDraws,
    mut names: Option<&mut HashSet<usize, foldhash::fast::RandomState>>,
) -> Result<(), String> {
    for s in slices {
        if s.is_counter_slice() {
            continue;
        }
        for d in &s.devices {
            if let Some(names) = names.as_deref_mut()
                && !names.insert(Arc::as_ptr(&d.name).cast::<u8>() as usize)
            {
                return Err(format!("duplicate device name {}", d.name));
            }
            if d.consumes.is_empty() || checked.is_good(&d.consumes) {
                continue;
            }
            for draw in d.consumes.iter() {
                let Some(set) = sets.get(&*draw.set) else {
                    return Err(format!("device {}: counter set {} not found", d.name, draw.set));
                };
                for (counter, value, amount) in draw.counters.iter() {
                    if !set.contains_key(&**counter) {
                        return Err(format!(
                            "device {}: counter {counter} not found in counter set {}",
                            d.name, draw.set
                        ));
                    }
                    if amount.is_none() {
                        return Err(format!("device {}: counter {counter}: invalid quantity {value:?}", d.name));
                    }
                }
            }
            checked.remember(&d.consumes);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::compact::Compactor;
    use super::super::test_support::*;
    use super::*;

    fn build_k8s(all: &[k8s_openapi::api::resource::v1::ResourceSlice]) -> (Vec<CompactSlice>, Vec<Pool>) {
        let mut c = Compactor::default();
        build(all.iter().map(|s| c.slice(s, None)).collect())
    }

    #[test]
    fn only_the_newest_generation_is_kept() {
        let old = slice("s-old", "node-1", "pool-1", 1, 1, vec![device("gpu-0"), device("gpu-9")]);
        let new = slice("s-new", "node-1", "pool-1", 2, 1, vec![device("gpu-0")]);
        let (kept, pools) = build_k8s(&[old, new]);
        assert_eq!(pools.len(), 1);
        assert_eq!(kept.len(), 1);
        assert_eq!(&*kept[0].name, "s-new");
        assert!(pools[0].problem.is_none());
    }

    #[test]
    fn missing_slices_make_a_pool_incomplete() {
        let s = slice("s", "node-1", "pool-1", 3, 2, vec![device("gpu-0")]);
        let (_, pools) = build_k8s(&[s]);
        assert_eq!(pools[0].problem, Some(PoolProblem::Incomplete { slices_seen: 1, slices_expected: 2 }));
    }

    #[test]
    fn duplicate_devices_and_unknown_counters_make_a_pool_invalid() {
        let a = slice("a", "node-1", "pool-1", 1, 2, vec![device("gpu-0")]);
        let b = slice("b", "node-1", "pool-1", 1, 2, vec![device("gpu-0")]);
        let (_, pools) = build_k8s(&[a, b]);
        assert!(
            matches!(&pools[0].problem, Some(PoolProblem::Invalid { reason }) if reason.contains("duplicate device name gpu-0"))
        );

        let mut d = device("mig-0");
        d.consumes_counters = Some(vec![consumes("gpu-0-set", &[("memory", "10Gi")])]);
        let c = slice("c", "node-1", "pool-2", 1, 1, vec![d]);
        let (_, pools) = build_k8s(&[c]);
        assert!(
            matches!(&pools[0].problem, Some(PoolProblem::Invalid { reason }) if reason.contains("counter set gpu-0-set not found"))
        );
    }

    #[test]
    fn pools_and_slices_are_sorted() {
        let s1 = slice("z", "node-1", "pool-b", 1, 1, vec![]);
        let s2 = slice("y", "node-1", "pool-a", 1, 2, vec![]);
        let s3 = slice("x", "node-1", "pool-a", 1, 2, vec![]);
        let (kept, pools) = build_k8s(&[s1, s2, s3]);
        assert_eq!(pools.iter().map(|p| &*p.name).collect::<Vec<_>>(), ["pool-a", "pool-b"]);
        let names: Vec<_> = kept.iter().map(|s| s.name.to_string()).collect();
        assert_eq!(names, ["x", "y", "z"], "pool by pool, slices by name");
    }
}
