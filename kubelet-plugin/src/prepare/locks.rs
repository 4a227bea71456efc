//! Named async locks: a claim's prepare holds its claim's lock and its
//! devices' locks, so claims wait for one another only when they share a
//! device (or are the same claim).
//!
//! Deadlock freedom: every caller takes at most one claim lock first, then
//! device locks in sorted order, and never a claim lock while holding a
//! device lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// A set of named locks, created on demand and dropped when unused.
#[derive(Default)]
pub struct KeyedLocks {
    locks: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
}

/// Held locks; released (and unused entries dropped) on drop.
pub struct Held<'a> {
    owner: &'a KeyedLocks,
    guards: Vec<(String, OwnedMutexGuard<()>)>,
}

impl KeyedLocks {
    fn entry(&self, key: &str) -> Arc<AsyncMutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(key.to_string()).or_default().clone()
    }

    /// Takes the locks of `keys` in sorted order (duplicates once).
    /// Cancel-safe: dropped while waiting, it releases what it took and
    /// drops the unused entries, as [`Held`]'s drop does.
    pub async fn lock(&self, mut keys: Vec<String>) -> Held<'_> {
        keys.sort();
        keys.dedup();
        let mut held = Held { owner: self, guards: Vec::with_capacity(keys.len()) };
        for key in keys {
            let guard = self.entry(&key).lock_owned().await;
            held.guards.push((key, guard));
        }
        held
    }

    /// How many names have a lock object (held or waited for).
    pub fn live(&self) -> usize {
        self.locks.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut locks = self.owner.locks.lock().unwrap_or_else(|p| p.into_inner());
        for (key, guard) in self.guards.drain(..) {
            drop(guard);
            // With the guard gone, the map holds the only reference
            // unless another caller holds or awaits this lock.
            if locks.get(&key).is_some_and(|m| Arc::strong_count(m) == 1) {
                locks.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn disjoint_keys_do_not_wait_and_unused_locks_are_dropped() {
        let locks = KeyedLocks::default();
        let a = locks.lock(vec!["b".into(), "a".into(), "a".into()]).await;
        let c = tokio::time::timeout(Duration::from_secs(5), locks.lock(vec!["c".into()])).await;
        assert!(c.is_ok(), "a disjoint key must not wait");
        assert_eq!(locks.live(), 3);
        drop(c);
        drop(a);
        assert_eq!(locks.live(), 0);
    }

    #[tokio::test]
    async fn giving_up_while_waiting_holds_nothing_and_leaves_no_entry() {
        let locks = KeyedLocks::default();
        let held = locks.lock(vec!["b".into()]).await;
        let waited = tokio::time::timeout(Duration::from_millis(50), locks.lock(vec!["a".into(), "b".into()])).await;
        assert!(waited.is_err(), "b is held");
        // "a" was taken and released on cancellation; "b" is still held.
        assert_eq!(locks.live(), 1);
        assert!(tokio::time::timeout(Duration::from_secs(5), locks.lock(vec!["a".into()])).await.is_ok());
        drop(held);
        assert_eq!(locks.live(), 0);
    }

    #[tokio::test]
    async fn a_shared_key_waits_for_release() {
        let locks = Arc::new(KeyedLocks::default());
        let held = locks.lock(vec!["gpu-0".into()]).await;
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let other = locks.clone();
        let task = tokio::spawn(async move {
            let _g = other.lock(vec!["gpu-1".into(), "gpu-0".into()]).await;
            let _ = tx.send(());
        });
        tokio::task::yield_now().await;
        assert!(rx.try_recv().is_err(), "must wait while gpu-0 is held");
        drop(held);
        task.await.unwrap();
        assert!(rx.await.is_ok());
        assert_eq!(locks.live(), 0);
    }
}
