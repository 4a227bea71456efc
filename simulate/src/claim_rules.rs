//! The apiserver's ResourceClaimSpec rules that decide whether an
//! allocation makes sense, checked before allocating so that a malformed
//! claim is an input error naming the field, not a confusing "does not fit".
//! Mirrors `validateDeviceClaim` and friends in
//! `k8s.io/kubernetes/pkg/apis/resource/validation/validation.go`
//! (request and subrequest names are DNS labels and unique; exactly one of
//! `exactly`/`firstAvailable`; `allocationMode` ExactCount with count > 0
//! after defaulting, or All without count; at most 32 requests, 8
//! subrequests, 32 selectors and 32 constraints; constraint and config
//! `requests` name existing requests). Classes are checked against the
//! inputs, as the scheduler would fail on a missing one.

use std::collections::HashSet;

use gpu_dra_driver::k8s_format::{check_dns1123_label, check_dns1123_subdomain};
use k8s_openapi::api::resource::v1::{DeviceSelector, ResourceClaimSpec};

/// `DeviceRequestsMaxSize`, `FirstAvailableDeviceRequestMaxSize`,
/// `DeviceSelectorsMaxSize`, `DeviceConstraintsMaxSize`, `DeviceConfigMaxSize`.
const MAX_REQUESTS: usize = 32;
const MAX_SUBREQUESTS: usize = 8;
const MAX_SELECTORS: usize = 32;
const MAX_CONSTRAINTS: usize = 32;
const MAX_CONFIGS: usize = 32;
/// `CELSelectorExpressionMaxLength`.
const MAX_EXPRESSION: usize = 10 * 1024;

/// A rule broken at `field` (relative to the object, e.g. `spec.devices...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    pub field: String,
    pub problem: String,
}

impl std::fmt::Display for RuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.problem)
    }
}

fn err(field: impl Into<String>, problem: impl Into<String>) -> RuleError {
    RuleError { field: field.into(), problem: problem.into() }
}

/// Checks `spec` (at `prefix`, e.g. `spec` or `spec.spec`) against the
/// apiserver's rules and `class_exists`; the first broken rule is returned.
pub fn check(
    spec: Option<&ResourceClaimSpec>,
    prefix: &str,
    class_missing: &dyn Fn(&str) -> Option<String>,
) -> Result<(), RuleError> {
    let Some(devices) = spec.and_then(|s| s.devices.as_ref()) else {
        return Ok(());
    };
    let at = format!("{prefix}.devices");
    let requests = devices.requests.as_deref().unwrap_or_default();
    if requests.len() > MAX_REQUESTS {
        return Err(err(
            format!("{at}.requests"),
            format!("has {} requests, more than {MAX_REQUESTS}", requests.len()),
        ));
    }
    // Names a constraint or config may refer to: `req` and `req/sub`.
    let mut known: HashSet<String> = HashSet::new();
    for (i, r) in requests.iter().enumerate() {
        let field = format!("{at}.requests[{i}]");
        check_dns1123_label(&r.name).map_err(|e| err(format!("{field}.name"), format!("{:?}: {e}", r.name)))?;
        if !known.insert(r.name.clone()) {
            return Err(err(format!("{field}.name"), format!("duplicate request name {:?}", r.name)));
        }
        match (&r.exactly, &r.first_available) {
            (Some(e), None) => {
                let field = format!("{field}.exactly");
                check_class(&e.device_class_name, &field, class_missing)?;
                check_mode(e.allocation_mode.as_deref(), e.count, &field)?;
                check_selectors(e.selectors.as_deref(), &field)?;
            }
            (None, Some(subs)) => {
                let field = format!("{field}.firstAvailable");
                if subs.is_empty() || subs.len() > MAX_SUBREQUESTS {
                    return Err(err(
                        field,
                        format!("must list 1 to {MAX_SUBREQUESTS} subrequests, not {}", subs.len()),
                    ));
                }
                let mut names = HashSet::new();
                for (j, s) in subs.iter().enumerate() {
                    let field = format!("{field}[{j}]");
                    check_dns1123_label(&s.name)
                        .map_err(|e| err(format!("{field}.name"), format!("{:?}: {e}", s.name)))?;
                    if !names.insert(s.name.clone()) {
                        return Err(err(format!("{field}.name"), format!("duplicate subrequest name {:?}", s.name)));
                    }
                    known.insert(format!("{}/{}", r.name, s.name));
                    check_class(&s.device_class_name, &field, class_missing)?;
                    check_mode(s.allocation_mode.as_deref(), s.count, &field)?;
                    check_selectors(s.selectors.as_deref(), &field)?;
                }
            }
            (Some(_), Some(_)) => {
                return Err(err(field, "sets both exactly and firstAvailable; keep exactly one"));
            }
            (None, None) => return Err(err(field, "sets neither exactly nor firstAvailable; add one")),
        }
    }
    let constraints = devices.constraints.as_deref().unwrap_or_default();
    if constraints.len() > MAX_CONSTRAINTS {
        return Err(err(format!("{at}.constraints"), format!("more than {MAX_CONSTRAINTS} constraints")));
    }
    for (i, c) in constraints.iter().enumerate() {
        let field = format!("{at}.constraints[{i}]");
        check_references(c.requests.as_deref(), &field, &known)?;
        let attribute = match (&c.match_attribute, &c.distinct_attribute) {
            (Some(a), None) | (None, Some(a)) => a,
            _ => return Err(err(field, "must set exactly one of matchAttribute and distinctAttribute")),
        };
        if !attribute.contains('/') {
            return Err(err(
                field,
                format!("attribute {attribute:?} must be fully qualified, e.g. gpu.nvidia.com/{attribute}"),
            ));
        }
    }
    let configs = devices.config.as_deref().unwrap_or_default();
    if configs.len() > MAX_CONFIGS {
        return Err(err(format!("{at}.config"), format!("more than {MAX_CONFIGS} entries")));
    }
    for (i, c) in configs.iter().enumerate() {
        let field = format!("{at}.config[{i}]");
        check_references(c.requests.as_deref(), &field, &known)?;
        if c.opaque.as_ref().is_none_or(|o| o.driver.is_empty()) {
            return Err(err(format!("{field}.opaque.driver"), "required"));
        }
    }
    Ok(())
}

fn check_class(name: &str, field: &str, class_missing: &dyn Fn(&str) -> Option<String>) -> Result<(), RuleError> {
    let field = format!("{field}.deviceClassName");
    if name.is_empty() {
        return Err(err(field, "required"));
    }
    check_dns1123_subdomain(name).map_err(|e| err(&field, format!("{name:?}: {e}")))?;
    match class_missing(name) {
        Some(problem) => Err(err(field, problem)),
        None => Ok(()),
    }
}

/// Defaulting first (`ExactCount`; count 0 becomes 1, as Go cannot tell an
/// unset count from 0), then `validateDeviceAllocationMode`.
fn check_mode(mode: Option<&str>, count: Option<i64>, field: &str) -> Result<(), RuleError> {
    match mode.unwrap_or("") {
        "" | "ExactCount" => match count {
            Some(n) if n < 0 => Err(err(format!("{field}.count"), format!("{n}: must be greater than zero"))),
            _ => Ok(()),
        },
        "All" => match count {
            Some(n) if n != 0 => {
                Err(err(format!("{field}.count"), format!("{n}: must not be specified when allocationMode is 'All'")))
            }
            _ => Ok(()),
        },
        other => Err(err(
            format!("{field}.allocationMode"),
            format!("Unsupported value: {other:?}: supported values: \"All\", \"ExactCount\""),
        )),
    }
}

fn check_selectors(selectors: Option<&[DeviceSelector]>, field: &str) -> Result<(), RuleError> {
    let selectors = selectors.unwrap_or_default();
    if selectors.len() > MAX_SELECTORS {
        return Err(err(format!("{field}.selectors"), format!("more than {MAX_SELECTORS} selectors")));
    }
    for (i, s) in selectors.iter().enumerate() {
        let field = format!("{field}.selectors[{i}].cel.expression");
        match &s.cel {
            None => return Err(err(field, "required (cel is the only selector type)")),
            Some(c) if c.expression.trim().is_empty() => return Err(err(field, "required")),
            Some(c) if c.expression.len() > MAX_EXPRESSION => {
                return Err(err(field, format!("{} bytes, more than {MAX_EXPRESSION}", c.expression.len())));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

fn check_references(requests: Option<&[String]>, field: &str, known: &HashSet<String>) -> Result<(), RuleError> {
    for (j, r) in requests.unwrap_or_default().iter().enumerate() {
        if !known.contains(r) {
            return Err(err(
                format!("{field}.requests[{j}]"),
                format!("{r:?} is not a request (or request/subrequest) of this claim"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_yaml(yaml: &str) -> Result<(), RuleError> {
        let spec: ResourceClaimSpec = serde_yaml_ng::from_str(yaml).unwrap();
        check(Some(&spec), "spec", &|c| (c != "gpu.nvidia.com").then(|| format!("DeviceClass {c:?} is missing")))
    }

    #[test]
    fn a_good_claim_passes() {
        check_yaml(
            "devices:\n  requests:\n  - name: a\n    exactly: {deviceClassName: gpu.nvidia.com, count: 2}\n  \
             - name: b\n    firstAvailable: [{name: x, deviceClassName: gpu.nvidia.com}]\n  \
             constraints: [{requests: [a, b/x], matchAttribute: gpu.nvidia.com/nvlinkGroup}]\n",
        )
        .unwrap();
    }

    #[test]
    fn broken_rules_name_the_field() {
        let cases = [
            ("requests: [{name: A_1, exactly: {deviceClassName: gpu.nvidia.com}}]", "spec.devices.requests[0].name"),
            (
                "requests: [{name: a, exactly: {deviceClassName: gpu.nvidia.com}}, {name: a, exactly: {deviceClassName: gpu.nvidia.com}}]",
                "spec.devices.requests[1].name: duplicate",
            ),
            ("requests: [{name: a, exactly: {deviceClassName: gpu.nvidia.com, count: -1}}]", "exactly.count: -1"),
            (
                "requests: [{name: a, exactly: {deviceClassName: gpu.nvidia.com, allocationMode: All, count: 2}}]",
                "must not be specified when allocationMode is 'All'",
            ),
            (
                "requests: [{name: a, exactly: {deviceClassName: gpu.nvidia.com, allocationMode: Some}}]",
                "exactly.allocationMode: Unsupported value: \"Some\"",
            ),
            ("requests: [{name: a, exactly: {deviceClassName: tpu.example.com}}]", "DeviceClass \"tpu.example.com\""),
            ("requests: [{name: a}]", "sets neither exactly nor firstAvailable"),
            (
                "requests: [{name: a, exactly: {deviceClassName: gpu.nvidia.com}}]\n  constraints: [{requests: [b], matchAttribute: gpu.nvidia.com/x}]",
                "spec.devices.constraints[0].requests[0]: \"b\" is not a request",
            ),
            (
                "requests: [{name: a, exactly: {deviceClassName: gpu.nvidia.com}}]\n  constraints: [{matchAttribute: nvlinkGroup}]",
                "must be fully qualified",
            ),
        ];
        for (devices, want) in cases {
            let e = check_yaml(&format!("devices:\n  {devices}\n")).unwrap_err().to_string();
            assert!(e.contains(want), "{devices}: {e}");
        }
    }

    #[test]
    fn count_zero_is_defaulted_not_rejected() {
        check_yaml("devices:\n  requests: [{name: a, exactly: {deviceClassName: gpu.nvidia.com, count: 0}}]\n")
            .unwrap();
    }
}
