//! Why an allocation did not produce results: the claims do not fit
//! ([`AllocateError::Unsatisfiable`], retry elsewhere or later) or something
//! is wrong with the input ([`AllocateError::Fatal`], retrying cannot help
//! until a claim, class or slice changes), or the search ran out of its
//! budget ([`AllocateError::Undecided`], ask again). The scheduler makes the same cut:
//! "does not fit on this node" versus an error that aborts the pod's
//! scheduling attempt.

use super::explain::Explanation;

/// The outcome of a failed allocation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AllocateError {
    /// A complete search found no solution; the explanation says why.
    #[error("{0}")]
    Unsatisfiable(Box<Explanation>),
    /// Bad input or a selector error: no node can fix this.
    #[error(transparent)]
    Fatal(#[from] FatalError),
    /// The call's [`super::SearchBudget`] ran out before a node was found
    /// or all were ruled out: neither a yes nor a no.
    #[error(
        "claim {claim}: not decided within {within}: {searched} of {nodes} nodes searched, none fits so far (the claim's requests and constraints allow too many combinations to try)"
    )]
    Undecided { claim: String, within: String, searched: usize, nodes: usize },
}

impl AllocateError {
    pub fn is_fatal(&self) -> bool {
        matches!(self, Self::Fatal(_))
    }

    /// The explanation when the claims simply do not fit.
    pub fn explanation(&self) -> Option<&Explanation> {
        match self {
            Self::Unsatisfiable(e) => Some(e),
            Self::Fatal(_) | Self::Undecided { .. } => None,
        }
    }
}

/// Errors that abort an allocation whatever the node.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FatalError {
    /// A selector does not compile. `source` is `class <name>` or
    /// `request <name>`.
    #[error("claim {claim}: {source_ref}: selector #{index}: CEL compile error: {message}")]
    CelCompile { claim: String, source_ref: String, index: usize, message: String },
    /// A selector failed while evaluating an actual candidate device.
    #[error("claim {claim}: {source_ref}: selector #{index}: CEL runtime error on device {device}: {message}")]
    CelRuntime { claim: String, source_ref: String, index: usize, device: String, message: String },
    /// A claim names a DeviceClass that does not exist.
    #[error(
        "claim {claim}: request {request}: device class {class} not found; create it or fix spec.devices.requests[].deviceClassName"
    )]
    ClassNotFound { claim: String, request: String, class: String },
    /// A claim the API server would have rejected.
    #[error("claim {claim}: {field}: {reason}")]
    InvalidClaim { claim: String, field: String, reason: String },
    /// `allocationMode: All` while a pool it depends on is incomplete or
    /// invalid: the set of "all" devices is not known (upstream: "asks for
    /// all devices, but resource pool ... is currently being updated").
    #[error("claim {claim}: request {request}: asks for all devices, but resource pool {driver}/{pool} {problem}")]
    PoolNotReady { claim: String, request: String, driver: String, pool: String, problem: String },
    /// An `All` request whose devices a claim constraint cannot accept
    /// together: declaring such a claim makes no sense, upstream errors too.
    #[error(
        "claim {claim}, request {request}: cannot add device {device} because a claim constraint would not be satisfied"
    )]
    ConstraintWithAll { claim: String, request: String, device: String },
    /// A slice or device node selector that cannot be evaluated.
    #[error("{message}")]
    InvalidSlice { message: String },
    /// More than 32 device results for one claim (`AllocationResultsMaxSize`).
    #[error("claim {claim}: needs {results} devices, more than the maximum of {max} results per claim")]
    TooManyResults { claim: String, results: usize, max: usize },
    /// Bad input handed to the allocator itself.
    #[error(transparent)]
    Input(#[from] InputError),
}

/// Bad input to [`super::Allocator`] methods.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InputError {
    #[error("commit: {claims} claims but {results} allocation results; pass one result per claim")]
    ResultCount { claims: usize, results: usize },
    #[error("claim {claim}: status.allocation.devices.results[{index}].{field}: {reason}")]
    BadResult { claim: String, index: usize, field: &'static str, reason: String },
}
