//! Partitionable devices: shared counters consumed by devices.
//!
//! As upstream's `checkAvailableCounters`: a pool's counter sets minus what
//! its allocated devices consume is what is available; a candidate adds its
//! consumption to what the current search has picked, and fits only if no
//! counter of the pool then exceeds what is available. Each allocated
//! device consumes once, however many claims share it.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::resource::v1::Device;

use super::amount::Amount;
use super::pools::CounterSets;

/// Counters consumed, per pool.
#[derive(Debug, Clone, Default)]
pub(crate) struct CounterUse {
    pools: HashMap<u32, CounterSets>,
}

/// A device's consumption as (set, counter, amount).
fn consumption(device: &Device) -> impl Iterator<Item = (&str, &str, Amount)> {
    device.consumes_counters.as_deref().unwrap_or_default().iter().flat_map(|c| {
        c.counters.iter().map(move |(name, counter)| {
            // Pools whose consumption does not parse are invalid and never
            // reach here; zero keeps this total.
            (c.counter_set.as_str(), name.as_str(), Amount::parse(&counter.value).unwrap_or_default())
        })
    })
}

pub(crate) fn consumes_counters(device: &Device) -> bool {
    device.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
}

impl CounterUse {
    pub(crate) fn add(&mut self, pool: u32, device: &Device) {
        let sets = self.pools.entry(pool).or_default();
        for (set, counter, amount) in consumption(device) {
            let e = sets.entry(set.to_string()).or_insert_with(BTreeMap::new).entry(counter.to_string()).or_default();
            *e = e.saturating_add(amount);
        }
    }

    pub(crate) fn sub(&mut self, pool: u32, device: &Device) {
        let Some(sets) = self.pools.get_mut(&pool) else { return };
        for (set, counter, amount) in consumption(device) {
            if let Some(e) = sets.get_mut(set).and_then(|s| s.get_mut(counter)) {
                *e = e.saturating_sub(amount);
            }
        }
    }

    fn get(&self, pool: u32, set: &str, counter: &str) -> Amount {
        self.pools.get(&pool).and_then(|s| s.get(set)).and_then(|c| c.get(counter)).copied().unwrap_or_default()
    }
}

/// Whether `device` fits the pool's counters given what is allocated and
/// what this search has picked. The first exceeded counter is returned
/// as `Err((set, counter))` for explanations.
pub(crate) fn fits(
    sets: &CounterSets,
    pool: u32,
    device: &Device,
    allocated: &CounterUse,
    allocating: &CounterUse,
) -> Result<(), (String, String)> {
    for (set, counters) in sets {
        for (counter, total) in counters {
            let own: Amount = consumption(device)
                .filter(|(s, c, _)| *s == set && *c == counter)
                .fold(Amount::ZERO, |acc, (_, _, a)| acc.saturating_add(a));
            let available = total.saturating_sub(allocated.get(pool, set, counter));
            let wanted = allocating.get(pool, set, counter).saturating_add(own);
            if wanted > available {
                return Err((set.clone(), counter.clone()));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

    #[test]
    fn partitions_share_a_gpu_budget() {
        let sets = CounterSets::from([(
            "gpu-0".to_string(),
            BTreeMap::from([("memory".to_string(), Amount::parse(&q("80Gi")).unwrap())]),
        )]);
        let half = device("half").consumes("gpu-0", &[("memory", "40Gi")]);
        let whole = device("whole").consumes("gpu-0", &[("memory", "80Gi")]);
        let (allocated, mut allocating) = (CounterUse::default(), CounterUse::default());
        assert!(fits(&sets, 0, &whole, &allocated, &allocating).is_ok());
        allocating.add(0, &half);
        assert!(fits(&sets, 0, &half, &allocated, &allocating).is_ok());
        assert_eq!(fits(&sets, 0, &whole, &allocated, &allocating), Err(("gpu-0".into(), "memory".into())));
        allocating.sub(0, &half);
        let mut taken = CounterUse::default();
        taken.add(0, &whole);
        assert!(fits(&sets, 0, &half, &taken, &allocating).is_err(), "allocated devices count too");
    }
}
