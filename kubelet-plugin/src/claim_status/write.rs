//! Writing a claim's `status.devices` without clobbering other writers:
//! read the claim, edit the list, write it back with the read's
//! resourceVersion (the API server answers 409 when someone wrote in
//! between); a conflict reads again, at most [`ATTEMPTS`] times. Every
//! call goes through the agent's client and its timeouts.

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::PostParams;

use gpu_dra_driver::claim_status::bounded_message;

/// Reads-and-writes tried before a claim that keeps changing is given up.
pub const ATTEMPTS: usize = 3;

/// Why a condition write failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConditionError {
    /// An answer retrying does not change: someone must fix RBAC or an
    /// admission rule.
    #[error("{action}: the API server refused it with HTTP {code} {reason}: {message}")]
    Refused { action: String, code: u16, reason: String, message: String },
    /// Anything else (unreachable, a server error, a conflict that kept on).
    #[error("{0}")]
    Failed(String),
}

impl ConditionError {
    /// Sorts a client error of `action` into a refusal or a failure; the
    /// server's words are escaped and bounded here, once (they reach logs
    /// and Events).
    pub fn from_kube(action: String, error: kube::Error) -> Self {
        match error {
            kube::Error::Api(status) if is_permanent(status.code) => Self::Refused {
                action,
                code: status.code,
                reason: bounded_message(&status.reason),
                message: bounded_message(&status.message),
            },
            other => Self::Failed(bounded_message(&format!("{action}: {other}"))),
        }
    }
}

/// A 4xx that a retry cannot cure (not a missing claim, a timeout, a
/// conflict or throttling).
pub fn is_permanent(code: u16) -> bool {
    (400..500).contains(&code) && ![404, 408, 409, 429].contains(&code)
}

/// Applies `edit` to the claim `namespace/name` and writes its status
/// (`resourceclaims/status`, update); `edit` answers `None` when the
/// claim already says what it would write, and nothing is written. A
/// claim that is gone has no status to write: that is no error.
pub async fn edit_status(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    edit: impl Fn(&ResourceClaim) -> Option<ResourceClaim>,
) -> Result<(), ConditionError> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace);
    for _ in 0..ATTEMPTS {
        let claim = api
            .get_opt(name)
            .await
            .map_err(|e| ConditionError::from_kube(format!("reading claim {namespace}/{name}"), e))?;
        let Some(updated) = claim.as_ref().and_then(&edit) else { return Ok(()) };
        match api.replace_status(name, &PostParams::default(), &updated).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(e) => {
                return Err(ConditionError::from_kube(format!("writing the status of claim {namespace}/{name}"), e));
            }
        }
    }
    Err(ConditionError::Failed(format!("claim {namespace}/{name} kept changing while its status was written")))
}
