//! `gpu-dra-controller run` flags. Every flag has an environment fallback.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use gpu_dra_driver::feature_gates::{FeatureGateError, FeatureGates};

mod duration;

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
    /// explanation event (`30s`, `2m`, `0s`; 0s to 24h). Claims of pending
    /// pods are explained at once.
    #[arg(long, env = "EXPLAIN_AFTER", default_value = "30s", value_parser = |t: &str| duration::EXPLAIN_AFTER.parse(t))]
    pub explain_after: Duration,
    /// How long a delegated claim may stay allocated with no consumer
    /// (empty `status.reservedFor`) before the controller deallocates it
    /// (1s to 168h).
    #[arg(long, env = "DEALLOCATE_AFTER", default_value = "5m", value_parser = |t: &str| duration::DEALLOCATE_AFTER.parse(t))]
    pub deallocate_after: Duration,
    /// Event writes per second (burst: five times as many).
    #[arg(long, env = "EVENT_QPS", default_value_t = 20.0)]
    pub event_qps: f64,
    /// Feature gates, `A=true,B=false`, as set on the node agents: the
    /// webhook judges claims' sharing configs with them.
    #[arg(long, env = "FEATURE_GATES", default_value = "", value_parser = parse_gates)]
    pub feature_gates: FeatureGates,
    /// Reconcile ComputeDomains (`computedomains.resource.nvidia.com`, whose
    /// CRD must be installed): each domain's workload ResourceClaimTemplate,
    /// status, finalizer and explanations.
    #[arg(long, env = "COMPUTE_DOMAINS")]
    pub compute_domains: bool,
    /// HTTPS port of the validating webhook; 0 disables it.
    #[arg(long, env = "WEBHOOK_PORT", default_value_t = 0)]
    pub webhook_port: u16,
    /// Address the webhook listens on (default: every address). A pod on
    /// its node's network gives its own (`$(POD_IP)`), so that replicas on
    /// nodes sharing one host (test nodes) do not take each other's port.
    #[arg(long, env = "WEBHOOK_HOST", default_value = "0.0.0.0")]
    pub webhook_host: std::net::IpAddr,
    /// TLS certificate of the webhook (PEM), reloaded when it changes.
    #[arg(long, env = "TLS_CERT_FILE", value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// TLS key of the webhook (PEM), reloaded when it changes.
    #[arg(long, env = "TLS_KEY_FILE", value_name = "FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// Elect one leader among replicas on a Lease; only the leader writes.
    #[arg(long, env = "LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// How long the Lease holds without renewal (client-go's flag; 1s to 1h).
    #[arg(long, env = "LEADER_ELECT_LEASE_DURATION", default_value = "15s", value_parser = |t: &str| duration::LEASE_DURATION.parse(t))]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops leading
    /// (500ms to 1h, shorter than the lease duration).
    #[arg(long, env = "LEADER_ELECT_RENEW_DEADLINE", default_value = "10s", value_parser = |t: &str| duration::RENEW_DEADLINE.parse(t))]
    pub leader_elect_renew_deadline: Duration,
    /// Between renewals and attempts to acquire (100ms to 10m).
    #[arg(long, env = "LEADER_ELECT_RETRY_PERIOD", default_value = "2s", value_parser = |t: &str| duration::RETRY_PERIOD.parse(t))]
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
    #[arg(long, env = "API_TIMEOUT", default_value = "30s", value_parser = |t: &str| duration::API_TIMEOUT.parse(t))]
    pub api_timeout: Duration,
}

fn parse_gates(text: &str) -> Result<FeatureGates, FeatureGateError> {
    text.parse::<FeatureGates>()?.check_dependencies()
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
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    #[test]
    fn the_webhook_listens_on_every_address_unless_given_one() {
        let cli = Cli::try_parse_from(["c"]).unwrap();
        assert_eq!(cli.run.webhook_host, std::net::IpAddr::from([0, 0, 0, 0]));
        let cli = Cli::try_parse_from(["c", "--webhook-host=198.18.0.7"]).unwrap();
        assert_eq!(cli.run.webhook_host, std::net::IpAddr::from([198, 18, 0, 7]));
        let error = Cli::try_parse_from(["c", "--webhook-host=node-a"]).unwrap_err();
        assert!(error.to_string().contains("--webhook-host"), "{error}");
    }

    #[test]
    fn duration_flags_are_bounded() {
        let parse = |flag: &str, value: &str| Cli::try_parse_from(["c", &format!("{flag}={value}")]);
        let error = parse("--explain-after", "18446744073709551615s18446744073709551615s").unwrap_err();
        assert!(error.to_string().contains("longer than 32 characters"), "{error}");
        let error = parse("--deallocate-after", "99999999999999999h").unwrap_err();
        assert!(error.to_string().contains("more than 6 digits"), "{error}");
        let error = parse("--leader-elect-lease-duration", "2h").unwrap_err();
        assert!(error.to_string().contains("range 1s to 1h"), "{error}");
        let cli = parse("--explain-after", "1.5s").unwrap();
        assert_eq!(cli.run.explain_after, Duration::from_millis(1500));
        let cli = parse("--deallocate-after", "0.5h").unwrap();
        assert_eq!(cli.run.deallocate_after, Duration::from_secs(1800));
    }

    #[test]
    fn the_api_timeout_is_bounded() {
        assert_eq!(duration::API_TIMEOUT.parse("2s"), Ok(Duration::from_secs(2)));
        assert!(duration::API_TIMEOUT.parse("0s").unwrap_err().to_string().contains("100ms to 5m"));
        assert!(duration::API_TIMEOUT.parse("1h").unwrap_err().to_string().contains("100ms to 5m"));
    }
}
