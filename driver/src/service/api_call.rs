//! API calls against a server that may misbehave: each error said in words
//! (never kube's "Failed to parse error data" or serde's "EOF while
//! parsing" alone), the server's text cut to a few hundred bytes, and
//! retries of transient failures bounded by the caller's deadline.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::echo;

/// The first pause between attempts; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Errors worth another try: throttling (429), server-side failures (5xx),
/// and everything below HTTP (refused, reset, timed out, an answer cut
/// short or damaged in transit).
pub fn is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::HyperError(_)
        | kube::Error::Service(_)
        | kube::Error::ReadEvents(_)
        | kube::Error::SerdeError(_)
        | kube::Error::FromUtf8(_) => true,
        _ => false,
    }
}

/// Whether the server answered 409 Conflict (someone else wrote first).
pub fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

/// Whether the server answered 404 Not Found.
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

/// What went wrong, in words a reader can act on, with anything the server
/// sent cut to [`echo::MAX_ECHO`] bytes on one line.
pub fn describe(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => {
            let code = status.code;
            let reason = axum::http::StatusCode::from_u16(code).ok().and_then(|c| c.canonical_reason()).unwrap_or("");
            let what = match code {
                429 => "the API server is throttling requests",
                503 => "the API server is unavailable",
                500..=599 => "the API server failed",
                _ => "the API server refused the request",
            };
            // kube's reason when the body was not a Kubernetes Status (an
            // HTML page from a proxy or load balancer, plain text).
            if status.reason == "Failed to parse error data" {
                format!(
                    "{what} (HTTP {code} {reason}, with a body that is not a Kubernetes Status: {})",
                    echo::text(&status.message)
                )
            } else {
                format!("{what} (HTTP {code} {reason}): {}", echo::text(&status.message))
            }
        }
        kube::Error::SerdeError(e) if e.is_eof() => format!(
            "the API server's answer ended early (cut short before the end of its JSON, at line {} column {})",
            e.line(),
            e.column()
        ),
        kube::Error::SerdeError(e) => format!(
            "the API server's answer is not the object asked for (damaged or of another type): {}",
            echo::text(&e.to_string())
        ),
        kube::Error::FromUtf8(_) => "the API server's answer is not UTF-8 text (damaged in transit)".to_owned(),
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => transport(error),
        other => echo::text(&other.to_string()).to_string(),
    }
}

/// A failure below HTTP, from the deepest cause that says what happened.
fn transport(error: &kube::Error) -> String {
    use std::io::ErrorKind;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    let mut incomplete = false;
    let mut deepest = error.to_string();
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            let said = match io.kind() {
                ErrorKind::TimedOut => Some("the API server did not answer within the read timeout"),
                ErrorKind::ConnectionRefused => Some("cannot connect to the API server (connection refused)"),
                ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe => {
                    Some("the API server closed the connection without answering (reset)")
                }
                ErrorKind::UnexpectedEof => Some("the API server closed the connection before its answer was complete"),
                _ => None,
            };
            if let Some(said) = said {
                return said.to_owned();
            }
        }
        if let Some(hyper) = e.downcast_ref::<hyper::Error>() {
            incomplete |= hyper.is_incomplete_message();
            if hyper.is_timeout() {
                return "the API server did not answer within the read timeout".to_owned();
            }
        }
        deepest = e.to_string();
        source = e.source();
    }
    if incomplete {
        return "the API server closed the connection before its answer was complete \
                (no answer, or one shorter than its Content-Length)"
            .to_owned();
    }
    let deepest = deepest.to_lowercase();
    if deepest.contains("timed out") || deepest.contains("deadline") {
        return "the API server did not answer within the timeout".to_owned();
    }
    format!("the connection to the API server failed: {}", echo::text(&deepest))
}

/// Why a call with a deadline failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The server said no, or the answer could not be used; retrying the
    /// same request would not help.
    #[error("{what}: {cause}")]
    Failed { what: String, cause: String },
    /// The deadline passed; `last` is the last transient failure, if any
    /// attempt ended before it.
    #[error("{what}: no answer within the {budget:.1?} allowed ({})", deadline_cause(*.attempts, .last.as_deref()))]
    Deadline { what: String, budget: Duration, attempts: usize, last: Option<String> },
}

fn deadline_cause(attempts: usize, last: Option<&str>) -> String {
    match last {
        Some(last) => format!("{attempts} attempts; the last: {last}"),
        None => "the API server did not answer".to_owned(),
    }
}

/// Runs `call` until it succeeds, fails for good, or `deadline` passes;
/// each attempt is cut off at the deadline, and transient failures are
/// retried after a pause that doubles from [`FIRST_BACKOFF`] to
/// [`MAX_BACKOFF`] (never past the deadline).
pub async fn with_deadline<T, F, Fut>(what: &str, deadline: Instant, mut call: F) -> Result<T, CallError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let budget = deadline.saturating_duration_since(Instant::now());
    let mut backoff = FIRST_BACKOFF;
    let mut attempts = 0;
    let mut last = None;
    loop {
        let give_up = || CallError::Deadline { what: what.to_owned(), budget, attempts, last: last.clone() };
        if Instant::now() >= deadline {
            return Err(give_up());
        }
        attempts += 1;
        match tokio::time::timeout_at(deadline, call()).await {
            Err(_) => {
                return Err(CallError::Deadline { what: what.to_owned(), budget, attempts, last: last.clone() });
            }
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(error)) if is_transient(&error) => {
                tracing::debug!(what, attempt = attempts, error = %describe(&error), "retrying");
                last = Some(describe(&error));
            }
            Ok(Err(error)) => return Err(CallError::Failed { what: what.to_owned(), cause: describe(&error) }),
        }
        let wake = Instant::now() + backoff;
        if wake >= deadline {
            tokio::time::sleep_until(deadline).await;
            continue;
        }
        tokio::time::sleep_until(wake).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use kube::core::Status;

    use super::*;

    fn api(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Status::failure(message, reason).with_code(code).boxed())
    }

    #[test]
    fn an_html_error_page_is_named_and_cut() {
        let page = format!("<html>\n<head><title>503</title></head>\n<body>{}</body>\n</html>", "x".repeat(5000));
        let text = describe(&api(503, "Failed to parse error data", &page));
        assert!(text.starts_with("the API server is unavailable (HTTP 503 Service Unavailable"), "{text}");
        assert!(text.contains("not a Kubernetes Status"), "{text}");
        assert!(!text.contains('\n') && text.len() < 400, "{text}");
        assert!(!text.contains("Failed to parse"), "{text}");
    }

    #[test]
    fn throttling_and_cut_answers_are_said_in_words() {
        let text = describe(&api(429, "TooManyRequests", "too many requests, please try again later"));
        assert!(text.starts_with("the API server is throttling requests (HTTP 429"), "{text}");
        let eof = serde_json::from_str::<serde_json::Value>("{\"kind\":\"ResourceClaim\",\"meta").unwrap_err();
        let text = describe(&kube::Error::SerdeError(eof));
        assert!(text.starts_with("the API server's answer ended early"), "{text}");
        assert!(!text.contains("EOF while parsing"), "{text}");
    }

    #[test]
    fn transient_is_throttling_server_failures_and_transport() {
        assert!(is_transient(&api(429, "", "")));
        assert!(is_transient(&api(503, "", "")));
        assert!(!is_transient(&api(404, "NotFound", "")));
        assert!(!is_transient(&api(409, "Conflict", "")));
        assert!(is_conflict(&api(409, "Conflict", "")));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_stop_at_the_deadline_with_the_last_cause() {
        let calls = AtomicUsize::new(0);
        let deadline = Instant::now() + Duration::from_secs(3);
        let result: Result<(), _> = with_deadline("reading ResourceClaim ns/a", deadline, || {
            calls.fetch_add(1, Ordering::Relaxed);
            async { Err(api(503, "ServiceUnavailable", "etcd is down")) }
        })
        .await;
        assert_eq!(Instant::now(), deadline);
        let err = result.unwrap_err().to_string();
        assert!(err.starts_with("reading ResourceClaim ns/a: no answer within the 3.0s allowed"), "{err}");
        assert!(err.contains("the API server is unavailable (HTTP 503"), "{err}");
        // 100 ms doubling to 2 s: attempts at 0, 0.1, 0.3, 0.7, 1.5, 3.0 s.
        assert!((4..=7).contains(&calls.load(Ordering::Relaxed)), "{calls:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_that_never_answers_is_cut_at_the_deadline() {
        let deadline = Instant::now() + Duration::from_secs(2);
        let result: Result<(), _> =
            with_deadline("listing", deadline, std::future::pending::<Result<(), kube::Error>>).await;
        let err = result.unwrap_err().to_string();
        assert!(err.contains("the API server did not answer"), "{err}");
        assert_eq!(Instant::now(), deadline);
    }

    #[tokio::test]
    async fn a_refusal_is_not_retried() {
        let calls = AtomicUsize::new(0);
        let deadline = Instant::now() + Duration::from_secs(30);
        let result: Result<(), _> = with_deadline("reading", deadline, || {
            calls.fetch_add(1, Ordering::Relaxed);
            async { Err(api(403, "Forbidden", "no")) }
        })
        .await;
        assert_eq!(calls.load(Ordering::Relaxed), 1);
        assert!(matches!(result, Err(CallError::Failed { .. })));
    }
}
