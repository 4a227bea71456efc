//! DeviceTaintRules: an administrator's taint on the devices a selector
//! names (`spec.deviceSelector`: driver, pool, device; each one set must
//! match, none set matches every device), added to what their slices say,
//! as the kube-scheduler's slice tracker adds them before allocating
//! (`staging/src/k8s.io/dynamic-resource-allocation/resourceslice/tracker`).
//! `resource.k8s.io/v1` serves them from 1.37 (DRADeviceTaintRules).

use k8s_openapi::api::resource::v1::{DeviceTaint, DeviceTaintRule};

/// One rule, as the allocator applies it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaintRule {
    pub name: String,
    driver: Option<String>,
    pool: Option<String>,
    device: Option<String>,
    pub taint: DeviceTaint,
}

/// Why a rule cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaintRuleError {
    #[error("metadata.name is missing; fix: name the rule")]
    NoName,
    #[error("DeviceTaintRule {0}: spec.taint.key is empty; fix: set the taint's key")]
    NoKey(String),
}

impl TaintRule {
    pub fn from_api(rule: &DeviceTaintRule) -> Result<Self, TaintRuleError> {
        let name = rule.metadata.name.clone().filter(|n| !n.is_empty()).ok_or(TaintRuleError::NoName)?;
        if rule.spec.taint.key.is_empty() {
            return Err(TaintRuleError::NoKey(name));
        }
        let selector = rule.spec.device_selector.as_ref();
        let part = |f: fn(&k8s_openapi::api::resource::v1::DeviceTaintSelector) -> &Option<String>| {
            selector.and_then(|s| f(s).clone()).filter(|v| !v.is_empty())
        };
        Ok(TaintRule {
            driver: part(|s| &s.driver),
            pool: part(|s| &s.pool),
            device: part(|s| &s.device),
            taint: rule.spec.taint.clone(),
            name,
        })
    }

    /// Whether the rule taints device `device` of `pool` of `driver`.
    pub fn matches(&self, driver: &str, pool: &str, device: &str) -> bool {
        self.driver.as_deref().is_none_or(|d| d == driver)
            && self.pool.as_deref().is_none_or(|p| p == pool)
            && self.device.as_deref().is_none_or(|d| d == device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(selector: serde_json::Value) -> TaintRule {
        let api: DeviceTaintRule = serde_json::from_value(json!({
            "metadata": {"name": "maintenance"},
            "spec": {"deviceSelector": selector, "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"}}
        }))
        .unwrap();
        TaintRule::from_api(&api).unwrap()
    }

    #[test]
    fn each_field_set_must_match_and_none_set_matches_all() {
        let one = rule(json!({"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-1"}));
        assert!(one.matches("gpu.nvidia.com", "node-a", "gpu-1"));
        assert!(!one.matches("gpu.nvidia.com", "node-a", "gpu-2"));
        assert!(!one.matches("gpu.nvidia.com", "node-b", "gpu-1"));
        assert!(!one.matches("nic.example.com", "node-a", "gpu-1"));
        let pool = rule(json!({"pool": "node-a"}));
        assert!(pool.matches("gpu.nvidia.com", "node-a", "gpu-7") && pool.matches("nic.example.com", "node-a", "x"));
        assert!(rule(json!({})).matches("any", "pool", "device"));
        assert!(rule(json!(null)).matches("any", "pool", "device"));
    }

    #[test]
    fn a_rule_without_a_name_or_key_is_refused() {
        let api: DeviceTaintRule = serde_json::from_value(
            json!({"metadata": {"name": "r"}, "spec": {"taint": {"key": "", "effect": "NoSchedule"}}}),
        )
        .unwrap();
        assert_eq!(TaintRule::from_api(&api), Err(TaintRuleError::NoKey("r".into())));
        let api: DeviceTaintRule =
            serde_json::from_value(json!({"metadata": {}, "spec": {"taint": {"key": "k", "effect": "NoSchedule"}}}))
                .unwrap();
        assert_eq!(TaintRule::from_api(&api), Err(TaintRuleError::NoName));
    }
}
