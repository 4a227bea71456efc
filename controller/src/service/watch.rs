//! Watches with kube-rs watchers, each object sent to the owner as it
//! comes (no reflector store: the owner's state is the one copy).

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

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
}

/// Starts one watcher per kind.
pub fn spawn_all(client: &Client, tx: mpsc::Sender<Change>) {
    spawn(Api::<ResourceSlice>::all(client.clone()), watcher::Config::default(), tx.clone(), Change::Slice);
    spawn(Api::<DeviceClass>::all(client.clone()), watcher::Config::default(), tx.clone(), Change::Class);
    spawn(Api::<Node>::all(client.clone()), watcher::Config::default(), tx.clone(), Change::Node);
    spawn(Api::<ResourceClaim>::all(client.clone()), watcher::Config::default(), tx.clone(), Change::Claim);
    // Only pending pods wait for claims.
    let pending = watcher::Config::default().fields("status.phase=Pending");
    spawn(Api::<Pod>::all(client.clone()), pending, tx, Change::Pod);
}

fn spawn<K>(api: Api<K>, config: watcher::Config, tx: mpsc::Sender<Change>, wrap: fn(Event<K>) -> Change)
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    tokio::spawn(async move {
        let mut stream = watcher(api, config).default_backoff().boxed();
        while let Some(item) = stream.next().await {
            let event = match item {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => Event::Apply(Box::new(o)),
                Ok(watcher::Event::Delete(o)) => Event::Delete(Box::new(o)),
                Ok(watcher::Event::Init) => Event::Init,
                Ok(watcher::Event::InitDone) => Event::InitDone,
                Err(error) => {
                    tracing::warn!(%error, "watch failed; retrying");
                    continue;
                }
            };
            if tx.send(wrap(event)).await.is_err() {
                return;
            }
        }
    });
}
