//! Where `shareID`s come from. Upstream uses a fresh random UUID per
//! allocation of a shareable device (`uuid.NewUUID()` in
//! `GenerateNewShareID`); tests and reproducible simulations inject a
//! deterministic source instead.

/// A source of RFC 4122 lower-case UUID strings.
pub trait ShareIdSource: Send {
    fn next_share_id(&mut self) -> String;
}

/// Random (v4) UUIDs, as upstream.
#[derive(Debug, Default, Clone, Copy)]
pub struct RandomShareIds;

impl ShareIdSource for RandomShareIds {
    fn next_share_id(&mut self) -> String {
        uuid::Uuid::new_v4().hyphenated().to_string()
    }
}

/// `00000000-0000-4000-8000-000000000001`, `...0002`, ...: valid v4-shaped
/// UUIDs in a fixed sequence, for tests and reproducible simulations.
#[derive(Debug, Default, Clone)]
pub struct SequentialShareIds {
    next: u64,
}

impl SequentialShareIds {
    pub fn new() -> Self {
        Self::default()
    }
}

impl ShareIdSource for SequentialShareIds {
    fn next_share_id(&mut self) -> String {
        self.next += 1;
        let bits = (0x4000_u128 << 64) | (0x8000_u128 << 48) | u128::from(self.next);
        uuid::Uuid::from_u128(bits).hyphenated().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_ids_are_valid_lower_case_uuids() {
        let mut ids = SequentialShareIds::new();
        let a = ids.next_share_id();
        let b = ids.next_share_id();
        assert_eq!(a, "00000000-0000-4000-8000-000000000001");
        assert_ne!(a, b);
        assert!(uuid::Uuid::parse_str(&b).is_ok());
    }

    #[test]
    fn random_ids_are_lower_case() {
        let id = RandomShareIds.next_share_id();
        assert_eq!(id, id.to_lowercase());
        assert_eq!(id.len(), 36);
    }
}
