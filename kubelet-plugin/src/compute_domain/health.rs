//! Keeps each domain's daemon true to what the cluster and the daemon say:
//! every interval, for each domain with a prepared claim here, the daemon
//! is started again if it died, told new peers when the domain's nodes
//! changed, and asked `nvidia-imex-ctl -q`; a changed answer is written as
//! the `Ready` condition of each of the domain's claims on this node (the
//! controller turns it into the node's status in the domain), and new
//! channel prepares there fail at once while it is not ready. A domain a
//! host-managed daemon serves is only asked, never started or signalled.
//! A write the API refuses is retried each pass and logged once
//! ([`super::ready_condition`]). Each pass then readies the channels the
//! scheduler holds for binding ([`super::binding`]). Each pass also releases prepared claims deleted from the API (see
//! [`DomainPreparer::deleted_claims`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use gpu_dra_driver::compute_domain::imex::DaemonState;
use gpu_dra_driver::names::DomainUid;

use super::channel_claim::ChannelClaim;
use super::cluster::{ConditionWriter, DomainLookup};
use super::error::Error;
use super::imex_server::Server;
use super::preparer::DomainPreparer;
use crate::prepare::types::ClaimSource;

pub async fn run<S: ClaimSource, D: DomainLookup, W: ConditionWriter>(
    preparer: Arc<DomainPreparer<S, D, W>>,
    interval: Duration,
) {
    // What each claim's condition says, as written.
    let mut written: HashMap<String, DaemonState> = HashMap::new();
    let mut binding = super::binding::BindingState::default();
    loop {
        tokio::time::sleep(interval).await;
        pass(&preparer, &mut written).await;
        preparer.binding_pass(&mut binding).await;
    }
}

#[cfg(test)]
pub(crate) async fn pass_for_tests<S: ClaimSource, D: DomainLookup, W: ConditionWriter>(
    preparer: &DomainPreparer<S, D, W>,
    written: &mut HashMap<String, DaemonState>,
) {
    pass(preparer, written).await
}

async fn pass<S: ClaimSource, D: DomainLookup, W: ConditionWriter>(
    preparer: &DomainPreparer<S, D, W>,
    written: &mut HashMap<String, DaemonState>,
) {
    let deleted = preparer.deleted_claims(&preparer.prepared()).await;
    // Not while a prepare or unprepare runs: it may be starting or
    // stopping the same daemon.
    let Ok(_guard) = preparer.lock.try_lock() else { return };
    for uid in deleted {
        if let Err(error) = preparer.release(&uid) {
            tracing::warn!(claim = %uid, %error, "cannot release a deleted claim; retrying later");
        }
    }
    let records = preparer.prepared();
    written.retain(|uid, _| records.iter().any(|r| &r.uid == uid));
    preparer.write_failures.retain(|uid| records.iter().any(|r| r.uid == uid));
    let mut domains: Vec<(String, DomainUid)> = records
        .iter()
        .filter_map(|r| r.compute_domain.as_ref())
        .map(|d| (d.namespace.clone(), d.domain_uid.clone()))
        .collect();
    domains.sort();
    domains.dedup();
    for (namespace, uid) in domains {
        let state = match keep_serving(preparer, &namespace, &uid) {
            Ok(server) => preparer.query(&uid, &server).await,
            Err(error) => {
                tracing::warn!(domain = %uid, %error, "cannot keep the IMEX daemon running");
                DaemonState::NotReady(error.to_string())
            }
        };
        let before = preparer.states.lock().unwrap_or_else(|p| p.into_inner()).insert(uid.to_string(), state.clone());
        if before.as_ref() != Some(&state) {
            tracing::info!(domain = %uid, node = preparer.node(), ?state, "IMEX daemon state changed");
        }
        for record in records.iter().filter(|r| r.compute_domain.as_ref().is_some_and(|d| d.domain_uid == uid)) {
            if written.get(&record.uid) == Some(&state) {
                continue;
            }
            let Some(device) = record.devices.first() else { continue };
            let claim = ChannelClaim {
                namespace: &record.namespace,
                name: &record.name,
                uid: &record.uid,
                domain_uid: uid.as_str(),
                device: &device.device_name,
            };
            if preparer.write_ready(&claim, &state).await {
                written.insert(record.uid.clone(), state.clone());
            }
        }
    }
}

/// Keeps the domain's daemon running with its current peers (or, before
/// the domain is known, from its files); a host-managed one is left alone.
fn keep_serving<S: ClaimSource, D: DomainLookup, W: ConditionWriter>(
    preparer: &DomainPreparer<S, D, W>,
    namespace: &str,
    uid: &DomainUid,
) -> Result<Server, Error> {
    match preparer.peers_of(namespace, uid) {
        Some(peers) => {
            let server = preparer.server(uid, &peers, &format!("{namespace}/{uid}"))?;
            if let Server::Own = server {
                preparer.daemons.ensure(uid, &peers)?;
            }
            Ok(server)
        }
        None => match (preparer.daemons.find(uid), preparer.host_daemon()) {
            (None, Some(host)) => Ok(Server::Host(host)),
            _ => {
                preparer.daemons.revive(uid)?;
                Ok(Server::Own)
            }
        },
    }
}
