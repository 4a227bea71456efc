//! A solution written as `AllocationResult`s, as upstream's `Allocate`
//! does after the search:
//!
//! - one result per picked device, in pick order, named `req` or
//!   `req/sub`; `adminAccess: true` only when requested; the request's
//!   tolerations copied; a fresh `shareID` and the `consumedCapacity` (when
//!   non-empty) for shareable devices; binding conditions copied;
//! - config: class configs first, once per class in request order, listing
//!   every request (or chosen subrequest) that used the class; then claim
//!   configs in claim order that apply (no `requests`, or naming a request
//!   or the chosen `req/sub`). Upstream appends a claim config once per
//!   matching request; we append it once, since the entry already lists
//!   its requests;
//! - `nodeSelector` from the picked devices (see `node_selection`).

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult, DeviceRequestAllocationResult,
};

use super::error::FatalError;
use super::index::Fleet;
use super::node_selection::allocation_node_selector;
use super::request::ClaimPlan;
use super::search::Solution;
use super::share_id::ShareIdSource;

pub(crate) fn build(
    fleet: &Fleet,
    plans: &[ClaimPlan<'_>],
    solution: &Solution,
    node: &str,
    share_ids: &mut dyn ShareIdSource,
) -> Result<Vec<AllocationResult>, FatalError> {
    let mut out = Vec::with_capacity(plans.len());
    for (c, plan) in plans.iter().enumerate() {
        let picks = solution.picks.get(c).map(Vec::as_slice).unwrap_or_default();
        let chosen = solution.chosen.get(c).map(Vec::as_slice).unwrap_or_default();
        let mut results = Vec::with_capacity(picks.len());
        for pick in picks {
            let (Some(request), Some(dev), Some(pool)) =
                (plan.requests.get(pick.request), fleet.device(pick.device), fleet.pool_of(pick.device))
            else {
                continue;
            };
            let Some(alt) = request.alternatives.get(pick.alt) else { continue };
            let shareable = dev.allow_multiple_allocations;
            let consumed = pick
                .take
                .as_ref()
                .filter(|t| !t.is_empty())
                .map(|t| t.iter().map(|(k, (_, q))| (k.clone(), q.clone())).collect());
            results.push(DeviceRequestAllocationResult {
                request: request.result_name(pick.alt),
                driver: pool.driver.to_string(),
                pool: pool.name.to_string(),
                device: dev.name.to_string(),
                admin_access: alt.admin.then_some(true),
                tolerations: (!alt.tolerations.is_empty()).then(|| alt.tolerations.to_vec()),
                share_id: shareable.then(|| share_ids.next_share_id()),
                consumed_capacity: if shareable { consumed } else { None },
                binding_conditions: dev.extra.as_deref().and_then(|e| e.binding_conditions.clone()),
                binding_failure_conditions: dev.extra.as_deref().and_then(|e| e.binding_failure_conditions.clone()),
                ..Default::default()
            });
        }
        let config = configs(plan, chosen);
        let reaches = picks.iter().map(|p| {
            (
                fleet.reach(p.device),
                fleet.device(p.device).and_then(|d| d.extra.as_deref()).and_then(|e| e.binds_to_node) == Some(true),
            )
        });
        let node_selector = allocation_node_selector(reaches, node).map_err(|e| FatalError::InvalidSlice {
            message: format!("create nodeSelector for claim {}: {e}", plan.name),
        })?;
        out.push(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(results),
                config: (!config.is_empty()).then_some(config),
            }),
            node_selector,
            allocation_timestamp: None,
        });
    }
    Ok(out)
}

fn configs(plan: &ClaimPlan<'_>, chosen: &[usize]) -> Vec<DeviceAllocationConfiguration> {
    let mut out: Vec<DeviceAllocationConfiguration> = Vec::new();
    // class name → range of its entries in `out`
    let mut class_ranges: Vec<(&str, std::ops::Range<usize>)> = Vec::new();
    for (r, request) in plan.requests.iter().enumerate() {
        let a = chosen.get(r).copied().unwrap_or(0);
        let Some(alt) = request.alternatives.get(a) else { continue };
        let class_name = alt.class.metadata.name.as_deref().unwrap_or_default();
        let name = request.result_name(a);
        if let Some((_, range)) = class_ranges.iter().find(|(n, _)| *n == class_name) {
            for entry in out.get_mut(range.clone()).into_iter().flatten() {
                entry.requests.get_or_insert_with(Vec::new).push(name.clone());
            }
            continue;
        }
        let start = out.len();
        for c in alt.class.spec.as_ref().and_then(|s| s.config.as_deref()).unwrap_or_default() {
            out.push(DeviceAllocationConfiguration {
                source: "FromClass".into(),
                requests: Some(vec![name.clone()]),
                opaque: c.opaque.clone(),
            });
        }
        class_ranges.push((class_name, start..out.len()));
    }
    let claim_configs =
        plan.claim.spec.as_ref().and_then(|s| s.devices.as_ref()).and_then(|d| d.config.as_deref()).unwrap_or_default();
    for c in claim_configs {
        let listed = c.requests.as_deref().unwrap_or_default();
        let applies = listed.is_empty()
            || plan.requests.iter().enumerate().any(|(r, request)| {
                listed.iter().any(|l| l == request.name)
                    || (request.first_available
                        && listed.iter().any(|l| *l == request.result_name(chosen.get(r).copied().unwrap_or(0))))
            });
        if applies {
            out.push(DeviceAllocationConfiguration {
                source: "FromClaim".into(),
                requests: c.requests.clone(),
                opaque: c.opaque.clone(),
            });
        }
    }
    out
}
