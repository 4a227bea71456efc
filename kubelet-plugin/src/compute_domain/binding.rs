//! Binding conditions of channels: the domain's IMEX daemon on this node is
//! started and ready *before* the pod is bound, not at prepare.
//!
//! A channel device carries the binding condition `Ready` and the failure
//! condition `ImexDaemonFailed` ([`gpu_dra_driver::compute_domain::devices`]).
//! With `DRADeviceBindingConditions` (beta and on since 1.36) the
//! kube-scheduler writes the allocation, then waits in PreBind (polling
//! every 5 s, up to its `bindingTimeout`, 10 min by default) until the
//! channel's entry in the claim's `status.devices` has `Ready` true, or
//! gives the allocation up when `ImexDaemonFailed` is true
//! (`pkg/scheduler/framework/plugins/dynamicresources`,
//! `isClaimReadyForBinding`). Releases or gates that drop the fields from
//! the slice never wait, and the prepare brings the daemon up as before.
//!
//! Each pass (the health loop's interval) takes the domains whose status
//! lists this node as not ready (the controller adds a node when a channel
//! is allocated there, ready only once all its channels say so: a domain
//! that runs costs no API call), lists each domain's claims by the label
//! its template puts on them, and for a channel allocated here and not yet decided: records the
//! claim (`PrepareStarted`, so a restart rolls it back and nothing it
//! started outlives it), starts or tells the daemon, and writes `Ready`
//! once `nvidia-imex-ctl` answers READY. A node that cannot serve the
//! domain (a host daemon without its nodes, a config the agent refuses, a
//! daemon not ready within `--imex-ready-timeout-ms`) gets
//! `ImexDaemonFailed` with the reason, and what was started for the claim
//! is released. A record whose claim went away or lost its allocation
//! here is released too. The kubelet's prepare then finds the daemon ready.
//!
//! A channel claim made by hand (not from the domain's template) must carry
//! the template's label (`resource.nvidia.com/computeDomain: <domain UID>`)
//! to be found here; without it the scheduler waits until its timeout.

use std::collections::HashMap;

use gpu_dra_driver::compute_domain::api::ComputeDomain;
use gpu_dra_driver::compute_domain::binding::{self, allocated_here};
use gpu_dra_driver::compute_domain::devices::CHANNEL_DEVICE;
use gpu_dra_driver::compute_domain::imex::DaemonState;
use gpu_dra_driver::names::ClaimUid;
use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::time::Instant;

use super::channel_claim::ChannelClaim;
use super::claim_plan;
use super::cluster::{ConditionWriter, DomainLookup};
use super::imex_server::Server;
use super::preparer::DomainPreparer;
use crate::prepare::types::ClaimSource;
use crate::state::checkpoint::{ClaimRecord, PrepareState};

/// What the passes remember: when each waiting claim was first seen (its
/// daemon's readiness deadline runs from there), and the last listing
/// error (logged once until it changes).
#[derive(Debug, Default)]
pub struct BindingState {
    first_seen: HashMap<String, Instant>,
    last_error: Option<super::error::LookupError>,
}

/// What one waiting claim came to in a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Ready,
    Waiting,
    Failed(String),
}

impl<S: ClaimSource, D: DomainLookup, W: ConditionWriter> DomainPreparer<S, D, W> {
    /// One pass (see the module's documentation).
    pub(crate) async fn binding_pass(&self, state: &mut BindingState) {
        let node = self.node().to_owned();
        let mut waiting: Vec<(ComputeDomain, ResourceClaim)> = Vec::new();
        let mut error = None;
        for domain in self.domains.listing(&node) {
            let (Some(namespace), Some(uid)) = (domain.metadata.namespace.clone(), domain.metadata.uid.clone()) else {
                continue;
            };
            match self.domains.claims_of(&namespace, &uid).await {
                Ok(claims) => waiting.extend(
                    claims.into_iter().filter(|c| binding::waits_for_binding(c, &node)).map(|c| (domain.clone(), c)),
                ),
                Err(e) => error = Some(e),
            }
        }
        if error != state.last_error {
            if let Some(error) = &error {
                tracing::warn!(%error, "cannot list the claims of a ComputeDomain to ready their channels for binding; retrying every pass, logged again only if the error changes");
            }
            state.last_error = error;
        }
        // Not while a prepare or unprepare runs: they share the daemons.
        let Ok(_guard) = self.lock.try_lock() else { return };
        self.release_abandoned().await;
        let mut seen = Vec::new();
        for (domain, claim) in &waiting {
            let Some(uid) = claim.metadata.uid.clone() else { continue };
            let since = *state.first_seen.entry(uid.clone()).or_insert_with(Instant::now);
            seen.push(uid);
            let outcome = self.ready_ahead(domain, claim, since).await;
            self.tell_scheduler(domain, claim, &outcome).await;
        }
        state.first_seen.retain(|uid, _| seen.contains(uid));
    }

    /// Brings the claim's daemon up, recording the claim first.
    async fn ready_ahead(&self, domain: &ComputeDomain, claim: &ResourceClaim, since: Instant) -> Outcome {
        let node = self.node();
        let Some(uid) = claim.metadata.uid.as_deref().and_then(|u| ClaimUid::new(u).ok()) else {
            return Outcome::Failed("the claim has no valid UID".into());
        };
        let plan = match claim_plan::plan(claim, self.config.driver.as_str(), node) {
            Ok(plan) => plan,
            Err(error) => return Outcome::Failed(error.to_string()),
        };
        let domain_name = format!(
            "{}/{}",
            claim.metadata.namespace.as_deref().unwrap_or_default(),
            domain.metadata.name.as_deref().unwrap_or_default()
        );
        // The label found the claim; its config says which domain it joins.
        if domain.metadata.uid.as_deref() != Some(plan.domain.domain_uid.as_str()) {
            return Outcome::Failed(format!(
                "the claim carries the label of ComputeDomain {domain_name} but its ComputeDomainChannelConfig names domain {}: make them agree",
                plan.domain.domain_uid
            ));
        }
        match self.record_of(&uid) {
            Ok(Some(_)) => {}
            Ok(None) => {
                let record = ClaimRecord {
                    uid: uid.to_string(),
                    namespace: claim.metadata.namespace.clone().unwrap_or_default(),
                    name: claim.metadata.name.clone().unwrap_or_default(),
                    state: PrepareState::PrepareStarted,
                    boot_id: self.config.boot_id.clone(),
                    cdi_spec_file: None,
                    devices: Vec::new(),
                    mps: None,
                    compute_domain: Some(plan.domain.clone()),
                    adopted: None,
                };
                if let Err(error) = self.checkpoint.write(&uid, &record) {
                    return Outcome::Failed(format!("recording the claim: {error}"));
                }
            }
            Err(error) => return Outcome::Failed(error.to_string()),
        }
        let domain_uid = &plan.domain.domain_uid;
        let Some(peers) = self.peers(domain) else { return Outcome::Waiting };
        let server = match self.server(domain_uid, &peers, &domain_name) {
            Ok(server) => server,
            Err(error) => return self.give_up(&uid, error.to_string()),
        };
        if let Server::Own = server
            && let Err(error) = self.daemons.ensure(domain_uid, &peers)
        {
            return self.give_up(&uid, error.to_string());
        }
        let answer = self.query(domain_uid, &server).await;
        self.states.lock().unwrap_or_else(|p| p.into_inner()).insert(domain_uid.to_string(), answer.clone());
        match answer {
            DaemonState::Ready => Outcome::Ready,
            DaemonState::NotReady(answer) if since.elapsed() >= self.config.ready_timeout => self.give_up(
                &uid,
                format!(
                    "the IMEX daemon of ComputeDomain {domain_name} on node {node} did not become ready in {:?} (nvidia-imex-ctl: {answer}); see {}",
                    self.config.ready_timeout,
                    self.daemons.log_file(domain_uid).display()
                ),
            ),
            DaemonState::NotReady(_) => Outcome::Waiting,
        }
    }

    /// Releases what was started for the claim, and fails it.
    fn give_up(&self, uid: &ClaimUid, reason: String) -> Outcome {
        if let Err(error) = self.release(uid) {
            tracing::warn!(claim = %uid, %error, "cannot release a channel readied for binding; start-up retries it");
        }
        Outcome::Failed(reason)
    }

    /// Writes the binding condition or the failure condition.
    async fn tell_scheduler(&self, domain: &ComputeDomain, claim: &ResourceClaim, outcome: &Outcome) {
        let (namespace, name, uid) = (
            claim.metadata.namespace.as_deref().unwrap_or_default(),
            claim.metadata.name.as_deref().unwrap_or_default(),
            claim.metadata.uid.as_deref().unwrap_or_default(),
        );
        match outcome {
            Outcome::Waiting => {}
            Outcome::Ready => {
                // Ready only when the claim's config names this domain.
                let domain_uid = domain.metadata.uid.as_deref().unwrap_or_default();
                let channel = ChannelClaim { namespace, name, uid, domain_uid, device: CHANNEL_DEVICE };
                if self.write_ready(&channel, &DaemonState::Ready).await {
                    tracing::info!(claim = %format!("{namespace}/{name}"), "channel ready for binding: the IMEX daemon answers READY");
                }
            }
            Outcome::Failed(reason) => {
                tracing::warn!(claim = %format!("{namespace}/{name}"), %reason, "this node cannot serve the channel; telling the scheduler to place the pod again");
                if let Err(error) = self.conditions.fail_binding(namespace, name, reason).await {
                    tracing::warn!(claim = %format!("{namespace}/{name}"), %error, "cannot write the channel's binding failure; retried next pass");
                }
            }
        }
    }

    /// Releases records of claims readied for binding that went away or
    /// lost their allocation here (the scheduler gave the allocation up).
    /// Under the prepare lock, a `PrepareStarted` record is one of these:
    /// a prepare's own is completed or rolled back before it lets go.
    async fn release_abandoned(&self) {
        let Ok(records) = self.records() else { return };
        for record in records.iter().filter(|r| r.state == PrepareState::PrepareStarted) {
            let Ok(uid) = ClaimUid::new(record.uid.as_str()) else { continue };
            let until = Instant::now() + super::serving::CLAIM_CHECK_TIMEOUT;
            let abandoned = match self.claims.get(&record.namespace, &record.name, until).await {
                Ok(None) => true,
                Ok(Some(claim)) => {
                    claim.metadata.uid.as_deref() != Some(record.uid.as_str()) || !allocated_here(&claim, self.node())
                }
                Err(_) => false,
            };
            if abandoned {
                tracing::info!(claim = %format!("{}/{}", record.namespace, record.name), "releasing a channel readied for binding: its claim is gone or no longer allocated here");
                if let Err(error) = self.release(&uid) {
                    tracing::warn!(claim = %uid, %error, "cannot release; retrying next pass");
                }
            }
        }
    }
}
