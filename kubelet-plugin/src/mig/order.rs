//! Pure decisions of dynamic MIG: the order instances are made and
//! destroyed in, the conflicts refused before anything is touched, and what
//! start-up does with the instances it finds.
//!
//! **Creation order.** The scheduler picks a placement for every device
//! (the counters make a claim's placements disjoint), and each is created
//! *at* its placement, never "wherever NVML finds room": so no creation
//! depends on another for contiguous space, whatever the order. We still
//! create the largest first (then by start), the order NVIDIA documents for
//! partitioning a GPU by hand, so that a GPU whose placement rules depend on
//! what exists already (none we know of) is filled the way it was tested;
//! and we destroy in exactly the reverse order, so that every intermediate
//! layout during unprepare is one that creation also went through (NVIDIA's
//! #933: instances destroyed out of placement order left a GPU fragmented).

use std::collections::{BTreeMap, BTreeSet};

use super::control::ObservedInstance;
use crate::state::checkpoint::MigIntent;

/// Indices of `intents` in creation order: larger placements first, then
/// by GPU and start.
pub fn creation_order(intents: &[&MigIntent]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..intents.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (intents[a], intents[b]);
        (&a.gpu_uuid, std::cmp::Reverse(a.placement_size), a.placement_start).cmp(&(
            &b.gpu_uuid,
            std::cmp::Reverse(b.placement_size),
            b.placement_start,
        ))
    });
    order
}

/// Indices in destruction order: the reverse of [`creation_order`].
pub fn destruction_order(intents: &[&MigIntent]) -> Vec<usize> {
    let mut order = creation_order(intents);
    order.reverse();
    order
}

/// Two devices of one claim whose placements overlap: the allocation is
/// damaged (the scheduler's counters never allow it).
pub fn overlap_within(intents: &[&MigIntent]) -> Option<(usize, usize)> {
    for (i, a) in intents.iter().enumerate() {
        for (j, b) in intents.iter().enumerate().skip(i + 1) {
            if a.overlaps(b) {
                return Some((i, j));
            }
        }
    }
    None
}

/// What start-up does on one dynamic GPU.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuSettlement {
    /// Instances of the plugin's that no kept claim holds, to destroy
    /// (compute instances first), in destruction order.
    pub destroy: Vec<ObservedInstance>,
    /// Recorded devices (by their index in `owned`) whose instance is gone
    /// or incomplete: to make again before the claim's containers start.
    pub remake: Vec<usize>,
    /// Instances nothing proves the plugin's: never destroyed.
    pub kept: Vec<ObservedInstance>,
}

/// Start-up on one dynamic GPU: `observed` is what NVML reports, `owned`
/// the devices kept claims hold on it (with the GPU instance id they were
/// made with, when known), `is_ours` whether the ownership ledger proves
/// an instance the plugin's. A held device whose instance is missing is
/// made again; one whose instance lost its compute instance is destroyed
/// and made again if it is provably ours. An instance no claim holds is
/// destroyed only if it is provably ours; anything else is kept.
pub fn settle(
    observed: &[ObservedInstance],
    owned: &[(&MigIntent, Option<u32>)],
    is_ours: &dyn Fn(&ObservedInstance) -> bool,
) -> GpuSettlement {
    let mut settlement = GpuSettlement::default();
    let mut matched = BTreeSet::new();
    for (index, (intent, _)) in owned.iter().enumerate() {
        match observed.iter().position(|o| o.is(intent)) {
            Some(at) if !observed[at].compute_instances.is_empty() => {
                matched.insert(at);
            }
            Some(at) if is_ours(&observed[at]) => {
                // Our GPU instance without its compute instance: destroyed and made again.
                matched.insert(at);
                settlement.destroy.push(observed[at].clone());
                settlement.remake.push(index);
            }
            Some(at) => {
                matched.insert(at);
                settlement.kept.push(observed[at].clone());
            }
            None => settlement.remake.push(index),
        }
    }
    for (_, o) in observed.iter().enumerate().filter(|(i, _)| !matched.contains(i)) {
        if is_ours(o) { settlement.destroy.push(o.clone()) } else { settlement.kept.push(o.clone()) }
    }
    settlement.destroy.sort_by_key(|o| (o.placement.size, std::cmp::Reverse(o.placement.start)));
    settlement
}

/// Groups devices by GPU UUID, keeping their order.
pub fn by_gpu<'a, T>(items: impl IntoIterator<Item = (&'a str, T)>) -> BTreeMap<&'a str, Vec<T>> {
    let mut out: BTreeMap<&str, Vec<T>> = BTreeMap::new();
    for (gpu, item) in items {
        out.entry(gpu).or_default().push(item);
    }
    out
}

#[cfg(test)]
mod tests {
    use gpu_dra_driver::inventory::Placement;

    use super::*;

    fn intent(gpu: &str, profile_id: u32, start: u32, size: u32) -> MigIntent {
        MigIntent {
            gpu_uuid: gpu.into(),
            gpu_minor: 0,
            profile: format!("p{profile_id}"),
            profile_id,
            compute_profile_index: 0,
            placement_start: start,
            placement_size: size,
        }
    }

    fn observed(gi: u32, profile_id: u32, start: u32, size: u32, ci: bool) -> ObservedInstance {
        ObservedInstance {
            gpu_instance_id: gi,
            profile_id,
            placement: Placement { start, size },
            compute_instances: if ci { vec![0] } else { vec![] },
        }
    }

    #[test]
    fn largest_first_and_destroyed_in_reverse() {
        // 1g at 6, 4g at 0, 2g at 4 (A100 4g+2g+1g).
        let (a, b, c) = (intent("G", 19, 6, 1), intent("G", 5, 0, 4), intent("G", 14, 4, 2));
        let intents = [&a, &b, &c];
        assert_eq!(creation_order(&intents), [1, 2, 0]);
        assert_eq!(destruction_order(&intents), [0, 2, 1]);
        assert_eq!(overlap_within(&intents), None);
        let d = intent("G", 19, 5, 1);
        assert_eq!(overlap_within(&[&a, &b, &c, &d]), Some((2, 3)), "2g at 4 covers slice 5");
        assert_eq!(overlap_within(&[&a, &intent("H", 19, 6, 1)]), None, "other GPU");
    }

    #[test]
    fn any_order_of_disjoint_placements_can_be_created() {
        // Each instance is made at its own placement: the slices it needs
        // are free whatever was created before, as long as the set is
        // disjoint. Check every permutation on an 8-slice GPU.
        let set = [intent("G", 5, 0, 4), intent("G", 14, 4, 2), intent("G", 19, 6, 1), intent("G", 19, 7, 1)];
        let mut perm: Vec<usize> = (0..set.len()).collect();
        let mut count = 0;
        heap_permutations(&mut perm, set.len(), &mut |order| {
            let mut taken = [false; 8];
            for &i in order {
                let p = set[i].placement();
                assert!(p.slices().all(|s| !taken[s as usize]));
                p.slices().for_each(|s| taken[s as usize] = true);
            }
            count += 1;
        });
        assert_eq!(count, 24);
    }

    fn heap_permutations(items: &mut Vec<usize>, k: usize, f: &mut dyn FnMut(&[usize])) {
        if k <= 1 {
            f(items);
            return;
        }
        for i in 0..k {
            heap_permutations(items, k - 1, f);
            let j = if k.is_multiple_of(2) { i } else { 0 };
            items.swap(j, k - 1);
        }
    }

    #[test]
    fn start_up_destroys_what_no_record_owns_and_remakes_what_vanished() {
        let kept = intent("G", 5, 0, 4);
        let vanished = intent("G", 14, 4, 2);
        let half = intent("G", 19, 6, 1);
        let seen = [observed(1, 5, 0, 4, true), observed(2, 19, 6, 1, false), observed(3, 19, 7, 1, true)];
        let s = settle(&seen, &[(&kept, Some(1)), (&vanished, Some(2)), (&half, Some(4))], &|_| true);
        assert_eq!(s.remake, [1, 2]);
        let destroyed: Vec<u32> = s.destroy.iter().map(|o| o.gpu_instance_id).collect();
        assert_eq!(destroyed, [3, 2], "the orphan at 7 and the half-made one at 6, smallest and last first");
        assert_eq!(settle(&[], &[], &|_| true), GpuSettlement::default());
        // Nothing proven ours: nothing destroyed, the half-made one not remade over.
        let s = settle(&seen, &[(&kept, Some(1)), (&vanished, Some(2)), (&half, Some(4))], &|_| false);
        assert!(s.destroy.is_empty(), "{s:?}");
        assert_eq!(s.remake, [1]);
        let kept: Vec<u32> = s.kept.iter().map(|o| o.gpu_instance_id).collect();
        assert_eq!(kept, [2, 3]);
    }
}
