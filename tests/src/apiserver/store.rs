//! The object store: what etcd plus the registry strategies do for the
//! stand-in. Objects are kept as JSON; every write takes the next value of
//! one global counter as its resourceVersion (etcd's revision), is checked,
//! and becomes an event in a bounded history that watches replay from.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::apply::{self, Managers};
use super::errors::ApiError;
use super::kinds::Kind;
use super::selectors::{FieldSelector, LabelSelector};
use super::{defaults, validate};

/// Events a watch can still start from; older resourceVersions get 410.
/// The real watch cache keeps a size- and time-bounded window likewise.
pub const DEFAULT_HISTORY: usize = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as watches see it.
#[derive(Debug)]
pub struct StoreEvent {
    pub kind: &'static Kind,
    pub rv: u64,
    pub event: EventType,
    pub namespace: String,
    pub object: Value,
    /// The object before the change (for MODIFIED), so a filtered watch can
    /// turn "stopped matching" into DELETED as the real watch cache does.
    pub previous: Option<Value>,
}

type Key = (&'static str, String, String);

struct Entry {
    object: Value,
    managers: Managers,
}

struct Inner {
    rv: u64,
    objects: BTreeMap<Key, Entry>,
    history: VecDeque<Arc<StoreEvent>>,
    history_limit: usize,
    /// Watches may start at resourceVersions >= this.
    oldest_rv: u64,
    counter: u64,
}

/// Where a new watch starts: the current objects (for a watch without a
/// resourceVersion) or the events after the requested one, plus the live feed.
pub struct WatchStart {
    pub initial: Vec<Value>,
    pub replay: Vec<Arc<StoreEvent>>,
    pub rv: u64,
    pub live: broadcast::Receiver<Arc<StoreEvent>>,
}

/// The shared store.
pub struct Store {
    inner: Mutex<Inner>,
    events: broadcast::Sender<Arc<StoreEvent>>,
    server_id: u128,
    /// The Kubernetes minor release the stand-in is (its `/version`, and the
    /// ResourceSlice rules it validates with).
    server_minor: AtomicU32,
    /// The feature gates turned off ([`super::gates`]).
    gates_off: Mutex<super::gates::GatesOff>,
}

/// A request's identity for an object write.
pub struct Write<'a> {
    pub kind: &'static Kind,
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    /// Writes the `/status` subresource.
    pub status: bool,
    pub manager: &'a str,
    /// A PUT (full replacement), as opposed to a patch or apply.
    pub put: bool,
}

fn meta_str<'v>(object: &'v Value, field: &str) -> Option<&'v str> {
    object.get("metadata").and_then(|m| m.get(field)).and_then(Value::as_str)
}

fn set_meta(object: &mut Value, field: &str, value: Value) {
    if !object.get("metadata").is_some_and(Value::is_object)
        && let Some(map) = object.as_object_mut()
    {
        map.insert("metadata".into(), json!({}));
    }
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        if value.is_null() {
            meta.remove(field);
        } else {
            meta.insert(field.into(), value);
        }
    }
}

fn parse_rv(rv: &str) -> Result<u64, ApiError> {
    rv.parse().map_err(|_| ApiError::bad_request(format!("invalid resource version {rv:?}: expected a number")))
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

impl Store {
    /// The Kubernetes minor release the stand-in reports and validates as.
    pub fn server_minor(&self) -> u32 {
        self.server_minor.load(Ordering::Relaxed)
    }

    /// Makes the stand-in report and validate as Kubernetes 1.`minor`.
    pub fn set_server_minor(&self, minor: u32) {
        self.server_minor.store(minor, Ordering::Relaxed);
    }

    /// Turns a feature gate (e.g. `DRADeviceTaints`) on or off.
    pub fn set_feature_gate(&self, gate: &str, on: bool) {
        let mut off = self.gates_off.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if on {
            off.remove(gate);
        } else {
            off.insert(gate.to_string());
        }
    }

    /// A ResourceSlice write's new object without the fields of the gates
    /// that are off (`old`: the stored object, on update).
    fn drop_disabled_fields(&self, kind: &Kind, new: &mut Value, old: Option<&Value>) {
        if kind.kind == "ResourceSlice" {
            let off = self.gates_off.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            super::gates::drop_disabled_slice_fields(&off, new, old);
        }
    }

    pub fn new() -> Self {
        let server_id = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        Self {
            inner: Mutex::new(Inner {
                rv: 1,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                history_limit: DEFAULT_HISTORY,
                oldest_rv: 1,
                counter: 0,
            }),
            events: broadcast::channel(4096).0,
            server_id,
            server_minor: AtomicU32::new(super::DEFAULT_SERVER_MINOR),
            gates_off: Mutex::new(super::gates::GatesOff::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-written
        // (every write is computed first, then inserted), so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current resourceVersion (ListMeta's).
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// Forgets the event history, as an etcd compaction does: watches from
    /// any earlier resourceVersion now get 410 Gone.
    pub fn compact(&self) {
        let mut inner = self.lock();
        inner.history.clear();
        inner.oldest_rv = inner.rv;
    }

    /// Bounds the history (tests shrink it to provoke 410).
    pub fn set_history_limit(&self, limit: usize) {
        let mut inner = self.lock();
        inner.history_limit = limit;
        trim(&mut inner);
    }

    fn key(kind: &'static Kind, namespace: Option<&str>, name: &str) -> Key {
        (kind.plural, namespace.unwrap_or_default().to_string(), name.to_string())
    }

    pub fn get(&self, kind: &'static Kind, namespace: Option<&str>, name: &str) -> Result<Value, ApiError> {
        self.lock()
            .objects
            .get(&Self::key(kind, namespace, name))
            .map(|e| e.object.clone())
            .ok_or_else(|| ApiError::not_found(kind, name))
    }

    /// Objects of `kind` (in `namespace`, or all) matching both selectors,
    /// with the resourceVersion the list reflects.
    pub fn list(
        &self,
        kind: &'static Kind,
        namespace: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> (Vec<Value>, u64) {
        let inner = self.lock();
        let items = inner
            .objects
            .iter()
            .filter(|((plural, ns, _), _)| *plural == kind.plural && namespace.is_none_or(|n| n == ns))
            .map(|(_, e)| &e.object)
            .filter(|o| labels.matches(o) && fields.matches(o))
            .cloned()
            .collect();
        (items, inner.rv)
    }

    /// At most `max` objects of a [`Store::list`], those after `after`
    /// (namespace, name) in key order: one page, cloning only its objects.
    pub fn list_after(
        &self,
        kind: &'static Kind,
        namespace: Option<&str>,
        selectors: (&LabelSelector, &FieldSelector),
        after: Option<&(String, String)>,
        max: usize,
    ) -> (Vec<Value>, u64) {
        let (labels, fields) = selectors;
        let inner = self.lock();
        let items = inner
            .objects
            .iter()
            .filter(|((plural, ns, _), _)| *plural == kind.plural && namespace.is_none_or(|n| n == ns))
            .filter(|((_, ns, name), _)| after.is_none_or(|(a_ns, a_name)| (ns, name) > (a_ns, a_name)))
            .map(|(_, e)| &e.object)
            .filter(|o| labels.matches(o) && fields.matches(o))
            .take(max)
            .cloned()
            .collect();
        (items, inner.rv)
    }

    /// POST: creates the object. `metadata.generateName` gives a fresh
    /// name; uid, creationTimestamp, generation and resourceVersion are the
    /// server's (`rest.BeforeCreate`); the status of a type with a status
    /// subresource is dropped (`PrepareForCreate` of those strategies).
    pub fn create(
        &self,
        kind: &'static Kind,
        namespace: Option<&str>,
        mut object: Value,
        manager: &str,
    ) -> Result<Value, ApiError> {
        if !object.is_object() {
            return Err(ApiError::bad_request("the request body must be a JSON object"));
        }
        if kind.namespaced {
            match (namespace, meta_str(&object, "namespace")) {
                (None, _) => return Err(ApiError::bad_request("a namespaced object needs a namespace in the URL")),
                (Some(url), Some(body)) if !body.is_empty() && url != body => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => {}
            }
        }
        if kind.status_subresource
            && let Some(map) = object.as_object_mut()
        {
            map.remove("status");
            // pod strategy PrepareForCreate: a new pod is Pending.
            if kind.kind == "Pod" {
                map.insert("status".into(), json!({"phase": "Pending"}));
            }
        }
        self.create_inner(kind, namespace, object, Managers::new(), manager)
    }

    /// Creates with a status (tests use this to put allocated claims in place).
    pub fn create_with_status(
        &self,
        kind: &'static Kind,
        namespace: Option<&str>,
        object: Value,
    ) -> Result<Value, ApiError> {
        self.create_inner(kind, namespace, object, Managers::new(), "test")
    }

    fn create_inner(
        &self,
        kind: &'static Kind,
        namespace: Option<&str>,
        mut object: Value,
        mut managers: Managers,
        manager: &str,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let name = match meta_str(&object, "name").filter(|n| !n.is_empty()) {
            Some(name) => name.to_string(),
            None => match meta_str(&object, "generateName").filter(|n| !n.is_empty()) {
                // names.SimpleNameGenerator: prefix + 5 random characters.
                Some(prefix) => {
                    let prefix = prefix.to_string();
                    loop {
                        inner.counter += 1;
                        let candidate = format!("{prefix}{}", random_suffix(self.server_id, inner.counter));
                        if !inner.objects.contains_key(&Self::key(kind, namespace, &candidate)) {
                            break candidate;
                        }
                    }
                }
                None => {
                    return Err(ApiError::invalid(
                        kind,
                        "",
                        "metadata.name: Required value: name or generateName is required",
                    ));
                }
            },
        };
        let key = Self::key(kind, namespace, &name);
        if inner.objects.contains_key(&key) {
            return Err(ApiError::already_exists(kind, &name));
        }
        inner.counter += 1;
        let uid =
            uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, format!("{}/{}", self.server_id, inner.counter).as_bytes());
        set_meta(&mut object, "name", json!(name));
        set_meta(&mut object, "namespace", namespace.map_or(Value::Null, |n| json!(n)));
        set_meta(&mut object, "uid", json!(uid.to_string()));
        set_meta(&mut object, "creationTimestamp", json!(now()));
        set_meta(&mut object, "generation", if kind.generation { json!(1) } else { Value::Null });
        set_meta(&mut object, "resourceVersion", Value::Null);
        set_meta(&mut object, "managedFields", Value::Null);
        set_type(kind, &mut object);
        defaults::apply(kind, &mut object);
        self.drop_disabled_fields(kind, &mut object, None);
        validate::check(kind, &name, &object, None, self.server_minor())?;
        if managers.is_empty() {
            apply::record_update(&mut managers, manager, &Value::Null, &object);
        }
        let rv = inner.rv + 1;
        inner.rv = rv;
        set_meta(&mut object, "resourceVersion", json!(rv.to_string()));
        inner.objects.insert(key, Entry { object: object.clone(), managers });
        self.emit(&mut inner, kind, EventType::Added, namespace, object.clone(), None);
        Ok(object)
    }

    /// The update path shared by PUT, merge patch and apply: `change` gets
    /// the current object and its managers and returns the candidate. Then
    /// the real server's rules: a set `metadata.resourceVersion` must be the
    /// current one (409 Conflict, optimistic concurrency); server fields are
    /// kept; the main resource cannot change status and `/status` can change
    /// only status; `metadata.generation` is bumped when spec changes; an
    /// update that changes nothing stores nothing and sends no event.
    pub fn update(
        &self,
        write: &Write<'_>,
        change: impl FnOnce(&Value, &mut Managers) -> Result<Value, ApiError>,
    ) -> Result<Value, ApiError> {
        let kind = write.kind;
        let mut inner = self.lock();
        let key = Self::key(kind, write.namespace, write.name);
        let entry = inner.objects.get(&key).ok_or_else(|| ApiError::not_found(kind, write.name))?;
        let old = entry.object.clone();
        let mut managers = entry.managers.clone();
        let mut new = change(&old, &mut managers)?;
        if !new.is_object() {
            return Err(ApiError::bad_request("the request body must be a JSON object"));
        }
        // registry/generic/registry/store.go Update: without a
        // resourceVersion the update is unconditional, if the type allows it.
        if write.put && !kind.unconditional_update && meta_str(&new, "resourceVersion").is_none_or(str::is_empty) {
            return Err(ApiError::stale(kind, write.name));
        }
        if let Some(rv) = meta_str(&new, "resourceVersion").filter(|rv| !rv.is_empty())
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            parse_rv(rv)?;
            return Err(ApiError::stale(kind, write.name));
        }
        match meta_str(&new, "name") {
            Some(n) if n != write.name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({})",
                    write.name
                )));
            }
            _ => {}
        }
        if write.status {
            // ResetObjectMetaForStatus + `newObj.Spec = oldObj.Spec`.
            let status = new.get("status").cloned();
            new = old.clone();
            if let Some(map) = new.as_object_mut() {
                match status {
                    Some(s) => map.insert("status".into(), s),
                    None => map.remove("status"),
                };
            }
        } else if kind.status_subresource
            && let Some(map) = new.as_object_mut()
        {
            match old.get("status") {
                Some(s) => map.insert("status".into(), s.clone()),
                None => map.remove("status"),
            };
        }
        // BeforeUpdate: server-set metadata, deletion state included, is
        // the stored object's whatever the client sends.
        for field in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "generation",
            "generateName",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            let value = old.get("metadata").and_then(|m| m.get(field)).cloned().unwrap_or(Value::Null);
            set_meta(&mut new, field, value);
        }
        set_meta(&mut new, "managedFields", Value::Null);
        set_type(kind, &mut new);
        if kind.generation && new.get("spec") != old.get("spec") {
            let generation = old.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0) + 1;
            set_meta(&mut new, "generation", json!(generation));
        }
        // PrepareForUpdate: the generation follows the spec as sent, then
        // the disabled fields go.
        if !write.status {
            self.drop_disabled_fields(kind, &mut new, Some(&old));
        }
        set_meta(&mut new, "resourceVersion", old.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null));
        if new == old {
            return Ok(old);
        }
        // ValidateObjectMetaUpdate: an object being deleted may lose
        // finalizers but gain none.
        if old.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null()) {
            let before = finalizers(&old);
            if let Some(added) = finalizers(&new).into_iter().find(|f| !before.contains(f)) {
                return Err(ApiError::invalid(
                    kind,
                    write.name,
                    &format!(
                        "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers [\"{added}\"]"
                    ),
                ));
            }
        }
        defaults::apply(kind, &mut new);
        validate::check(kind, write.name, &new, Some(&old), self.server_minor())?;
        apply::record_update(&mut managers, write.manager, &old, &new);
        let rv = inner.rv + 1;
        inner.rv = rv;
        set_meta(&mut new, "resourceVersion", json!(rv.to_string()));
        // registry Store.Update / deleteForEmptyFinalizers: the update that
        // removes the last finalizer of an object being deleted deletes it.
        if new.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null()) && finalizers(&new).is_empty() {
            inner.rv = rv - 1;
            inner.objects.insert(key.clone(), Entry { object: new.clone(), managers });
            return Ok(self.remove(&mut inner, kind, key));
        }
        inner.objects.insert(key, Entry { object: new.clone(), managers });
        self.emit(&mut inner, kind, EventType::Modified, write.namespace, new.clone(), Some(old));
        Ok(new)
    }

    /// Server-side apply: creates the object when absent (apply is an
    /// upsert), else merges the applied configuration with field ownership
    /// (see [`apply`]).
    pub fn apply(&self, write: &Write<'_>, applied: Value, force: bool) -> Result<Value, ApiError> {
        let kind = write.kind;
        let conflicts = |c: Vec<apply::ApplyConflict>| {
            let list = c.iter().map(|c| format!("conflict with \"{}\": {}", c.manager, c.field)).collect::<Vec<_>>();
            ApiError::conflict(
                kind,
                write.name,
                &format!("Apply failed with {} conflicts: {}", list.len(), list.join(", ")),
            )
        };
        let exists = self.lock().objects.contains_key(&Self::key(kind, write.namespace, write.name));
        if !exists {
            if write.status {
                return Err(ApiError::not_found(kind, write.name));
            }
            let mut managers = Managers::new();
            let mut object =
                apply::apply(&Value::Null, &mut managers, write.manager, &applied, force).map_err(conflicts)?;
            set_meta(&mut object, "name", json!(write.name));
            return match self.create_inner(kind, write.namespace, object, managers, write.manager) {
                // Lost a race with a concurrent create: apply onto it.
                Err(e) if e.reason == "AlreadyExists" => self.apply(write, applied, force),
                other => other,
            };
        }
        self.update(write, |current, managers| {
            let mut applied = applied.clone();
            if write.status
                && let Some(map) = applied.as_object_mut()
            {
                map.retain(|k, _| k == "status" || k == "metadata" || k == "apiVersion" || k == "kind");
            }
            apply::apply(current, managers, write.manager, &applied, force).map_err(conflicts)
        })
    }

    /// DELETE of one object. A precondition resourceVersion or uid must
    /// match (409 Conflict otherwise, like `Preconditions` in
    /// DeleteOptions). An object with finalizers is not removed: as the
    /// registry's `Store.Delete` (`updateForGracefulDeletionAndFinalizers`)
    /// does, it gets `deletionTimestamp` (once; a second DELETE changes
    /// nothing) and stays until an update removes its last finalizer.
    pub fn delete(
        &self,
        kind: &'static Kind,
        namespace: Option<&str>,
        name: &str,
        precondition_rv: Option<&str>,
        precondition_uid: Option<&str>,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let key = Self::key(kind, namespace, name);
        let entry = inner.objects.get(&key).ok_or_else(|| ApiError::not_found(kind, name))?;
        if precondition_rv.is_some_and(|rv| Some(rv) != meta_str(&entry.object, "resourceVersion")) {
            return Err(ApiError::conflict(kind, name, "Precondition failed: ResourceVersion does not match"));
        }
        if precondition_uid.is_some_and(|uid| Some(uid) != meta_str(&entry.object, "uid")) {
            return Err(ApiError::conflict(kind, name, "Precondition failed: UID in precondition does not match"));
        }
        if !finalizers(&entry.object).is_empty() {
            if entry.object.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null()) {
                return Ok(entry.object.clone());
            }
            let old = entry.object.clone();
            let managers = entry.managers.clone();
            let mut object = old.clone();
            set_meta(&mut object, "deletionTimestamp", json!(now()));
            set_meta(&mut object, "deletionGracePeriodSeconds", json!(0));
            let rv = inner.rv + 1;
            inner.rv = rv;
            set_meta(&mut object, "resourceVersion", json!(rv.to_string()));
            inner.objects.insert(key, Entry { object: object.clone(), managers });
            self.emit(&mut inner, kind, EventType::Modified, namespace, object.clone(), Some(old));
            return Ok(object);
        }
        Ok(self.remove(&mut inner, kind, key))
    }

    fn remove(&self, inner: &mut Inner, kind: &'static Kind, key: Key) -> Value {
        let Some(entry) = inner.objects.remove(&key) else { return Value::Null };
        let mut object = entry.object;
        let rv = inner.rv + 1;
        inner.rv = rv;
        // The DELETED event carries the object at the deletion's revision.
        set_meta(&mut object, "resourceVersion", json!(rv.to_string()));
        let namespace = (!key.1.is_empty()).then_some(key.1.as_str());
        self.emit(inner, kind, EventType::Deleted, namespace, object.clone(), None);
        object
    }

    /// DeleteCollection: deletes every match one by one (each its own
    /// revision and event, as the registry's `DeleteCollection` does).
    pub fn delete_collection(
        &self,
        kind: &'static Kind,
        namespace: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> Vec<Value> {
        let mut inner = self.lock();
        let keys: Vec<Key> = inner
            .objects
            .iter()
            .filter(|((plural, ns, _), e)| {
                *plural == kind.plural
                    && namespace.is_none_or(|n| n == ns)
                    && labels.matches(&e.object)
                    && fields.matches(&e.object)
            })
            .map(|(k, _)| k.clone())
            .collect();
        keys.into_iter().map(|key| self.remove(&mut inner, kind, key)).collect()
    }

    /// Registers a watch. Without a resourceVersion (or "0") the watch
    /// starts with the current objects as ADDED events ("Get State and
    /// Start at Most Recent" / "Start at Any"); with one it replays the
    /// events after it, or fails with 410 Expired when the history no
    /// longer reaches back that far. A version newer than the store's is
    /// served as "now" (the real server waits for it, then times out).
    pub fn watch(
        &self,
        kind: &'static Kind,
        namespace: Option<&str>,
        from: Option<&str>,
    ) -> Result<WatchStart, ApiError> {
        let inner = self.lock();
        let live = self.events.subscribe();
        let from = match from.filter(|rv| !rv.is_empty() && *rv != "0") {
            None => None,
            Some(rv) => Some(parse_rv(rv)?),
        };
        let in_scope = |plural: &str, ns: &str| plural == kind.plural && namespace.is_none_or(|n| n == ns);
        match from {
            None => Ok(WatchStart {
                initial: inner
                    .objects
                    .iter()
                    .filter(|((plural, ns, _), _)| in_scope(plural, ns))
                    .map(|(_, e)| e.object.clone())
                    .collect(),
                replay: Vec::new(),
                rv: inner.rv,
                live,
            }),
            // watch_cache.go: `if resourceVersion < oldest-1` →
            // NewResourceExpired("too old resource version: %d (%d)").
            Some(rv) if rv < inner.oldest_rv => Err(ApiError::expired(rv, inner.oldest_rv)),
            Some(rv) => Ok(WatchStart {
                initial: Vec::new(),
                replay: inner
                    .history
                    .iter()
                    .filter(|e| e.rv > rv && in_scope(e.kind.plural, &e.namespace))
                    .cloned()
                    .collect(),
                rv: inner.rv.max(rv),
                live,
            }),
        }
    }

    fn emit(
        &self,
        inner: &mut Inner,
        kind: &'static Kind,
        event: EventType,
        namespace: Option<&str>,
        object: Value,
        previous: Option<Value>,
    ) {
        let event = Arc::new(StoreEvent {
            kind,
            rv: inner.rv,
            event,
            namespace: namespace.unwrap_or_default().to_string(),
            object,
            previous,
        });
        inner.history.push_back(event.clone());
        trim(inner);
        // No receivers is fine: nobody watches.
        let _ = self.events.send(event);
    }
}

fn trim(inner: &mut Inner) {
    while inner.history.len() > inner.history_limit {
        if let Some(e) = inner.history.pop_front() {
            inner.oldest_rv = e.rv;
        }
    }
}

/// `metadata.finalizers`.
fn finalizers(object: &Value) -> Vec<String> {
    object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|f| f.as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

fn set_type(kind: &Kind, object: &mut Value) {
    if let Some(map) = object.as_object_mut() {
        map.insert("apiVersion".into(), json!(kind.api_version()));
        map.insert("kind".into(), json!(kind.kind));
    }
}

/// RFC 3339 with seconds, as metav1.Time serializes.
pub fn now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    k8s_openapi::jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(0))
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_string())
}

/// Five characters of the alphabet `names.SimpleNameGenerator` uses.
fn random_suffix(seed: u128, counter: u64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut x = (seed as u64) ^ counter.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..5)
        .map(|_| {
            x ^= x >> 33;
            x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
            x ^= x >> 29;
            ALPHABET.get((x % ALPHABET.len() as u64) as usize).map_or('x', |&b| b as char)
        })
        .collect()
}
