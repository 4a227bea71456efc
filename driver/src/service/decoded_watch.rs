//! Watches that decode each object on its own.
//!
//! kube's typed watcher decodes a list as one document, so one object the
//! type cannot hold (a `numNodes` past `u32`, stored before the CRD had its
//! bound or under an older chart's CRD) fails every list: the watch never
//! syncs and no object of the kind is served. Here the watch is of untyped
//! objects ([`DynamicObject`], whose metadata the API server validated)
//! and [`Decoder`] turns each into `K` on its own. One that does not decode
//! is left out, as if absent (a decoded version seen before is deleted from
//! the caller's store), and recorded in [`Rejections`]: logged and counted
//! once per object, kept while the object stays undecodable, for its owner
//! to explain with an Event ([`Rejection::note`]).

use std::collections::{BTreeMap, BTreeSet};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use kube::Resource;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::watcher::Event;
use serde::de::DeserializeOwned;

use crate::echo;

/// An object that does not decode, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The field that failed, as a path (`spec.numNodes`); `.` for the
    /// object as a whole.
    pub field: String,
    /// What the decoder said of it.
    pub error: String,
}

impl Rejection {
    /// The Event reason: which part of the object is at fault.
    pub fn reason(&self) -> &'static str {
        if self.field.starts_with("spec") {
            "InvalidSpec"
        } else if self.field.starts_with("status") {
            "InvalidStatus"
        } else {
            "InvalidObject"
        }
    }

    /// `<kind> <namespace>/<name>` for logs and notes.
    pub fn object(&self, kind: &str) -> String {
        if self.namespace.is_empty() {
            format!("{kind} {}", self.name)
        } else {
            format!("{kind} {}/{}", self.namespace, self.name)
        }
    }

    /// The explanation: what is ignored, the field, the decoder's words
    /// (quoted, control characters escaped, cut) and `fix`.
    pub fn note(&self, kind: &str, fix: &str) -> String {
        format!(
            "{} cannot be read by the GPU DRA driver and is ignored: {}: {}. {fix}",
            self.object(kind),
            self.field,
            echo::quoted(&self.error)
        )
    }
}

/// The objects of one watch that do not decode now, by UID; shared by the
/// watch (writer) and its owner (reader).
#[derive(Debug, Clone, Default)]
pub struct Rejections(Arc<Mutex<BTreeMap<String, Rejection>>>);

impl Rejections {
    /// Every object undecodable now, in UID order.
    pub fn current(&self) -> Vec<Rejection> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Rejection>> {
        match self.0.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

/// The API resource of `K`, to watch it untyped.
pub fn api_resource<K: Resource<DynamicType = ()>>() -> ApiResource {
    ApiResource::erase::<K>(&())
}

/// Called once when an object is first found undecodable (for a metric).
pub type OnRejected = Box<dyn Fn(&Rejection) + Send + Sync>;

/// Untyped watch events → `K` events, one object at a time.
pub struct Decoder<K> {
    rejections: Rejections,
    on_rejected: OnRejected,
    /// UIDs seen since the last `Init`, while a (re)list runs: a rejected
    /// object not in the new list was deleted while the watch was away.
    listing: Option<BTreeSet<String>>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Decoder<K>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    pub fn new(rejections: Rejections, on_rejected: OnRejected) -> Self {
        Self { rejections, on_rejected, listing: None, kind: PhantomData }
    }

    /// The event for `K`'s watchers, or `None` when the object does not
    /// decode and nothing was known of it.
    pub fn decode(&mut self, event: Event<DynamicObject>) -> Option<Event<K>> {
        match event {
            Event::Init => {
                self.listing = Some(BTreeSet::new());
                Some(Event::Init)
            }
            Event::InitDone => {
                if let Some(listed) = self.listing.take() {
                    self.rejections.lock().retain(|uid, _| listed.contains(uid));
                }
                Some(Event::InitDone)
            }
            Event::InitApply(object) => {
                if let Some(listed) = self.listing.as_mut() {
                    listed.insert(object.metadata.uid.clone().unwrap_or_default());
                }
                // Left out of the list: the store replaces its content at
                // InitDone, so nothing stale of it stays.
                self.typed(&object).map(Event::InitApply)
            }
            Event::Apply(object) => match self.typed(&object) {
                Some(typed) => Some(Event::Apply(typed)),
                // A decoded version seen before must not stay in use.
                None => stub(&object).map(Event::Delete),
            },
            Event::Delete(object) => {
                let uid = object.metadata.uid.clone().unwrap_or_default();
                self.rejections.lock().remove(&uid);
                let gone = serde_json::to_value(&object).ok().and_then(|v| serde_json::from_value(v).ok());
                gone.or_else(|| stub(&object)).map(Event::Delete)
            }
        }
    }

    /// `object` as `K`, or `None` (recorded) when it does not decode.
    fn typed(&mut self, object: &DynamicObject) -> Option<K> {
        let uid = object.metadata.uid.clone().unwrap_or_default();
        let decoded = serde_json::to_value(object).map_err(|e| (".".to_owned(), e.to_string())).and_then(|value| {
            serde_path_to_error::deserialize::<_, K>(value).map_err(|e| (e.path().to_string(), e.inner().to_string()))
        });
        match decoded {
            Ok(typed) => {
                self.rejections.lock().remove(&uid);
                Some(typed)
            }
            Err((field, error)) => {
                let rejection = Rejection {
                    namespace: object.metadata.namespace.clone().unwrap_or_default(),
                    name: object.metadata.name.clone().unwrap_or_default(),
                    uid: uid.clone(),
                    field,
                    error,
                };
                let first = self.rejections.lock().insert(uid, rejection.clone()).is_none();
                if first {
                    tracing::warn!(
                        object = %rejection.object(&K::kind(&())),
                        field = %rejection.field,
                        error = %echo::quoted(&rejection.error),
                        "an object does not decode; it is ignored until it is fixed or deleted"
                    );
                    (self.on_rejected)(&rejection);
                }
                None
            }
        }
    }
}

/// `K` with only `object`'s identity (for a store's delete), when `K`
/// decodes from its type and metadata alone.
fn stub<K: Resource<DynamicType = ()> + DeserializeOwned>(object: &DynamicObject) -> Option<K> {
    let value = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": object.metadata,
    });
    serde_json::from_value(value).ok()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::json;

    use super::*;

    fn object(uid: &str, data: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"namespace": "ns", "name": format!("cm-{uid}"), "uid": uid},
            "data": data,
        }))
        .unwrap()
    }

    fn good(uid: &str) -> DynamicObject {
        object(uid, json!({"k": "v"}))
    }

    /// `data` values must be strings: a number does not decode.
    fn bad(uid: &str) -> DynamicObject {
        object(uid, json!({"k": 4_294_967_296_u64}))
    }

    fn name(event: &Option<Event<ConfigMap>>) -> String {
        match event {
            Some(Event::Apply(c)) => format!("apply {}", c.metadata.name.as_deref().unwrap_or_default()),
            Some(Event::InitApply(c)) => format!("init-apply {}", c.metadata.name.as_deref().unwrap_or_default()),
            Some(Event::Delete(c)) => format!("delete {}", c.metadata.name.as_deref().unwrap_or_default()),
            Some(Event::Init) => "init".into(),
            Some(Event::InitDone) => "init-done".into(),
            None => "none".into(),
        }
    }

    fn decoder() -> (Decoder<ConfigMap>, Rejections, Arc<AtomicUsize>) {
        let rejections = Rejections::default();
        let counted = Arc::new(AtomicUsize::new(0));
        let count = counted.clone();
        let decoder = Decoder::new(
            rejections.clone(),
            Box::new(move |_| {
                count.fetch_add(1, Ordering::Relaxed);
            }),
        );
        (decoder, rejections, counted)
    }

    #[test]
    fn a_list_with_one_bad_object_keeps_the_others_and_reports_it_once_across_relists() {
        let (mut decoder, rejections, counted) = decoder();
        for _ in 0..3 {
            let events: Vec<String> =
                [Event::Init, Event::InitApply(bad("b")), Event::InitApply(good("g")), Event::InitDone]
                    .into_iter()
                    .map(|e| name(&decoder.decode(e)))
                    .collect();
            assert_eq!(events, ["init", "none", "init-apply cm-g", "init-done"]);
        }
        assert_eq!(counted.load(Ordering::Relaxed), 1, "logged and counted once");
        let current = rejections.current();
        assert_eq!(current.len(), 1);
        let rejection = &current[0];
        assert_eq!((rejection.name.as_str(), rejection.field.as_str()), ("cm-b", "data.k"));
        assert_eq!(rejection.reason(), "InvalidObject");
        let note = rejection.note("ConfigMap", "Fix it.");
        assert!(note.starts_with("ConfigMap ns/cm-b cannot be read by the GPU DRA driver and is ignored: data.k: \"invalid type: integer `4294967296`"), "{note}");
        assert!(note.ends_with(". Fix it."), "{note}");
    }

    #[test]
    fn an_object_turned_bad_is_deleted_from_the_store_and_a_fixed_or_gone_one_forgotten() {
        let (mut decoder, rejections, counted) = decoder();
        assert_eq!(name(&decoder.decode(Event::Apply(good("a")))), "apply cm-a");
        assert_eq!(name(&decoder.decode(Event::Apply(bad("a")))), "delete cm-a");
        assert_eq!(rejections.current().len(), 1);
        assert_eq!(name(&decoder.decode(Event::Apply(good("a")))), "apply cm-a");
        assert!(rejections.current().is_empty(), "fixed");
        assert_eq!(name(&decoder.decode(Event::Apply(bad("a")))), "delete cm-a");
        assert_eq!(name(&decoder.decode(Event::Delete(bad("a")))), "delete cm-a");
        assert!(rejections.current().is_empty(), "deleted");
        assert_eq!(counted.load(Ordering::Relaxed), 2, "each time it turned bad");
        // Deleted while the watch was away: the next list forgets it.
        decoder.decode(Event::Apply(bad("z")));
        for event in [Event::Init, Event::InitApply(good("g")), Event::InitDone] {
            decoder.decode(event);
        }
        assert!(rejections.current().is_empty());
    }

    #[test]
    fn control_characters_in_the_error_are_escaped() {
        let rejection = Rejection {
            namespace: "ns".into(),
            name: "n".into(),
            uid: "u".into(),
            field: "spec.x".into(),
            error: "unknown variant `\u{1b}[31mred`".into(),
        };
        let note = rejection.note("ComputeDomain", "");
        assert!(!note.contains('\u{1b}') && note.contains("\\u{1b}"), "{note}");
        assert_eq!(rejection.reason(), "InvalidSpec");
    }
}
