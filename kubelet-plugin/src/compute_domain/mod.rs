//! The node agent's ComputeDomain side: the `compute-domain.nvidia.com`
//! driver, served by the same process as the GPU driver (`run
//! --compute-domains`) with its own registration, sockets, slice pool,
//! checkpoint and CDI specs.
//!
//! One process serves both because both read the same inventory (a node's
//! clique is its GPUs' fabric clique): a second process would open a second
//! NVML session and a second API watch for nothing. The IMEX daemon is
//! the node agent's child, not a pod's: a channel is prepared only when the
//! domain's daemon on this node answers ready, and the agent is the one
//! that knows, without an API round trip.
//!
//! Prepare (channel or daemon claim), each step recorded first:
//! 1. the claim's plan ([`claim_plan`]): domain, channels;
//! 2. checkpoint `PrepareStarted`;
//! 3. wait (bounded) until the domain's status lists this node, then write
//!    the IMEX configuration with the domain's node addresses and start
//!    `nvidia-imex` (or tell a running one the new peers) ([`daemons`]);
//!    beside a host-managed `nvidia-imex`, check that it lists the domain's
//!    nodes instead, else refuse the claim ([`host_imex`]);
//! 4. wait (bounded) until `nvidia-imex-ctl -q` answers READY; a daemon
//!    that was already running and is not ready fails the prepare at once;
//! 5. create the channel device nodes a fresh node lacks;
//! 6. CDI spec, checkpoint `PrepareCompleted`, and the device's `Ready`
//!    condition on the claim (which the controller aggregates into the
//!    domain's status).
//!
//! A failure rolls back the claim's record and spec, and stops the
//! domain's daemon when no other claim of it remains. Start-up rolls back
//! every `PrepareStarted` record, stops daemons no record needs, and
//! starts again the daemons of prepared claims that died with the
//! previous agent. Unprepare removes the record first, then the spec, then
//! what no record needs; a kill between leaves files start-up removes.
//! The health loop also releases claims deleted from the API while the
//! kubelet could not unprepare them, so no daemon runs on for nothing.
//! Every step between two side effects is a kill point for the crash
//! tests ([`crate::state::kill_point`]).
//!
//! State files are input like any other: a path is never read from one.
//! A record's spec file is derived from its claim UID and its daemon's
//! directory from its domain UID ([`records`]); the created device nodes
//! are listed by channel number ([`created_nodes`]); a daemon is the one
//! the agent started, by pid, start time and executable ([`daemons`]). A
//! state file that breaks these rules is damaged: set aside
//! (`*.damaged`), logged once with what to do, counted in
//! `gpu_dra_errors_total{kind="checkpoint"}`, and nothing it names is
//! touched.

pub mod binding;
mod channel_claim;
pub mod claim_plan;
mod cluster;
mod config;
pub mod created_nodes;
pub mod daemons;
mod error;
pub mod health;
pub mod host_imex;
mod imex_server;
mod preparer;
pub mod ready_condition;
pub mod records;
pub mod serve;
mod serving;
pub mod status;

pub use cluster::{ConditionWriter, DomainLookup};
pub use config::DomainConfig;
pub use error::{Error, LookupError};
pub use preparer::DomainPreparer;

#[cfg(test)]
mod binding_tests;
#[cfg(test)]
mod forged_tests;
#[cfg(test)]
mod tests;
