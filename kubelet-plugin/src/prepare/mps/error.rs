//! What can go wrong bringing an MPS daemon up or down on the node. Each
//! message is the one the kubelet and the log show: it names the path,
//! command or GPU and what was being done to it.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use crate::prepare::sharing::GpuControlError;
use crate::state::checkpoint::CheckpointError;

/// An error of an MPS daemon's directories, mount, process or supervisor.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A daemon directory was replaced by a link: nothing is done through it.
    #[error("{} is a symbolic link, not the directory the plugin made: left alone", .0.display())]
    LinkedDir(PathBuf),
    #[error("{} is not a directory, as the plugin made it: left alone", .0.display())]
    NotADir(PathBuf),
    #[error("{}: {source}", path.display())]
    Inspect { path: PathBuf, source: std::io::Error },
    #[error("creating {}: {source}", path.display())]
    CreateDir { path: PathBuf, source: std::io::Error },
    #[error(
        "mounting a tmpfs on {} for the MPS daemon's /dev/shm: {source}{}",
        path.display(),
        if *source == rustix::io::Errno::PERM {
            " (mounting needs CAP_SYS_ADMIN: run the plugin privileged)"
        } else {
            ""
        }
    )]
    Mount { path: PathBuf, source: rustix::io::Errno },
    #[error("unmounting {}: {source}", path.display())]
    Unmount { path: PathBuf, source: rustix::io::Errno },
    #[error("{} is still mounted; not removing {}", shm.display(), root.display())]
    StillMounted { shm: PathBuf, root: PathBuf },
    #[error("removing {}: {source}", path.display())]
    RemoveDir { path: PathBuf, source: std::io::Error },
    #[error("resolving {}: {source}", path.display())]
    Resolve { path: PathBuf, source: std::io::Error },
    #[error("reading /proc/self/mountinfo: {0}")]
    MountInfo(#[source] std::io::Error),
    #[error("opening {}: {source}", path.display())]
    OpenLog { path: PathBuf, source: std::io::Error },
    #[error("running {} -d: {source}", program.display())]
    Launch { program: PathBuf, source: std::io::Error },
    /// `what` is the command line as the log shows it.
    #[error("{what}: {source}")]
    Spawn { what: String, source: std::io::Error },
    #[error("{what}: writing: {source}")]
    WriteStdin { what: String, source: std::io::Error },
    #[error("{what} did not return within {after:?}")]
    TimedOut { what: String, after: Duration },
    #[error("waiting for {what}: {source}")]
    Wait { what: String, source: std::io::Error },
    /// The command exited unsuccessfully; `said` is what it printed.
    #[error("{what} failed ({status}): {said}")]
    Failed { what: String, status: ExitStatus, said: String },
    #[error("encoding the launch request: {0}")]
    EncodeRequest(#[source] serde_json::Error),
    #[error("writing {}: {source}", path.display())]
    WriteRequest { path: PathBuf, source: std::io::Error },
    #[error("reading {}: {source}", path.display())]
    ReadOutcome { path: PathBuf, source: serde_json::Error },
    /// The supervisor's own account, as it wrote it in `launch.result`.
    #[error("the MPS supervisor could not launch the daemon: {0}")]
    SupervisorFailed(String),
    #[error(
        "no MPS supervisor answered within {within:?} (the plugin runs with --mps-supervisor: is the \
         `gpu-kubelet-plugin mps-supervisor` container of its pod running on {}?)",
        root.display()
    )]
    NoSupervisor { within: Duration, root: PathBuf },
    #[error("becoming the daemons' subreaper: {0}")]
    Subreaper(#[source] rustix::io::Errno),
    #[error("setting GPU {gpu} to EXCLUSIVE_PROCESS for MPS: {source}")]
    ExclusiveMode { gpu: String, source: GpuControlError },
    #[error("starting the MPS control daemon: {0}")]
    Start(#[source] Box<Error>),
    #[error(
        "the MPS control daemon in {} did not answer within {within:?} (last: {last}); see its logs in {}",
        pipe_dir.display(),
        log_dir.display()
    )]
    NotReady { pipe_dir: PathBuf, within: Duration, last: Box<Error>, log_dir: PathBuf },
    /// The checkpoint could not record the started daemon.
    #[error(transparent)]
    Record(#[from] CheckpointError),
    #[error("applying the MPS limit `{command}`: {source}")]
    Limit { command: String, source: Box<Error> },
}

/// Why a claim's devices cannot get the MPS daemon their configs and
/// shares ask for: each names the device or the config field to fix.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("device {0} is not on this node")]
    NotOnNode(String),
    #[error("device {0} is a dynamic MIG device with no instance yet")]
    NoInstanceYet(String),
    #[error(
        "device {device} asks for an active thread percentage of {percentage} and device {other} for \
         {other_percentage}: a claim has one MPS daemon with one percentage; give its devices the same one"
    )]
    PercentagesDiffer { device: String, percentage: u8, other: String, other_percentage: u8 },
    /// `at` is the config's path in the claim.
    #[error(
        "{at}.sharing: MPS is not supported with the ConsumableShares feature gate (its shares are not enforced, and \
         an MPS daemon would take the GPU from the other claims sharing it): remove the MPS sharing config, or run \
         the plugin with ConsumableCapacity and MPSSupport for enforced shares"
    )]
    UnderConsumableShares { at: String },
    #[error(
        "device {device} (request {request}) was allocated a share of a GPU (consumedCapacity {consumed:?}), whose \
         limits this driver enforces through MPS, but neither the ConsumableCapacity nor the MPSSupport feature gate \
         is on: run the plugin with --feature-gates ConsumableCapacity=true"
    )]
    ShareWithoutGate { device: String, request: String, consumed: std::collections::BTreeMap<String, String> },
    #[error("{field}: {key:?} is neither an index (0 to {last}) nor the UUID of a device this config applies to")]
    UnknownPinnedTarget { field: String, key: String, last: usize },
    /// `field` is the config field or consumed capacity holding the text.
    #[error("{field}: {source}")]
    Quantity { field: String, source: dra_cel::quantity::QuantityError },
    #[error("{field}: {text} is less than 1Mi")]
    BelowOneMi { field: String, text: String },
    #[error(
        "{what}: {} {text} is not a whole percentage from 1 to 100",
        gpu_dra_driver::slices::attributes::name::SM_PERCENT
    )]
    NotWholePercent { what: String, text: String },
    /// Another prepared claim shares the GPU the other way.
    #[error(
        "GPU {gpu} is {theirs} for ResourceClaim {their_claim} and would be {ours} for ResourceClaim {our_claim}: a \
         GPU is shared one way at a time; wait for that claim to be unprepared"
    )]
    SharedOtherwise { gpu: String, theirs: &'static str, their_claim: String, ours: &'static str, our_claim: String },
}
