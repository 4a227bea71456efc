//! Command line of `gpu-kubelet-plugin`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};
use gpu_dra_driver::names::{ClaimUid, DeviceName};

use crate::flags::{ArgsError, DriverRootArgs, HostRootsArgs, NodeArgs};

/// Kubelet plugin of the GPU DRA driver: discovers the node's NVIDIA GPUs,
/// publishes them as ResourceSlices and prepares claimed devices through CDI.
#[derive(Debug, Parser)]
#[command(name = "gpu-kubelet-plugin", version, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub logging: LoggingArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node agent: publish this node's GPUs as ResourceSlices,
    /// register with the kubelet and serve its DRA gRPC calls until SIGTERM.
    Run(RunArgs),
    /// Print the ResourceSlices this node would publish, built by the same
    /// code the plugin publishes with.
    PrintSlices(PrintSlicesArgs),
    /// Print the CDI spec the plugin would write when preparing these devices
    /// for a claim.
    PrintCdi(PrintCdiArgs),
    /// Run an MPS control daemon with a claim's tmpfs as its /dev/shm (the
    /// plugin runs this itself).
    #[command(hide = true)]
    MpsLaunch(crate::prepare::mps::launch::MpsLaunchArgs),
    /// Launch MPS control daemons the plugin asks for (`run
    /// --mps-supervisor`), so that they live in this process's container
    /// and outlive the plugin's restarts. Runs until stopped.
    MpsSupervisor(crate::prepare::mps::launch::MpsSupervisorArgs),
}

#[derive(Debug, Args)]
pub struct LoggingArgs {
    /// Log format on standard error.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "LOG_FORMAT", global = true)]
    pub log_format: LogFormat,
    /// Log filter: a level (off, error, warn, info, debug, trace) or
    /// comma-separated `target=level` directives, e.g.
    /// `info,gpu_dra_driver=debug`.
    #[arg(long, default_value = "warn", env = "LOG_LEVEL", global = true, value_parser = parse_log_filter)]
    pub log_level: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Flags of `run`. Every flag also reads the environment variable shown.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub driver_root: DriverRootArgs,
    /// The kubelet's plugin directory; the DRA socket is
    /// `<plugins-dir>/<driver-name>/dra.sock`. The path must be the same
    /// inside and outside the container: the kubelet dials it as given.
    #[arg(long, env = "PLUGINS_DIR", default_value = "/var/lib/kubelet/plugins", value_name = "DIR")]
    pub plugins_dir: PathBuf,
    /// The kubelet's plugin registry directory; the registration socket is
    /// `<registry-dir>/<driver-name>-reg.sock`.
    #[arg(long, env = "REGISTRY_DIR", default_value = "/var/lib/kubelet/plugins_registry", value_name = "DIR")]
    pub registry_dir: PathBuf,
    /// Where CDI spec files for prepared claims are written (a directory the
    /// container runtime reads CDI specs from).
    #[arg(long, env = "CDI_DIR", default_value = "/var/run/cdi", value_name = "DIR")]
    pub cdi_dir: PathBuf,
    /// Feature gates, `A=true,B=false`: TimeSlicingSettings (claims may
    /// time-slice whole GPUs), MPSSupport (an MPS control daemon per
    /// claim) and ConsumableCapacity (whole GPUs published shareable by
    /// memory; needs MPSSupport, which enforces the shares); all off by
    /// default, as NVIDIA's.
    #[arg(long, env = "FEATURE_GATES", default_value = "", value_parser = parse_gates)]
    pub feature_gates: gpu_dra_driver::feature_gates::FeatureGates,
    /// Have MPS daemons launched by `gpu-kubelet-plugin mps-supervisor` (a
    /// second container of the pod sharing its process namespace and
    /// --state-dir), so that they outlive restarts of this container.
    #[arg(long, env = "MPS_SUPERVISOR")]
    pub mps_supervisor: bool,
    /// How long prepare waits for a claim's MPS control daemon to answer
    /// before failing the claim, in milliseconds (100 to 600000).
    #[arg(long, env = "MPS_READY_TIMEOUT_MS", default_value_t = 20_000, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub mps_ready_timeout_ms: u64,
    /// Where the checkpoint of prepared claims lives [default:
    /// <plugins-dir>/<driver-name>].
    #[arg(long, env = "STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Kubeconfig file for the API server. Without it, `KUBECONFIG` is used,
    /// then the in-cluster service account. A plain `http://` server works.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Address of the HTTP server for `/metrics`, `/healthz` and `/readyz`,
    /// or `off` to disable it. Port 0 picks a free port (logged).
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:8080", value_parser = parse_metrics_addr)]
    pub metrics_addr: MetricsAddr,
    #[command(flatten)]
    pub host: HostRootsArgs,
    /// The directory the host's /dev is under: device nodes a fresh node
    /// lacks (/dev/nvidia0, /dev/nvidia-uvm, ...) are created there before
    /// a claim's spec is written [default: / with NVML; none with
    /// --fake-inventory].
    #[arg(long, env = "DEV_ROOT", value_name = "DIR")]
    pub dev_root: Option<PathBuf>,
    /// How long an API call waits for the server's next bytes (an answer
    /// that stalls or is cut short fails after this; connecting waits at
    /// most 5 s of it), in milliseconds. A NodePrepareResources call also
    /// ends at the kubelet's deadline, whichever comes first.
    #[arg(long, env = "API_TIMEOUT_MS", default_value_t = 30_000, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(100..=300_000))]
    pub api_timeout_ms: u64,
    /// Also serve NVIDIA's `compute-domain.nvidia.com` driver
    /// (ComputeDomains: IMEX channels across a multi-node NVLink clique):
    /// its own registration and slices, channels and daemons prepared
    /// here, `nvidia-imex` run from --driver-root.
    #[arg(long, env = "COMPUTE_DOMAINS")]
    pub compute_domains: bool,
    /// Serve the GPU driver (--driver-name): publish the node's GPUs and
    /// prepare their claims. `--gpus=false` (with --compute-domains) serves
    /// ComputeDomains only: no GPU slices, no GPU registration; the GPUs
    /// are still read, for their fabric clique.
    #[arg(long, env = "GPUS", default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub gpus: bool,
    /// How long a ComputeDomain prepare waits for the node to join its
    /// domain and for a newly started IMEX daemon to answer ready, in
    /// milliseconds.
    #[arg(long, env = "IMEX_READY_TIMEOUT_MS", default_value_t = 30_000, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub imex_ready_timeout_ms: u64,
    /// How often each IMEX daemon is asked whether it is ready
    /// (`nvidia-imex-ctl -q`), in milliseconds.
    #[arg(long, env = "IMEX_HEALTH_INTERVAL_MS", default_value_t = 2_000, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(50..=600_000))]
    pub imex_health_interval_ms: u64,
    /// How often the --fake-inventory file is re-read for changes (fault
    /// injection), in milliseconds (10 to 3600000).
    #[arg(long, env = "FAKE_INVENTORY_POLL_MS", default_value_t = 2000, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    pub fake_inventory_poll_ms: u64,
    #[command(flatten)]
    pub telemetry: crate::observe::telemetry::args::TelemetryArgs,
}

impl RunArgs {
    /// `--state-dir`, or `<plugins-dir>/<driver-name>`.
    pub fn state_dir(&self) -> PathBuf {
        self.state_dir.clone().unwrap_or_else(|| self.plugins_dir.join(self.node.driver_name.as_str()))
    }

    /// At least one driver is served.
    pub fn check_drivers(&self) -> Result<(), ArgsError> {
        match (self.gpus, self.compute_domains) {
            (false, false) => Err(ArgsError::NoDriver),
            _ => Ok(()),
        }
    }

    /// Directories must be absolute: the kubelet dials the advertised
    /// socket path as given, and relative paths would depend on the cwd.
    pub fn check_paths(&self) -> Result<(), ArgsError> {
        let state_dir = self.state_dir();
        let dirs: [(&str, &Path); 4] = [
            ("--plugins-dir", &self.plugins_dir),
            ("--registry-dir", &self.registry_dir),
            ("--cdi-dir", &self.cdi_dir),
            ("--state-dir", &state_dir),
        ];
        for (flag, dir) in dirs {
            if !dir.is_absolute() {
                return Err(ArgsError::RelativePath { flag, dir: dir.to_path_buf() });
            }
        }
        Ok(())
    }
}

/// Where the HTTP server listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsAddr {
    Off,
    Listen(SocketAddr),
}

fn parse_metrics_addr(value: &str) -> Result<MetricsAddr, String> {
    match value.trim() {
        "" | "off" | "none" | "disabled" => Ok(MetricsAddr::Off),
        text => text
            .parse()
            .map(MetricsAddr::Listen)
            .map_err(|e| format!("{e}; expected HOST:PORT such as 0.0.0.0:8080, or `off`")),
    }
}

/// The node a print command describes, with `run`'s flags for it: which
/// node and driver, where its GPUs are read from, and the host's paths.
#[derive(Debug, Args)]
pub struct PrintedNodeArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub driver_root: DriverRootArgs,
    #[command(flatten)]
    pub host: HostRootsArgs,
}

#[derive(Debug, Args)]
pub struct PrintSlicesArgs {
    #[command(flatten)]
    pub printed: PrintedNodeArgs,
    /// Output format: YAML documents ready for `kubectl apply -f -`, or a
    /// JSON `v1` List.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Yaml)]
    pub output: OutputFormat,
    /// Pool generation to stamp on the slices.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = parse_generation)]
    pub generation: i64,
    /// Feature gates as `run` takes them, to see what a gate changes in the
    /// slices (ConsumableCapacity: shareable GPUs). Only what is published
    /// is shown, so gates `run` would refuse are accepted here.
    #[arg(long, env = "FEATURE_GATES", default_value = "", value_parser = parse_known_gates)]
    pub feature_gates: gpu_dra_driver::feature_gates::FeatureGates,
    /// The Kubernetes release the slices are for, `1.34` to `1.37`: where
    /// releases differ (taint effect None, and with DynamicMIG whether
    /// counter sets sit beside their devices (1.34) or in slices of their
    /// own (1.35+)), the plugin publishes for its API server's.
    #[arg(long, default_value = "1.34", value_name = "1.MINOR", value_parser = parse_kubernetes_version)]
    pub kubernetes_version: gpu_dra_driver::slices::ServerRules,
}

/// `1.34` .. `1.37` (a patch or `v` prefix is accepted) as the server's rules.
fn parse_kubernetes_version(
    value: &str,
) -> Result<gpu_dra_driver::slices::ServerRules, dra_cel::kubernetes_version::VersionError> {
    dra_cel::kubernetes_version::parse_minor(value).map(|minor| gpu_dra_driver::slices::ServerRules { minor })
}

#[derive(Debug, Args)]
pub struct PrintCdiArgs {
    #[command(flatten)]
    pub printed: PrintedNodeArgs,
    /// UID of the ResourceClaim (RFC 4122, lower case).
    #[arg(long)]
    pub claim_uid: ClaimUid,
    /// A device of the claim, as named in the ResourceSlice (e.g. gpu-0);
    /// repeat for several.
    #[arg(long = "device", value_name = "NAME", required = true)]
    pub devices: Vec<DeviceName>,
    /// Output format of the spec.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Json)]
    pub output: OutputFormat,
    /// CDI spec directory, to show where the file would go.
    #[arg(long, env = "CDI_DIR", default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Yaml,
    Json,
}

/// A pool generation: 0 to i64's maximum, as the apiserver takes it.
/// Negative numbers reach this parser (rather than being taken for flags)
/// so the answer can say what is allowed.
fn parse_generation(text: &str) -> Result<i64, String> {
    const ALLOWED: &str = "a pool generation is a whole number from 0 to 9223372036854775807 (the plugin starts at 1)";
    match text.trim().parse::<i64>() {
        Ok(n) if n >= 0 => Ok(n),
        Ok(n) => Err(format!("{n} is negative; {ALLOWED}")),
        Err(e) => Err(format!("{text:?} is not a number ({e}); {ALLOWED}")),
    }
}

/// A log filter of levels and `target=level` directives only: a bare word
/// that is not a level (`verbose`) would be read as a target and filter
/// every other log out. The chart's `logLevel` pattern is the same.
fn parse_log_filter(text: &str) -> Result<String, String> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    let is_target = |target: &str| {
        target.split("::").all(|part| {
            part.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                && part.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
    };
    for directive in text.split(',') {
        let valid = match directive.split_once('=') {
            None => LEVELS.contains(&directive),
            Some((target, level)) => is_target(target) && LEVELS.contains(&level),
        };
        if !valid {
            return Err(format!(
                "{directive:?} is not a log level; write one of {} or target=level directives separated by commas, \
                 such as info,gpu_dra_driver=debug",
                LEVELS.join(", ")
            ));
        }
    }
    Ok(text.to_string())
}

fn parse_known_gates(text: &str) -> Result<gpu_dra_driver::feature_gates::FeatureGates, String> {
    text.parse::<gpu_dra_driver::feature_gates::FeatureGates>().map_err(|e| e.to_string())
}

fn parse_gates(text: &str) -> Result<gpu_dra_driver::feature_gates::FeatureGates, String> {
    text.parse::<gpu_dra_driver::feature_gates::FeatureGates>()
        .map_err(|e| e.to_string())?
        .check_dependencies()
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn generation_errors_say_the_allowed_range() {
        let err = Cli::try_parse_from(["gpu-kubelet-plugin", "print-slices", "--node-name", "n", "--generation", "-1"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "invalid value '-1' for '--generation <GENERATION>': -1 is negative; a pool generation is a whole \
                 number from 0 to 9223372036854775807 (the plugin starts at 1)"
            ),
            "{err}"
        );
        let err = Cli::try_parse_from(["gpu-kubelet-plugin", "print-slices", "--node-name", "n", "--generation", "x"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"x\" is not a number (invalid digit found in string); a pool generation"), "{err}");
        let cli = Cli::try_parse_from(["gpu-kubelet-plugin", "print-slices", "--node-name", "n", "--generation", "0"])
            .unwrap();
        assert!(matches!(cli.command, Command::PrintSlices(a) if a.generation == 0));
    }

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn bad_names_are_rejected_by_the_parser() {
        let err = Cli::try_parse_from(["gpu-kubelet-plugin", "print-slices", "--node-name", "Bad_Node"]).unwrap_err();
        assert!(err.to_string().contains("invalid node name"), "{err}");
        let err = Cli::try_parse_from([
            "gpu-kubelet-plugin",
            "print-cdi",
            "--node-name",
            "n",
            "--claim-uid",
            "../etc",
            "--device",
            "gpu-0",
        ])
        .unwrap_err();
        assert!(err.to_string().contains("claim UID"), "{err}");
    }

    #[test]
    fn run_has_the_kubelets_defaults() {
        let cli = Cli::try_parse_from(["gpu-kubelet-plugin", "run", "--node-name", "node-a"]).unwrap();
        let Command::Run(args) = cli.command else { panic!("not run") };
        assert_eq!(args.node.driver_name.as_str(), "gpu.nvidia.com");
        assert_eq!(args.plugins_dir, Path::new("/var/lib/kubelet/plugins"));
        assert_eq!(args.registry_dir, Path::new("/var/lib/kubelet/plugins_registry"));
        assert_eq!(args.cdi_dir, Path::new("/var/run/cdi"));
        assert_eq!(args.state_dir(), Path::new("/var/lib/kubelet/plugins/gpu.nvidia.com"));
        assert_eq!(args.metrics_addr, MetricsAddr::Listen("0.0.0.0:8080".parse().unwrap()));
        assert!(args.check_paths().is_ok());
        assert!(args.gpus && !args.compute_domains);
        assert!(args.check_drivers().is_ok());
    }

    #[test]
    fn compute_domains_may_be_served_alone_but_something_is_served() {
        let run = |extra: &[&str]| {
            let mut argv = vec!["gpu-kubelet-plugin", "run", "--node-name", "node-a"];
            argv.extend_from_slice(extra);
            let Command::Run(args) = Cli::try_parse_from(argv).unwrap().command else { panic!("not run") };
            args
        };
        let alone = run(&["--gpus=false", "--compute-domains"]);
        assert!(!alone.gpus && alone.compute_domains);
        assert!(alone.check_drivers().is_ok());
        let err = run(&["--gpus=false"]).check_drivers().unwrap_err().to_string();
        assert!(err.contains("--gpus=false without --compute-domains serves no driver"), "{err}");
        assert!(run(&["--gpus", "true", "--compute-domains"]).check_drivers().is_ok());
        let err = Cli::try_parse_from(["gpu-kubelet-plugin", "run", "--node-name", "n", "--gpus=no"]).unwrap_err();
        assert!(err.to_string().contains("--gpus"), "{err}");
    }

    #[test]
    fn gates_are_checked_by_run_and_only_parsed_by_print_slices() {
        let parse = |command: &str, gates: &str| {
            Cli::try_parse_from(["gpu-kubelet-plugin", command, "--node-name", "n", "--feature-gates", gates])
        };
        let err = parse("run", "ConsumableCapacity=true").unwrap_err();
        assert!(err.to_string().contains("ConsumableCapacity needs MPSSupport"), "{err}");
        let Command::PrintSlices(args) = parse("print-slices", "ConsumableCapacity=true").unwrap().command else {
            panic!("not print-slices")
        };
        assert!(args.feature_gates.enabled(gpu_dra_driver::feature_gates::Gate::ConsumableCapacity));
        let err = parse("print-slices", "Fractions=true").unwrap_err();
        assert!(err.to_string().contains("unknown feature gate"), "{err}");
    }

    #[test]
    fn log_filters_are_levels_or_directives() {
        for good in ["info", "warn", "info,gpu_dra_driver=debug", "gpu_kubelet_plugin::prepare=trace,off"] {
            assert_eq!(parse_log_filter(good).as_deref(), Ok(good));
        }
        for bad in ["verbose", "info: {x", "", "info,", "Info", "x=loud", "info\n--kubeconfig=/x", "a-b=info"] {
            let error = parse_log_filter(bad).unwrap_err();
            assert!(
                error.contains("is not a log level") && error.contains("info,gpu_dra_driver=debug"),
                "{bad}: {error}"
            );
        }
        let err =
            Cli::try_parse_from(["gpu-kubelet-plugin", "--log-level", "verbose", "print-slices", "--node-name", "n"])
                .unwrap_err();
        assert!(err.to_string().contains("\"verbose\" is not a log level"), "{err}");
    }

    #[test]
    fn run_flags_are_checked() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["gpu-kubelet-plugin", "run", "--node-name", "node-a"];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv)
        };
        let Command::Run(args) = parse(&["--metrics-addr", "off", "--state-dir", "/s"]).unwrap().command else {
            panic!("not run")
        };
        assert_eq!(args.metrics_addr, MetricsAddr::Off);
        assert_eq!(args.state_dir(), Path::new("/s"));
        for (flag, value) in
            [("--mps-ready-timeout-ms", "18446744073709551615"), ("--fake-inventory-poll-ms", "3600001")]
        {
            let err = parse(&[flag, value]).unwrap_err();
            assert!(err.to_string().contains("is not in"), "{flag}: {err}");
        }
        let err = parse(&["--metrics-addr", "localhost"]).unwrap_err();
        assert!(err.to_string().contains("expected HOST:PORT"), "{err}");
        let Command::Run(args) = parse(&["--plugins-dir", "rel"]).unwrap().command else { panic!("not run") };
        let err = args.check_paths().unwrap_err().to_string();
        assert!(err.contains("--plugins-dir rel is not an absolute path"), "{err}");
    }
}
