//! `matchAttribute` and `distinctAttribute` constraints of a claim.
//!
//! As upstream (`matchAttributeConstraint`, `distinctAttributeConstraint`):
//! a constraint covers the requests it lists (all when empty); listing
//! `req` covers all of `req`'s subrequests, `req/sub` only that one. A
//! covered device without the attribute violates it. Attributes are looked
//! up by the fully qualified name, or by the bare name when the domain is
//! the device's driver.
//!
//! Two rules, chosen by DRAListTypeAttributes (alpha in 1.36 and 1.37, what
//! the allocator's CEL environment says):
//! - off (scalar): values compare by type and value; versions compare as
//!   strings (semver's minimal form makes that exact). The first covered
//!   device is taken whatever its value; a list value equals nothing after
//!   it, and a list is distinct only from nothing.
//! - on (sets, 1.37's experimental allocator): every value is a set, a
//!   scalar one element. `matchAttribute`: the sets of all covered devices
//!   have a common element (their intersection, narrowed device by device,
//!   is not empty). `distinctAttribute`: the sets are pairwise disjoint.
//!   Sets of different types never intersect. An empty list (or no value)
//!   is no set and fails either constraint.
//!
//! One deliberate difference from 1.36's incubating allocator: its distinct
//! constraint remembers one value per request name, so two devices of the
//! same request are not compared with each other; we require every covered
//! device to differ, which is what the field promises ("all devices must
//! have distinct values") and what 1.37's experimental allocator does.

use std::collections::BTreeSet;

use super::compact::{AttrValue, DeviceRecord, ListValue};

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

/// An attribute's values as a set (`deviceAttributeListAsSet`): a scalar is
/// a set of one. Never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ValueSet {
    Ints(BTreeSet<i64>),
    Bools(BTreeSet<bool>),
    Strs(BTreeSet<String>),
    /// Compared as strings, as upstream does.
    Versions(BTreeSet<String>),
}

impl ValueSet {
    /// The set of `a`; `None` for an empty list or no value.
    pub(crate) fn of(a: &AttrValue) -> Option<ValueSet> {
        let set = match a {
            AttrValue::Int(i) => ValueSet::Ints(BTreeSet::from([*i])),
            AttrValue::Bool(b) => ValueSet::Bools(BTreeSet::from([*b])),
            AttrValue::Str(s) => ValueSet::Strs(BTreeSet::from([s.to_string()])),
            AttrValue::Version(v) => ValueSet::Versions(BTreeSet::from([v.to_string()])),
            AttrValue::List(list) => match &**list {
                ListValue::Ints(v) => ValueSet::Ints(v.iter().copied().collect()),
                ListValue::Bools(v) => ValueSet::Bools(v.iter().copied().collect()),
                ListValue::Strings(v) => ValueSet::Strs(v.iter().cloned().collect()),
                ListValue::Versions(v) => ValueSet::Versions(v.iter().cloned().collect()),
            },
            AttrValue::Empty => return None,
        };
        (!set.is_empty()).then_some(set)
    }

    fn is_empty(&self) -> bool {
        match self {
            ValueSet::Ints(s) => s.is_empty(),
            ValueSet::Bools(s) => s.is_empty(),
            ValueSet::Strs(s) | ValueSet::Versions(s) => s.is_empty(),
        }
    }

    /// The common elements, if any (none across types).
    pub(crate) fn intersection(&self, other: &ValueSet) -> Option<ValueSet> {
        let common = match (self, other) {
            (ValueSet::Ints(a), ValueSet::Ints(b)) => ValueSet::Ints(a.intersection(b).copied().collect()),
            (ValueSet::Bools(a), ValueSet::Bools(b)) => ValueSet::Bools(a.intersection(b).copied().collect()),
            (ValueSet::Strs(a), ValueSet::Strs(b)) => ValueSet::Strs(a.intersection(b).cloned().collect()),
            (ValueSet::Versions(a), ValueSet::Versions(b)) => ValueSet::Versions(a.intersection(b).cloned().collect()),
            _ => return None,
        };
        (!common.is_empty()).then_some(common)
    }
}

impl std::fmt::Display for ValueSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn list<T: std::fmt::Display>(
            f: &mut std::fmt::Formatter<'_>,
            prefix: &str,
            items: impl Iterator<Item = T>,
        ) -> std::fmt::Result {
            let items: Vec<String> = items.map(|i| i.to_string()).collect();
            match items.as_slice() {
                [one] => write!(f, "{prefix}{one}"),
                _ => write!(f, "{prefix}[{}]", items.join(", ")),
            }
        }
        match self {
            ValueSet::Ints(s) => list(f, "", s.iter()),
            ValueSet::Bools(s) => list(f, "", s.iter()),
            ValueSet::Strs(s) => list(f, "", s.iter().map(|s| format!("{s:?}"))),
            ValueSet::Versions(s) => list(f, "version ", s.iter()),
        }
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
#[cfg(test)]
pub(crate) fn value_of(device: &DeviceRecord, driver: &str, name: &str) -> Option<Value> {
    lookup(device, driver, name).and_then(scalar)
}

/// How attribute `name` of a device reads in an explanation: its scalar
/// value, or its set with list-type attributes.
pub(crate) fn shown_value(device: &DeviceRecord, driver: &str, name: &str, lists: bool) -> Option<String> {
    let a = lookup(device, driver, name)?;
    if lists { ValueSet::of(a).map(|s| s.to_string()) } else { scalar(a).map(|v| v.to_string()) }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Match,
    Distinct,
}

/// What a constraint remembers of the covered devices picked so far, one
/// entry per device (so a removal pops one).
#[derive(Debug, Clone)]
enum Picked {
    /// Scalar rule: each device's value (`None`: a list or no value, which
    /// only the first device may have).
    Scalars(Vec<Option<Value>>),
    /// Set rule: for Match, the intersection after each device; for
    /// Distinct, each device's set.
    Sets(Vec<ValueSet>),
}

/// A claim constraint while the search runs.
#[derive(Debug, Clone)]
pub(crate) struct Constraint {
    pub(crate) kind: Kind,
    pub(crate) attribute: String,
    /// Empty: all requests.
    pub(crate) requests: Vec<String>,
    picked: Picked,
}

impl Constraint {
    /// `lists`: DRAListTypeAttributes is on (the set rule).
    pub(crate) fn new(kind: Kind, attribute: String, requests: Vec<String>, lists: bool) -> Self {
        let picked = if lists { Picked::Sets(Vec::new()) } else { Picked::Scalars(Vec::new()) };
        Self { kind, attribute, requests, picked }
    }

    /// Whether the set rule (DRAListTypeAttributes) applies.
    pub(crate) fn uses_sets(&self) -> bool {
        matches!(self.picked, Picked::Sets(_))
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
        let Some(a) = lookup(device, driver, &self.attribute) else { return false };
        match &mut self.picked {
            Picked::Scalars(values) => {
                let v = scalar(a);
                let ok = match (self.kind, values.first(), &v) {
                    (_, None, _) => true,
                    (Kind::Match, Some(first), Some(v)) => first.as_ref() == Some(v),
                    (Kind::Match, Some(_), None) => false,
                    (Kind::Distinct, Some(_), Some(v)) => !values.iter().flatten().any(|p| p == v),
                    (Kind::Distinct, Some(_), None) => false,
                };
                if ok {
                    values.push(v);
                }
                ok
            }
            Picked::Sets(sets) => {
                let Some(set) = ValueSet::of(a) else { return false };
                let next = match (self.kind, sets.last()) {
                    (_, None) => Some(set),
                    (Kind::Match, Some(common)) => common.intersection(&set),
                    (Kind::Distinct, Some(_)) => sets.iter().all(|p| p.intersection(&set).is_none()).then_some(set),
                };
                match next {
                    Some(s) => {
                        sets.push(s);
                        true
                    }
                    None => false,
                }
            }
        }
    }

    /// Undoes a successful `add` of the same device (searches are LIFO).
    pub(crate) fn remove(&mut self, request: &str, sub: Option<&str>) {
        if self.covers(request, sub) {
            match &mut self.picked {
                Picked::Scalars(values) => {
                    values.pop();
                }
                Picked::Sets(sets) => {
                    sets.pop();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

    #[test]
    fn scope_of_requests_and_subrequests() {
        let c = Constraint::new(Kind::Match, "gpu.nvidia.com/x".into(), vec!["a".into(), "b/fast".into()], false);
        assert!(c.covers("a", None));
        assert!(c.covers("a", Some("any")), "a parent name covers its subrequests");
        assert!(c.covers("b", Some("fast")));
        assert!(!c.covers("b", Some("slow")));
        assert!(!c.covers("b", None));
        assert!(Constraint::new(Kind::Match, "x/y".into(), vec![], false).covers("z", None));
    }

    #[test]
    fn match_needs_equal_values_of_the_same_type() {
        let mut c = Constraint::new(Kind::Match, "gpu.nvidia.com/group".into(), vec![], false);
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
        let mut c = Constraint::new(Kind::Distinct, "gpu.nvidia.com/numa".into(), vec![], false);
        assert!(c.add("r", None, &rec(device("a").int("numa", 0)), DRIVER));
        assert!(c.add("r", None, &rec(device("b").int("numa", 1)), DRIVER));
        assert!(!c.add("s", None, &rec(device("c").int("numa", 0)), DRIVER));
        assert!(c.add("s", None, &rec(device("c").string("numa", "0")), DRIVER), "different type is different");
    }
}
