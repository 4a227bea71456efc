//! Domain types of a prepare call, as agreed for `prepare::types` (branch
//! `prep`). Kept here only until that module lands; then this file becomes
//! a re-export.

/// A claim as the kubelet names it; raw, the preparer validates it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// One device prepared for a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    pub cdi_device_ids: Vec<String>,
    pub share_id: Option<String>,
}

/// A claim's result: its devices, or the error text the kubelet shows.
pub type ClaimOutcome = Result<Vec<PreparedDevice>, String>;
