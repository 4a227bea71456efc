//! How simulate names a namespaced object: `namespace/name`, the namespace
//! defaulted as the apiserver defaults it. Every module that matches
//! references (a pod's claims, a workload's pods) keys objects this way.

/// Namespace of namespaced objects that do not name one, as `kubectl apply`.
pub const DEFAULT_NAMESPACE: &str = "default";

/// `namespace/name` of a namespaced object (namespace defaulted).
pub fn key(namespace: Option<&str>, name: &str) -> String {
    format!("{}/{name}", namespace.unwrap_or(DEFAULT_NAMESPACE))
}
