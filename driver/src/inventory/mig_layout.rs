//! Checks that a set of MIG instances can exist on one GPU, and places them.
//!
//! The rules are the hardware's: each instance sits at one of its profile's
//! placements, instances do not share memory slices, their compute slices do
//! not exceed the GPU's, and no profile exceeds its instance count.

use super::catalog::{CatalogMigProfile, GpuModel};
use super::model::Placement;

/// One instance as asked for: a profile and, optionally, where it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestedInstance {
    pub profile: String,
    pub start: Option<u32>,
}

/// An instance with its place decided.
#[derive(Debug, Clone, Copy)]
pub struct PlacedInstance<'m> {
    pub profile: &'m CatalogMigProfile,
    pub placement: Placement,
}

/// Why a layout is impossible: which instance, what is wrong, how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("instances[{instance}] ({profile}): {problem}")]
pub struct LayoutError {
    pub instance: usize,
    pub profile: String,
    pub problem: String,
    pub fix: String,
}

/// Places `requested` on a GPU of `model`, keeping the order given. Explicit
/// starts are honoured; the rest get the first placements (in the model's
/// order) that make the whole layout fit, searching exhaustively.
pub fn place<'m>(model: &'m GpuModel, requested: &[RequestedInstance]) -> Result<Vec<PlacedInstance<'m>>, LayoutError> {
    let mut profiles = Vec::with_capacity(requested.len());
    for (i, r) in requested.iter().enumerate() {
        let err = |problem: String, fix: String| LayoutError { instance: i, profile: r.profile.clone(), problem, fix };
        if model.mig_profiles.is_empty() {
            return Err(err(
                format!("{} does not support MIG", model.product_name),
                "remove the mig section for this model".to_string(),
            ));
        }
        let Some(profile) = model.mig_profile(&r.profile) else {
            return Err(err(
                format!("{} has no MIG profile {:?}", model.product_name, r.profile),
                format!("use one of: {}", model.mig_profile_names().join(", ")),
            ));
        };
        if let Some(start) = r.start
            && !profile.placements().any(|p| p.start == start)
        {
            let starts: Vec<String> = profile.placements().map(|p| p.start.to_string()).collect();
            return Err(err(
                format!("cannot start at memory slice {start}"),
                format!("use one of the starts {} or leave start out", starts.join(", ")),
            ));
        }
        let same = requested[..=i].iter().filter(|o| o.profile == r.profile).count();
        if same as u32 > profile.max_count {
            return Err(err(
                format!("at most {} instance(s) of {} fit on one GPU", profile.max_count, r.profile),
                format!("remove {} instance(s) of {}", same as u32 - profile.max_count, r.profile),
            ));
        }
        let compute: u32 =
            profiles.iter().map(|p: &&CatalogMigProfile| p.compute_slices).sum::<u32>() + profile.compute_slices;
        if compute > model.compute_slices {
            return Err(err(
                format!(
                    "needs {} compute slice(s) but only {} of {} remain",
                    profile.compute_slices,
                    model.compute_slices.saturating_sub(compute - profile.compute_slices),
                    model.compute_slices
                ),
                "use smaller profiles or fewer instances".to_string(),
            ));
        }
        profiles.push(profile);
    }
    // Find the first prefix that cannot be placed: its last instance is the
    // one to blame.
    let mut placed = Vec::new();
    for k in 1..=requested.len() {
        match search(&profiles[..k], &requested[..k]) {
            Some(p) => placed = p,
            None => {
                let r = &requested[k - 1];
                let profile = profiles[k - 1];
                let options: Vec<String> = profile
                    .placements()
                    .map(|p| match p.size {
                        1 => p.start.to_string(),
                        n => format!("{}-{}", p.start, p.start + n - 1),
                    })
                    .collect();
                return Err(LayoutError {
                    instance: k - 1,
                    profile: r.profile.clone(),
                    problem: format!(
                        "does not fit beside the instances before it: it needs memory slices {} and those are taken",
                        options.join(" or ")
                    ),
                    fix: "remove or shrink an instance, or change explicit starts".to_string(),
                });
            }
        }
    }
    Ok(placed.into_iter().zip(&profiles).map(|(placement, &profile)| PlacedInstance { profile, placement }).collect())
}

/// Backtracking over each instance's allowed placements.
fn search(profiles: &[&CatalogMigProfile], requested: &[RequestedInstance]) -> Option<Vec<Placement>> {
    fn go(
        i: usize,
        profiles: &[&CatalogMigProfile],
        requested: &[RequestedInstance],
        chosen: &mut Vec<Placement>,
    ) -> bool {
        if i == profiles.len() {
            return true;
        }
        for p in profiles[i].placements() {
            if requested[i].start.is_some_and(|s| s != p.start) {
                continue;
            }
            if chosen.iter().any(|c| c.overlaps(p)) {
                continue;
            }
            chosen.push(p);
            if go(i + 1, profiles, requested, chosen) {
                return true;
            }
            chosen.pop();
        }
        false
    }
    let mut chosen = Vec::with_capacity(profiles.len());
    go(0, profiles, requested, &mut chosen).then_some(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::catalog::Catalog;

    fn req(specs: &[&str]) -> Vec<RequestedInstance> {
        specs
            .iter()
            .map(|s| match s.split_once('@') {
                Some((p, start)) => RequestedInstance { profile: p.to_string(), start: Some(start.parse().unwrap()) },
                None => RequestedInstance { profile: s.to_string(), start: None },
            })
            .collect()
    }

    fn h100() -> &'static GpuModel {
        Catalog::embedded().unwrap().model("H100-80GB").unwrap()
    }

    fn starts(placed: &[PlacedInstance]) -> Vec<u32> {
        placed.iter().map(|p| p.placement.start).collect()
    }

    #[test]
    fn full_partitions_fit() {
        assert_eq!(starts(&place(h100(), &req(&["1g.10gb"; 7])).unwrap()), [0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(starts(&place(h100(), &req(&["3g.40gb", "3g.40gb"])).unwrap()), [0, 4]);
        assert_eq!(starts(&place(h100(), &req(&["4g.40gb", "2g.20gb", "1g.10gb"])).unwrap()), [0, 4, 6]);
    }

    #[test]
    fn search_backtracks_past_a_greedy_dead_end() {
        // Greedy would put the 1g at slice 0, leaving the 4g nowhere.
        let placed = place(h100(), &req(&["1g.10gb", "4g.40gb"])).unwrap();
        assert_eq!(starts(&placed), [4, 0]);
    }

    #[test]
    fn explicit_starts_are_kept_or_rejected() {
        assert_eq!(starts(&place(h100(), &req(&["3g.40gb@4", "1g.10gb"])).unwrap()), [4, 0]);
        let err = place(h100(), &req(&["3g.40gb@2"])).unwrap_err();
        assert!(err.problem.contains("cannot start at memory slice 2"), "{err:?}");
        assert!(err.fix.contains("0, 4"), "{err:?}");
    }

    #[test]
    fn impossible_layouts_name_the_instance_and_profile() {
        let err = place(h100(), &req(&["3g.40gb", "3g.40gb", "1g.10gb"])).unwrap_err();
        assert_eq!((err.instance, err.profile.as_str()), (2, "1g.10gb"));
        assert!(err.problem.contains("memory slices 0 or 1 or 2"), "{err:?}");

        let err = place(h100(), &req(&["4g.40gb", "2g.20gb", "2g.20gb"])).unwrap_err();
        assert_eq!(err.instance, 2);
        assert!(err.problem.contains("compute slice"), "{err:?}");

        let err = place(h100(), &req(&["4g.40gb", "4g.40gb"])).unwrap_err();
        assert_eq!(err.instance, 1);
        assert!(err.problem.contains("at most 1"), "{err:?}");

        let err = place(h100(), &req(&["3g.40gb@0", "4g.40gb"])).unwrap_err();
        assert_eq!((err.instance, err.profile.as_str()), (1, "4g.40gb"));
        assert!(err.problem.contains("memory slices 0-3"), "{err:?}");

        let err = place(h100(), &req(&["2g.10gb"])).unwrap_err();
        assert!(err.problem.contains("no MIG profile"), "{err:?}");
        assert!(err.fix.contains("1g.10gb"), "{err:?}");
    }

    #[test]
    fn memory_limits_are_enforced_by_placement() {
        // Four 1g.20gb use all eight memory slices; a fifth instance of any
        // kind has nowhere to go.
        let err = place(h100(), &req(&["1g.20gb", "1g.20gb", "1g.20gb", "1g.20gb", "1g.10gb"])).unwrap_err();
        assert_eq!(err.instance, 4);
    }
}
