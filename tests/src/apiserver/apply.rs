//! JSON merge patch (RFC 7386) and server-side apply with per-manager field
//! ownership.
//!
//! Simplifications against the real structured-merge-diff (kept to what the
//! driver relies on, which is one manager per object):
//! - every list is atomic (the real server merges `listType=map`/`set` lists
//!   per key; the fields the driver writes, `spec.devices` and the slice
//!   spec's other lists, are atomic in the real schema too);
//! - ownership is kept beside the object, not rendered into
//!   `metadata.managedFields`;
//! - a non-apply write (create, update, merge patch) takes the fields whose
//!   value it changed, as the real server's `Update` operations do.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

/// Fields each manager owns, as JSON pointers to leaves (scalars or whole lists).
pub type Managers = BTreeMap<String, BTreeSet<String>>;

/// Object metadata the server owns; never part of anyone's field set.
const SERVER_FIELDS: &[&str] = &[
    "/apiVersion",
    "/kind",
    "/metadata/name",
    "/metadata/namespace",
    "/metadata/generateName",
    "/metadata/resourceVersion",
    "/metadata/uid",
    "/metadata/creationTimestamp",
    "/metadata/generation",
    "/metadata/managedFields",
];

/// RFC 7386: objects merge key by key, `null` deletes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else {
                merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Pointers to the leaves of `value` (objects recurse; lists are atomic).
pub fn leaf_paths(value: &Value) -> BTreeSet<String> {
    fn walk(prefix: &str, value: &Value, out: &mut BTreeSet<String>) {
        match value {
            Value::Object(map) if !map.is_empty() || prefix.is_empty() => {
                for (k, v) in map {
                    walk(&format!("{prefix}/{}", escape(k)), v, out);
                }
            }
            _ => {
                out.insert(prefix.to_string());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk("", value, &mut out);
    out.retain(|p| !SERVER_FIELDS.contains(&p.as_str()) && !p.is_empty());
    out
}

/// Whether two pointers name the same field or one contains the other.
fn overlaps(a: &str, b: &str) -> bool {
    a == b || a.starts_with(&format!("{b}/")) || b.starts_with(&format!("{a}/"))
}

fn remove_pointer(value: &mut Value, pointer: &str) {
    if let Some((parent, last)) = pointer.rsplit_once('/') {
        let last = last.replace("~1", "/").replace("~0", "~");
        if let Some(Value::Object(map)) = value.pointer_mut(parent) {
            map.remove(&last);
        }
    }
}

/// Deep merge for apply: objects merge, lists and scalars replace, `null`s
/// in the applied configuration are ignored.
fn overlay(target: &mut Value, applied: &Value) {
    match (target, applied) {
        (Value::Object(t), Value::Object(a)) => {
            for (k, v) in a {
                if v.is_null() {
                    continue;
                }
                match t.get_mut(k) {
                    Some(existing) => overlay(existing, v),
                    None => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (t, a) => *t = a.clone(),
    }
}

/// A field another manager owns with a different value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyConflict {
    pub manager: String,
    pub field: String,
}

/// Server-side apply of `applied` by `manager` onto `current` (`Null` when
/// the object does not exist yet). Returns the new object; `managers` is
/// updated. Without `force`, fields another manager owns with a different
/// value are conflicts (the real server's 409 "Apply failed with N
/// conflicts"); with `force` they change owner.
pub fn apply(
    current: &Value,
    managers: &mut Managers,
    manager: &str,
    applied: &Value,
    force: bool,
) -> Result<Value, Vec<ApplyConflict>> {
    let applied_paths = leaf_paths(applied);
    let mut conflicts = Vec::new();
    for (other, owned) in managers.iter() {
        if other == manager {
            continue;
        }
        for field in owned {
            let clashes = applied_paths.iter().any(|p| {
                overlaps(p, field) && current.pointer(p) != applied.pointer(p) && current.pointer(p).is_some()
            });
            if clashes {
                conflicts.push(ApplyConflict { manager: other.clone(), field: field.clone() });
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }
    for c in &conflicts {
        if let Some(owned) = managers.get_mut(&c.manager) {
            owned.remove(&c.field);
        }
    }
    let mut next = current.clone();
    // Fields this manager applied before and no longer applies are removed,
    // unless another manager still owns them.
    let previous = managers.get(manager).cloned().unwrap_or_default();
    for field in previous.difference(&applied_paths) {
        let shared = managers.iter().any(|(m, owned)| m != manager && owned.contains(field));
        if !shared {
            remove_pointer(&mut next, field);
        }
    }
    overlay(&mut next, applied);
    managers.insert(manager.to_string(), applied_paths);
    managers.retain(|_, owned| !owned.is_empty());
    Ok(next)
}

/// Ownership after a non-apply write by `manager`: it takes every field
/// whose value changed; fields that disappeared leave every set.
pub fn record_update(managers: &mut Managers, manager: &str, old: &Value, new: &Value) {
    let new_paths = leaf_paths(new);
    let changed: BTreeSet<String> = new_paths.iter().filter(|p| old.pointer(p) != new.pointer(p)).cloned().collect();
    for owned in managers.values_mut() {
        owned.retain(|f| new_paths.contains(f) && !changed.contains(f));
    }
    if !changed.is_empty() {
        managers.entry(manager.to_string()).or_default().extend(changed);
    }
    managers.retain(|_, owned| !owned.is_empty());
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merge_patch_follows_rfc7386() {
        let mut doc = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge_patch(&mut doc, &json!({"a": "z", "c": {"f": null}, "l": [3]}));
        assert_eq!(doc, json!({"a": "z", "c": {"d": "e"}, "l": [3]}));
    }

    #[test]
    fn apply_replaces_the_managers_fields_and_keeps_others() {
        let mut managers = Managers::new();
        let obj = apply(&Value::Null, &mut managers, "a", &json!({"spec": {"x": 1, "y": [1]}}), false).unwrap();
        let mut obj = obj;
        merge_patch(&mut obj, &json!({"metadata": {"labels": {"k": "v"}}}));
        record_update(&mut managers, "b", &json!({"spec": {"x": 1, "y": [1]}}), &obj);
        let obj = apply(&obj, &mut managers, "a", &json!({"spec": {"y": [2]}}), false).unwrap();
        assert_eq!(obj, json!({"spec": {"y": [2]}, "metadata": {"labels": {"k": "v"}}}));
    }

    #[test]
    fn apply_conflicts_with_other_managers_unless_forced() {
        let mut managers = Managers::new();
        let obj = apply(&Value::Null, &mut managers, "a", &json!({"spec": {"x": 1}}), false).unwrap();
        // Same value: shared ownership, no conflict.
        assert!(apply(&obj, &mut managers, "b", &json!({"spec": {"x": 1}}), false).is_ok());
        let err = apply(&obj, &mut managers, "b", &json!({"spec": {"x": 2}}), false).unwrap_err();
        assert_eq!(err, vec![ApplyConflict { manager: "a".into(), field: "/spec/x".into() }]);
        let obj = apply(&obj, &mut managers, "b", &json!({"spec": {"x": 2}}), true).unwrap();
        assert_eq!(obj, json!({"spec": {"x": 2}}));
        assert!(!managers.contains_key("a"));
    }
}
