//! The ranges of the controller's duration flags; the grammar is
//! `gpu_dra_driver::duration`'s. The chart checks values with the same
//! ranges (`_helpers.tpl`), so a value the chart renders is one the binary
//! starts with.

use std::time::Duration;

use gpu_dra_driver::duration::DurationRange;

const fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

pub const EXPLAIN_AFTER: DurationRange =
    DurationRange { flag: "--explain-after", min: Duration::ZERO, max: secs(24 * 3600) };
pub const DEALLOCATE_AFTER: DurationRange =
    DurationRange { flag: "--deallocate-after", min: secs(1), max: secs(7 * 24 * 3600) };
pub const LEASE_DURATION: DurationRange =
    DurationRange { flag: "--leader-elect-lease-duration", min: secs(1), max: secs(3600) };
pub const RENEW_DEADLINE: DurationRange =
    DurationRange { flag: "--leader-elect-renew-deadline", min: Duration::from_millis(500), max: secs(3600) };
pub const API_TIMEOUT: DurationRange =
    DurationRange { flag: "--api-timeout", min: Duration::from_millis(100), max: secs(300) };
pub const RETRY_PERIOD: DurationRange =
    DurationRange { flag: "--leader-elect-retry-period", min: Duration::from_millis(100), max: secs(600) };

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_flag_has_a_range() {
        assert_eq!(EXPLAIN_AFTER.parse("24h"), Ok(secs(86400)));
        let error = EXPLAIN_AFTER.parse("24h0.001s").unwrap_err().to_string();
        assert_eq!(error, "24h0.001s is outside --explain-after's range 0s to 24h");
        assert!(DEALLOCATE_AFTER.parse("0s").unwrap_err().to_string().contains("range 1s to 168h"));
        assert!(RETRY_PERIOD.parse("99ms").unwrap_err().to_string().contains("100ms to 10m"));
        assert_eq!(RENEW_DEADLINE.parse("0.5s"), Ok(Duration::from_millis(500)));
        assert!(LEASE_DURATION.parse("999999h").unwrap_err().to_string().contains("1s to 1h"));
    }
}
