//! Extended resources served by DRA (`DRAExtendedResource`, on by default
//! from Kubernetes 1.36): a pod asking for `nvidia.com/gpu: 1` in a
//! container's `resources` gets its devices through a DeviceClass whose
//! `spec.extendedResourceName` is `nvidia.com/gpu`, or through the implicit
//! name `deviceclass.resource.kubernetes.io/<class>` every class has.
//!
//! As the kube-scheduler does it (`pkg/scheduler/framework/plugins/
//! dynamicresources/extendeddynamicresources.go`, `createRequestsAndMappings`
//! and `createResourceRequestAndMappings`; the mapping in `extended/
//! cache.go`): one special claim per pod, owned by the pod and annotated
//! `resource.kubernetes.io/extended-resource-claim: "true"`, named from
//! `<pod>-extended-resources-` (here without the random suffix); for each
//! extended resource (in name order) served by a class, one ExactCount
//! request per container that asks for a whole number of it, named
//! `container-<i>-request-<j>` (`i`: the container's index in init
//! containers then containers; `j`: the resource's index among the
//! container's sorted requests), with the class and the quantity as count.
//! An init container that is not a sidecar reuses the requests of the
//! containers after it when they suffice, asks only for what they lack
//! otherwise, and only the largest such request is kept. Requests are
//! sorted by name. The claim is allocated with the pod's other claims.
//!
//! Not modelled: a node whose device plugin advertises the resource
//! (`status.allocatable`) gets no claim for it in Kubernetes; `simulate`
//! serves every mapped resource through DRA.

use std::collections::{BTreeMap, BTreeSet};

use dra_cel::quantity::Quantity;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceClass, DeviceRequest, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// The annotation on the scheduler's special claim.
pub const CLAIM_ANNOTATION: &str = "resource.kubernetes.io/extended-resource-claim";
/// Every class's implicit extended resource name is this and its name.
pub const IMPLICIT_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// Extended resource name -> class serving it: each class's implicit
/// name, and its `extendedResourceName`; a later class wins a name, as
/// the scheduler's cache keeps the last class it saw.
#[derive(Debug, Default)]
pub struct Classes {
    by_resource: BTreeMap<String, String>,
}

impl Classes {
    pub fn new<'a>(classes: impl IntoIterator<Item = &'a DeviceClass>) -> Self {
        let mut by_resource = BTreeMap::new();
        for class in classes {
            let Some(name) = class.metadata.name.clone() else { continue };
            if let Some(resource) = class.spec.as_ref().and_then(|s| s.extended_resource_name.clone()) {
                by_resource.insert(resource, name.clone());
            }
            by_resource.insert(format!("{IMPLICIT_PREFIX}{name}"), name);
        }
        Classes { by_resource }
    }

    fn class_for(&self, resource: &str) -> Option<&str> {
        self.by_resource.get(resource).map(String::as_str)
    }
}

/// A pod's extended resources: the special claim if a class serves any,
/// and the names of those no class serves (left to device plugins).
#[derive(Debug, Default)]
pub struct PodExtended {
    pub claim: Option<ResourceClaim>,
    pub unserved: Vec<String>,
}

/// Whether `name` can be an extended resource (`IsDRAExtendedResourceName`:
/// a domain-prefixed name outside `kubernetes.io`, or an implicit name).
fn is_extended(name: &str) -> bool {
    name.starts_with(IMPLICIT_PREFIX)
        || (name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests."))
}

/// A container's requests after the apiserver's defaulting: a resource
/// with only a limit requests its limit. Name -> quantity text, sorted.
fn requests(container: &Container) -> BTreeMap<String, String> {
    let resources = container.resources.as_ref();
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for (name, q) in resources.and_then(|r| r.limits.as_ref()).into_iter().flatten() {
        out.insert(name.clone(), q.0.clone());
    }
    for (name, q) in resources.and_then(|r| r.requests.as_ref()).into_iter().flatten() {
        out.insert(name.clone(), q.0.clone());
    }
    out
}

/// A whole, positive number of `text` (`AsInt64`); anything else asks for
/// nothing, as for the scheduler.
fn whole(text: &str) -> Option<i64> {
    let nanos = Quantity::parse(text).ok()?.nanos();
    if nanos <= 0 || nanos % 1_000_000_000 != 0 {
        return None;
    }
    i64::try_from(nanos / 1_000_000_000).ok()
}

/// The request container `index` makes for `resource`, given the requests
/// of later long-lived containers it may reuse (an init container's).
fn container_request(
    index: usize,
    container: &Container,
    resource: &str,
    class: &str,
    reusable: &[Option<DeviceRequest>],
) -> Option<DeviceRequest> {
    let all = requests(container);
    let wanted = whole(all.get(resource)?)?;
    let reused: i64 = reusable.iter().flatten().filter_map(|r| r.exactly.as_ref()?.count).sum();
    if reused >= wanted {
        return None;
    }
    let position = all.keys().position(|k| k == resource).unwrap_or(0);
    Some(DeviceRequest {
        name: format!("container-{index}-request-{position}"),
        exactly: Some(ExactDeviceRequest {
            device_class_name: class.to_string(),
            allocation_mode: Some("ExactCount".to_string()),
            count: Some(wanted - reused),
            ..Default::default()
        }),
        first_available: None,
    })
}

/// The special claim for `pod` (named `<pod>-extended-resources`, in the
/// pod's namespace, owned by the pod whose UID is `pod_uid`).
pub fn for_pod(pod: &Pod, pod_uid: &str, classes: &Classes) -> PodExtended {
    let Some(spec) = pod.spec.as_ref() else { return PodExtended::default() };
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let containers: Vec<&Container> = init.iter().chain(&spec.containers).collect();
    let short_lived =
        |i: usize| i < init.len() && containers.get(i).is_none_or(|c| c.restart_policy.as_deref() != Some("Always"));
    let mut resources: BTreeSet<String> = BTreeSet::new();
    for c in &containers {
        for (name, q) in requests(c) {
            if is_extended(&name) && Quantity::parse(&q).is_ok_and(|q| q.nanos() != 0) {
                resources.insert(name);
            }
        }
    }
    let mut out = PodExtended::default();
    let mut device_requests = Vec::new();
    for resource in &resources {
        let Some(class) = classes.class_for(resource) else {
            out.unserved.push(resource.clone());
            continue;
        };
        let mut long_lived: Vec<Option<DeviceRequest>> = vec![None; containers.len()];
        for (i, c) in containers.iter().enumerate().filter(|(i, _)| !short_lived(*i)) {
            long_lived[i] = container_request(i, c, resource, class, &[]);
        }
        let mut largest: Option<DeviceRequest> = None;
        for (i, c) in containers.iter().enumerate().filter(|(i, _)| short_lived(*i)) {
            let reusable = long_lived.get(i..).unwrap_or_default();
            if let Some(r) = container_request(i, c, resource, class, reusable) {
                let count = |r: &DeviceRequest| r.exactly.as_ref().and_then(|e| e.count).unwrap_or(0);
                if largest.as_ref().is_none_or(|l| count(l) < count(&r)) {
                    largest = Some(r);
                }
            }
        }
        device_requests.extend(largest);
        device_requests.extend(long_lived.into_iter().flatten());
    }
    if device_requests.is_empty() {
        return out;
    }
    device_requests.sort_by(|a, b| a.name.cmp(&b.name));
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    out.claim = Some(ResourceClaim {
        metadata: ObjectMeta {
            name: Some(format!("{pod_name}-extended-resources")),
            namespace: pod.metadata.namespace.clone(),
            annotations: Some([(CLAIM_ANNOTATION.to_string(), "true".to_string())].into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".to_string(),
                kind: "Pod".to_string(),
                name: pod_name,
                uid: pod_uid.to_string(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim { requests: Some(device_requests), ..Default::default() }),
        }),
        status: None,
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes() -> Classes {
        let gpu: DeviceClass =
            serde_yaml_ng::from_str("metadata: {name: gpu.nvidia.com}\nspec: {extendedResourceName: nvidia.com/gpu}\n")
                .unwrap();
        let mig: DeviceClass = serde_yaml_ng::from_str("metadata: {name: mig.nvidia.com}\nspec: {}\n").unwrap();
        Classes::new([&gpu, &mig])
    }

    fn pod(spec: &str) -> Pod {
        serde_yaml_ng::from_str(&format!("metadata: {{name: p, namespace: ml}}\nspec: {spec}\n")).unwrap()
    }

    /// (name, class, count) of each request.
    fn requests_of(extended: &PodExtended) -> Vec<(String, String, i64)> {
        let claim = extended.claim.as_ref().unwrap();
        let requests = claim.spec.as_ref().unwrap().devices.as_ref().unwrap().requests.clone().unwrap();
        requests
            .into_iter()
            .map(|r| {
                let e = r.exactly.unwrap();
                assert_eq!(e.allocation_mode.as_deref(), Some("ExactCount"));
                (r.name, e.device_class_name, e.count.unwrap())
            })
            .collect()
    }

    #[test]
    fn one_request_per_container_and_resource_with_the_scheduler_names() {
        let p = pod("{containers: [\
            {name: a, resources: {limits: {nvidia.com/gpu: 2, cpu: 1}}},\
            {name: b, resources: {requests: {memory: 1Gi, deviceclass.resource.kubernetes.io/mig.nvidia.com: 1}}},\
            {name: c, resources: {limits: {example.com/foo: 1}}}]}");
        let extended = for_pod(&p, "uid-1", &classes());
        assert_eq!(
            requests_of(&extended),
            [
                ("container-0-request-1".to_string(), "gpu.nvidia.com".to_string(), 2),
                ("container-1-request-0".to_string(), "mig.nvidia.com".to_string(), 1),
            ]
        );
        assert_eq!(extended.unserved, ["example.com/foo"]);
        let claim = extended.claim.unwrap();
        assert_eq!(claim.metadata.name.as_deref(), Some("p-extended-resources"));
        assert_eq!(claim.metadata.namespace.as_deref(), Some("ml"));
        assert_eq!(claim.metadata.annotations.unwrap()[CLAIM_ANNOTATION], "true");
        let owner = &claim.metadata.owner_references.unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str(), owner.controller), ("Pod", "uid-1", Some(true)));
    }

    #[test]
    fn init_containers_reuse_later_requests_and_only_the_largest_shortfall_is_kept() {
        let p = pod("{initContainers: [\
            {name: i0, resources: {limits: {nvidia.com/gpu: 3}}},\
            {name: i1, resources: {limits: {nvidia.com/gpu: 1}}},\
            {name: side, restartPolicy: Always, resources: {limits: {nvidia.com/gpu: 1}}}],\
            containers: [{name: main, resources: {limits: {nvidia.com/gpu: 1}}}]}");
        // i0 wants 3, the sidecar and main give 2: it asks for 1 more;
        // i1 wants 1, covered by them.
        assert_eq!(
            requests_of(&for_pod(&p, "u", &classes())),
            [
                ("container-0-request-0".to_string(), "gpu.nvidia.com".to_string(), 1),
                ("container-2-request-0".to_string(), "gpu.nvidia.com".to_string(), 1),
                ("container-3-request-0".to_string(), "gpu.nvidia.com".to_string(), 1),
            ]
        );
    }

    #[test]
    fn no_whole_extended_request_no_claim() {
        let p = pod("{containers: [{name: a, resources: {limits: {cpu: 2, nvidia.com/gpu: 500m}}}]}");
        let extended = for_pod(&p, "u", &classes());
        assert!(extended.claim.is_none());
        assert!(extended.unserved.is_empty());
        assert!(for_pod(&pod("{containers: [{name: a}]}"), "u", &classes()).claim.is_none());
    }
}
