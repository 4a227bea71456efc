//! The domain types the servers convert to, owned by the preparer.

pub use crate::prepare::types::{ClaimOutcome, ClaimRef, PreparedDevice};
