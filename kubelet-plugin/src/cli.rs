//! Command line of `gpu-kubelet-plugin`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use gpu_dra_driver::names::{ClaimUid, DeviceName, DriverName, NodeName};

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
    /// Print the ResourceSlices this node would publish, built by the same
    /// code the plugin publishes with.
    PrintSlices(PrintSlicesArgs),
    /// Print the CDI spec the plugin would write when preparing these devices
    /// for a claim.
    PrintCdi(PrintCdiArgs),
}

#[derive(Debug, Args)]
pub struct LoggingArgs {
    /// Log format on standard error.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "LOG_FORMAT", global = true)]
    pub log_format: LogFormat,
    /// Log filter, e.g. `info` or `gpu_dra_driver=debug` (RUST_LOG syntax).
    #[arg(long, default_value = "warn", env = "LOG_LEVEL", global = true)]
    pub log_level: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Which node and which GPUs.
#[derive(Debug, Args)]
pub struct NodeArgs {
    /// Name of this node; also the name of its device pool.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: NodeName,
    /// DRA driver name: the ResourceSlices' driver, the attribute domain and
    /// the CDI vendor suffix. Keep NVIDIA's default for claims to port unchanged.
    #[arg(long, env = "DRIVER_NAME", default_value_t = DriverName::nvidia_default())]
    pub driver_name: DriverName,
    /// Read GPUs from this fake inventory YAML file instead of NVML (for
    /// nodes without GPUs; see examples/inventories/).
    #[arg(long, env = "FAKE_INVENTORY", value_name = "FILE")]
    pub fake_inventory: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct PrintSlicesArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// Output format: YAML documents ready for `kubectl apply -f -`, or a
    /// JSON `v1` List.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Yaml)]
    pub output: OutputFormat,
    /// Pool generation to stamp on the slices.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i64).range(0..))]
    pub generation: i64,
}

#[derive(Debug, Args)]
pub struct PrintCdiArgs {
    #[command(flatten)]
    pub node: NodeArgs,
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

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
}
