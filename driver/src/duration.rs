//! Durations on the command line: Go's `time.ParseDuration` syntax (what
//! every Kubernetes component's flags take, fractions included: `1.5h`),
//! narrowed so that no input can overflow, and a valid range per flag.
//!
//! The chart checks values with the same grammar (`values.schema.json`'s
//! `duration` pattern) and the same ranges (`_helpers.tpl`), so a value the
//! chart renders is one the binary starts with; the chart test runs both
//! over one table of inputs. The controller's flags and `kubectl gpu
//! --timeout` read durations here, so both take the same text.
//!
//! Grammar: `0`, or one or more `<digits>[.<decimals>]<unit>` with at most
//! 6 digits, 9 decimals (nanoseconds) and 32 characters in all; units
//! `ns`, `us` (`µs`), `ms`, `s`, `m`, `h`. No sign: none of these waits can
//! be negative.

use std::time::Duration;

/// Longest duration text accepted, in characters.
pub const MAX_CHARS: usize = 32;
const MAX_DIGITS: usize = 6;
const MAX_DECIMALS: usize = 9;

const NANOS_PER_SECOND: u128 = 1_000_000_000;

/// A duration that cannot be used: what was wrong, with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not of the grammar above.
    #[error(
        "{text:?} is not a duration ({why}); write one such as 30s, 1m30s, 1.5h or 250ms: \
         numbers of at most {MAX_DIGITS} digits and {MAX_DECIMALS} decimals, units ns, us, ms, s, m, h"
    )]
    Syntax { text: String, why: String },
    /// A duration, but outside a flag's range.
    #[error("{text} is outside {flag}'s range {} to {}", format(*.min), format(*.max))]
    OutOfRange { text: String, flag: &'static str, min: Duration, max: Duration },
}

/// A flag's valid range, inclusive.
#[derive(Debug, Clone, Copy)]
pub struct DurationRange {
    pub flag: &'static str,
    pub min: Duration,
    pub max: Duration,
}

impl DurationRange {
    /// Parses `text` and checks it lies in the range.
    pub fn parse(&self, text: &str) -> Result<Duration, DurationError> {
        let value = parse(text)?;
        if value < self.min || value > self.max {
            return Err(DurationError::OutOfRange {
                text: text.to_string(),
                flag: self.flag,
                min: self.min,
                max: self.max,
            });
        }
        Ok(value)
    }
}

/// Parses a duration of the grammar above (no range check).
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let fail = |why: &str| DurationError::Syntax { text: text.to_string(), why: why.to_string() };
    if text.chars().count() > MAX_CHARS {
        return Err(fail(&format!("longer than {MAX_CHARS} characters")));
    }
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(fail("empty"));
    }
    let mut total: u128 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(fail("a number must come before each unit"));
        }
        if digits > MAX_DIGITS {
            return Err(fail(&format!("more than {MAX_DIGITS} digits")));
        }
        let whole: u128 = rest[..digits].parse().map_err(|_| fail("not a number"))?;
        rest = &rest[digits..];
        let mut decimals = "";
        if let Some(after_dot) = rest.strip_prefix('.') {
            let n = after_dot.find(|c: char| !c.is_ascii_digit()).unwrap_or(after_dot.len());
            if n == 0 {
                return Err(fail("a decimal point must be followed by digits"));
            }
            if n > MAX_DECIMALS {
                return Err(fail(&format!("more than {MAX_DECIMALS} decimals")));
            }
            decimals = &after_dot[..n];
            rest = &after_dot[n..];
        }
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let unit: u128 = match &rest[..unit_len] {
            "ns" => 1,
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "s" => NANOS_PER_SECOND,
            "m" => 60 * NANOS_PER_SECOND,
            "h" => 3600 * NANOS_PER_SECOND,
            "" => return Err(fail("a unit must follow each number")),
            _ => return Err(fail(&format!("unknown unit {:?}", &rest[..unit_len]))),
        };
        // The decimals as nanoseconds of the unit, truncated: the same
        // integer arithmetic as the chart's check.
        let billionths: u128 = format!("{decimals:0<9}").parse().map_err(|_| fail("not a number"))?;
        total += whole * unit + billionths * unit / NANOS_PER_SECOND;
        rest = &rest[unit_len..];
    }
    // At most 4 parts of 999999h fit in 32 characters: far below u64.
    u64::try_from(total).map(Duration::from_nanos).map_err(|_| fail("too long"))
}

/// `90s`, `1h`, `500ms`, `0s`: for messages.
pub fn format(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 => "0s".to_string(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn durations_read_as_go_writes_them() {
        assert_eq!(parse("30s"), Ok(secs(30)));
        assert_eq!(parse("1h30m"), Ok(secs(5400)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("0.5h"), Ok(secs(1800)));
        assert_eq!(parse("1.000000001s"), Ok(Duration::from_nanos(1_000_000_001)));
        assert_eq!(parse("2us"), parse("2µs"));
        assert_eq!(parse("1h1h"), Ok(secs(7200)));
        assert_eq!(parse("0.5ns"), Ok(Duration::ZERO), "below a nanosecond truncates, as Go");
    }

    #[test]
    fn bad_durations_are_refused_without_panic_or_wrap() {
        for (text, why) in [
            ("18446744073709551615s18446744073709551615s", "longer than 32"),
            ("99999999999999999h", "more than 6 digits"),
            ("9999999h", "more than 6 digits"),
            ("1.0000000001s", "more than 9 decimals"),
            ("soon", "a number must come before"),
            ("5", "a unit must follow"),
            ("", "empty"),
            ("-1s", "a number must come before"),
            ("+1s", "a number must come before"),
            ("1.s", "followed by digits"),
            (".5s", "a number must come before"),
            ("1d", "unknown unit \"d\""),
            ("1s ", "unknown unit \"s \""),
            ("1s\n--kubeconfig=/x", "unknown unit"),
        ] {
            let error = parse(text).unwrap_err().to_string();
            assert!(error.contains(why), "{text:?}: {error}");
            assert!(error.contains("such as 30s"), "{error}");
        }
        // The largest value the grammar allows does not overflow.
        assert_eq!(parse("999999h999999h999999h999999h"), Ok(secs(4 * 999_999 * 3600)));
    }
}
