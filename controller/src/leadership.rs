//! Whether this replica may write, decided by the clock at each write, and
//! every write bounded in time.
//!
//! client-go's leader election stops a leader that could not renew within
//! its renew deadline, and its callers check `IsLeader()` before acting.
//! Here the election task records when its last successful renewal
//! *started*; leadership then holds for the renew deadline from that
//! instant and no longer, whether or not the election task itself is stuck
//! on a call that never answers. Another replica takes over only after it
//! saw the Lease unchanged for the (longer) lease duration, so the two
//! never write at once.
//!
//! Every write goes through [`Writes::run`]: refused when not leading, and
//! cut off at the end of leadership or after the call timeout, whichever
//! comes first, so that an API server that never answers cannot hold the
//! owner's loop.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpu_dra_driver::service::api_call;
use tokio::time::Instant;

/// Whether and until when this replica leads.
#[derive(Debug, Clone)]
pub struct Leadership(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    /// `None`: no election, this replica always leads.
    renew_deadline: Option<Duration>,
    until: Mutex<Option<Instant>>,
}

impl Leadership {
    /// Leader election off: the only replica leads.
    pub fn sole() -> Self {
        Self(Arc::new(Inner { renew_deadline: None, until: Mutex::new(None) }))
    }

    /// Leads only after [`Self::renewed`], for `renew_deadline` each time.
    pub fn elected(renew_deadline: Duration) -> Self {
        Self(Arc::new(Inner { renew_deadline: Some(renew_deadline), until: Mutex::new(None) }))
    }

    fn until(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.0.until.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A renewal (or acquisition) that started at `started` succeeded.
    pub fn renewed(&self, started: Instant) {
        if let Some(deadline) = self.0.renew_deadline {
            let mut until = self.until();
            let next = started + deadline;
            *until = Some(until.map_or(next, |u| u.max(next)));
        }
    }

    /// Someone else holds the Lease: stop now.
    pub fn lost(&self) {
        *self.until() = None;
    }

    /// How long this replica still leads; `None` when it does not.
    pub fn remaining(&self) -> Option<Duration> {
        if self.0.renew_deadline.is_none() {
            return Some(Duration::MAX);
        }
        let until = (*self.until())?;
        let left = until.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }

    pub fn is_leading(&self) -> bool {
        self.remaining().is_some()
    }
}

/// Why a write did not happen or did not finish.
#[derive(Debug)]
pub enum WriteError {
    NotLeading,
    Timeout(Duration),
    Api(kube::Error),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::NotLeading => f.write_str("not written: this replica no longer leads"),
            WriteError::Timeout(after) => write!(
                f,
                "no answer within {after:.1?} (the API server did not answer; the write may or may not have landed)"
            ),
            WriteError::Api(error) => f.write_str(&api_call::describe(error)),
        }
    }
}

impl std::error::Error for WriteError {}

impl WriteError {
    /// The server answered 409 Conflict.
    pub fn is_conflict(&self) -> bool {
        matches!(self, WriteError::Api(e) if api_call::is_conflict(e))
    }

    /// The server answered 404 Not Found.
    pub fn is_not_found(&self) -> bool {
        matches!(self, WriteError::Api(e) if api_call::is_not_found(e))
    }
}

/// The gate every write of the owner passes.
#[derive(Debug, Clone)]
pub struct Writes {
    pub leadership: Leadership,
    /// The longest one call may take (`--api-timeout`).
    pub call_timeout: Duration,
}

impl Writes {
    /// Runs `write` if this replica leads, cut off when its leadership ends
    /// or after the call timeout.
    pub async fn run<T>(&self, write: impl Future<Output = Result<T, kube::Error>>) -> Result<T, WriteError> {
        let left = self.leadership.remaining().ok_or(WriteError::NotLeading)?;
        let bound = left.min(self.call_timeout);
        match tokio::time::timeout(bound, write).await {
            Ok(result) => result.map_err(WriteError::Api),
            Err(_) if !self.leadership.is_leading() => Err(WriteError::NotLeading),
            Err(_) => Err(WriteError::Timeout(bound)),
        }
    }

    /// Runs a read, cut off after the call timeout (reads need no lease).
    pub async fn read<T>(&self, read: impl Future<Output = Result<T, kube::Error>>) -> Result<T, WriteError> {
        match tokio::time::timeout(self.call_timeout, read).await {
            Ok(result) => result.map_err(WriteError::Api),
            Err(_) => Err(WriteError::Timeout(self.call_timeout)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn leadership_lapses_by_the_clock_at_the_renew_deadline() {
        let leadership = Leadership::elected(Duration::from_secs(2));
        assert!(!leadership.is_leading(), "not before the first renewal");
        let started = Instant::now();
        leadership.renewed(started);
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert_eq!(leadership.remaining(), Some(Duration::from_millis(500)));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(!leadership.is_leading(), "no renewal for the renew deadline: stop at once");
        leadership.renewed(Instant::now());
        assert!(leadership.is_leading());
        // A late answer to an older attempt never shortens or revives it.
        leadership.renewed(started);
        assert_eq!(leadership.remaining(), Some(Duration::from_secs(2)));
        leadership.lost();
        assert!(!leadership.is_leading());
        assert!(Leadership::sole().is_leading());
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_never_answers_ends_with_leadership() {
        let leadership = Leadership::elected(Duration::from_secs(2));
        leadership.renewed(Instant::now());
        let writes = Writes { leadership: leadership.clone(), call_timeout: Duration::from_secs(10) };
        let started = Instant::now();
        let result = writes.run(std::future::pending::<Result<(), kube::Error>>()).await;
        assert!(matches!(result, Err(WriteError::NotLeading)), "{result:?}");
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        let refused = writes.run(async { Ok::<_, kube::Error>(()) }).await;
        assert!(matches!(refused, Err(WriteError::NotLeading)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_is_bounded_by_the_call_timeout() {
        let writes = Writes { leadership: Leadership::sole(), call_timeout: Duration::from_secs(3) };
        let result = writes.run(std::future::pending::<Result<(), kube::Error>>()).await;
        let err = result.unwrap_err();
        assert!(matches!(err, WriteError::Timeout(d) if d == Duration::from_secs(3)), "{err}");
        assert!(err.to_string().starts_with("no answer within 3.0s"), "{err}");
    }
}
