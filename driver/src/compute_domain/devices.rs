//! What a node with a fabric clique publishes under the
//! `compute-domain.nvidia.com` driver: NVIDIA's `channel-0` (type
//! `channel`, id 0) and `daemon-0` (type `daemon`, id 0), in a pool named
//! after the node; ours also carry the node's `cliqueID`, so that the
//! controller reads a node's clique from the same slice.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourcePool, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::constants::DRIVER_NAME;
use crate::inventory::Inventory;

pub const CHANNEL_DEVICE: &str = "channel-0";
pub const DAEMON_DEVICE: &str = "daemon-0";
pub const CLIQUE_ATTRIBUTE: &str = crate::slices::attributes::name::CLIQUE_ID;
/// The channel's binding condition: the kube-scheduler (with
/// `DRADeviceBindingConditions`, beta and on since 1.36) binds a pod whose
/// claim got a channel only once the channel's entry in the claim's
/// `status.devices` says `Ready` (its node's IMEX daemon answers READY),
/// which the node agent writes before the pod is bound.
pub const BINDING_CONDITION: &str = "Ready";
/// The channel's binding failure condition: the node agent sets it when
/// the node cannot serve the domain (it never joined, or its daemon did
/// not become ready in time), and the scheduler then gives the allocation
/// up and schedules the pod again.
pub const BINDING_FAILURE_CONDITION: &str = "ImexDaemonFailed";

/// GPUs of one node that report different fabric cliques: the node is in
/// one NVLink partition or none, so it publishes no channel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GPUs of this node are in two fabric cliques ({first} and {second})")]
pub struct TwoCliques {
    pub first: String,
    pub second: String,
}

/// The node's clique when every GPU that has one agrees; `Err` naming the
/// two when GPUs disagree (a node is in one NVLink partition or none).
pub fn node_clique(inventory: &Inventory) -> Result<Option<String>, TwoCliques> {
    let mut found: Option<String> = None;
    for gpu in &inventory.gpus {
        let Some(clique) = gpu.clique else { continue };
        let clique = clique.to_string();
        match &found {
            Some(first) if *first != clique => {
                return Err(TwoCliques { first: first.clone(), second: clique });
            }
            Some(_) => {}
            None => found = Some(clique),
        }
    }
    Ok(found)
}

fn device(name: &str, kind: &str, clique: &str) -> Device {
    let attributes = BTreeMap::from([
        ("type".to_owned(), DeviceAttribute { string: Some(kind.to_owned()), ..Default::default() }),
        ("id".to_owned(), DeviceAttribute { int: Some(0), ..Default::default() }),
        (CLIQUE_ATTRIBUTE.to_owned(), DeviceAttribute { string: Some(clique.to_owned()), ..Default::default() }),
    ]);
    Device { name: name.to_owned(), attributes: Some(attributes), ..Default::default() }
}

/// The node's one slice: both devices when it has a clique, none
/// otherwise (the pool exists and says "nothing here").
pub fn slice(node: &str, clique: Option<&str>, generation: i64) -> ResourceSlice {
    let devices = clique
        .map(|c| {
            let channel = Device {
                binding_conditions: Some(vec![BINDING_CONDITION.to_owned()]),
                binding_failure_conditions: Some(vec![BINDING_FAILURE_CONDITION.to_owned()]),
                ..device(CHANNEL_DEVICE, "channel", c)
            };
            vec![channel, device(DAEMON_DEVICE, "daemon", c)]
        })
        .unwrap_or_default();
    ResourceSlice {
        metadata: ObjectMeta { name: Some(format!("{node}-{DRIVER_NAME}-0")), ..Default::default() },
        spec: ResourceSliceSpec {
            driver: DRIVER_NAME.to_owned(),
            node_name: Some(node.to_owned()),
            pool: ResourcePool { name: node.to_owned(), generation, resource_slice_count: 1 },
            devices: Some(devices),
            ..Default::default()
        },
    }
}

/// The clique a published compute-domain slice states for its node.
pub fn slice_clique(slice: &ResourceSlice) -> Option<&str> {
    slice.spec.devices.as_deref()?.iter().find_map(|d| d.attributes.as_ref()?.get(CLIQUE_ATTRIBUTE)?.string.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clique_node_publishes_nvidias_two_devices() {
        let s = slice("n1", Some("u.1"), 3);
        let devices = s.spec.devices.as_ref().unwrap();
        let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["channel-0", "daemon-0"]);
        let attrs = devices[0].attributes.as_ref().unwrap();
        assert_eq!(attrs["type"].string.as_deref(), Some("channel"));
        assert_eq!(attrs["id"].int, Some(0));
        // The channel binds once its node's daemon is ready; a daemon
        // device (held by no workload) binds at once.
        assert_eq!(devices[0].binding_conditions.as_deref(), Some(&["Ready".to_owned()][..]));
        assert_eq!(devices[0].binding_failure_conditions.as_deref(), Some(&["ImexDaemonFailed".to_owned()][..]));
        assert_eq!(devices[1].binding_conditions, None);
        assert_eq!(slice_clique(&s), Some("u.1"));
        assert_eq!(s.spec.pool.name, "n1");
        assert!(crate::slices::validation::validate_slice(&s).is_empty());
        assert!(slice("n1", None, 1).spec.devices.unwrap().is_empty());
    }
}
