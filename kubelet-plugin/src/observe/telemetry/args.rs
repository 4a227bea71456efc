//! Flags of the telemetry and the idle-claim watch.

use std::time::Duration;

use clap::Args;

use super::families::Naming;
use super::idle::IdlePolicy;
use super::series_cap::DEFAULT_MAX_CLAIM_SERIES;

#[derive(Debug, Clone, Args)]
pub struct TelemetryArgs {
    /// How often NVML is read for the devices' utilization, memory, power,
    /// temperature, clocks and ECC counts, in milliseconds (100 to
    /// 3600000), or 0 for no telemetry (and no idle-claim warnings). Never
    /// on the prepare path. Without NVML (--fake-inventory) there is none.
    #[arg(long, env = "TELEMETRY_INTERVAL_MS", default_value_t = 15_000, value_name = "MS",
          value_parser = parse_interval)]
    pub telemetry_interval_ms: u64,
    /// Metric names and labels of the device readings: `native`
    /// (`gpu_dra_device_*`) or `dcgm` (dcgm-exporter's `DCGM_FI_DEV_*` and
    /// labels, for dashboards built on dcgm-exporter).
    #[arg(long, env = "TELEMETRY_NAMES", value_enum, default_value_t = Naming::Native)]
    pub telemetry_names: Naming,
    /// A claim whose devices' average GPU utilization stays under this
    /// percentage for --idle-window-seconds is warned about (0 to 100; 0
    /// turns the warnings off).
    #[arg(long, env = "IDLE_THRESHOLD_PERCENT", default_value_t = 5.0, value_name = "PERCENT",
          value_parser = parse_percent)]
    pub idle_threshold_percent: f64,
    /// The idle window, in seconds (1 to 604800; default 30 minutes).
    #[arg(long, env = "IDLE_WINDOW_SECONDS", default_value_t = 1800, value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub idle_window_seconds: u64,
    /// At most this many claim label sets carry per-claim telemetry series
    /// on this node (0 to 65536): one per device and claim (`native`), one
    /// per device, claim and pod (`dcgm`). Each gives one series per
    /// device family. A claim that would pass it gets no series of its own
    /// (its devices keep their unlabelled ones) and is counted in
    /// gpu_dra_claim_series_dropped_total; a claim keeps its series while
    /// it is prepared.
    #[arg(long, env = "MAX_CLAIM_SERIES", default_value_t = DEFAULT_MAX_CLAIM_SERIES, value_name = "SETS",
          value_parser = clap::value_parser!(u32).range(0..=65_536))]
    pub max_claim_series: u32,
}

impl TelemetryArgs {
    /// `None` when telemetry is off.
    pub fn interval(&self) -> Option<Duration> {
        (self.telemetry_interval_ms > 0).then(|| Duration::from_millis(self.telemetry_interval_ms))
    }

    /// `None` when idle warnings are off.
    pub fn idle_policy(&self) -> Option<IdlePolicy> {
        (self.idle_threshold_percent > 0.0).then(|| IdlePolicy {
            threshold_percent: self.idle_threshold_percent,
            window: Duration::from_secs(self.idle_window_seconds),
        })
    }
}

/// A bad value of a telemetry flag; clap shows it after the flag's name.
#[derive(Debug, thiserror::Error)]
enum FlagError {
    #[error("{0}; expected milliseconds, e.g. 15000, or 0 for off")]
    Interval(std::num::ParseIntError),
    #[error("{0} is out of range: 0 (off) or 100 to 3600000 milliseconds")]
    IntervalRange(u64),
    #[error("{0}; expected a percentage from 0 to 100")]
    Percent(std::num::ParseFloatError),
    #[error("{0} is out of range: 0 to 100")]
    PercentRange(f64),
}

fn parse_interval(text: &str) -> Result<u64, FlagError> {
    let ms: u64 = text.trim().parse().map_err(FlagError::Interval)?;
    match ms {
        0 | 100..=3_600_000 => Ok(ms),
        _ => Err(FlagError::IntervalRange(ms)),
    }
}

fn parse_percent(text: &str) -> Result<f64, FlagError> {
    let p: f64 = text.trim().parse().map_err(FlagError::Percent)?;
    if (0.0..=100.0).contains(&p) { Ok(p) } else { Err(FlagError::PercentRange(p)) }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        t: TelemetryArgs,
    }

    fn parse(args: &[&str]) -> Result<TelemetryArgs, String> {
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied())).map(|c| c.t).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_a_platform_teams_and_bad_values_name_the_flag() {
        let t = parse(&[]).unwrap();
        assert_eq!(t.interval(), Some(Duration::from_secs(15)));
        assert_eq!(t.idle_policy(), Some(IdlePolicy { threshold_percent: 5.0, window: Duration::from_secs(1800) }));
        assert_eq!(t.telemetry_names, Naming::Native);
        assert_eq!(t.max_claim_series, 256);
        assert_eq!(parse(&["--max-claim-series", "0"]).unwrap().max_claim_series, 0);
        assert_eq!(parse(&["--telemetry-interval-ms", "0"]).unwrap().interval(), None);
        assert_eq!(parse(&["--idle-threshold-percent", "0"]).unwrap().idle_policy(), None);
        assert_eq!(parse(&["--telemetry-names", "dcgm"]).unwrap().telemetry_names, Naming::Dcgm);
        for (flag, value) in [
            ("--telemetry-interval-ms", "50"),
            ("--idle-threshold-percent", "101"),
            ("--idle-window-seconds", "0"),
            ("--max-claim-series", "65537"),
        ] {
            let err = parse(&[flag, value]).unwrap_err();
            assert!(err.contains(flag) && err.contains(value), "{err}");
        }
    }

    #[test]
    fn bad_values_say_what_is_expected() {
        assert_eq!(
            parse_interval("50").unwrap_err().to_string(),
            "50 is out of range: 0 (off) or 100 to 3600000 milliseconds"
        );
        assert_eq!(
            parse_interval("x").unwrap_err().to_string(),
            "invalid digit found in string; expected milliseconds, e.g. 15000, or 0 for off"
        );
        assert_eq!(parse_percent("101").unwrap_err().to_string(), "101 is out of range: 0 to 100");
        assert_eq!(
            parse_percent("x").unwrap_err().to_string(),
            "invalid float literal; expected a percentage from 0 to 100"
        );
    }
}
