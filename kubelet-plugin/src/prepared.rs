//! What a prepared claim gave its pods, in the plugin's own words: one
//! [`PreparedDevice`] per device. The GPU preparer and the ComputeDomain
//! preparer make them, the checkpoint records them (with what undoing needs,
//! see [`crate::state::checkpoint::CheckpointDevice::new`]) and gives them
//! back, and the gRPC edge turns them into the kubelet's answer; on the
//! ground floor so that all of them read one type.

/// One device prepared for a claim.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    /// Request names as in the allocation result (`req` or `req/sub`); the
    /// gRPC edge strips them to base names.
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    pub cdi_device_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
}
