//! Protobuf <-> domain conversions, the only place both kinds meet.

use kubelet_proto::{dra_v1, dra_v1beta1};

use crate::prepare::types::ClaimRef;
use crate::prepared::PreparedDevice;

/// The base name of a request reference: `gpu/large` (a subrequest of a
/// `firstAvailable` request) becomes `gpu`. The kubelet matches
/// `Device.request_names` against `pod.spec.containers[].resources.claims[].request`,
/// which names base requests only (`claiminfo.go` `cdiDevicesAsList`); the
/// Go helper strips the same way (`stripSubrequestNames`). Order is kept,
/// duplicates are dropped.
pub(super) fn base_request_names(names: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for name in names {
        let base = name.split_once('/').map_or(name.as_str(), |(base, _)| base);
        if !out.iter().any(|n| n == base) {
            out.push(base.to_owned());
        }
    }
    out
}

// Both API versions' `Claim` and `Device` are the same messages (v1beta1's
// `Device` without `share_id`, which the kubelet's own v1beta1 conversion
// drops the same way): one conversion each, spelled once.
macro_rules! conversions {
    ($proto:ident $(, $share_id:ident)?) => {
        impl From<$proto::Claim> for ClaimRef {
            fn from(c: $proto::Claim) -> Self {
                Self { namespace: c.namespace, name: c.name, uid: c.uid }
            }
        }

        impl From<PreparedDevice> for $proto::Device {
            fn from(d: PreparedDevice) -> Self {
                Self {
                    request_names: base_request_names(&d.request_names),
                    pool_name: d.pool_name,
                    device_name: d.device_name,
                    cdi_device_ids: d.cdi_device_ids,
                    $($share_id: d.$share_id,)?
                }
            }
        }
    };
}

conversions!(dra_v1, share_id);
conversions!(dra_v1beta1);

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> PreparedDevice {
        PreparedDevice {
            request_names: vec!["gpu/large".into(), "gpu/small".into(), "nic".into()],
            pool_name: "node-a".into(),
            device_name: "gpu-0".into(),
            cdi_device_ids: vec!["k8s.gpu.nvidia.com/claim=u-gpu-0".into()],
            share_id: Some("7f3c".into()),
        }
    }

    #[test]
    fn request_names_are_base_names() {
        let v1: dra_v1::Device = device().into();
        assert_eq!(v1.request_names, ["gpu", "nic"]);
        assert_eq!(v1.share_id.as_deref(), Some("7f3c"));
        assert_eq!(v1.cdi_device_ids, ["k8s.gpu.nvidia.com/claim=u-gpu-0"]);
        let beta: dra_v1beta1::Device = device().into();
        assert_eq!(beta.request_names, ["gpu", "nic"]);
        assert_eq!((beta.pool_name.as_str(), beta.device_name.as_str()), ("node-a", "gpu-0"));
    }

    #[test]
    fn claims_keep_every_field() {
        let c: ClaimRef = dra_v1::Claim { namespace: "ns".into(), uid: "u".into(), name: "n".into() }.into();
        assert_eq!(c, ClaimRef { namespace: "ns".into(), name: "n".into(), uid: "u".into() });
        let c: ClaimRef = dra_v1beta1::Claim { namespace: "ns".into(), uid: "u".into(), name: "n".into() }.into();
        assert_eq!(c.uid, "u");
    }
}
