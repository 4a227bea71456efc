//! Domain types of a prepare call. The gRPC edge converts protobuf to and
//! from these, so the preparer never sees protobuf types.

use std::future::Future;
use std::sync::Arc;

use gpu_dra_driver::k8s_format;
use gpu_dra_driver::names::{ClaimUid, InvalidName};
use k8s_openapi::api::resource::v1::ResourceClaim;

use super::failure::Failure;
use crate::prepared::PreparedDevice;

/// A claim as the kubelet names it; raw, [`ClaimRef::validate`] checks it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// A claim reference whose parts are safe to use: the UID in a path, the
/// namespace and name in an API request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ValidClaim {
    pub uid: ClaimUid,
    pub namespace: String,
    pub name: String,
}

impl ClaimRef {
    /// Checks the UID (RFC 4122, lower case), the namespace (DNS label) and
    /// the name (DNS subdomain) before any of them touches a path or a URL.
    pub fn validate(&self) -> Result<ValidClaim, InvalidName> {
        let uid = ClaimUid::new(self.uid.as_str())?;
        k8s_format::check_dns1123_label(&self.namespace).map_err(|rule| InvalidName {
            kind: "claim namespace",
            value: self.namespace.clone(),
            rule: rule.to_string(),
        })?;
        k8s_format::check_dns1123_subdomain(&self.name).map_err(|rule| InvalidName {
            kind: "claim name",
            value: self.name.clone(),
            rule: rule.to_string(),
        })?;
        Ok(ValidClaim { uid, namespace: self.namespace.clone(), name: self.name.clone() })
    }
}

impl std::fmt::Display for ValidClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// A claim's result: its devices, or why it failed.
pub type ClaimOutcome = Result<Vec<PreparedDevice>, ClaimError>;

/// Why one claim of a batch failed. Its text is the claim's `error` in the
/// kubelet's answer, made only at the gRPC edge.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClaimError {
    /// The GPU preparer's, counted in metrics by its kind.
    #[error(transparent)]
    Failed(#[from] Failure),
    /// Another service's (the ComputeDomain preparer's, a test's).
    #[error(transparent)]
    Service(Arc<dyn std::error::Error + Send + Sync>),
    /// The batch gave no result for the claim (the operation named).
    #[error("internal error: the driver returned no {0} result for this claim")]
    NoResult(&'static str),
}

impl ClaimError {
    /// Another service's error, kept whole (its text and its sources).
    pub fn service(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        ClaimError::Service(Arc::from(error.into()))
    }
}

/// Two claim errors are the same when the kubelet reads the same text.
impl PartialEq for ClaimError {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

/// Where the preparer reads ResourceClaims: the API server in production
/// ([`crate::prepare::claims::KubeClaimSource`]), a map in tests.
pub trait ClaimSource: Send + Sync + 'static {
    /// Why a claim could not be read; its text is shown to the kubelet as is.
    type Error: std::fmt::Display + Send + 'static;

    /// The claim, `None` when it does not exist; gives up at `deadline`.
    fn get(
        &self,
        namespace: &str,
        name: &str,
        deadline: tokio::time::Instant,
    ) -> impl Future<Output = Result<Option<ResourceClaim>, Self::Error>> + Send;

    /// Drops any cached copy (called when the cached copy's UID is stale).
    fn forget(&self, namespace: &str, name: &str);
}

impl ClaimSource for crate::prepare::claims::KubeClaimSource {
    type Error = crate::prepare::claims::ClaimLookupError;

    async fn get(
        &self,
        namespace: &str,
        name: &str,
        deadline: tokio::time::Instant,
    ) -> Result<Option<ResourceClaim>, Self::Error> {
        crate::prepare::claims::KubeClaimSource::get(self, namespace, name, deadline).await
    }

    fn forget(&self, namespace: &str, name: &str) {
        crate::prepare::claims::KubeClaimSource::forget(self, namespace, name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(namespace: &str, name: &str, uid: &str) -> ClaimRef {
        ClaimRef { namespace: namespace.into(), name: name.into(), uid: uid.into() }
    }

    #[test]
    fn valid_claims_pass() {
        let c = claim("default", "train-0.gpu", "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a").validate().unwrap();
        assert_eq!(c.to_string(), "default/train-0.gpu (0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a)");
    }

    #[test]
    fn each_part_is_checked_and_named() {
        let uid = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
        let e = claim("default", "c", "../../etc/passwd").validate().unwrap_err();
        assert_eq!(e.kind, "claim UID");
        let e = claim("Default", "c", uid).validate().unwrap_err();
        assert_eq!(e.kind, "claim namespace");
        let e = claim("default", "a/b", uid).validate().unwrap_err();
        assert_eq!(e.kind, "claim name");
        assert!(e.to_string().contains("\"a/b\""), "{e}");
    }
}
