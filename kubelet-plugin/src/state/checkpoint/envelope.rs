//! The on-disk form of one checkpoint record and its checksum.
//!
//! ```json
//! {"version": 1, "checksum": "crc32:1a2b3c4d", "claim": { ...record... }}
//! ```
//!
//! The checksum covers the canonical JSON of the `claim` value *as stored*
//! (object keys sorted, no whitespace), not a re-encoding of our struct. So
//! a newer plugin that adds a field writes a checksum an older plugin still
//! verifies (it hashes the same value, unknown field included), and the
//! older plugin's files verify in the newer one. NVIDIA's checkpoint hashes
//! its re-marshalled struct, which broke exactly this way (their #1080).
//! `version` changes only for a change old readers cannot understand.

use serde::Deserialize as _;
use serde_json::Value;

use super::records::ClaimRecord;

/// The format version this build writes and the newest it reads.
pub const FORMAT_VERSION: u64 = 1;

/// Why a record file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("not JSON: {0}")]
    NotJson(String),
    #[error("field `{0}` is missing or has the wrong type")]
    Field(&'static str),
    #[error(
        "format version {found} was written by a newer, incompatible plugin (this one reads up to {FORMAT_VERSION}): \
         run that version or remove the file"
    )]
    NewerVersion { found: u64 },
    #[error("checksum mismatch (stored {stored}, computed {computed}): the file is damaged")]
    Checksum { stored: String, computed: String },
    #[error("field `claim`: {0}")]
    Record(String),
}

/// Encodes `record` with its checksum.
pub fn encode(record: &ClaimRecord) -> Result<Vec<u8>, serde_json::Error> {
    let claim = serde_json::to_value(record)?;
    let envelope = serde_json::json!({
        "version": FORMAT_VERSION,
        "checksum": checksum(&claim),
        "claim": claim,
    });
    serde_json::to_vec(&envelope)
}

/// Decodes and verifies a record file.
pub fn decode(bytes: &[u8]) -> Result<ClaimRecord, DecodeError> {
    let envelope: Value = serde_json::from_slice(bytes).map_err(|e| DecodeError::NotJson(e.to_string()))?;
    let version = envelope.get("version").and_then(Value::as_u64).ok_or(DecodeError::Field("version"))?;
    if version > FORMAT_VERSION {
        return Err(DecodeError::NewerVersion { found: version });
    }
    let stored = envelope.get("checksum").and_then(Value::as_str).ok_or(DecodeError::Field("checksum"))?;
    let claim = envelope.get("claim").ok_or(DecodeError::Field("claim"))?;
    let computed = checksum(claim);
    if stored != computed {
        return Err(DecodeError::Checksum { stored: stored.to_string(), computed });
    }
    // Lenient on purpose: fields a newer plugin added are ignored (the
    // derive's default).
    ClaimRecord::deserialize(claim).map_err(|e| DecodeError::Record(e.to_string()))
}

/// `crc32:<hex>` of the canonical JSON of `value`.
pub fn checksum(value: &Value) -> String {
    let mut text = String::new();
    canonical(value, &mut text);
    format!("crc32:{:08x}", crc32fast::hash(text.as_bytes()))
}

/// Compact JSON with object keys sorted, independent of how the value was
/// parsed or built.
fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                if let Some(v) = map.get(key) {
                    canonical(v, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::checkpoint::test_support::record;

    #[test]
    fn round_trip() {
        let r = record("0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a", &["gpu-0"]);
        assert_eq!(decode(&encode(&r).unwrap()).unwrap(), r);
    }

    #[test]
    fn key_order_does_not_change_the_checksum() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"y":[1,{"d":2,"c":3}],"x":"s"}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":"s","y":[1,{"c":3,"d":2}]},"b":1}"#).unwrap();
        assert_eq!(checksum(&a), checksum(&b));
        let c: Value = serde_json::from_str(r#"{"a":{"x":"t","y":[1,{"c":3,"d":2}]},"b":1}"#).unwrap();
        assert_ne!(checksum(&a), checksum(&c));
    }

    /// A file from a newer plugin with a field this build does not know
    /// verifies and decodes; the extra field is ignored.
    #[test]
    fn files_with_unknown_fields_from_newer_plugins_are_read() {
        let r = record("0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a", &["gpu-0"]);
        let mut claim = serde_json::to_value(&r).unwrap();
        claim["futureField"] = serde_json::json!({"z": 1});
        claim["devices"][0]["futureDeviceField"] = serde_json::json!(true);
        let file = serde_json::json!({"version": 1, "checksum": checksum(&claim), "claim": claim});
        assert_eq!(decode(file.to_string().as_bytes()).unwrap(), r);
    }

    /// A file from an older plugin lacking fields added since (here
    /// `shareId`, `adminAccess`) reads with their defaults.
    #[test]
    fn files_from_older_plugins_without_optional_fields_are_read() {
        let claim = serde_json::json!({
            "uid": "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a", "namespace": "ns", "name": "c",
            "state": "PrepareCompleted", "bootId": "b",
            "devices": [{"requestNames": ["gpu"], "poolName": "node-a", "deviceName": "gpu-0", "cdiDeviceIds": ["x"]}]
        });
        let file = serde_json::json!({"version": 1, "checksum": checksum(&claim), "claim": claim});
        let r = decode(file.to_string().as_bytes()).unwrap();
        assert_eq!(r.devices[0].device_name, "gpu-0");
        assert!(!r.devices[0].admin_access);
        assert_eq!(r.cdi_spec_file, None);
    }

    #[test]
    fn damage_and_newer_versions_are_refused() {
        let r = record("0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a", &["gpu-0"]);
        let text = String::from_utf8(encode(&r).unwrap()).unwrap();
        let damaged = text.replace("gpu-0", "gpu-1");
        assert!(matches!(decode(damaged.as_bytes()), Err(DecodeError::Checksum { .. })));
        assert!(matches!(decode(&text.as_bytes()[..text.len() / 2]), Err(DecodeError::NotJson(_))));
        let newer = text.replacen("\"version\":1", "\"version\":2", 1);
        let err = decode(newer.as_bytes()).unwrap_err();
        assert_eq!(err, DecodeError::NewerVersion { found: 2 });
        assert!(err.to_string().contains("newer"));
        assert_eq!(decode(b"{}"), Err(DecodeError::Field("version")));
    }
}
