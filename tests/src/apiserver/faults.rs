//! Fault injection for tests: failing requests, slow responses and dropped
//! watches, plus a log of what clients asked for.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;

/// Requests kept in the log (the oldest half is dropped beyond this).
const MAX_LOG: usize = 100_000;

/// Which requests a fault applies to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Matcher {
    /// HTTP method (`GET`, `PUT`, ...); `None` matches any.
    pub method: Option<String>,
    /// A substring of the path; empty matches any.
    pub path_contains: String,
    /// Match only watch requests (`Some(true)`), only non-watch requests
    /// (`Some(false)`) or both (`None`).
    pub watch: Option<bool>,
}

impl Matcher {
    pub fn any() -> Self {
        Self::default()
    }

    pub fn new(method: &str, path_contains: &str) -> Self {
        Self { method: Some(method.to_uppercase()), path_contains: path_contains.into(), watch: None }
    }

    pub fn watches(mut self, watch: bool) -> Self {
        self.watch = Some(watch);
        self
    }

    fn matches(&self, request: &RequestRecord) -> bool {
        self.method.as_ref().is_none_or(|m| *m == request.method)
            && request.path.contains(&self.path_contains)
            && self.watch.is_none_or(|w| w == request.watch)
    }
}

/// One request the server received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    pub query: String,
    pub watch: bool,
    /// The client's `User-Agent` (the binary that made the request).
    pub user_agent: String,
    /// The status code the server answered with (200 for watches).
    pub status: u16,
}

#[derive(Debug)]
struct Failure {
    matcher: Matcher,
    remaining: usize,
    code: u16,
}

#[derive(Debug, Default)]
struct State {
    failures: Vec<Failure>,
    delays: Vec<(Matcher, Duration)>,
    log: Vec<RequestRecord>,
}

/// Shared fault state; tests reach it through [`super::ApiServer::faults`].
#[derive(Debug)]
pub struct Faults {
    state: Mutex<State>,
    /// Bumped to end every open watch.
    drop_watches: watch::Sender<u64>,
}

impl Default for Faults {
    fn default() -> Self {
        Self { state: Mutex::new(State::default()), drop_watches: watch::channel(0).0 }
    }
}

/// What to do with a request before serving it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub delay: Option<Duration>,
    pub fail: Option<u16>,
}

impl Faults {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next `count` requests matching `matcher` fail with `code`
    /// (500, 503, ...) and a `Status` body.
    pub fn fail_next(&self, matcher: Matcher, count: usize, code: u16) {
        self.state().failures.push(Failure { matcher, remaining: count, code });
    }

    /// Requests matching `matcher` wait `delay` before being served.
    pub fn delay(&self, matcher: Matcher, delay: Duration) {
        self.state().delays.push((matcher, delay));
    }

    /// Removes all injected failures and delays.
    pub fn clear(&self) {
        let mut state = self.state();
        state.failures.clear();
        state.delays.clear();
    }

    /// Ends every open watch stream (the client sees the response end, as
    /// when an apiserver restarts or a load balancer drops the connection).
    pub fn drop_watches(&self) {
        self.drop_watches.send_modify(|n| *n += 1);
    }

    pub(super) fn watch_drops(&self) -> watch::Receiver<u64> {
        self.drop_watches.subscribe()
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.state().log.clone()
    }

    /// How many requests matched `matcher` and got `status`.
    pub fn count(&self, matcher: &Matcher, status: u16) -> usize {
        self.state().log.iter().filter(|r| r.status == status && matcher.matches(r)).count()
    }

    /// Decides the fate of a request (consuming one injected failure).
    pub(super) fn verdict(&self, method: &str, path: &str, watch: bool) -> Verdict {
        let probe = RequestRecord {
            method: method.into(),
            path: path.into(),
            query: String::new(),
            watch,
            user_agent: String::new(),
            status: 0,
        };
        let mut state = self.state();
        let delay = state.delays.iter().filter(|(m, _)| m.matches(&probe)).map(|(_, d)| *d).max();
        let fail = state.failures.iter_mut().find(|f| f.remaining > 0 && f.matcher.matches(&probe)).map(|f| {
            f.remaining -= 1;
            f.code
        });
        state.failures.retain(|f| f.remaining > 0);
        Verdict { delay, fail }
    }

    pub(super) fn record(&self, record: RequestRecord) {
        let mut state = self.state();
        // Bounded so a long crash test cannot grow it without limit.
        if state.log.len() >= MAX_LOG {
            state.log.drain(..MAX_LOG / 2);
        }
        state.log.push(record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_counted_down_per_matcher() {
        let faults = Faults::default();
        faults.fail_next(Matcher::new("put", "/resourceslices/"), 2, 500);
        assert_eq!(faults.verdict("GET", "/apis/resource.k8s.io/v1/resourceslices/a", false).fail, None);
        for _ in 0..2 {
            assert_eq!(faults.verdict("PUT", "/apis/resource.k8s.io/v1/resourceslices/a", false).fail, Some(500));
        }
        assert_eq!(faults.verdict("PUT", "/apis/resource.k8s.io/v1/resourceslices/a", false), Verdict::default());
    }
}
