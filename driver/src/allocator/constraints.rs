//! `matchAttribute` and `distinctAttribute` constraints of a claim.
//!
//! As upstream (`matchAttributeConstraint`, `distinctAttributeConstraint`):
//! a constraint covers the requests it lists (all when empty); listing
//! `req` covers all of `req`'s subrequests, `req/sub` only that one. A
//! covered device without the attribute violates it. Attributes are looked
//! up by the fully qualified name, or by the bare name when the domain is
//! the device's driver. Values compare by type and value; versions compare
//! as strings (semver's minimal form makes that exact). List attributes
//! (1.36 alpha, gate off by default) have no scalar value and never match.
//!
//! One deliberate difference: upstream's distinct constraint remembers one
//! value per request name, so two devices of the same request are not
//! compared with each other; we require every covered device to differ,
//! which is what the field promises ("all devices must have distinct
//! values").

use super::compact::{AttrValue, DeviceRecord};

/// A scalar attribute value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
    Version(String),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Str(s) => write!(f, "{s:?}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Version(v) => write!(f, "version {v}"),
        }
    }
}

fn scalar(a: &AttrValue) -> Option<Value> {
    match a {
        AttrValue::Str(s) => Some(Value::Str(s.to_string())),
        AttrValue::Int(i) => Some(Value::Int(*i)),
        AttrValue::Bool(b) => Some(Value::Bool(*b)),
        AttrValue::Version(v) => Some(Value::Version(v.to_string())),
        AttrValue::List(_) | AttrValue::Empty => None,
    }
}

/// The attribute `name` (fully qualified) of a device of `driver`.
pub(crate) fn lookup<'d>(device: &'d DeviceRecord, driver: &str, name: &str) -> Option<&'d AttrValue> {
    let attrs = &device.attributes;
    if let Some(a) = attrs.get(name) {
        return Some(a);
    }
    let (domain, id) = name.split_once('/')?;
    if domain != driver {
        return None;
    }
    attrs.get(id)
}

/// The scalar value of attribute `name`, if the device has one.
pub(crate) fn value_of(device: &DeviceRecord, driver: &str, name: &str) -> Option<Value> {
    lookup(device, driver, name).and_then(scalar)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Match,
    Distinct,
}

/// A claim constraint while the search runs.
#[derive(Debug, Clone)]
pub(crate) struct Constraint {
    pub(crate) kind: Kind,
    pub(crate) attribute: String,
    /// Empty: all requests.
    pub(crate) requests: Vec<String>,
    /// Values of the covered devices picked so far (for Match they are all equal).
    values: Vec<Value>,
}

impl Constraint {
    pub(crate) fn new(kind: Kind, attribute: String, requests: Vec<String>) -> Self {
        Self { kind, attribute, requests, values: Vec::new() }
    }

    /// Whether the constraint applies to request `request` (subrequest `sub`).
    pub(crate) fn covers(&self, request: &str, sub: Option<&str>) -> bool {
        self.requests.is_empty()
            || self.requests.iter().any(|r| {
                r == request
                    || sub.is_some_and(|s| {
                        r.len() == request.len() + 1 + s.len()
                            && r.starts_with(request)
                            && r.as_bytes().get(request.len()) == Some(&b'/')
                            && r.ends_with(s)
                    })
            })
    }

    /// Tries to add a device; `false` if it would violate the constraint
    /// (nothing changes then). Uncovered devices always pass.
    pub(crate) fn add(&mut self, request: &str, sub: Option<&str>, device: &DeviceRecord, driver: &str) -> bool {
        if !self.covers(request, sub) {
            return true;
        }
        let Some(v) = value_of(device, driver, &self.attribute) else { return false };
        let ok = match self.kind {
            Kind::Match => self.values.first().is_none_or(|first| *first == v),
            Kind::Distinct => !self.values.contains(&v),
        };
        if ok {
            self.values.push(v);
        }
        ok
    }

    /// Undoes a successful `add` of the same device (searches are LIFO).
    pub(crate) fn remove(&mut self, request: &str, sub: Option<&str>) {
        if self.covers(request, sub) {
            self.values.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

    #[test]
    fn scope_of_requests_and_subrequests() {
        let c = Constraint::new(Kind::Match, "gpu.nvidia.com/x".into(), vec!["a".into(), "b/fast".into()]);
        assert!(c.covers("a", None));
        assert!(c.covers("a", Some("any")), "a parent name covers its subrequests");
        assert!(c.covers("b", Some("fast")));
        assert!(!c.covers("b", Some("slow")));
        assert!(!c.covers("b", None));
        assert!(Constraint::new(Kind::Match, "x/y".into(), vec![]).covers("z", None));
    }

    #[test]
    fn match_needs_equal_values_of_the_same_type() {
        let mut c = Constraint::new(Kind::Match, "gpu.nvidia.com/group".into(), vec![]);
        let d0 = device("a").int("group", 1);
        let d1 = device("b").int("gpu.nvidia.com/group", 1);
        let d2 = device("c").string("group", "1");
        assert!(c.add("r", None, &rec(d0), DRIVER));
        assert!(c.add("r", None, &rec(d1), DRIVER), "qualified and bare names are the same attribute");
        assert!(!c.add("r", None, &rec(d2.clone()), DRIVER));
        assert!(!c.add("r", None, &rec(device("d")), DRIVER), "missing attribute");
        c.remove("r", None);
        c.remove("r", None);
        assert!(c.add("r", None, &rec(d2), DRIVER), "empty again after removals");
    }

    #[test]
    fn other_domains_need_the_qualified_name() {
        let d = device("a").int("group", 1);
        assert!(value_of(&rec(d.clone()), DRIVER, "example.com/group").is_none());
        assert_eq!(value_of(&rec(d.clone()), DRIVER, "gpu.nvidia.com/group"), Some(Value::Int(1)));
    }

    #[test]
    fn distinct_rejects_any_repeat() {
        let mut c = Constraint::new(Kind::Distinct, "gpu.nvidia.com/numa".into(), vec![]);
        assert!(c.add("r", None, &rec(device("a").int("numa", 0)), DRIVER));
        assert!(c.add("r", None, &rec(device("b").int("numa", 1)), DRIVER));
        assert!(!c.add("s", None, &rec(device("c").int("numa", 0)), DRIVER));
        assert!(c.add("s", None, &rec(device("c").string("numa", "0")), DRIVER), "different type is different");
    }
}
