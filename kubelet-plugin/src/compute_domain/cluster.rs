//! The cluster as the ComputeDomain preparer reaches it: where it finds
//! domains ([`DomainLookup`]) and how it writes claim conditions
//! ([`ConditionWriter`]); a kube client in `run`, maps in tests. Apart from
//! `mod.rs` so the preparer's parts read them as siblings.

use gpu_dra_driver::compute_domain::api::ComputeDomain;
use gpu_dra_driver::compute_domain::imex::DaemonState;

use super::error::LookupError;
use crate::claim_status::refusal::{EventError, Explanation};
use crate::claim_status::write::ConditionError;

/// Where the agent finds ComputeDomains (a reflector store in `run`, a map
/// in tests): the domain with `uid` in `namespace`.
pub trait DomainLookup: Send + Sync + 'static {
    fn find(&self, namespace: &str, uid: &str) -> Option<ComputeDomain>;

    /// Whether the lookup has heard the API's whole list once (a domain
    /// it lacks before then may just not have arrived yet).
    fn synced(&self) -> bool {
        true
    }

    /// The domain as the API server has it now, for one the lookup lacks
    /// although it has listed: a watch may deliver a domain made moments
    /// ago after its claim is already allocated and being prepared (seen
    /// on a loaded machine). `Ok(None)` when the API has no such domain
    /// either; an error when the API server could not be read (the prepare
    /// then says so, rather than that the domain was deleted).
    fn read_live(
        &self,
        namespace: &str,
        uid: &str,
    ) -> impl std::future::Future<Output = Result<Option<ComputeDomain>, LookupError>> + Send {
        std::future::ready(Ok(self.find(namespace, uid)))
    }

    /// The domains whose status lists `node` as not ready (a channel of
    /// theirs allocated there may wait for binding), for readying channels
    /// before binding.
    fn listing(&self, node: &str) -> Vec<ComputeDomain>;

    /// The claims of the domain with `uid` in `namespace`: those carrying
    /// the label its template puts on them. An error when the API server
    /// could not be read.
    fn claims_of(
        &self,
        namespace: &str,
        uid: &str,
    ) -> impl std::future::Future<Output = Result<Vec<k8s_openapi::api::resource::v1::ResourceClaim>, LookupError>> + Send;
}

/// Writes the `Ready` condition of a prepared device on its claim, and
/// the Event that explains why the API server refuses it.
pub trait ConditionWriter: Send + Sync + 'static {
    fn set_ready(
        &self,
        namespace: &str,
        name: &str,
        device: &str,
        state: &DaemonState,
    ) -> impl std::future::Future<Output = Result<(), ConditionError>> + Send;

    fn explain(&self, explanation: &Explanation) -> impl std::future::Future<Output = Result<(), EventError>> + Send;

    /// Sets the binding failure condition of this node's channel with
    /// `reason`: the scheduler gives the allocation up ([`super::binding`]).
    fn fail_binding(
        &self,
        namespace: &str,
        name: &str,
        reason: &str,
    ) -> impl std::future::Future<Output = Result<(), ConditionError>> + Send;
}
