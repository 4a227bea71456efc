//! Partitionable devices: shared counters consumed by devices.
//!
//! As upstream's `checkAvailableCounters`: a pool's counter sets minus what
//! its allocated devices consume is what is available; a candidate adds its
//! consumption to what the current search has picked, and fits only if that
//! stays within what is available. Each allocated device consumes once,
//! however many claims share it.
//!
//! Counters are numbered per pool and device consumption is parsed once,
//! so a check is a few integer comparisons. Upstream compares every counter
//! of the pool, we compare the ones the device consumes: the same answer
//! unless recorded allocations already overdraw some other counter.

use std::collections::HashMap;

use dra_cel::quantity::Quantity;

use super::compact::CounterDraw;
use super::pools::CounterSets;

/// A device's consumption: (counter number in its pool, amount). Shared by
/// the devices that consume the same (most of a fleet's GPUs look alike).
pub(crate) type Consumption = std::sync::Arc<[(u32, Quantity)]>;

/// A pool's counters, numbered.
#[derive(Debug, Clone, Default)]
pub(crate) struct PoolCounters {
    /// (set, counter) by number.
    pub(crate) names: Vec<(String, String)>,
    pub(crate) totals: Vec<Quantity>,
    /// set → counter → number.
    index: HashMap<String, HashMap<String, u32>>,
}

impl PoolCounters {
    pub(crate) fn new(sets: &CounterSets) -> Self {
        let mut pc = PoolCounters::default();
        for (set, counters) in sets {
            for (counter, total) in counters {
                pc.index.entry(set.clone()).or_default().insert(counter.clone(), pc.names.len() as u32);
                pc.names.push((set.clone(), counter.clone()));
                pc.totals.push(*total);
            }
        }
        pc
    }

    /// The consumption of `device`; unknown counters and unparsable amounts
    /// are left out (pools with those are invalid and never allocated from).
    pub(crate) fn consumption(&self, draws: &[CounterDraw]) -> Vec<(u32, Quantity)> {
        let mut out: Vec<(u32, Quantity)> = Vec::new();
        for c in draws {
            for (name, _, amount) in c.counters.iter() {
                let (Some(&i), Some(a)) = (self.index.get(&*c.set).and_then(|s| s.get(&**name)), *amount) else {
                    continue;
                };
                match out.iter_mut().find(|(j, _)| *j == i) {
                    Some((_, sum)) => *sum = sum.saturating_add(a),
                    None => out.push((i, a)),
                }
            }
        }
        out
    }
}

/// Counters consumed, per pool.
#[derive(Debug, Clone, Default)]
pub(crate) struct CounterUse {
    pools: HashMap<u32, Vec<Quantity>>,
}

impl CounterUse {
    pub(crate) fn add(&mut self, pool: u32, consumption: &[(u32, Quantity)]) {
        let used = self.pools.entry(pool).or_default();
        for &(i, a) in consumption {
            let i = i as usize;
            if used.len() <= i {
                used.resize(i + 1, Quantity::ZERO);
            }
            if let Some(u) = used.get_mut(i) {
                *u = u.saturating_add(a);
            }
        }
    }

    pub(crate) fn sub(&mut self, pool: u32, consumption: &[(u32, Quantity)]) {
        let Some(used) = self.pools.get_mut(&pool) else { return };
        for &(i, a) in consumption {
            if let Some(u) = used.get_mut(i as usize) {
                *u = u.saturating_sub(a);
            }
        }
    }

    /// Forgets what a pool has in use (before summing it again).
    pub(crate) fn reset(&mut self, pool: u32) {
        self.pools.remove(&pool);
    }

    fn get(&self, pool: u32, i: u32) -> Quantity {
        self.pools.get(&pool).and_then(|u| u.get(i as usize)).copied().unwrap_or_default()
    }
}

/// Whether a device with `consumption` fits the pool's counters given what
/// is allocated and what this search has picked; else the first exceeded
/// (set, counter).
pub(crate) fn fits<'p>(
    counters: &'p PoolCounters,
    pool: u32,
    consumption: &[(u32, Quantity)],
    allocated: &CounterUse,
    allocating: &CounterUse,
) -> Result<(), &'p (String, String)> {
    for &(i, own) in consumption {
        let total = counters.totals.get(i as usize).copied().unwrap_or_default();
        let available = total.saturating_sub(allocated.get(pool, i));
        if allocating.get(pool, i).saturating_add(own) > available {
            return Err(counters.names.get(i as usize).unwrap_or(&EMPTY));
        }
    }
    Ok(())
}

static EMPTY: (String, String) = (String::new(), String::new());

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::test_support::*;
    use super::*;

    #[test]
    fn partitions_share_a_gpu_budget() {
        let sets = CounterSets::from([(
            "gpu-0".to_string(),
            BTreeMap::from([("memory".to_string(), Quantity::parse("80Gi").unwrap())]),
        )]);
        let pc = PoolCounters::new(&sets);
        let mut c = super::super::compact::Compactor::default();
        let half = pc.consumption(
            &c.device(&device("half").consumes("gpu-0", &[("memory", "40Gi")]), super::super::compact::Like::default())
                .consumes,
        );
        let whole = pc.consumption(
            &c.device(
                &device("whole").consumes("gpu-0", &[("memory", "80Gi")]),
                super::super::compact::Like::default(),
            )
            .consumes,
        );
        let (allocated, mut allocating) = (CounterUse::default(), CounterUse::default());
        assert!(fits(&pc, 0, &whole, &allocated, &allocating).is_ok());
        allocating.add(0, &half);
        assert!(fits(&pc, 0, &half, &allocated, &allocating).is_ok());
        assert_eq!(fits(&pc, 0, &whole, &allocated, &allocating), Err(&("gpu-0".into(), "memory".into())));
        allocating.sub(0, &half);
        let mut taken = CounterUse::default();
        taken.add(0, &whole);
        assert!(fits(&pc, 0, &half, &taken, &allocating).is_err(), "allocated devices count too");
    }
}
