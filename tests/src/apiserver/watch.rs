//! Watch streams: newline-delimited JSON `{"type": ..., "object": ...}`
//! events over one chunked response, as the real server sends for
//! `?watch=true` with `Accept: application/json`.

use std::time::Duration;

use axum::body::Bytes;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};

use super::kinds::Kind;
use super::selectors::{FieldSelector, LabelSelector};
use super::store::{EventType, StoreEvent, WatchStart};

/// What one watch request asked for.
pub struct WatchRequest {
    pub kind: &'static Kind,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// `allowWatchBookmarks=true`: the server may send BOOKMARK events
    /// carrying only a resourceVersion, so a client can resume from there.
    pub bookmarks: bool,
    /// `sendInitialEvents=true`: after the initial ADDED events, a BOOKMARK
    /// annotated `k8s.io/initial-events-end: "true"` (streaming lists).
    pub send_initial_events: bool,
    /// `timeoutSeconds`: the server ends the stream after this long.
    pub timeout: Option<Duration>,
    pub bookmark_interval: Duration,
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut text = json!({"type": kind, "object": object}).to_string();
    text.push('\n');
    Bytes::from(text)
}

fn bookmark(kind: &Kind, rv: u64, initial_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_end && let Some(map) = metadata.as_object_mut() {
        map.insert("annotations".into(), json!({"k8s.io/initial-events-end": "true"}));
    }
    line("BOOKMARK", &json!({"kind": kind.kind, "apiVersion": kind.api_version(), "metadata": metadata}))
}

/// The ERROR event the watch cache sends for an expired resourceVersion.
pub fn error_line(status: &Value) -> Bytes {
    line("ERROR", status)
}

impl WatchRequest {
    fn matches(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }

    /// The event a filtered watcher sees for `event`, if any: an object that
    /// starts matching is ADDED, one that stops matching is DELETED (the
    /// watch cache's `filterWithAttrsFunction` over old and new object).
    fn translate(&self, event: &StoreEvent) -> Option<Bytes> {
        if event.kind.plural != self.kind.plural || self.namespace.as_ref().is_some_and(|ns| *ns != event.namespace) {
            return None;
        }
        let now = self.matches(&event.object);
        let before = event.previous.as_ref().map(|p| self.matches(p));
        let kind = match (event.event, now, before) {
            (EventType::Modified, true, Some(false)) => EventType::Added,
            (EventType::Modified, false, Some(true)) => {
                let mut gone = event.previous.clone().unwrap_or(Value::Null);
                if let Some(meta) = gone.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.insert("resourceVersion".into(), json!(event.rv.to_string()));
                }
                return Some(line(EventType::Deleted.as_str(), &gone));
            }
            (e, true, _) => e,
            _ => return None,
        };
        Some(line(kind.as_str(), &event.object))
    }

    /// Streams the watch into `tx` until the timeout, a dropped-watches
    /// fault, the client going away, or the client falling too far behind
    /// (then it re-watches from its last resourceVersion, as after the real
    /// server closes a slow watcher).
    pub async fn run(self, start: WatchStart, tx: mpsc::Sender<Bytes>, mut drops: watch::Receiver<u64>) {
        let WatchStart { initial, replay, rv, mut live } = start;
        let mut last_rv = rv;
        for object in initial.iter().filter(|o| self.matches(o)) {
            if tx.send(line("ADDED", object)).await.is_err() {
                return;
            }
        }
        if self.send_initial_events && tx.send(bookmark(self.kind, rv, true)).await.is_err() {
            return;
        }
        for event in &replay {
            if let Some(bytes) = self.translate(event)
                && tx.send(bytes).await.is_err()
            {
                return;
            }
        }
        drops.borrow_and_update();
        let deadline = tokio::time::sleep(self.timeout.unwrap_or(Duration::from_secs(1800)));
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(self.bookmark_interval);
        ticker.tick().await;
        loop {
            tokio::select! {
                received = live.recv() => match received {
                    Ok(event) => {
                        if event.rv <= last_rv && event.rv <= rv { continue; }
                        if let Some(bytes) = self.translate(&event) && tx.send(bytes).await.is_err() {
                            return;
                        }
                        last_rv = last_rv.max(event.rv);
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) | Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = ticker.tick(), if self.bookmarks => {
                    if tx.send(bookmark(self.kind, last_rv, false)).await.is_err() {
                        return;
                    }
                }
                _ = &mut deadline => {
                    if self.bookmarks {
                        let _ = tx.send(bookmark(self.kind, last_rv, false)).await;
                    }
                    return;
                }
                _ = drops.changed() => return,
                _ = tx.closed() => return,
            }
        }
    }
}
