//! Builders the MIG modules' tests share.

use crate::state::checkpoint::MigIntent;

/// A 1g.10gb intent on GPU-a at `start` (the ledger's and the ownership tests').
pub(super) fn intent(start: u32) -> MigIntent {
    MigIntent {
        gpu_uuid: "GPU-a".into(),
        gpu_minor: 0,
        profile: "1g.10gb".into(),
        profile_id: 19,
        compute_profile_index: 0,
        placement_start: start,
        placement_size: 1,
    }
}
