//! Which nodes a slice or device serves, and the `nodeSelector` an
//! allocation result carries.
//!
//! Matching follows `k8s.io/component-helpers/scheduling/corev1/nodeaffinity`:
//! terms are ORed, an empty term matches nothing, requirements inside a term
//! are ANDed; `matchFields` supports only `metadata.name`. An unknown
//! operator is an error, as there (`NewNodeSelector` fails to parse).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};

/// What the allocator knows about a node: its name and labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// A node selector the allocator cannot evaluate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node selector: {0}")]
pub struct BadSelector(pub String);

/// Where a slice or device may be used, as the API spells it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Reach<'a> {
    Node(&'a str),
    All,
    Selector(&'a NodeSelector),
    /// None of the three set: some future extension; usable nowhere.
    Unknown,
}

impl<'a> Reach<'a> {
    pub(crate) fn of(
        node_name: Option<&'a String>,
        all_nodes: Option<bool>,
        selector: Option<&'a NodeSelector>,
    ) -> Self {
        match (node_name.filter(|n| !n.is_empty()), all_nodes.unwrap_or(false), selector) {
            (Some(n), _, _) => Reach::Node(n),
            (None, true, _) => Reach::All,
            (None, false, Some(s)) => Reach::Selector(s),
            (None, false, None) => Reach::Unknown,
        }
    }

    pub(crate) fn matches(&self, node: &NodeInfo) -> Result<bool, BadSelector> {
        match self {
            Reach::Node(n) => Ok(*n == node.name),
            Reach::All => Ok(true),
            Reach::Selector(s) => selector_matches(s, node),
            Reach::Unknown => Ok(false),
        }
    }
}

/// Whether `selector` matches `node`; the one node-affinity matcher of the
/// workspace (`simulate` asks it which nodes an allocation admits).
pub fn selector_matches(selector: &NodeSelector, node: &NodeInfo) -> Result<bool, BadSelector> {
    let mut any = false;
    for term in &selector.node_selector_terms {
        // Evaluate every term so that a malformed one is reported even when
        // an earlier term matches, as NewNodeSelector parses all terms first.
        if term_matches(term, node)? {
            any = true;
        }
    }
    Ok(any)
}

fn term_matches(term: &NodeSelectorTerm, node: &NodeInfo) -> Result<bool, BadSelector> {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return Ok(false);
    }
    let mut all = true;
    for r in exprs {
        all &= requirement_matches(r, node.labels.get(&r.key).map(String::as_str), false)?;
    }
    for r in fields {
        if r.key != "metadata.name" {
            return Err(BadSelector(format!("matchFields key {:?} is not supported, only metadata.name", r.key)));
        }
        all &= requirement_matches(r, Some(&node.name), true)?;
    }
    Ok(all)
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>, field: bool) -> Result<bool, BadSelector> {
    let values = r.values.as_deref().unwrap_or_default();
    let in_values = |v: &str| values.iter().any(|x| x == v);
    let op = r.operator.as_str();
    if field && !matches!(op, "In" | "NotIn") {
        return Err(BadSelector(format!("matchFields operator {op:?} is not supported, only In and NotIn")));
    }
    let int = |s: &str| {
        s.parse::<i64>().map_err(|_| BadSelector(format!("{op} needs an integer value, got {s:?} for key {}", r.key)))
    };
    Ok(match op {
        "In" => value.is_some_and(in_values),
        "NotIn" => !value.is_some_and(in_values),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let [bound] = values else {
                return Err(BadSelector(format!("{op} needs exactly one value for key {}", r.key)));
            };
            let bound = int(bound)?;
            match value.map(str::parse::<i64>) {
                Some(Ok(v)) => (op == "Gt" && v > bound) || (op == "Lt" && v < bound),
                _ => false,
            }
        }
        other => return Err(BadSelector(format!("unknown operator {other:?} for key {}", r.key))),
    })
}

/// The node selector of an allocation, computed as upstream's
/// `createNodeSelector`: any node-local device (or one that binds to its
/// node) pins the allocation to `node` via `matchFields metadata.name In
/// [node]`; otherwise the single terms of the devices' node selectors are
/// merged (duplicates dropped); devices available everywhere add nothing,
/// and no requirement at all gives `None` (usable on every node).
pub(crate) fn allocation_node_selector<'a>(
    devices: impl IntoIterator<Item = (Reach<'a>, bool)>,
    node: &str,
) -> Result<Option<NodeSelector>, BadSelector> {
    let mut merged = NodeSelectorTerm::default();
    for (reach, binds_to_node) in devices {
        match reach {
            Reach::Node(_) => return Ok(Some(pin(node))),
            _ if binds_to_node => return Ok(Some(pin(node))),
            Reach::Selector(s) => match s.node_selector_terms.as_slice() {
                [] => {}
                [term] => {
                    merge(&term.match_fields, &mut merged.match_fields);
                    merge(&term.match_expressions, &mut merged.match_expressions);
                }
                terms => {
                    return Err(BadSelector(format!(
                        "unsupported ResourceSlice nodeSelector with {} terms (the API allows one)",
                        terms.len()
                    )));
                }
            },
            Reach::All | Reach::Unknown => {}
        }
    }
    if merged.match_fields.is_none() && merged.match_expressions.is_none() {
        return Ok(None);
    }
    Ok(Some(NodeSelector { node_selector_terms: vec![merged] }))
}

fn pin(node: &str) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: Some(vec![node.to_string()]),
            }]),
            match_expressions: None,
        }],
    }
}

fn merge(from: &Option<Vec<NodeSelectorRequirement>>, to: &mut Option<Vec<NodeSelectorRequirement>>) {
    for r in from.as_deref().unwrap_or_default() {
        let list = to.get_or_insert_with(Vec::new);
        if !list.iter().any(|e| same_requirement(e, r)) {
            list.push(r.clone());
        }
    }
}

/// Same key, operator and set of values (order and duplicates ignored).
fn same_requirement(a: &NodeSelectorRequirement, b: &NodeSelectorRequirement) -> bool {
    let set = |r: &NodeSelectorRequirement| {
        r.values.as_deref().unwrap_or_default().iter().cloned().collect::<std::collections::BTreeSet<_>>()
    };
    a.key == b.key && a.operator == b.operator && set(a) == set(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, labels: &[(&str, &str)]) -> NodeInfo {
        NodeInfo { name: name.into(), labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
    }

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn sel(terms: Vec<Vec<NodeSelectorRequirement>>) -> NodeSelector {
        NodeSelector {
            node_selector_terms: terms
                .into_iter()
                .map(|e| NodeSelectorTerm { match_expressions: Some(e), match_fields: None })
                .collect(),
        }
    }

    #[test]
    fn operators() {
        let n = node("n1", &[("zone", "a"), ("gpus", "8")]);
        let m = |r| selector_matches(&sel(vec![vec![r]]), &n).unwrap();
        assert!(m(req("zone", "In", &["a", "b"])));
        assert!(!m(req("zone", "NotIn", &["a"])));
        assert!(m(req("rack", "NotIn", &["x"])));
        assert!(m(req("zone", "Exists", &[])));
        assert!(m(req("rack", "DoesNotExist", &[])));
        assert!(m(req("gpus", "Gt", &["4"])));
        assert!(!m(req("gpus", "Lt", &["4"])));
        assert!(selector_matches(&sel(vec![vec![req("zone", "Foo", &[])]]), &n).is_err());
    }

    #[test]
    fn terms_are_ored_and_empty_terms_match_nothing() {
        let n = node("n1", &[("zone", "a")]);
        assert!(
            selector_matches(&sel(vec![vec![req("zone", "In", &["b"])], vec![req("zone", "In", &["a"])]]), &n).unwrap()
        );
        assert!(!selector_matches(&sel(vec![vec![]]), &n).unwrap());
    }

    #[test]
    fn match_fields_name() {
        let s = NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_fields: Some(vec![req("metadata.name", "In", &["n1"])]),
                match_expressions: None,
            }],
        };
        assert!(selector_matches(&s, &node("n1", &[])).unwrap());
        assert!(!selector_matches(&s, &node("n2", &[])).unwrap());
    }

    #[test]
    fn allocation_selector_pins_local_devices_and_merges_selectors() {
        let s1 = sel(vec![vec![req("zone", "In", &["a"])]]);
        let s2 = sel(vec![vec![req("zone", "In", &["a"]), req("rack", "In", &["r1"])]]);
        let merged = allocation_node_selector([(Reach::Selector(&s1), false), (Reach::Selector(&s2), false)], "n1")
            .unwrap()
            .unwrap();
        let exprs = merged.node_selector_terms[0].match_expressions.as_ref().unwrap();
        assert_eq!(exprs.len(), 2, "duplicate requirement dropped");
        let pinned = allocation_node_selector([(Reach::Selector(&s1), false), (Reach::Node("n1"), false)], "n1")
            .unwrap()
            .unwrap();
        assert_eq!(pinned.node_selector_terms[0].match_fields.as_ref().unwrap()[0].values.as_ref().unwrap(), &["n1"]);
        assert!(allocation_node_selector([(Reach::All, false)], "n1").unwrap().is_none());
        assert!(allocation_node_selector([(Reach::All, true)], "n1").unwrap().is_some(), "bindsToNode pins");
    }
}
