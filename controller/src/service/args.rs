//! `gpu-dra-controller run` flags. Every flag has an environment fallback.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Kubeconfig file; else `KUBECONFIG`, else the in-cluster service
    /// account. A plain `http://127.0.0.1:PORT` server works.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of the controller's Lease and of its own objects.
    #[arg(long, env = "POD_NAMESPACE", default_value = "gpu-dra-driver")]
    pub namespace: String,
    /// The driver whose DeviceClasses and claims this controller serves.
    #[arg(long, env = "DRIVER_NAME", default_value = "gpu.nvidia.com")]
    pub driver_name: String,
    /// How long an unallocated claim may wait before it gets an
    /// explanation event (`30s`, `2m`, `0s`). Claims of pending pods are
    /// explained at once.
    #[arg(long, env = "EXPLAIN_AFTER", default_value = "30s", value_parser = parse_duration)]
    pub explain_after: Duration,
    /// How long a delegated claim may stay allocated with no consumer
    /// (empty `status.reservedFor`) before the controller deallocates it.
    #[arg(long, env = "DEALLOCATE_AFTER", default_value = "5m", value_parser = parse_duration)]
    pub deallocate_after: Duration,
    /// Event writes per second (burst: five times as many).
    #[arg(long, env = "EVENT_QPS", default_value_t = 20.0)]
    pub event_qps: f64,
    /// Feature gates, `A=true,B=false`, as set on the node agents: the
    /// webhook judges claims' sharing configs with them.
    #[arg(long, env = "FEATURE_GATES", default_value = "", value_parser = parse_gates)]
    pub feature_gates: gpu_dra_driver::feature_gates::FeatureGates,
    /// HTTPS port of the validating webhook; 0 disables it.
    #[arg(long, env = "WEBHOOK_PORT", default_value_t = 0)]
    pub webhook_port: u16,
    /// TLS certificate of the webhook (PEM), reloaded when it changes.
    #[arg(long, env = "TLS_CERT_FILE", value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// TLS key of the webhook (PEM), reloaded when it changes.
    #[arg(long, env = "TLS_KEY_FILE", value_name = "FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// Elect one leader among replicas on a Lease; only the leader writes.
    #[arg(long, env = "LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// How long the Lease holds without renewal (client-go's flag).
    #[arg(long, env = "LEADER_ELECT_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops leading.
    #[arg(long, env = "LEADER_ELECT_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// Between renewals and attempts to acquire.
    #[arg(long, env = "LEADER_ELECT_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
    /// Address of `/metrics`, `/healthz` and `/readyz`; `off` disables.
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:8080", value_parser = parse_addr)]
    pub metrics_addr: Listen,
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// This replica's name in the Lease (default: `POD_NAME`, else the host
    /// name, plus a random suffix).
    #[arg(long, env = "CONTROLLER_IDENTITY")]
    pub identity: Option<String>,
    /// The longest one API call may take (`100ms` to `5m`): a write or read
    /// that gets no complete answer in this time fails and the next pass
    /// retries; a list or watch whose answer stalls this long is cut and
    /// resumed. Also the client's read timeout.
    #[arg(long, env = "API_TIMEOUT", default_value = "30s", value_parser = parse_api_timeout)]
    pub api_timeout: Duration,
}

/// `--api-timeout`: a duration from 100 ms to 5 min.
fn parse_api_timeout(text: &str) -> Result<Duration, String> {
    let value = parse_duration(text)?;
    if !(Duration::from_millis(100)..=Duration::from_secs(300)).contains(&value) {
        return Err(format!("{text:?} is outside the allowed range, 100ms to 5m"));
    }
    Ok(value)
}

/// `90s`, `5m`, `1h30m`, `250ms`, `0s`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let fail = || format!("{text:?} is not a duration; write one such as 30s, 2m or 1h30m");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return Err(fail());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(fail)?;
        let value: u64 = rest[..digits].parse().map_err(|_| fail())?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let part = match &rest[..unit_len] {
            "ms" => Duration::from_millis(value),
            "s" => Duration::from_secs(value),
            "m" => Duration::from_secs(value * 60),
            "h" => Duration::from_secs(value * 3600),
            _ => return Err(fail()),
        };
        total += part;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

fn parse_gates(text: &str) -> Result<gpu_dra_driver::feature_gates::FeatureGates, String> {
    text.parse::<gpu_dra_driver::feature_gates::FeatureGates>().map_err(|e| e.to_string())?.check_dependencies()
}

/// An address to listen on, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    Off,
    At(SocketAddr),
}

fn parse_addr(text: &str) -> Result<Listen, String> {
    if text == "off" {
        return Ok(Listen::Off);
    }
    text.parse().map(Listen::At).map_err(|_| format!("{text:?} is not an address such as 0.0.0.0:8080, or off"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_kubernetes_writes_them() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("soon").unwrap_err().contains("30s"));
        assert!(parse_duration("5").is_err());
    }

    #[test]
    fn the_api_timeout_is_bounded() {
        assert_eq!(parse_api_timeout("2s"), Ok(Duration::from_secs(2)));
        assert!(parse_api_timeout("0s").unwrap_err().contains("100ms to 5m"));
        assert!(parse_api_timeout("1h").unwrap_err().contains("100ms to 5m"));
    }
}
