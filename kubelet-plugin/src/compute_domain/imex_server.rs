//! Which `nvidia-imex` serves a domain on this node: the agent's own or a
//! host-managed one ([`super::host_imex`]); chosen in [`super::serving`].

use super::host_imex::HostDaemon;

/// Which daemon serves a domain on this node.
#[derive(Debug, Clone)]
pub(crate) enum Server {
    /// This agent's own `nvidia-imex` for the domain.
    Own,
    /// A host-managed one that lists every node of the domain.
    Host(HostDaemon),
}
