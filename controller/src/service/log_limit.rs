//! Warnings about one kind of failure at most once per interval: a server
//! answering every status write with a 503 page made the controller log
//! 4,161 lines in 20 s. The line after a quiet spell says how many were
//! left out; the texts themselves are cut by `api_call::describe`.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// One line per key per `interval`.
#[derive(Debug)]
pub struct LogLimit {
    interval: Duration,
    /// When each key last logged, and how many lines were left out since.
    keys: HashMap<&'static str, (Instant, u64)>,
}

impl LogLimit {
    pub fn new(interval: Duration) -> Self {
        Self { interval, keys: HashMap::new() }
    }

    /// `Some(left out since the last line)` when a line for `key` may be
    /// written now; `None` when it is left out (and counted).
    pub fn admit(&mut self, key: &'static str) -> Option<u64> {
        let now = Instant::now();
        match self.keys.get_mut(key) {
            Some((last, skipped)) if now.duration_since(*last) < self.interval => {
                *skipped += 1;
                None
            }
            Some((last, skipped)) => {
                *last = now;
                Some(std::mem::take(skipped))
            }
            None => {
                self.keys.insert(key, (now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_line_per_interval_and_the_count_of_the_rest() {
        let mut limit = LogLimit::new(Duration::from_secs(10));
        assert_eq!(limit.admit("write"), Some(0));
        for _ in 0..4160 {
            assert_eq!(limit.admit("write"), None);
        }
        assert_eq!(limit.admit("event"), Some(0), "keys are independent");
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(limit.admit("write"), Some(4160));
        assert_eq!(limit.admit("write"), None);
    }
}
