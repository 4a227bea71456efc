//! Names with rules, validated once where they enter the program.

use std::fmt;
use std::str::FromStr;

use crate::k8s_format;

/// A name that broke its rule: which kind of name, the value, and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} {}: {rule}", crate::echo::quoted(value))]
pub struct InvalidName {
    pub kind: &'static str,
    pub value: String,
    pub rule: String,
}

macro_rules! checked_name {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $check:path) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub fn new(value: impl Into<String>) -> Result<Self, InvalidName> {
                let value = value.into();
                match $check(&value) {
                    Ok(()) => Ok(Self(value)),
                    Err(rule) => Err(InvalidName { kind: $kind, value, rule: rule.to_string() }),
                }
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = InvalidName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

checked_name!(
    /// A DRA driver name such as `gpu.nvidia.com`: also the domain of our
    /// attributes, the prefix of our taint keys and the CDI vendor suffix.
    DriverName,
    "driver name",
    k8s_format::check_driver_name
);

checked_name!(
    /// A Kubernetes node name (DNS subdomain); our pool is named after it.
    NodeName,
    "node name",
    k8s_format::check_dns1123_subdomain
);

checked_name!(
    /// A device name inside a pool (DNS label), e.g. `gpu-0`.
    DeviceName,
    "device name",
    k8s_format::check_dns1123_label
);

checked_name!(
    /// A ResourceClaim UID in RFC 4122 normalized form (36 lower-case
    /// characters), the form the apiserver generates. Safe to put in a path.
    ClaimUid,
    "claim UID",
    check_claim_uid
);

checked_name!(
    /// A ComputeDomain's UID (a claim config's `domainID`), in the same
    /// RFC 4122 normalized form: the name of the domain's daemon directory,
    /// so never a path.
    DomainUid,
    "ComputeDomain UID",
    check_claim_uid
);

/// Read from a state file: a value that breaks the rule fails to decode,
/// so a record naming a path as its domain is damaged, never used.
impl<'de> serde::Deserialize<'de> for DomainUid {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = String::deserialize(deserializer)?;
        Self::new(value).map_err(serde::de::Error::custom)
    }
}

/// The rule of every Kubernetes UID we put in a path.
fn check_claim_uid(s: &str) -> Result<(), String> {
    let normalized = s.len() == 36 && uuid::Uuid::try_parse(s).is_ok_and(|u| u.hyphenated().to_string() == s);
    if normalized {
        Ok(())
    } else {
        Err("must be a UUID in RFC 4122 normalized form, xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx \
             with lower-case hexadecimal digits"
            .to_string())
    }
}

impl DriverName {
    /// The driver name NVIDIA's driver uses; claims written for it port unchanged.
    pub fn nvidia_default() -> Self {
        Self("gpu.nvidia.com".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_names_are_accepted() {
        assert_eq!(DriverName::new("gpu.nvidia.com").unwrap(), DriverName::nvidia_default());
        assert!(NodeName::new("node-1.example").is_ok());
        assert!(DeviceName::new("gpu-0-mig-1g10gb-19-0").is_ok());
        assert!(ClaimUid::new("0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a").is_ok());
    }

    #[test]
    fn invalid_names_say_which_rule() {
        let err = DeviceName::new("gpu.0").unwrap_err();
        assert_eq!(err.kind, "device name");
        assert!(err.to_string().contains("RFC 1123 label"), "{err}");
        for bad in ["../../etc", "0B4F5A1E-9C1D-4A57-8D3C-1F2E3D4C5B6A", "0b4f5a1e9c1d4a578d3c1f2e3d4c5b6a", ""] {
            assert!(ClaimUid::new(bad).is_err(), "{bad:?}");
        }
        assert!(NodeName::new("Node_1").is_err());
        for bad in ["/outside/dom", "../../..", "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a/x"] {
            assert!(DomainUid::new(bad).is_err(), "{bad:?}");
            assert!(serde_json::from_value::<DomainUid>(serde_json::json!(bad)).is_err(), "{bad:?}");
        }
        let uid: DomainUid = serde_json::from_value(serde_json::json!("0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a")).unwrap();
        assert_eq!(uid.as_str(), "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a");
    }

    #[test]
    fn a_huge_value_is_echoed_cut_with_its_length() {
        let err = ClaimUid::new("x".repeat(1 << 20)).unwrap_err().to_string();
        assert!(err.len() < 600, "{} bytes echoed", err.len());
        assert!(err.contains("(1048576 bytes)") && err.contains("RFC 4122"), "{err}");
    }
}
