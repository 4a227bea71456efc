//! NVIDIA's names for ComputeDomain drivers, classes, finalizers and labels,
//! and the size limit of one IMEX domain.

/// The DRA driver name of channels and daemons (NVIDIA's).
pub const DRIVER_NAME: &str = "compute-domain.nvidia.com";
/// The class of the workload's channel (NVIDIA's name and selector).
pub const CHANNEL_CLASS: &str = "compute-domain-default-channel.nvidia.com";
/// The class of an IMEX daemon device (NVIDIA's name and selector).
pub const DAEMON_CLASS: &str = "compute-domain-daemon.nvidia.com";
/// The finalizer the controller keeps on a ComputeDomain and its template
/// until both are cleaned up (NVIDIA's name).
pub const FINALIZER: &str = "resource.nvidia.com/computeDomain";
/// Label on objects made for a domain: the domain's UID (NVIDIA's key).
pub const DOMAIN_LABEL: &str = "resource.nvidia.com/computeDomain";
/// The most nodes one IMEX domain holds (NVIDIA's default
/// `--max-nodes-per-imex-domain`; an NVL72 rack has 18 compute trays).
pub const MAX_NODES_PER_DOMAIN: usize = 18;
