//! (in progress) What is allocated, and to whom.
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};

use super::error::InputError;
use super::index::Fleet;

#[derive(Debug, Default)]
pub(crate) struct AllocatedState;

impl AllocatedState {
    pub(crate) fn record(
        &mut self,
        _fleet: &Fleet,
        _owner: &str,
        _result: &AllocationResult,
    ) -> Result<(), InputError> {
        Ok(())
    }
}

pub(crate) fn owner_of(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}
