//! API errors as the real server reports them: a `v1.Status` body with the
//! HTTP code, a machine-readable `reason` and `details` (apimachinery
//! `pkg/api/errors/errors.go`).

use serde_json::{Value, json};

use super::kinds::Kind;

/// A failed request, rendered as a `Status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// `(name, group, kind)` for `details`, when the error is about one object.
    pub details: Option<(String, &'static str, &'static str)>,
}

impl ApiError {
    /// `NewNotFound`: `resourceslices.resource.k8s.io "x" not found`.
    pub fn not_found(kind: &Kind, name: &str) -> Self {
        Self {
            code: 404,
            reason: "NotFound",
            message: format!("{} \"{name}\" not found", kind.qualified()),
            details: Some((name.to_string(), kind.group, kind.plural)),
        }
    }

    /// `NewAlreadyExists` (409) on create of an existing name.
    pub fn already_exists(kind: &Kind, name: &str) -> Self {
        Self {
            code: 409,
            reason: "AlreadyExists",
            message: format!("{} \"{name}\" already exists", kind.qualified()),
            details: Some((name.to_string(), kind.group, kind.plural)),
        }
    }

    /// `NewConflict` (409) with the optimistic-concurrency message of
    /// `registry/generic/registry/store.go` (`OptimisticLockErrorMsg`).
    pub fn conflict(kind: &Kind, name: &str, why: &str) -> Self {
        Self {
            code: 409,
            reason: "Conflict",
            message: format!("Operation cannot be fulfilled on {} \"{name}\": {why}", kind.qualified()),
            details: Some((name.to_string(), kind.group, kind.plural)),
        }
    }

    pub fn stale(kind: &Kind, name: &str) -> Self {
        Self::conflict(
            kind,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// `NewInvalid` (422) listing field errors.
    pub fn invalid(kind: &Kind, name: &str, causes: &str) -> Self {
        Self {
            code: 422,
            reason: "Invalid",
            message: format!("{} \"{name}\" is invalid: {causes}", kind.kind),
            details: Some((name.to_string(), kind.group, kind.plural)),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self { code: 400, reason: "BadRequest", message: message.into(), details: None }
    }

    /// `NewResourceExpired` (410): what the watch cache answers for a
    /// resourceVersion older than its history.
    pub fn expired(requested: u64, oldest: u64) -> Self {
        Self {
            code: 410,
            reason: "Expired",
            message: format!("too old resource version: {requested} ({oldest})"),
            details: None,
        }
    }

    pub fn method_not_allowed(method: &str) -> Self {
        Self {
            code: 405,
            reason: "MethodNotAllowed",
            message: format!("the server does not allow this method on the requested resource: {method}"),
            details: None,
        }
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self {
            code: 415,
            reason: "UnsupportedMediaType",
            message: format!("the body of the request was in an unknown format: {content_type}"),
            details: None,
        }
    }

    /// A fault a test injected.
    pub fn injected(code: u16) -> Self {
        Self {
            code,
            reason: match code {
                403 => "Forbidden",
                409 => "Conflict",
                503 => "ServiceUnavailable",
                _ => "InternalError",
            },
            message: format!("injected fault: HTTP {code}"),
            details: None,
        }
    }

    /// The `Status` object.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let (Some((name, group, kind)), Some(map)) = (&self.details, status.as_object_mut()) {
            map.insert("details".into(), json!({"name": name, "group": group, "kind": kind}));
        }
        status
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}
