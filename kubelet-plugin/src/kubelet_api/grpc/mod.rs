//! The kubelet-facing DRAPlugin servers (v1 and v1beta1) over one core.
//!
//! The servers convert protobuf to domain types at the edge ([`convert`]),
//! hand the batch to a [`DraService`] (the preparer) and convert back. The
//! core guarantees what the kubelet checks (`pkg/kubelet/cm/dra/manager.go`,
//! dra-facts §1.3): every claim UID of the request gets exactly one entry,
//! no entry for a UID that was not asked for, and a per-claim failure goes
//! in that claim's `error`, never as a gRPC error for the whole batch.

mod any_client;
pub mod authority;
mod convert;
pub mod serve;
mod service;
mod versions;

pub use service::{DraCore, DraService, InFlight, InFlightGuard};
pub use versions::{DraPluginV1, DraPluginV1beta1};
