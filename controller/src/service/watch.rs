//! Watches with kube-rs watchers, each object sent to the owner as it
//! comes (no reflector store: the owner's state is the one copy).

use std::time::Duration;

use futures::StreamExt;
use gpu_dra_driver::service::api_call;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use super::log_limit::LogLimit;

/// A watcher's failure in words (its list or watch call's error, cut).
fn describe(error: &watcher::Error) -> String {
    match error {
        watcher::Error::InitialListFailed(e) => format!("listing failed: {}", api_call::describe(e)),
        watcher::Error::WatchStartFailed(e) => format!("starting the watch failed: {}", api_call::describe(e)),
        watcher::Error::WatchFailed(e) => format!("the watch failed: {}", api_call::describe(e)),
        watcher::Error::WatchError(status) => {
            format!("the server ended the watch: {}", api_call::describe(&kube::Error::Api(status.clone())))
        }
        other => gpu_dra_driver::echo::text(&other.to_string()).to_string(),
    }
}

/// One watch event, of one kind.
#[derive(Debug)]
pub enum Event<K> {
    /// Boxed: objects differ in size by kilobytes, events queue by thousands.
    Apply(Box<K>),
    Delete(Box<K>),
    /// A (re)list starts: objects not seen before `InitDone` are gone.
    Init,
    InitDone,
}

#[derive(Debug)]
pub enum Change {
    Slice(Event<ResourceSlice>),
    Class(Event<DeviceClass>),
    Node(Event<Node>),
    Claim(Event<ResourceClaim>),
    Pod(Event<Pod>),
    TaintRule(Event<DeviceTaintRule>),
}

/// Starts one watcher per kind. Each watch asks the server to end it after
/// `timeout_seconds` (less than the client's read timeout, so a quiet watch
/// ends cleanly and resumes from its resourceVersion rather than being cut
/// as a failure); a list or watch cut short or damaged fails, and the
/// watcher relists or resumes with backoff.
pub fn spawn_all(client: &Client, tx: mpsc::Sender<Change>, timeout_seconds: u32) {
    let config = || watcher::Config::default().timeout(timeout_seconds);
    spawn(Api::<ResourceSlice>::all(client.clone()), config(), tx.clone(), Change::Slice);
    spawn(Api::<DeviceClass>::all(client.clone()), config(), tx.clone(), Change::Class);
    spawn(Api::<Node>::all(client.clone()), config(), tx.clone(), Change::Node);
    spawn(Api::<ResourceClaim>::all(client.clone()), config(), tx.clone(), Change::Claim);
    // Only pending pods wait for claims.
    let pending = config().fields("status.phase=Pending");
    spawn(Api::<Pod>::all(client.clone()), pending, tx.clone(), Change::Pod);
    spawn_taint_rules(client.clone(), config(), tx);
}

/// DeviceTaintRules, which `resource.k8s.io/v1` serves from Kubernetes
/// 1.37 (`DRADeviceTaintRules`): on an older server (its list answers 404
/// Not Found) none exist for the controller, as for the scheduler, which
/// reads them only from that version on; said once, and the list counts
/// as done so the other kinds are acted on.
fn spawn_taint_rules(client: Client, config: watcher::Config, tx: mpsc::Sender<Change>) {
    tokio::spawn(async move {
        let api = Api::<DeviceTaintRule>::all(client);
        let probe = api.list(&kube::api::ListParams::default().limit(1)).await;
        if let Err(error) = &probe
            && api_call::is_not_found(error)
        {
            tracing::info!(
                "this API server does not serve DeviceTaintRules in resource.k8s.io/v1 (Kubernetes 1.37+): none are applied, as the scheduler applies none"
            );
            for event in [Event::Init, Event::InitDone] {
                if tx.send(Change::TaintRule(event)).await.is_err() {
                    return;
                }
            }
            return;
        }
        spawn(api, config, tx, Change::TaintRule);
    });
}

fn spawn<K>(api: Api<K>, config: watcher::Config, tx: mpsc::Sender<Change>, wrap: fn(Event<K>) -> Change)
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    tokio::spawn(async move {
        let mut stream = watcher(api, config).default_backoff().boxed();
        let mut limit = LogLimit::new(Duration::from_secs(10));
        while let Some(item) = stream.next().await {
            let event = match item {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => Event::Apply(Box::new(o)),
                Ok(watcher::Event::Delete(o)) => Event::Delete(Box::new(o)),
                Ok(watcher::Event::Init) => Event::Init,
                Ok(watcher::Event::InitDone) => Event::InitDone,
                Err(error) => {
                    if let Some(skipped) = limit.admit("watch") {
                        tracing::warn!(%kind, error = %describe(&error), skipped, "watch failed; retrying with backoff");
                    }
                    continue;
                }
            };
            if tx.send(wrap(event)).await.is_err() {
                return;
            }
        }
    });
}
