//! The API edges of the ComputeDomain side: domains from a reflector
//! store, and each prepared device's `Ready` condition on its claim
//! (`status.devices`, which the controller reads for the domain's status),
//! with the Warning Event that explains a refused write.

use gpu_dra_driver::compute_domain::api::ComputeDomain;
use gpu_dra_driver::compute_domain::binding::with_binding_failure;
use gpu_dra_driver::compute_domain::imex::DaemonState;
use gpu_dra_driver::compute_domain::{DOMAIN_LABEL, DRIVER_NAME};
use gpu_dra_driver::service::decoded_watch;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{DynamicObject, ListParams};
use kube::runtime::reflector::Store;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::cluster::{ConditionWriter, DomainLookup};
use super::error::LookupError;
use crate::claim_status::refusal::{EventError, Explanation, post_event};
use crate::claim_status::write::{ConditionError, edit_status};
use gpu_dra_driver::claim_status::{EntryKey, Readiness, entry_mut, set_ready};

/// Domains as a reflector store holds them, and as the API server has
/// them for one the store lacks.
pub struct StoreDomains {
    pub store: Store<ComputeDomain>,
    /// Set once the store has its first complete list.
    pub synced: Arc<AtomicBool>,
    /// The client the live read lists a namespace's domains with.
    client: kube::Client,
}

impl StoreDomains {
    /// The lookup over `store`, marked synced when the store is ready.
    pub fn new(store: Store<ComputeDomain>, client: kube::Client) -> Self {
        let synced = Arc::new(AtomicBool::new(false));
        let (flag, waiting) = (synced.clone(), store.clone());
        tokio::spawn(async move {
            if waiting.wait_until_ready().await.is_ok() {
                flag.store(true, Ordering::Release);
            }
        });
        Self { store, synced, client }
    }
}

impl DomainLookup for StoreDomains {
    fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    fn find(&self, namespace: &str, uid: &str) -> Option<ComputeDomain> {
        self.store
            .state()
            .iter()
            .find(|d| d.metadata.namespace.as_deref() == Some(namespace) && d.metadata.uid.as_deref() == Some(uid))
            .map(|d| (**d).clone())
    }

    /// One list of the namespace's domains (a consistent read, through
    /// the agent's client and its timeouts), each decoded on its own as
    /// the watch does; a failed list reads as "not there", the answer the
    /// store gave.
    async fn read_live(&self, namespace: &str, uid: &str) -> Result<Option<ComputeDomain>, LookupError> {
        let resource = decoded_watch::api_resource::<ComputeDomain>();
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, &resource);
        let listed = api.list(&ListParams::default()).await.map_err(|error| {
            tracing::warn!(%error, namespace, uid, "listing ComputeDomains for one the watch has not delivered");
            LookupError::ListFailed {
                what: format!("ComputeDomains in {namespace}"),
                reason: error.to_string().escape_debug().to_string(),
            }
        })?;
        let Some(object) = listed.items.into_iter().find(|d| d.metadata.uid.as_deref() == Some(uid)) else {
            return Ok(None);
        };
        let domain =
            serde_json::to_value(object).and_then(serde_json::from_value::<ComputeDomain>).map_err(|error| {
                LookupError::Undecodable {
                    uid: uid.to_owned(),
                    namespace: namespace.to_owned(),
                    reason: error.to_string(),
                }
            })?;
        tracing::info!(namespace, uid, "ComputeDomain read from the API: the watch had not delivered it yet");
        Ok(Some(domain))
    }

    fn listing(&self, node: &str) -> Vec<ComputeDomain> {
        self.store
            .state()
            .iter()
            .filter(|d| gpu_dra_driver::compute_domain::binding::lists_node_not_ready(d, node))
            .map(|d| (**d).clone())
            .collect()
    }

    /// One list of the namespace's claims with the domain's label, through
    /// the agent's client and its timeouts.
    async fn claims_of(&self, namespace: &str, uid: &str) -> Result<Vec<ResourceClaim>, LookupError> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        let selector = format!("{DOMAIN_LABEL}={uid}");
        let listed =
            api.list(&ListParams::default().labels(&selector)).await.map_err(|error| LookupError::ListFailed {
                what: format!("ResourceClaims in {namespace} ({selector})"),
                reason: error.to_string().escape_debug().to_string(),
            })?;
        Ok(listed.items)
    }
}

/// Writes conditions through the API server as this node.
pub struct KubeConditions {
    pub client: kube::Client,
    pub node: String,
}

/// The claim's `status.devices` with `device`'s `Ready` condition set to
/// `state` (other entries, other drivers' above all, kept); `None` when it
/// already says so.
pub fn with_condition(claim: &ResourceClaim, node: &str, device: &str, state: &DaemonState) -> Option<ResourceClaim> {
    let readiness = match state {
        DaemonState::Ready => Readiness {
            ready: true,
            reason: "ImexDaemonReady",
            message: "the node's IMEX daemon for this ComputeDomain is ready".to_owned(),
        },
        DaemonState::NotReady(answer) => Readiness {
            ready: false,
            reason: "ImexDaemonNotReady",
            message: format!("the node's IMEX daemon is not ready: {answer}"),
        },
    };
    let mut claim = claim.clone();
    let generation = claim.metadata.generation;
    let devices = claim.status.get_or_insert_default().devices.get_or_insert_default();
    let key = EntryKey { driver: DRIVER_NAME, pool: node, device, share_id: None };
    set_ready(entry_mut(devices, &key), &readiness, generation).then_some(claim)
}

impl ConditionWriter for KubeConditions {
    async fn fail_binding(&self, namespace: &str, name: &str, reason: &str) -> Result<(), ConditionError> {
        edit_status(&self.client, namespace, name, |claim| with_binding_failure(claim, &self.node, reason)).await
    }

    async fn set_ready(
        &self,
        namespace: &str,
        name: &str,
        device: &str,
        state: &DaemonState,
    ) -> Result<(), ConditionError> {
        edit_status(&self.client, namespace, name, |claim| with_condition(claim, &self.node, device, state)).await
    }

    async fn explain(&self, explanation: &Explanation) -> Result<(), EventError> {
        post_event(&self.client, &self.node, explanation).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client of a server that answers every request with `status` and a
    /// Status whose message holds an escape sequence.
    fn failing_client(status: u16) -> kube::Client {
        let service = tower::service_fn(move |_: http::Request<kube::client::Body>| async move {
            let body = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"etcd \u001b[2J unavailable","code":500}"#;
            http::Response::builder().status(status).body(kube::client::Body::from(body.to_vec()))
        });
        kube::Client::new(service, "default")
    }

    #[tokio::test]
    async fn a_failing_api_server_is_reported_as_such_not_as_a_deleted_domain() {
        let (store, _writer) = kube::runtime::reflector::store::<ComputeDomain>();
        let domains = StoreDomains::new(store, failing_client(500));
        let error = domains.read_live("default", "7f3c").await.unwrap_err().to_string();
        assert!(error.contains("listing ComputeDomains in default"), "{error}");
        assert!(!error.contains('\u{1b}'), "the server's text is escaped: {error}");
    }

    #[test]
    fn the_condition_is_set_once_and_flips() {
        let claim = ResourceClaim::default();
        let ready = with_condition(&claim, "n1", "channel-0", &DaemonState::Ready).unwrap();
        let entry = &ready.status.as_ref().unwrap().devices.as_ref().unwrap()[0];
        assert_eq!(
            (entry.driver.as_str(), entry.pool.as_str(), entry.device.as_str()),
            (DRIVER_NAME, "n1", "channel-0")
        );
        assert_eq!(entry.conditions.as_ref().unwrap()[0].status, "True");
        assert!(with_condition(&ready, "n1", "channel-0", &DaemonState::Ready).is_none());
        let down = with_condition(&ready, "n1", "channel-0", &DaemonState::NotReady("NOT_READY".into())).unwrap();
        let conditions = down.status.unwrap().devices.unwrap()[0].conditions.clone().unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].status, "False");
        assert!(conditions[0].message.contains("NOT_READY"));
    }
}
