//! `gpu-dra-controller`: the cluster-side component of the GPU DRA driver.
//! Argument parsing and wiring only; the logic lives in this crate's
//! library and in `gpu-dra-driver`.

use gpu_dra_controller::{args, service, validate};

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Cluster-side tools of the GPU DRA driver.
#[derive(Debug, Parser)]
#[command(name = "gpu-dra-controller", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the controller service: watch the cluster, explain claims that
    /// cannot be allocated (events on the claim and its pods), allocate the
    /// claims annotated `gpu.nvidia.com/allocate: "true"`, with leader
    /// election among replicas. Stops on SIGTERM or SIGINT.
    Run(Box<args::RunArgs>),
    /// Check ResourceSlices against the apiserver's validation rules (for
    /// servers 1.34 to 1.37) without a cluster. Reads YAML or JSON files,
    /// multi-document streams and `List`s; objects of other kinds are
    /// skipped with a note. Exits 1 if any slice is invalid.
    ValidateSlices {
        /// Files or directories to read; `-` reads standard input.
        #[arg(short = 'f', long = "filename", value_name = "PATH", required = true)]
        files: Vec<PathBuf>,
        /// The release whose rules apply (1.34 to 1.37): they differ on
        /// taints and on partitionable devices, whose counter sets sit beside
        /// their devices on 1.34 and in slices of their own from 1.35.
        #[arg(long = "kubernetes-version", value_name = "1.MINOR", default_value = "1.34", value_parser = parse_minor)]
        kubernetes_version: u32,
    },
    /// Would these claims fit this fleet, which devices would they get, and
    /// if not, why not. Reads ResourceSlices, DeviceClasses, DeviceTaintRules,
    /// ResourceClaims, ResourceClaimTemplates, Pods and Nodes (other kinds are skipped with
    /// a note); allocates claims in input order, a pod's claims together on
    /// one node, nodes tried in name order. Exits 0 when every input was
    /// understood, even if claims do not fit; 1 for malformed input.
    Simulate {
        /// Files or directories of YAML/JSON manifests; `-` reads standard input.
        #[arg(short = 'f', long = "filename", value_name = "PATH", required = true)]
        files: Vec<PathBuf>,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t = gpu_dra_simulate::Format::Table)]
        output: gpu_dra_simulate::Format,
        /// Nodes with labels and fake inventories whose slices are published
        /// with the plugin's slice builder and, per fleet or node, its
        /// `featureGates` (e.g. ConsumableCapacity=true for GPUs shared by
        /// memory; see examples/fleets/).
        #[arg(long = "fleet", value_name = "FILE")]
        fleet: Option<PathBuf>,
        /// Print how long each phase took (reading, fleet, workload,
        /// allocation, output) on standard error.
        #[arg(long = "timings")]
        timings: bool,
        /// Check CEL selectors as this Kubernetes version does (1.34, 1.35,
        /// 1.36 or 1.37), with its default feature gates.
        #[arg(long = "kubernetes-version", value_name = "1.MINOR", default_value = "1.37", value_parser = parse_minor)]
        kubernetes_version: u32,
        /// Check selectors as the apiserver checks a claim being created
        /// (`new`: only what the version before it had, and the cost
        /// limit on the estimate) rather than as the scheduler evaluates a
        /// stored one (`stored`, the default).
        #[arg(long = "selectors-as", value_enum, default_value_t = SelectorsAs::Stored)]
        selectors_as: SelectorsAs,
        /// The webhook's feature gates (as the node agents'), for checking
        /// opaque configs as the webhook does: `MPSSupport=true` lets MPS
        /// configs through to their range checks. Default: the fleet
        /// file's `featureGates`, or none.
        #[arg(long = "feature-gates", value_name = "A=true,B=false", value_parser = parse_gates)]
        feature_gates: Option<gpu_dra_driver::feature_gates::FeatureGates>,
        /// The cluster's own gates where they differ from the release's
        /// defaults (as given to its API server and scheduler), e.g.
        /// `DRADeviceTaints=true,DRAConsumableCapacity=true` on 1.34: with a
        /// gate off, the API server drops the slice fields it serves, and
        /// the simulation leaves them out too.
        #[arg(long = "cluster-feature-gates", value_name = "A=true,B=false", default_value = "")]
        cluster_feature_gates: String,
    },
}

/// Which of Kubernetes' two CEL environments `simulate` checks in.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum SelectorsAs {
    Stored,
    New,
}

/// Gates as the node agents' `--feature-gates` take them.
fn parse_gates(
    text: &str,
) -> Result<gpu_dra_driver::feature_gates::FeatureGates, gpu_dra_driver::feature_gates::FeatureGateError> {
    text.parse()
}

/// The slice fields Kubernetes 1.`minor` drops with `cluster_gates`.
/// List-typed attributes are the exception: unless `cluster_gates` names
/// DRAListTypeAttributes, they follow the driver's gate of that name, as
/// the CEL environment and the allocator's list rule do (the operator turns
/// it on for the cluster and the driver alike).
fn not_served(
    minor: u32,
    cluster_gates: &str,
) -> Result<gpu_dra_driver::slices::served::NotServed, gpu_dra_driver::slices::served::ClusterGateError> {
    use gpu_dra_driver::slices::served::{GatedField, NotServed};
    let mut not_served = NotServed::on_release(minor, cluster_gates)?;
    if !cluster_gates.contains(GatedField::ListAttributes.gate()) {
        not_served.remove(GatedField::ListAttributes);
    }
    Ok(not_served)
}

/// `1.34` → 34; only the versions the driver models.
fn parse_minor(text: &str) -> Result<u32, dra_cel::kubernetes_version::VersionError> {
    dra_cel::kubernetes_version::parse_minor(text)
}

/// Logs to standard error; `RUST_LOG` filters (default `info`).
fn init_logging(format: args::LogFormat) {
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let user_filter = std::env::var("RUST_LOG").unwrap_or_default();
    if let Some(Ok(quiet)) = gpu_dra_driver::service::kube_client::request_log_directive(&user_filter).map(str::parse) {
        filter = filter.add_directive(quiet);
    }
    // Colours only on a terminal: logs in files and `kubectl logs` stay greppable.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        args::LogFormat::Json => builder.json().init(),
        args::LogFormat::Text => builder.init(),
    }
}

/// jemalloc: the allocator's fleet model churns small allocations, where
/// glibc malloc costs it 40% of its speed (`cargo bench -p dra-allocator`).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Run(args) => {
            init_logging(args.log_format);
            match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
                Ok(runtime) => runtime.block_on(service::run((**args).clone())).map(|()| true),
                Err(error) => Err(anyhow::anyhow!("cannot start the async runtime: {error}")),
            }
        }
        Command::ValidateSlices { files, kubernetes_version } => {
            let rules = gpu_dra_driver::slices::ServerRules { minor: *kubernetes_version };
            validate::run(files, rules, &mut std::io::stdout().lock(), &mut std::io::stderr().lock())
        }
        Command::Simulate {
            files,
            output,
            fleet,
            timings,
            kubernetes_version,
            selectors_as,
            feature_gates,
            cluster_feature_gates,
        } => {
            let mut buffer = Vec::new();
            let cel = match selectors_as {
                SelectorsAs::Stored => dra_cel::CelEnvironment::stored_expressions(*kubernetes_version),
                SelectorsAs::New => dra_cel::CelEnvironment::new_expressions(*kubernetes_version),
            };
            let options = gpu_dra_simulate::Options {
                fleet: fleet.as_deref(),
                format: *output,
                timings: *timings,
                cel,
                // DRAExtendedResource: alpha (off) in 1.34 and 1.35, on from 1.36.
                extended_resources: *kubernetes_version >= 36,
                gates: *feature_gates,
                source: gpu_dra_simulate::Source::Files,
                not_served: match not_served(*kubernetes_version, cluster_feature_gates) {
                    Ok(not_served) => not_served,
                    Err(error) => {
                        eprintln!("error: --cluster-feature-gates: {error}");
                        return ExitCode::FAILURE;
                    }
                },
            };
            gpu_dra_simulate::run(files, &options, &mut buffer, &mut std::io::stderr().lock())
                .map_err(anyhow::Error::from)
                .and_then(|()| {
                    // Nothing on stdout unless the whole run succeeded.
                    std::io::Write::write_all(&mut std::io::stdout().lock(), &buffer)?;
                    Ok(true)
                })
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            // One line, every cause included; a server's or a file's
            // control characters escaped.
            let line = format!("{err:#}").replace('\n', " ");
            eprintln!("error: {}", gpu_dra_driver::printable::escape(&line));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
        let cli = <super::Cli as clap::Parser>::try_parse_from(["gpu-dra-controller", "run", "--metrics-addr", "off"])
            .unwrap();
        assert!(matches!(cli.command, super::Command::Run(_)));
    }
}
