//! The apiserver's rules for a capacity's `requestPolicy` on a
//! multi-allocatable device (`validateRequestPolicy` in
//! `pkg/apis/resource/validation/validation.go`): at most one of
//! `validValues` and `validRange`; either needs a `default` that it allows;
//! no option, `min`, `max` or first step beyond the capacity's value; steps
//! counted in whole units from `min`.
//!
//! Checked before publishing because a slice the apiserver refuses
//! publishes nothing at all for the node, not just this device.

use k8s_openapi::api::resource::v1::{CapacityRequestPolicy, CapacityRequestPolicyRange};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use super::field_error::FieldError;
use dra_cel::quantity::Quantity;

/// Most `validValues` (`CapacityRequestPolicyDiscreteMaxOptions`).
const MAX_VALID_VALUES: usize = 10;

/// Errors found so far under one policy's path.
struct Found<'a> {
    at: &'a str,
    errors: Vec<FieldError>,
}

impl Found<'_> {
    fn add(&mut self, child: &str, rule: impl Into<String>) {
        let field = if child.is_empty() { self.at.to_string() } else { format!("{}.{child}", self.at) };
        self.errors.push(FieldError { field, rule: rule.into() });
    }

    /// `q` as an amount, or an error at `child`.
    fn amount(&mut self, q: &ApiQuantity, child: &str) -> Option<Quantity> {
        let amount = Quantity::try_from(q).ok();
        if amount.is_none() {
            self.add(child, format!("Invalid value: {:?}: not a quantity", q.0));
        }
        amount
    }
}

/// All rules `policy` breaks for a capacity of `value`; `at` is the
/// policy's field path.
pub(super) fn validate(value: &ApiQuantity, policy: &CapacityRequestPolicy, at: &str) -> Vec<FieldError> {
    let mut found = Found { at, errors: Vec::new() };
    let values = policy.valid_values.as_deref().unwrap_or_default();
    if !values.is_empty() && policy.valid_range.is_some() {
        found.add(
            "",
            "Forbidden: exactly one policy can be specified, cannot specify \"validValues\" and \"validRange\" at the same time",
        );
        return found.errors;
    }
    let which = match (values.is_empty(), &policy.valid_range) {
        (false, _) => "validValues",
        (true, Some(_)) => "validRange",
        (true, None) => return found.errors,
    };
    let Some(default) = &policy.default else {
        found.add("default", format!("Required value: required when {which} is defined"));
        return found.errors;
    };
    let (Some(capacity), Some(default)) = (Quantity::try_from(value).ok(), found.amount(default, "default")) else {
        return found.errors;
    };
    match &policy.valid_range {
        Some(range) => check_range(&mut found, capacity, default, range, &value.0),
        None => check_values(&mut found, capacity, default, values, &value.0),
    }
    found.errors
}

fn check_values(found: &mut Found<'_>, capacity: Quantity, default: Quantity, values: &[ApiQuantity], shown: &str) {
    if values.len() > MAX_VALID_VALUES {
        found.add("validValues", format!("Too many: {}: must have at most {MAX_VALID_VALUES} items", values.len()));
        return;
    }
    let amounts: Vec<Option<Quantity>> =
        values.iter().enumerate().map(|(i, q)| found.amount(q, &format!("validValues[{i}]"))).collect();
    for (i, pair) in amounts.windows(2).enumerate() {
        if let [Some(a), Some(b)] = pair
            && a > b
        {
            found.add(
                &format!("validValues[{}]", i + 1),
                format!("Invalid value: {:?}: values must be sorted in ascending order", values[i + 1].0),
            );
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, amount) in amounts.iter().enumerate() {
        let Some(amount) = amount else { continue };
        if *amount > capacity {
            found.add(
                &format!("validValues[{i}]"),
                format!("Invalid value: {:?}: option is larger than capacity value: {shown}", values[i].0),
            );
        }
        if !seen.insert(amount.whole_units()) {
            found.add(&format!("validValues[{i}]"), format!("Duplicate value: {:?}", values[i].0));
        }
    }
    if !amounts.contains(&Some(default)) {
        found.add("validValues", "Invalid value: default value is not valid according to the requestPolicy");
    }
}

fn check_range(
    found: &mut Found<'_>,
    capacity: Quantity,
    default: Quantity,
    range: &CapacityRequestPolicyRange,
    shown: &str,
) {
    let Some(min) = found.amount(&range.min, "validRange.min") else { return };
    let min_text = &range.min.0;
    if min > capacity {
        found.add("validRange.min", format!("Invalid value: {min_text:?}: min is larger than capacity value: {shown}"));
    }
    if default < min {
        found.add("validRange.min", format!("Invalid value: default is less than min: {min_text}"));
    }
    let max = range.max.as_ref().and_then(|q| found.amount(q, "validRange.max"));
    if let (Some(max), Some(max_q)) = (max, &range.max) {
        if min > max {
            found.add("validRange.max", format!("Invalid value: {min_text:?}: min is larger than max: {}", max_q.0));
        }
        if max > capacity {
            found.add(
                "validRange.max",
                format!("Invalid value: {:?}: max is larger than capacity value: {shown}", max_q.0),
            );
        }
        if default > max {
            found.add("validRange.max", format!("Invalid value: default is more than max: {}", max_q.0));
        }
    }
    let Some(step_q) = &range.step else { return };
    let Some(step) = found.amount(step_q, "validRange.step") else { return };
    if min.saturating_add(step) > capacity {
        found.add(
            "validRange.step",
            format!("Invalid value: {:?}: one step from min is larger than capacity value: {shown}", step_q.0),
        );
    }
    let whole_step = step.whole_units();
    if whole_step <= 0 {
        found.add("validRange.step", format!("Invalid value: {:?}: must be at least 1", step_q.0));
        return;
    }
    for (what, value) in [("default", Some(default)), ("max", max)] {
        if let Some(value) = value
            && (value.whole_units() - min.whole_units()) % whole_step != 0
        {
            found.add(
                "validRange.step",
                format!("Invalid value: {what} is not a multiple of a given step ({}) from ({min_text})", step_q.0),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> ApiQuantity {
        ApiQuantity(s.into())
    }

    fn range(default: &str, min: &str, max: Option<&str>, step: Option<&str>) -> CapacityRequestPolicy {
        CapacityRequestPolicy {
            default: Some(q(default)),
            valid_range: Some(CapacityRequestPolicyRange { min: q(min), max: max.map(q), step: step.map(q) }),
            valid_values: None,
        }
    }

    fn fields(value: &str, policy: &CapacityRequestPolicy) -> Vec<String> {
        validate(&q(value), policy, "p").into_iter().map(|e| format!("{}: {}", e.field, e.rule)).collect()
    }

    #[test]
    fn the_published_policies_pass() {
        assert!(fields("80Gi", &range("80Gi", "1Gi", None, Some("1Gi"))).is_empty());
        assert!(fields("81559Mi", &range("79Gi", "1Gi", None, Some("1Gi"))).is_empty());
        assert!(fields("100", &range("0", "0", None, Some("1"))).is_empty());
    }

    #[test]
    fn range_rules() {
        let got = fields("80Gi", &range("81559Mi", "1Gi", Some("90Gi"), Some("1Gi")));
        assert_eq!(
            got,
            [
                "p.validRange.max: Invalid value: \"90Gi\": max is larger than capacity value: 80Gi",
                "p.validRange.step: Invalid value: default is not a multiple of a given step (1Gi) from (1Gi)",
            ]
        );
        let got = fields("80Gi", &range("1Gi", "2Gi", None, Some("79Gi")));
        assert_eq!(
            got,
            [
                "p.validRange.min: Invalid value: default is less than min: 2Gi",
                "p.validRange.step: Invalid value: \"79Gi\": one step from min is larger than capacity value: 80Gi",
                "p.validRange.step: Invalid value: default is not a multiple of a given step (79Gi) from (2Gi)",
            ]
        );
        let mut no_default = range("1Gi", "1Gi", None, None);
        no_default.default = None;
        assert_eq!(fields("80Gi", &no_default), ["p.default: Required value: required when validRange is defined"]);
    }

    #[test]
    fn valid_values_rules() {
        let policy = CapacityRequestPolicy {
            default: Some(q("3Gi")),
            valid_range: None,
            valid_values: Some(vec![q("20Gi"), q("10Gi"), q("10Gi"), q("90Gi")]),
        };
        assert_eq!(
            fields("80Gi", &policy),
            [
                "p.validValues[1]: Invalid value: \"10Gi\": values must be sorted in ascending order",
                "p.validValues[2]: Duplicate value: \"10Gi\"",
                "p.validValues[3]: Invalid value: \"90Gi\": option is larger than capacity value: 80Gi",
                "p.validValues: Invalid value: default value is not valid according to the requestPolicy",
            ]
        );
        let both = CapacityRequestPolicy { valid_range: range("1", "1", None, None).valid_range, ..policy };
        assert_eq!(fields("80Gi", &both).len(), 1);
        assert!(fields("80Gi", &both)[0].starts_with("p: Forbidden: exactly one policy"));
    }
}
