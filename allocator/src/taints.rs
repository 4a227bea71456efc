//! Device taints versus request tolerations.
//!
//! As upstream's `taintPreventsAllocation`: only `NoSchedule` and
//! `NoExecute` taints keep a device from being allocated (`None` and unknown
//! effects are ignored), unless a toleration of the request matches;
//! matching is `resourceclaim.ToleratesTaint` (a copy of the core/v1 pod
//! toleration rule: empty effect matches any effect, empty key matches any
//! key, operator `Equal` (default) compares values, `Exists` does not).

use k8s_openapi::api::resource::v1::{DeviceTaint, DeviceToleration};

use super::compact::DeviceRecord;

pub(crate) fn tolerates(toleration: &DeviceToleration, taint: &DeviceTaint) -> bool {
    if let Some(effect) = toleration.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    if let Some(key) = toleration.key.as_deref().filter(|k| !k.is_empty())
        && key != taint.key
    {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => toleration.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default(),
        "Exists" => true,
        _ => false,
    }
}

/// The first taint of `device` that keeps it from these tolerations.
pub(crate) fn blocking_taint<'d>(
    device: &'d DeviceRecord,
    tolerations: &[DeviceToleration],
) -> Option<&'d DeviceTaint> {
    device
        .taints()
        .iter()
        .filter(|t| matches!(t.effect.as_str(), "NoSchedule" | "NoExecute"))
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
}

/// `key=value:Effect`, as kubectl prints taints.
pub fn describe(taint: &DeviceTaint) -> String {
    match taint.value.as_deref().filter(|v| !v.is_empty()) {
        Some(v) => format!("{}={v}:{}", taint.key, taint.effect),
        None => format!("{}:{}", taint.key, taint.effect),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::Device;

    use super::*;

    fn taint(key: &str, value: Option<&str>, effect: &str) -> DeviceTaint {
        DeviceTaint { key: key.into(), value: value.map(Into::into), effect: effect.into(), time_added: None }
    }

    fn tol(key: Option<&str>, op: Option<&str>, value: Option<&str>, effect: Option<&str>) -> DeviceToleration {
        DeviceToleration {
            key: key.map(Into::into),
            operator: op.map(Into::into),
            value: value.map(Into::into),
            effect: effect.map(Into::into),
            toleration_seconds: None,
        }
    }

    #[test]
    fn toleration_rules() {
        let t = taint("gpu.nvidia.com/xid", Some("79"), "NoSchedule");
        assert!(tolerates(&tol(Some("gpu.nvidia.com/xid"), None, Some("79"), None), &t));
        assert!(!tolerates(&tol(Some("gpu.nvidia.com/xid"), Some("Equal"), Some("48"), None), &t));
        assert!(tolerates(&tol(Some("gpu.nvidia.com/xid"), Some("Exists"), None, Some("NoSchedule")), &t));
        assert!(!tolerates(&tol(Some("gpu.nvidia.com/xid"), Some("Exists"), None, Some("NoExecute")), &t));
        assert!(tolerates(&tol(None, Some("Exists"), None, None), &t), "empty key with Exists tolerates all");
        assert!(!tolerates(&tol(Some("gpu.nvidia.com/xid"), Some("Bogus"), None, None), &t));
    }

    #[test]
    fn only_scheduling_effects_block() {
        let device = Device {
            name: "d".into(),
            taints: Some(vec![taint("a", None, "None"), taint("b", None, "NoExecute")]),
            ..Default::default()
        };
        let device = super::super::test_support::rec(device);
        assert_eq!(blocking_taint(&device, &[]).map(|t| t.key.as_str()), Some("b"));
        assert!(blocking_taint(&device, &[tol(Some("b"), Some("Exists"), None, None)]).is_none());
        assert_eq!(describe(&taint("k", Some("v"), "NoSchedule")), "k=v:NoSchedule");
    }
}
