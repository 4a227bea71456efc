//! The deadline of a kubelet call: the gRPC `grpc-timeout` header the
//! kubelet's context sets (45 s, `defaultClientCallTimeout`), or
//! [`DEFAULT_TIMEOUT`] when a client sent none. The batch must answer
//! before it, so it works to a little earlier ([`Deadline::work_until`]):
//! after the deadline the kubelet has given up and the answer is lost.

use std::time::Duration;

use tokio::time::Instant;

/// When the caller sent no `grpc-timeout`: the kubelet's own 45 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(45);

/// Kept back from the caller's deadline for the answer to travel back and
/// for the work that runs after the last cancellation point (file writes).
const MAX_MARGIN: Duration = Duration::from_secs(1);

/// A call's deadline and how it was set (for the error texts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    /// What the caller allowed.
    pub timeout: Duration,
    /// When the call arrived.
    pub received: Instant,
}

impl Deadline {
    /// From the request's `grpc-timeout` value, if any and valid.
    pub fn from_header(value: Option<&str>, received: Instant) -> Self {
        let timeout = value.and_then(parse_grpc_timeout).unwrap_or(DEFAULT_TIMEOUT);
        Self { timeout, received }
    }

    /// The default deadline from now (callers that are not the kubelet).
    pub fn default_from_now() -> Self {
        Self { timeout: DEFAULT_TIMEOUT, received: Instant::now() }
    }

    /// When the work must stop to answer in time: a tenth of the timeout,
    /// at most a second, before the caller's deadline.
    pub fn work_until(&self) -> Instant {
        let margin = (self.timeout / 10).min(MAX_MARGIN);
        self.received + self.timeout.saturating_sub(margin)
    }
}

/// `grpc-timeout` as the gRPC HTTP/2 protocol defines it: at most 8 ASCII
/// digits and a unit, `H` `M` `S` `m` `u` `n`
/// (hours, minutes, seconds, milli-, micro-, nanoseconds).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let unit = value.chars().last()?;
    let digits = &value[..value.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        'H' => Duration::from_secs(n * 3600),
        'M' => Duration::from_secs(n * 60),
        'S' => Duration::from_secs(n),
        'm' => Duration::from_millis(n),
        'u' => Duration::from_micros(n),
        'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_is_read_as_the_grpc_protocol_writes_it() {
        assert_eq!(parse_grpc_timeout("45S"), Some(Duration::from_secs(45)));
        assert_eq!(parse_grpc_timeout("44999m"), Some(Duration::from_millis(44_999)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("100000000S"), None, "at most 8 digits");
        for bad in ["", "S", "10", "10s", "-1S", "1.5S", "1é"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn work_stops_before_the_callers_deadline() {
        let now = Instant::now();
        let kubelet = Deadline::from_header(Some("45S"), now);
        assert_eq!(kubelet.work_until(), now + Duration::from_secs(44));
        let short = Deadline::from_header(Some("2S"), now);
        assert_eq!(short.work_until(), now + Duration::from_millis(1800));
        let none = Deadline::from_header(None, now);
        assert_eq!(none.timeout, DEFAULT_TIMEOUT);
        assert_eq!(Deadline::from_header(Some("junk"), now).timeout, DEFAULT_TIMEOUT);
    }
}
