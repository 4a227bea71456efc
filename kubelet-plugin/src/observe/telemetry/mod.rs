//! Telemetry per device and per claim: what each GPU and MIG device is
//! doing, and, while a claim holds it, whose it is.
//!
//! The data travels one way: a sampler reads NVML on an interval (never on
//! the prepare path) → [`DeviceSample`]s, joined with the inventory
//! ([`DeviceIdentity`]) and the prepared claims ([`ClaimHolder`], with the
//! pods of the claim's `reservedFor`) into a [`Snapshot`] → [`families`]
//! turns the snapshot into metric families (pure) → the `/metrics`
//! endpoint encodes the last snapshot ([`TelemetryStore`]). At most
//! `--max-claim-series` claim label sets are published ([`series_cap`]). The idle-claim
//! watch ([`idle`]) reads the same snapshots.
//!
//! A reading NVML cannot give (MIG utilization needs DCGM profiling, a
//! board without ECC) is `None` and is not published: no zeros that look
//! like an idle GPU.

pub mod args;
pub mod families;
pub mod holders;
pub mod idle;
pub mod idle_events;
mod readings;
pub mod sampler;
pub mod series_cap;
pub mod snapshot;
mod store;
pub mod task;

pub use families::Naming;
pub use readings::{
    ClaimHolder, DeviceIdentity, DeviceReading, DeviceSample, IdleReport, MigIdentity, PodRef, Snapshot,
};
pub use store::TelemetryStore;
