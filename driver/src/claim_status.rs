//! A claim's `status.devices` entries as a driver writes them (the node agent, and the controller for a ComputeDomain channel that cannot bind), as
//! pure edits of the list: find or add our entry, set its `Ready`
//! condition, drop our entries that are no longer prepared.
//!
//! The list is shared by every driver of the claim's devices, so an entry
//! is only ever matched by its whole key (driver, pool, device, shareID)
//! and an entry of another driver is never changed or removed. Messages
//! come in part from servers and devices: they are escaped and bounded
//! before they reach the API server (which caps a condition's message at
//! 32768 bytes).

use k8s_openapi::api::resource::v1::AllocatedDeviceStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The longest message we write, in characters (well under the API
/// server's 32768 bytes even when every character takes four).
pub const MESSAGE_LIMIT: usize = 1024;

/// The condition type the agent writes.
pub const READY: &str = "Ready";

/// What names one entry of `status.devices`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryKey<'a> {
    pub driver: &'a str,
    pub pool: &'a str,
    pub device: &'a str,
    /// The share of a device allocated in shares (`None` for a whole one).
    pub share_id: Option<&'a str>,
}

impl EntryKey<'_> {
    /// Whether `entry` is the one this key names.
    pub fn names(&self, entry: &AllocatedDeviceStatus) -> bool {
        entry.driver == self.driver
            && entry.pool == self.pool
            && entry.device == self.device
            && entry.share_id.as_deref() == self.share_id
    }
}

/// `text` with control characters escaped, cut to [`MESSAGE_LIMIT`]
/// characters (the cut marked with `…`).
pub fn bounded_message(text: &str) -> String {
    let escaped = |c: char| -> String { if c.is_control() { c.escape_default().collect() } else { c.to_string() } };
    let mut width = 0;
    let fits = text.chars().all(|c| {
        width += escaped(c).chars().count();
        width <= MESSAGE_LIMIT
    });
    let room = if fits { MESSAGE_LIMIT } else { MESSAGE_LIMIT - 1 };
    let mut out = String::new();
    let mut chars = 0;
    for piece in text.chars().map(escaped) {
        let len = piece.chars().count();
        if chars + len > room {
            break;
        }
        chars += len;
        out.push_str(&piece);
    }
    if !fits {
        out.push('…');
    }
    out
}

/// The claim's allocation results (none when it is not allocated).
pub fn allocation_results(
    claim: &k8s_openapi::api::resource::v1::ResourceClaim,
) -> impl Iterator<Item = &k8s_openapi::api::resource::v1::DeviceRequestAllocationResult> {
    let status = claim.status.as_ref();
    let results = status.and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref());
    results.and_then(|d| d.results.as_ref()).into_iter().flatten()
}

/// The entry `key` names in `devices`, added (empty) when missing.
pub fn entry_mut<'a>(devices: &'a mut Vec<AllocatedDeviceStatus>, key: &EntryKey<'_>) -> &'a mut AllocatedDeviceStatus {
    let index = match devices.iter().position(|d| key.names(d)) {
        Some(i) => i,
        None => {
            devices.push(AllocatedDeviceStatus {
                driver: key.driver.to_owned(),
                pool: key.pool.to_owned(),
                device: key.device.to_owned(),
                share_id: key.share_id.map(str::to_owned),
                ..AllocatedDeviceStatus::default()
            });
            devices.len() - 1
        }
    };
    &mut devices[index]
}

/// The `Ready` condition to set: its status, a machine reason (the API
/// server's CamelCase form) and the text for a user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    pub ready: bool,
    pub reason: &'static str,
    pub message: String,
}

/// Sets `entry`'s `Ready` condition; `false` when it already said so
/// (same status, reason, message and generation). The transition time
/// moves only when the status changes, as conditions' contract asks.
pub fn set_ready(entry: &mut AllocatedDeviceStatus, readiness: &Readiness, generation: Option<i64>) -> bool {
    set_condition(entry, READY, readiness, generation)
}

/// Sets `entry`'s condition of type `type_` (true when `readiness.ready`),
/// as [`set_ready`] does `Ready`.
pub fn set_condition(
    entry: &mut AllocatedDeviceStatus,
    type_: &str,
    readiness: &Readiness,
    generation: Option<i64>,
) -> bool {
    let status = if readiness.ready { "True" } else { "False" };
    let message = bounded_message(&readiness.message);
    let conditions = entry.conditions.get_or_insert_default();
    let previous = conditions.iter().find(|c| c.type_ == type_);
    if previous.is_some_and(|c| {
        c.status == status
            && c.reason == readiness.reason
            && c.message == message
            && c.observed_generation == generation
    }) {
        return false;
    }
    let since = previous
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(k8s_openapi::jiff::Timestamp::now()));
    conditions.retain(|c| c.type_ != type_);
    conditions.push(Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: readiness.reason.to_owned(),
        message,
        last_transition_time: since,
        observed_generation: generation,
    });
    true
}

/// Removes `driver`'s entries in `pool` that `keep` refuses; other
/// drivers' and other pools' entries stay. `true` when one was removed.
pub fn remove_stale(
    devices: &mut Vec<AllocatedDeviceStatus>,
    driver: &str,
    pool: &str,
    keep: impl Fn(&AllocatedDeviceStatus) -> bool,
) -> bool {
    let before = devices.len();
    devices.retain(|d| d.driver != driver || d.pool != pool || keep(d));
    devices.len() != before
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: &str = "gpu.nvidia.com";

    fn key<'a>(device: &'a str, share: Option<&'a str>) -> EntryKey<'a> {
        EntryKey { driver: OURS, pool: "node-a", device, share_id: share }
    }

    fn entry(driver: &str, pool: &str, device: &str) -> AllocatedDeviceStatus {
        AllocatedDeviceStatus {
            driver: driver.into(),
            pool: pool.into(),
            device: device.into(),
            ..AllocatedDeviceStatus::default()
        }
    }

    fn ready(message: &str) -> Readiness {
        Readiness { ready: true, reason: "Prepared", message: message.into() }
    }

    #[test]
    fn an_entry_is_matched_by_its_whole_key_and_other_drivers_are_kept() {
        let theirs = entry("nic.example.com", "node-a", "gpu-0");
        let mut devices = vec![theirs.clone()];
        assert!(set_ready(entry_mut(&mut devices, &key("gpu-0", None)), &ready("ok"), Some(2)));
        assert!(set_ready(entry_mut(&mut devices, &key("gpu-0", Some("share-1"))), &ready("ok"), Some(2)));
        assert_eq!(devices.len(), 3, "same device name of another driver and another share are distinct entries");
        assert_eq!(devices[0], theirs, "the other driver's entry is untouched");
        assert!(!set_ready(entry_mut(&mut devices, &key("gpu-0", None)), &ready("ok"), Some(2)), "unchanged");
        assert_eq!(devices.len(), 3);
    }

    #[test]
    fn the_transition_time_moves_only_when_the_status_flips() {
        let mut devices = Vec::new();
        let stamp = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let entry = entry_mut(&mut devices, &key("gpu-0", None));
        set_ready(entry, &ready("ok"), Some(1));
        entry.conditions.as_mut().unwrap()[0].last_transition_time = stamp.clone();
        assert!(set_ready(entry, &ready("ok"), Some(2)), "a new generation is a change");
        assert_eq!(entry.conditions.as_ref().unwrap()[0].last_transition_time, stamp);
        let failed = Readiness { ready: false, reason: "PrepareFailed", message: "no".into() };
        assert!(set_ready(entry, &failed, Some(2)));
        let conditions = entry.conditions.as_ref().unwrap();
        assert_eq!((conditions.len(), conditions[0].status.as_str()), (1, "False"));
        assert_ne!(conditions[0].last_transition_time, stamp);
    }

    #[test]
    fn only_our_stale_entries_in_our_pool_are_removed() {
        let mut devices = vec![
            entry(OURS, "node-a", "gpu-0"),
            entry(OURS, "node-a", "gpu-1"),
            entry(OURS, "node-b", "gpu-1"),
            entry("nic.example.com", "node-a", "gpu-1"),
        ];
        assert!(remove_stale(&mut devices, OURS, "node-a", |d| d.device == "gpu-0"));
        let left: Vec<_> = devices.iter().map(|d| (d.driver.as_str(), d.pool.as_str(), d.device.as_str())).collect();
        assert_eq!(
            left,
            [(OURS, "node-a", "gpu-0"), (OURS, "node-b", "gpu-1"), ("nic.example.com", "node-a", "gpu-1")]
        );
        assert!(!remove_stale(&mut devices, OURS, "node-a", |_| true));
    }

    #[test]
    fn a_message_is_escaped_and_bounded() {
        assert_eq!(bounded_message("bad\nline\u{1b}[31m"), "bad\\nline\\u{1b}[31m");
        let long = bounded_message(&"é".repeat(5000));
        assert_eq!(long.chars().count(), MESSAGE_LIMIT);
        assert!(long.ends_with('…'));
        let escapes = bounded_message(&"\n".repeat(2000));
        assert!(escapes.chars().count() <= MESSAGE_LIMIT && escapes.ends_with("\\n…"), "{escapes}");
        assert_eq!(bounded_message(&"a".repeat(MESSAGE_LIMIT)), "a".repeat(MESSAGE_LIMIT), "an exact fit is whole");
    }
}
