//! Label and field selectors, as `labels.Parse` and `fields.ParseSelector`
//! in apimachinery accept them (the subset clients send: equality,
//! inequality, existence and set membership for labels; `=`, `==` and `!=`
//! for fields).

use std::collections::BTreeMap;

use serde_json::Value;

use super::errors::ApiError;
use super::kinds::Kind;

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed `labelSelector`; all requirements must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<LabelReq>);

/// A parsed `fieldSelector`; all terms must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// Splits on commas outside parentheses (`a in (x,y),b`).
fn split_terms(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter().map(|t| t.trim().to_string()).filter(|t| !t.is_empty()).collect()
}

fn set_values(s: &str) -> Option<Vec<String>> {
    let inner = s.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(inner.split(',').map(|v| v.trim().to_string()).collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let bad =
            |t: &str| ApiError::bad_request(format!("unable to parse requirement: invalid label selector term {t:?}"));
        let mut reqs = Vec::new();
        for term in split_terms(s) {
            let req = if let Some((k, v)) = term.split_once("!=") {
                LabelReq::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = term.split_once("==") {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = term.split_once('=') {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = term.split_once(" notin ") {
                LabelReq::NotIn(k.trim().into(), set_values(v).ok_or_else(|| bad(&term))?)
            } else if let Some((k, v)) = term.split_once(" in ") {
                LabelReq::In(k.trim().into(), set_values(v).ok_or_else(|| bad(&term))?)
            } else if let Some(k) = term.strip_prefix('!') {
                LabelReq::NotExists(k.trim().into())
            } else if term.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c)) {
                LabelReq::Exists(term.clone())
            } else {
                return Err(bad(&term));
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, object: &Value) -> bool {
        let empty = serde_json::Map::new();
        let labels = object.pointer("/metadata/labels").and_then(Value::as_object).unwrap_or(&empty);
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v),
            LabelReq::NotEq(k, v) => get(k) != Some(v),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
            LabelReq::In(k, vs) => get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|l| vs.iter().all(|v| v != l)),
        })
    }
}

impl FieldSelector {
    /// Parses and checks every field label against what `kind` supports;
    /// the real server answers 400 `field label not supported` otherwise.
    pub fn parse(s: &str, kind: &Kind) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        for term in split_terms(s) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!("invalid selector: '{term}'; can't understand '{term}'")));
            };
            let field = field.trim();
            let supported = field == "metadata.name"
                || (kind.namespaced && field == "metadata.namespace")
                || kind.fields.contains(&field);
            if !supported {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field} (for {}; supported: metadata.name{}{})",
                    kind.qualified(),
                    if kind.namespaced { ", metadata.namespace" } else { "" },
                    kind.fields.iter().map(|f| format!(", {f}")).collect::<String>()
                )));
            }
            terms.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(Self(terms))
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let actual = field_value(object, field);
            (actual == *value) == *equal
        })
    }

    /// The terms as a map (for tests and logs).
    pub fn terms(&self) -> BTreeMap<String, String> {
        self.0.iter().map(|(f, _, v)| (f.clone(), v.clone())).collect()
    }
}

/// A field's value as the selectable-fields set renders it: strings as-is,
/// booleans as `true`/`false`, absent as the empty string.
fn field_value(object: &Value, field: &str) -> String {
    let pointer = format!("/{}", field.replace('.', "/"));
    match object.pointer(&pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        // `spec.unschedulable` unset reads as false.
        None if field == "spec.unschedulable" => "false".into(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::apiserver::kinds::by_kind;

    #[test]
    fn labels() {
        let obj = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        for (sel, want) in [
            ("a=1", true),
            ("a==1,b=2", true),
            ("a!=1", false),
            ("c", false),
            ("!c", true),
            ("a in (1,3)", true),
            ("b notin (2)", false),
            ("", true),
        ] {
            assert_eq!(LabelSelector::parse(sel).unwrap().matches(&obj), want, "{sel}");
        }
        assert!(LabelSelector::parse("a in 1").is_err());
    }

    #[test]
    fn fields() {
        let kind = by_kind("ResourceSlice").unwrap();
        let obj = json!({"metadata": {"name": "s"}, "spec": {"nodeName": "n1", "driver": "gpu.nvidia.com"}});
        let sel = FieldSelector::parse("spec.nodeName=n1,spec.driver=gpu.nvidia.com", kind).unwrap();
        assert!(sel.matches(&obj));
        assert!(!FieldSelector::parse("spec.nodeName=n2", kind).unwrap().matches(&obj));
        assert!(FieldSelector::parse("metadata.name!=x", kind).unwrap().matches(&obj));
        let err = FieldSelector::parse("spec.foo=1", kind).unwrap_err();
        assert_eq!((err.code, err.message.contains("field label not supported: spec.foo")), (400, true));
        assert!(FieldSelector::parse("spec.nodeName=n1", by_kind("ResourceClaim").unwrap()).is_err());
    }
}
