//! Which `nvidia-imex` serves a domain on this node: the agent's own, or
//! a host-managed one ([`super::host_imex`]); starting the agent's own
//! again after a restart; and prepared claims the API no longer has.

use std::net::IpAddr;
use std::time::Duration;

use gpu_dra_driver::compute_domain::imex::DaemonState;
use gpu_dra_driver::names::{ClaimUid, DomainUid};

use super::cluster::{ConditionWriter, DomainLookup};
use super::error::Error;
use super::host_imex::HostDaemon;
use super::imex_server::Server;
use super::preparer::DomainPreparer;
use crate::prepare::types::ClaimSource;
use crate::state::checkpoint::{ClaimRecord, PrepareState};

/// How long the health loop waits for the API to say whether a claim exists.
pub(super) const CLAIM_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

impl<S: ClaimSource, D: DomainLookup, W: ConditionWriter> DomainPreparer<S, D, W> {
    /// Starts again the daemons of prepared claims that are not running
    /// (the previous agent's container took them along), from their
    /// directories, before the domain store has synced; a domain a
    /// host-managed daemon now serves is left to it.
    pub(super) fn revive_daemons(&self, records: &[ClaimRecord]) {
        let mut domains: Vec<&DomainUid> = records
            .iter()
            .filter(|r| r.state == PrepareState::PrepareCompleted)
            .filter_map(|r| r.compute_domain.as_ref())
            .map(|d| &d.domain_uid)
            .collect();
        domains.sort_unstable();
        domains.dedup();
        for domain in domains {
            if self.daemons.find(domain).is_none() && self.host_daemon().is_some() {
                continue;
            }
            match self.daemons.revive(domain) {
                Ok(true) => tracing::info!(%domain, "started the IMEX daemon of a prepared claim again"),
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(%domain, %error, "cannot start the IMEX daemon again; the health loop retries")
                }
            }
        }
    }

    /// A host-managed `nvidia-imex`, if the host runs one.
    pub(crate) fn host_daemon(&self) -> Option<HostDaemon> {
        self.daemons.host_daemon(&self.config.proc_root)
    }

    /// Who serves `domain_uid` here: our daemon when it runs or the host
    /// runs none; else the host's, when it lists every peer.
    pub(crate) fn server(&self, domain_uid: &DomainUid, peers: &[IpAddr], domain_name: &str) -> Result<Server, Error> {
        if self.daemons.find(domain_uid).is_some() {
            return Ok(Server::Own);
        }
        match self.host_daemon() {
            None => Ok(Server::Own),
            Some(host) => {
                host.check_serves(peers, self.config.node.as_str(), domain_name)?;
                Ok(Server::Host(host))
            }
        }
    }

    /// Asks the domain's daemon whether it is ready.
    pub(crate) async fn query(&self, domain_uid: &DomainUid, server: &Server) -> DaemonState {
        match server {
            Server::Own => self.daemons.query(domain_uid).await,
            Server::Host(host) => self.daemons.query_host(host).await,
        }
    }

    /// The prepared claims the API no longer has (deleted, or replaced by
    /// a claim of the same name): the kubelet could not unprepare them (the
    /// agent was down, or the kubelet lost its state), and no pod can use
    /// a deleted claim. Asked without the prepare lock; an API error
    /// decides nothing.
    pub(crate) async fn deleted_claims(&self, records: &[ClaimRecord]) -> Vec<ClaimUid> {
        let mut deleted = Vec::new();
        for record in records {
            let until = tokio::time::Instant::now() + CLAIM_CHECK_TIMEOUT;
            let gone = match self.claims.get(&record.namespace, &record.name, until).await {
                Ok(None) => true,
                Ok(Some(claim)) if claim.metadata.uid.as_deref() != Some(record.uid.as_str()) => {
                    self.claims.forget(&record.namespace, &record.name);
                    true
                }
                Ok(Some(_)) | Err(_) => false,
            };
            if let (true, Ok(uid)) = (gone, ClaimUid::new(record.uid.as_str())) {
                tracing::info!(claim = %format!("{}/{}", record.namespace, record.name), uid = record.uid, "releasing a prepared claim deleted from the API without an unprepare");
                deleted.push(uid);
            }
        }
        deleted
    }
}
