//! Version strings as DRA `version` attributes need them.
//!
//! NVIDIA reports versions like `580.82.07` (leading zero), `13.0` or `9.0`,
//! none of which is valid semver; the apiserver rejects a `version` attribute
//! unless it is. We normalize the way NVIDIA's driver does (numeric parts,
//! padded to three, leading zeros dropped) so CEL comparisons such as
//! `driverVersion.isGreaterThan(semver("580.0.0"))` behave as users expect.

use std::fmt;

use crate::k8s_format;

/// A valid semantic version, the value of a `version` attribute.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct Semver(String);

/// A version string that cannot be read as `MAJOR[.MINOR[.PATCH]]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("version {value:?} is not of the form MAJOR[.MINOR[.PATCH]] with decimal numbers")]
pub struct InvalidVersion {
    pub value: String,
}

impl Semver {
    /// Reads `MAJOR[.MINOR[.PATCH]]` with decimal parts, tolerating leading
    /// zeros and a leading `v`.
    pub fn normalize(raw: &str) -> Result<Self, InvalidVersion> {
        let invalid = || InvalidVersion { value: raw.to_string() };
        let trimmed = raw.trim();
        let trimmed = trimmed.strip_prefix('v').unwrap_or(trimmed);
        let parts: Vec<&str> = trimmed.split('.').collect();
        if parts.is_empty() || parts.len() > 3 {
            return Err(invalid());
        }
        let mut numbers = [0u64; 3];
        for (slot, part) in numbers.iter_mut().zip(&parts) {
            if part.is_empty() || !part.bytes().all(|c| c.is_ascii_digit()) {
                return Err(invalid());
            }
            *slot = part.parse().map_err(|_| invalid())?;
        }
        let [major, minor, patch] = numbers;
        Ok(Self(format!("{major}.{minor}.{patch}")))
    }

    /// From `major.minor`, as NVML reports compute capability and CUDA versions.
    pub fn from_major_minor(major: u64, minor: u64) -> Self {
        Self(format!("{major}.{minor}.0"))
    }

    /// Accepts only strings that already are semver, as the apiserver does.
    pub fn parse_strict(raw: &str) -> Result<Self, k8s_format::FormatError> {
        k8s_format::check_semver(raw).map(|()| Self(raw.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Semver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_versions_become_semver() {
        assert_eq!(Semver::normalize("580.82.07").unwrap().as_str(), "580.82.7");
        assert_eq!(Semver::normalize("13.0").unwrap().as_str(), "13.0.0");
        assert_eq!(Semver::normalize("9").unwrap().as_str(), "9.0.0");
        assert_eq!(Semver::normalize("v1.2.3").unwrap().as_str(), "1.2.3");
        for v in ["580.82.07", "13.0", "9"] {
            assert!(k8s_format::check_semver(Semver::normalize(v).unwrap().as_str()).is_ok());
        }
    }

    #[test]
    fn garbage_is_rejected() {
        for bad in ["", "a.b", "1..2", "1.2.3.4", "1.2-beta", "99999999999999999999"] {
            assert!(Semver::normalize(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cuda_style_versions() {
        assert_eq!(Semver::from_major_minor(9, 0).as_str(), "9.0.0");
        assert!(Semver::parse_strict("580.82.07").is_err());
    }
}
