//! A claim's failure as the preparer hands it out: what the kubelet reads
//! and the kind metrics count it by. A leaf, so that the claim's outcome
//! ([`super::types::ClaimError`]) and every step of a prepare read it
//! without a circle through the undo errors.

use crate::observe::metrics::ErrorKind;

/// A claim's failure: the text for the kubelet and its kind for metrics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    pub kind: ErrorKind,
    pub message: String,
}

/// Tags an error with its kind: `result.map_err(kind(ErrorKind::Cdi))`.
pub(super) fn kind<E: ToString>(kind: ErrorKind) -> impl FnOnce(E) -> Failure {
    move |error| Failure { kind, message: error.to_string() }
}
