//! Binding conditions of ComputeDomain channels, the pure part shared by
//! the node agent (which readies a channel's IMEX daemon before the pod is
//! bound and says so) and the controller (which fails the binding of a
//! channel on a node that cannot join its domain). The conditions are
//! [`super::devices::BINDING_CONDITION`] and
//! [`super::devices::BINDING_FAILURE_CONDITION`]; the kube-scheduler waits
//! for the first, or gives the allocation up on the second
//! (`isClaimReadyForBinding` in
//! `pkg/scheduler/framework/plugins/dynamicresources`).

use k8s_openapi::api::resource::v1::ResourceClaim;

use super::api::{self, ComputeDomain};
use super::constants::DRIVER_NAME;
use super::devices::{BINDING_CONDITION, BINDING_FAILURE_CONDITION, CHANNEL_DEVICE};
use crate::claim_status::{EntryKey, Readiness, allocation_results, entry_mut, set_condition};

/// The failure condition's reason.
pub const FAILURE_REASON: &str = "ImexDaemonUnavailable";

/// Whether the scheduler holds `claim`'s binding for this node's channel:
/// allocated here with our binding condition, and neither it nor the
/// failure condition true yet in the claim's `status.devices`.
pub fn waits_for_binding(claim: &ResourceClaim, node: &str) -> bool {
    let Some(status) = claim.status.as_ref() else { return false };
    let here = allocation_results(claim).any(|r| {
        r.driver == DRIVER_NAME
            && r.pool == node
            && r.device == CHANNEL_DEVICE
            && r.binding_conditions.iter().flatten().any(|c| c == BINDING_CONDITION)
    });
    let decided = status
        .devices
        .iter()
        .flatten()
        .filter(|d| d.driver == DRIVER_NAME && d.pool == node && d.device == CHANNEL_DEVICE)
        .flat_map(|d| d.conditions.iter().flatten())
        .any(|c| c.status == "True" && (c.type_ == BINDING_CONDITION || c.type_ == BINDING_FAILURE_CONDITION));
    here && !decided
}

/// Whether `claim` (still) has this node's channel allocated.
pub fn allocated_here(claim: &ResourceClaim, node: &str) -> bool {
    allocation_results(claim).any(|r| r.driver == DRIVER_NAME && r.pool == node && r.device == CHANNEL_DEVICE)
}

/// Whether `domain`'s status lists `node` as not ready: a channel of the
/// domain is allocated there (the controller adds the node) and one of the
/// node's channels has no `Ready` condition yet, or a false one (the
/// controller's node status is ready only when all are). Only then may a
/// channel there wait for binding, so a node agent lists a domain's claims
/// only then, not every pass of a domain that runs.
pub fn lists_node_not_ready(domain: &ComputeDomain, node: &str) -> bool {
    domain.status.as_ref().is_some_and(|s| s.nodes.iter().any(|n| n.name == node && n.status != api::Readiness::Ready))
}

/// The claim's `status.devices` with the binding failure condition of
/// `node`'s channel true, saying `reason` (escaped and bounded); `None`
/// when it already says so.
pub fn with_binding_failure(claim: &ResourceClaim, node: &str, reason: &str) -> Option<ResourceClaim> {
    let failed = Readiness { ready: true, reason: FAILURE_REASON, message: reason.to_owned() };
    let mut claim = claim.clone();
    let generation = claim.metadata.generation;
    let devices = claim.status.get_or_insert_default().devices.get_or_insert_default();
    let key = EntryKey { driver: DRIVER_NAME, pool: node, device: CHANNEL_DEVICE, share_id: None };
    set_condition(entry_mut(devices, &key), BINDING_FAILURE_CONDITION, &failed, generation).then_some(claim)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, DeviceRequestAllocationResult};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use serde_json::json;

    use super::*;

    fn claim(conditions: &[(&str, &str)], pool: &str, binding: bool) -> ResourceClaim {
        let mut result: DeviceRequestAllocationResult = serde_json::from_value(json!({
            "request": "channel", "driver": DRIVER_NAME, "pool": pool, "device": CHANNEL_DEVICE,
        }))
        .unwrap();
        if binding {
            result.binding_conditions = Some(vec![BINDING_CONDITION.into()]);
            result.binding_failure_conditions = Some(vec![BINDING_FAILURE_CONDITION.into()]);
        }
        let mut claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "default", "uid": "u"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": []}}},
        }))
        .unwrap();
        let status = claim.status.as_mut().unwrap();
        status.allocation.as_mut().unwrap().devices.as_mut().unwrap().results = Some(vec![result]);
        if !conditions.is_empty() {
            status.devices = Some(vec![AllocatedDeviceStatus {
                driver: DRIVER_NAME.into(),
                pool: pool.into(),
                device: CHANNEL_DEVICE.into(),
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| Condition {
                            type_: (*t).into(),
                            status: (*s).into(),
                            reason: "R".into(),
                            message: String::new(),
                            last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
                            observed_generation: None,
                        })
                        .collect(),
                ),
                ..AllocatedDeviceStatus::default()
            }]);
        }
        claim
    }

    #[test]
    fn a_failure_is_one_true_condition_with_the_reason_escaped() {
        let failed = with_binding_failure(&claim(&[("Ready", "False")], "n1", true), "n1", "no \u{1b}[2J").unwrap();
        let conditions = failed.status.as_ref().unwrap().devices.as_ref().unwrap()[0].conditions.clone().unwrap();
        let types: Vec<(&str, &str)> = conditions.iter().map(|c| (c.type_.as_str(), c.status.as_str())).collect();
        assert_eq!(types, [("Ready", "False"), ("ImexDaemonFailed", "True")]);
        assert!(!conditions[1].message.contains('\u{1b}'), "{:?}", conditions[1].message);
        assert!(!waits_for_binding(&failed, "n1"), "decided");
        assert!(with_binding_failure(&failed, "n1", "no \u{1b}[2J").is_none());
    }

    #[test]
    fn a_domain_is_read_for_a_node_only_while_the_node_is_not_ready_in_it() {
        use super::super::api::{ComputeDomainNode, ComputeDomainSpec, ComputeDomainStatus, Readiness};
        let mut domain = ComputeDomain::new("team", "job", ComputeDomainSpec::with_template(0, "job-channel"));
        assert!(!lists_node_not_ready(&domain, "n1"), "no status yet");
        let node = |status| ComputeDomainNode {
            name: "n1".into(),
            ip_address: "10.0.0.1".into(),
            clique_id: "u.1".into(),
            index: 0,
            status,
        };
        domain.status =
            Some(ComputeDomainStatus { status: Readiness::NotReady, nodes: vec![node(Readiness::NotReady)] });
        assert!(lists_node_not_ready(&domain, "n1"));
        assert!(!lists_node_not_ready(&domain, "n2"));
        domain.status = Some(ComputeDomainStatus { status: Readiness::Ready, nodes: vec![node(Readiness::Ready)] });
        assert!(!lists_node_not_ready(&domain, "n1"), "every channel there is ready: nothing waits");
    }

    #[test]
    fn a_channel_waits_until_ready_or_failed_is_true() {
        assert!(waits_for_binding(&claim(&[], "n1", true), "n1"));
        assert!(waits_for_binding(&claim(&[("Ready", "False")], "n1", true), "n1"), "not ready yet");
        assert!(!waits_for_binding(&claim(&[("Ready", "True")], "n1", true), "n1"));
        assert!(!waits_for_binding(&claim(&[("ImexDaemonFailed", "True")], "n1", true), "n1"));
        assert!(!waits_for_binding(&claim(&[], "n2", true), "n1"), "another node's channel");
        assert!(!waits_for_binding(&claim(&[], "n1", false), "n1"), "allocated without binding conditions");
        assert!(!waits_for_binding(&ResourceClaim::default(), "n1"), "not allocated");
        assert!(allocated_here(&claim(&[], "n1", false), "n1"));
        assert!(!allocated_here(&claim(&[], "n2", true), "n1"));
    }
}
