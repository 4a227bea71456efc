//! What can go wrong preparing a ComputeDomain claim or keeping its IMEX
//! daemon. Each message is the one the kubelet and the log show: it names
//! the claim, domain, node, file or program, and what to do.

use std::path::PathBuf;
use std::time::Duration;

use gpu_dra_driver::names::{DomainUid, InvalidName};

use crate::prepare::types::ValidClaim;
use crate::state::checkpoint::CheckpointError;

/// An error of the ComputeDomain side of the node agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("creating {}: {source}", path.display())]
    CreateDir { path: PathBuf, source: std::io::Error },
    #[error("creating the CDI directory {}: {source}", path.display())]
    CreateCdiDir { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A spec file of the driver's no record owns (start-up).
    #[error("removing {name}: {source}")]
    RemoveStraySpec { name: String, source: std::io::Error },
    #[error("removing CDI spec {file}: {source}")]
    RemoveSpec { file: String, source: std::io::Error },
    #[error("writing CDI spec {file}: {source}")]
    WriteSpec { file: String, source: std::io::Error },
    #[error("{0}")]
    EncodeSpec(#[source] serde_json::Error),
    /// The list of created device nodes could not be removed.
    #[error("{0}")]
    ForgetCreatedNodes(#[source] std::io::Error),
    #[error("{} was damaged (set aside): no channel node is created until the next prepare", .0.display())]
    CreatedNodesDamaged(PathBuf),
    #[error("recording device nodes: {0}")]
    RecordCreatedNodes(#[source] std::io::Error),
    #[error("{} cannot be opened without following a link: {source}", path.display())]
    ChannelDirLinked { path: PathBuf, source: std::io::Error },
    #[error("{}: {source}", path.display())]
    InspectNode { path: PathBuf, source: std::io::Error },
    /// A channel device node or a daemon's directory.
    #[error("removing {}: {source}", path.display())]
    Remove { path: PathBuf, source: std::io::Error },
    /// The kubelet named the claim with a UID, namespace or name that
    /// breaks its rules.
    #[error(transparent)]
    InvalidClaim(#[from] InvalidName),
    /// The claim source's own account (API server or cache).
    #[error("{0}")]
    ClaimLookup(String),
    #[error("claim {0} does not exist")]
    NoClaim(ValidClaim),
    #[error("claim {claim} was replaced (its UID is now {uid:?})")]
    Replaced { claim: ValidClaim, uid: Option<String> },
    #[error(transparent)]
    Plan(#[from] super::claim_plan::PlanError),
    #[error(
        "ComputeDomain {domain_uid} is not in the node agent's watch yet and the API server could not be read for it \
         ({reason}); the kubelet retries the prepare"
    )]
    DomainUnreadable { domain_uid: DomainUid, reason: LookupError },
    #[error(
        "no ComputeDomain with UID {domain_uid} in namespace {namespace}: it was deleted, or the claim's config names \
         another namespace's domain"
    )]
    NoDomain { domain_uid: DomainUid, namespace: String },
    #[error(
        "the node agent has not yet listed ComputeDomains from the API after {after:?} (is the \
         computedomains.resource.nvidia.com CRD installed, and may the agent list it?); ComputeDomain {domain_uid} \
         unknown so far"
    )]
    DomainsNotListed { after: Duration, domain_uid: DomainUid },
    #[error(
        "node {node} has not joined ComputeDomain {domain} after {after:?} (its status lists [{}]): the domain's \
         Events say why (another NVLink clique, no clique, no address), or the controller (gpu-dra-controller run \
         --compute-domains) is not running",
        listed.join(", ")
    )]
    NotJoined { node: String, domain: String, after: Duration, listed: Vec<String> },
    /// A daemon that was already running answers not ready.
    #[error(
        "the IMEX daemon of ComputeDomain {domain} on node {node} is not ready (nvidia-imex-ctl: {answer}): no new \
         channels are prepared here until it is; {hint}"
    )]
    NotReady { domain: String, node: String, answer: String, hint: String },
    #[error(
        "the IMEX daemon of ComputeDomain {domain} on node {node} did not become ready in {after:?} (nvidia-imex-ctl: \
         {answer}); {hint}"
    )]
    NeverReady { domain: String, node: String, after: Duration, answer: String, hint: String },
    /// `describe` says which host daemon runs on which node.
    #[error("{describe}: cannot read its configuration {}: {source}", path.display())]
    HostConfigUnreadable { describe: String, path: PathBuf, source: std::io::Error },
    #[error("{describe}: cannot read its node list {}: {source}", path.display())]
    HostNodesUnreadable { describe: String, path: PathBuf, source: std::io::Error },
    #[error(
        "{describe}, and its node list {} lacks {} of ComputeDomain {domain}: the driver does not start a second IMEX \
         daemon beside it. Either add the domain's nodes to that file and restart the host's daemon, or stop and \
         disable it (systemctl disable --now nvidia-imex) so the driver runs the domain's own daemon",
        nodes_file.display(),
        missing.join(", ")
    )]
    HostLacksPeers { describe: String, nodes_file: PathBuf, missing: Vec<String>, domain: String },
    #[error(
        "nvidia-imex and nvidia-imex-ctl are not in the driver root (usr/bin or bin): install NVIDIA's nvidia-imex \
         package matching the driver"
    )]
    NoImexPrograms,
    #[error("opening {}: {source}", path.display())]
    OpenDir { path: PathBuf, source: std::io::Error },
    #[error(
        "{} is not a directory the agent made ({source}): a symbolic link or another file there is not followed; \
         remove it",
        path.display()
    )]
    NotOurDir { path: PathBuf, source: std::io::Error },
    #[error("{} is missing", .0.display())]
    DirMissing(PathBuf),
    #[error("writing {name}: {source}")]
    WriteDaemonFile { name: &'static str, source: std::io::Error },
    #[error(
        "{} is a {kind:?}, not the daemon's log: the agent does not start a daemon that would write through it; \
         remove it",
        path.display()
    )]
    LogNotRegular { path: PathBuf, kind: rustix::fs::FileType },
    #[error("opening the daemon's output log: {source}; remove {} (the agent creates it)", path.display())]
    OpenOutput { path: PathBuf, source: std::io::Error },
    /// Duplicating the output log's handle, or waiting for a daemon that
    /// exited at once.
    #[error("{0}")]
    DaemonIo(#[source] std::io::Error),
    #[error("starting {}: {source}", program.display())]
    StartDaemon { program: PathBuf, source: std::io::Error },
    #[error("{} exited at once ({status}); see {}", program.display(), output.display())]
    ExitedAtOnce { program: PathBuf, status: std::process::ExitStatus, output: PathBuf },
    #[error("{0}")]
    EncodeDaemonRecord(#[source] serde_json::Error),
    #[error("recording the daemon: {0}")]
    WriteDaemonRecord(#[source] std::io::Error),
    #[error("signalling nvidia-imex (pid {pid}): {source}")]
    Signal { pid: i32, source: rustix::io::Errno },
}

/// The API server could not be read for a domain or its claims. Its
/// answer is kept as text, control characters escaped: it is shown, and
/// compared to log a repeated failure once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// `what` names the list, e.g. `ComputeDomains in <namespace>`.
    #[error("listing {what}: {reason}")]
    ListFailed { what: String, reason: String },
    #[error("ComputeDomain {uid} in {namespace} cannot be read: {reason}")]
    Undecodable { uid: String, namespace: String, reason: String },
}
