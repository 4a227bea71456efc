//! What the ComputeDomain preparer is configured with.

use std::path::PathBuf;
use std::time::Duration;

use gpu_dra_driver::names::{DriverName, NodeName};

#[derive(Debug, Clone)]
pub struct DomainConfig {
    pub driver: DriverName,
    pub node: NodeName,
    pub cdi_dir: PathBuf,
    /// `<state-dir>/compute-domains`: checkpoint, daemons, created nodes.
    pub state_dir: PathBuf,
    pub boot_id: String,
    /// Where the host's `/dev` is; `None`: create no device nodes.
    pub dev_root: Option<PathBuf>,
    /// The host's `/proc` (`devices` names the channels' major).
    pub proc_root: PathBuf,
    /// How long a prepare waits for the node to join the domain and for a
    /// fresh daemon to become ready.
    pub ready_timeout: Duration,
}
