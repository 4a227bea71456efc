//! One way for a test to wait for something to happen: poll until it
//! holds, within a bound, and panic saying what was awaited, with the
//! context (usually a process's log) that tells why it did not come.

use std::time::{Duration, Instant};

/// How often a condition is polled: short beside any bound a test sets.
const INTERVAL: Duration = Duration::from_millis(50);

/// Polls `done` on this thread until it holds; after `within`, panics with
/// `what` and `context()`.
pub fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool, context: impl Fn() -> String) {
    until_some(what, within, || done().then_some(()), context);
}

/// Polls `check` on this thread until it gives a value, and returns it;
/// after `within`, panics with `what` and `context()`.
pub fn until_some<T>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> Option<T>,
    context: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}\n{}", context());
        std::thread::sleep(INTERVAL);
    }
}

/// [`wait_until`] for async tests: it sleeps on tokio's timer, so that what
/// the test runs on the same runtime (an API server, a publisher) goes on.
pub async fn eventually(what: &str, within: Duration, mut done: impl FnMut() -> bool, context: impl Fn() -> String) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}\n{}", context());
        tokio::time::sleep(INTERVAL).await;
    }
}
