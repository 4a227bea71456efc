//! `--request-timeout`, as kubectl's: how long the whole command may wait
//! for the API server (and the node agents' metrics through it). Each
//! request is bounded besides by the client's connect and read timeouts
//! (`ApiTimeouts`), so even `0` (no limit) never waits on a silent server
//! for good.

use std::future::Future;
use std::time::Duration;

/// The command's time limit; `None`: none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTimeout(pub Option<Duration>);

/// A `--request-timeout` in none of kubectl's forms: the duration
/// grammar's complaint and the forms that work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}; a timeout is a whole number of seconds or a duration with units (e.g. 1s, 2m, 3h), 0 for none")]
pub struct InvalidTimeout(gpu_dra_driver::duration::DurationError);

/// kubectl's forms: `0` (no limit), a whole number of seconds (`30`), or a
/// duration with units (`10s`, `1m`, `1m30s`, `500ms`).
pub fn parse(text: &str) -> Result<RequestTimeout, InvalidTimeout> {
    let text = text.trim();
    let with_unit = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        format!("{text}s")
    } else {
        text.to_string()
    };
    let duration = gpu_dra_driver::duration::parse(&with_unit).map_err(InvalidTimeout)?;
    Ok(RequestTimeout((!duration.is_zero()).then_some(duration)))
}

impl std::fmt::Display for RequestTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            None => f.write_str("0"),
            Some(d) => f.write_str(&gpu_dra_driver::duration::format(d)),
        }
    }
}

/// `work`'s result, or `None` if the limit passed first.
pub async fn within<T>(limit: RequestTimeout, work: impl Future<Output = T>) -> Option<T> {
    match limit.0 {
        Some(limit) => tokio::time::timeout(limit, work).await.ok(),
        None => Some(work.await),
    }
}

/// What the user reads when the limit passed: the server, the limit, and
/// the flag to raise.
pub fn expired(server: &str, limit: RequestTimeout) -> String {
    format!(
        "the API server {server} did not answer within --request-timeout {limit}; it may be overloaded, stalled or \
         unreachable: check it (kubectl get --raw /readyz), or raise --request-timeout (0: no limit)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_as_kubectl_reads_them() {
        assert_eq!(parse("0"), Ok(RequestTimeout(None)));
        assert_eq!(parse("0s"), Ok(RequestTimeout(None)));
        assert_eq!(parse("30"), Ok(RequestTimeout(Some(Duration::from_secs(30)))));
        assert_eq!(parse("10s"), Ok(RequestTimeout(Some(Duration::from_secs(10)))));
        assert_eq!(parse("1m"), Ok(RequestTimeout(Some(Duration::from_secs(60)))));
        assert_eq!(parse("500ms"), Ok(RequestTimeout(Some(Duration::from_millis(500)))));
        let err = parse("-1").unwrap_err().to_string();
        assert!(err.contains("e.g. 1s, 2m, 3h"), "{err}");
        assert!(parse("soon").is_err());
        assert!(parse("99999999999999999999").is_err(), "no overflow");
        assert_eq!(RequestTimeout(Some(Duration::from_secs(2))).to_string(), "2s");
    }
}
