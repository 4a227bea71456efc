//! Which nodes an existing allocation's `nodeSelector` admits, so that a
//! pod's other claims land on the node of a claim it shares or that was
//! already allocated. Semantics of `k8s.io/component-helpers/scheduling/
//! corev1/nodeaffinity`: terms are ORed, requirements within a term ANDed,
//! an empty term matches nothing; `matchFields` supports `metadata.name`.
//! (The allocator has the same logic crate-private; see the report.)

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement};

/// A node as selectors see it.
#[derive(Debug, Clone, Default)]
pub struct NodeLabels {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// Whether `selector` admits `node`; `None` (no selector) admits every node.
/// Malformed requirements admit nothing.
pub fn admits(selector: Option<&NodeSelector>, node: &NodeLabels) -> bool {
    let Some(selector) = selector else { return true };
    selector.node_selector_terms.iter().any(|term| {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        (!exprs.is_empty() || !fields.is_empty())
            && exprs.iter().all(|r| requirement(r, node.labels.get(&r.key).map(String::as_str)))
            && fields.iter().all(|r| r.key == "metadata.name" && requirement(r, Some(&node.name)))
    })
}

fn requirement(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let listed = |v: &str| values.iter().any(|x| x == v);
    match r.operator.as_str() {
        "In" => value.is_some_and(listed),
        "NotIn" => !value.is_some_and(listed),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        op @ ("Gt" | "Lt") => {
            let (Some(v), [bound]) = (value.and_then(|v| v.parse::<i64>().ok()), values) else { return false };
            let Ok(bound) = bound.parse::<i64>() else { return false };
            if op == "Gt" { v > bound } else { v < bound }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, labels: &[(&str, &str)]) -> NodeLabels {
        NodeLabels { name: name.into(), labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
    }

    fn selector(yaml: &str) -> NodeSelector {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn name_fields_and_label_expressions() {
        let by_name = selector("nodeSelectorTerms: [{matchFields: [{key: metadata.name, operator: In, values: [a]}]}]");
        assert!(admits(Some(&by_name), &node("a", &[])));
        assert!(!admits(Some(&by_name), &node("b", &[])));
        let zone = selector(
            "nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: In, values: [z1]}, {key: gpus, operator: Gt, values: ['4']}]}]",
        );
        assert!(admits(Some(&zone), &node("a", &[("zone", "z1"), ("gpus", "8")])));
        assert!(!admits(Some(&zone), &node("a", &[("zone", "z1"), ("gpus", "2")])));
        assert!(!admits(Some(&zone), &node("a", &[("gpus", "8")])));
        assert!(admits(None, &node("x", &[])));
        assert!(!admits(Some(&selector("nodeSelectorTerms: [{}]")), &node("x", &[])));
    }
}
