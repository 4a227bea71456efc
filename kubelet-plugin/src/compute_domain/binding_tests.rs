//! Channels readied before binding ([`super::binding`]), on fake IMEX
//! programs: ready, failed, abandoned, a failing API server, a forged claim.

use std::time::Duration;

use gpu_dra_driver::compute_domain::imex::DaemonState;

use super::binding::BindingState;
use super::status::with_condition;
use super::tests::{DOMAIN, NODE, Node, UID_A, domain, prepare, unprepare};
use crate::prepare::types::ClaimRef;

/// Passes, as the health loop runs them, until `done` (a fresh daemon
/// answers READY a moment after it starts), at most 3 s.
async fn passes_until(p: &super::tests::Preparer, state: &mut BindingState, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while !done() && std::time::Instant::now() < deadline {
        p.binding_pass(state).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn reference(name: &str, uid: &str) -> ClaimRef {
    ClaimRef { namespace: "team".into(), name: name.into(), uid: uid.into() }
}

#[tokio::test]
async fn a_waiting_channels_daemon_is_ready_before_binding_and_its_prepare_reuses_it() {
    let node = Node::new(&[NODE, "gb200-1"]);
    let p = node.open();
    let claim = node.waiting_channel_claim("pod-a-channel", UID_A, DOMAIN);
    let mut state = BindingState::default();
    passes_until(&p, &mut state, || !node.conditions.written.lock().unwrap().is_empty()).await;
    assert_eq!(node.imex_log().len(), 1, "started ahead: {:?}", node.imex_log());
    assert!(node.imex_log()[0].starts_with("start ") && node.imex_log()[0].ends_with("10.0.0.1 10.0.0.2"));
    assert_eq!(node.conditions.written.lock().unwrap().as_slice(), [("pod-a-channel".to_owned(), DaemonState::Ready)]);
    assert_eq!(node.files("state/checkpoint"), [format!("{UID_A}.json")], "recorded before anything started");
    assert!(node.files("cdi").is_empty(), "no spec before the kubelet asks");

    // The API now says Ready: nothing more to do, however many passes.
    node.set_domain_claims(vec![with_condition(&claim, NODE, "channel-0", &DaemonState::Ready).unwrap()]);
    p.binding_pass(&mut state).await;
    assert_eq!(node.conditions.written.lock().unwrap().len(), 1);

    // The pod is bound; the kubelet prepares at once over the same daemon.
    let started = std::time::Instant::now();
    prepare(&p, &reference("pod-a-channel", UID_A)).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(node.imex_log().len(), 1, "the same daemon: {:?}", node.imex_log());
    p.binding_pass(&mut state).await;
    assert!(p.daemons.find(&domain()).is_some(), "a prepared claim is not released");
    unprepare(&p, &reference("pod-a-channel", UID_A)).await;
    assert!(p.daemons.find(&domain()).is_none());
    assert!(node.files("state/checkpoint").is_empty());
}

#[tokio::test]
async fn a_daemon_not_ready_in_time_fails_the_binding_and_is_stopped() {
    let node = Node::new(&[NODE]);
    let p = node.open();
    std::fs::write(node.root().join("driver/imex.not-ready"), "").unwrap();
    node.waiting_channel_claim("pod-a-channel", UID_A, DOMAIN);
    let mut state = BindingState::default();
    p.binding_pass(&mut state).await;
    assert!(node.conditions.failed.lock().unwrap().is_empty(), "still within the ready timeout");
    assert!(node.conditions.written.lock().unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(1600)).await;
    p.binding_pass(&mut state).await;
    let failed = node.conditions.failed.lock().unwrap().clone();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(
        failed[0].1.starts_with(
            "the IMEX daemon of ComputeDomain team/job on node gb200-0 did not become ready in 1.5s (nvidia-imex-ctl: NOT_READY)"
        ),
        "{failed:?}"
    );
    assert!(p.daemons.find(&domain()).is_none(), "what was started for the claim is stopped");
    assert!(node.files("state/checkpoint").is_empty());
}

#[tokio::test]
async fn a_claim_given_up_by_the_scheduler_releases_its_daemon() {
    let node = Node::new(&[NODE]);
    let p = node.open();
    node.waiting_channel_claim("pod-a-channel", UID_A, DOMAIN);
    let mut state = BindingState::default();
    p.binding_pass(&mut state).await;
    assert!(p.daemons.find(&domain()).is_some());
    node.remove_claim("pod-a-channel");
    p.binding_pass(&mut state).await;
    assert!(p.daemons.find(&domain()).is_none(), "{:?}", node.imex_log());
    assert!(node.files("state/checkpoint").is_empty());
}

/// The API server fails the list: nothing is started or written, the
/// error is kept (logged once); the next pass after it recovers readies
/// the channel.
#[tokio::test]
async fn a_failing_api_server_readies_nothing_until_it_answers() {
    let node = Node::new(&[NODE]);
    let p = node.open();
    node.waiting_channel_claim("pod-a-channel", UID_A, DOMAIN);
    node.set_api_error(Some(crate::compute_domain::LookupError::ListFailed {
        what: "ResourceClaims in team".into(),
        reason: "HTTP 500".into(),
    }));
    let mut state = BindingState::default();
    p.binding_pass(&mut state).await;
    p.binding_pass(&mut state).await;
    assert!(node.imex_log().is_empty());
    assert!(node.conditions.written.lock().unwrap().is_empty() && node.conditions.failed.lock().unwrap().is_empty());
    node.set_api_error(None);
    passes_until(&p, &mut state, || !node.conditions.written.lock().unwrap().is_empty()).await;
    assert_eq!(node.conditions.written.lock().unwrap().len(), 1);
    assert_eq!(node.imex_log().len(), 1);
    unprepare(&p, &reference("pod-a-channel", UID_A)).await;
    assert!(p.daemons.find(&domain()).is_none(), "nothing left running");
}

/// A claim with the domain's label whose config names another domain:
/// refused with the reason, and no daemon started for either domain.
#[tokio::test]
async fn a_claim_whose_label_and_config_disagree_is_failed_and_starts_nothing() {
    let node = Node::new(&[NODE]);
    let p = node.open();
    node.waiting_channel_claim("pod-a-channel", UID_A, "9e8d7c6b-5a49-4382-b1a0-f9e8d7c6b5a4");
    let mut state = BindingState::default();
    p.binding_pass(&mut state).await;
    let failed = node.conditions.failed.lock().unwrap().clone();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].1.contains("names domain 9e8d7c6b-5a49-4382-b1a0-f9e8d7c6b5a4"), "{failed:?}");
    assert!(node.imex_log().is_empty());
    assert!(node.files("state/checkpoint").is_empty() && node.files("state/domains").is_empty());
}
