//! The one reader of a Kubernetes version as users write it on a command
//! line or in a file (`1.35`, `v1.35.2`): the minor, within the releases
//! this environment models ([`OLDEST_MINOR`]..=[`NEWEST_MINOR`]).

use crate::environment::{NEWEST_MINOR, OLDEST_MINOR};

/// Why a version was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    #[error("{0:?} is not a Kubernetes version; write one such as 1.{OLDEST_MINOR} or 1.{NEWEST_MINOR}")]
    Malformed(String),
    #[error("Kubernetes 1.{0} is not modelled; use 1.{OLDEST_MINOR} to 1.{NEWEST_MINOR}")]
    Unmodelled(u32),
}

/// `1.MINOR` (a leading `v` and a patch are accepted) → `MINOR`.
pub fn parse_minor(value: &str) -> Result<u32, VersionError> {
    let text = value.trim();
    let text = text.strip_prefix('v').unwrap_or(text);
    let minor = text
        .strip_prefix("1.")
        .and_then(|rest| {
            let mut parts = rest.split('.');
            let minor = parts.next()?.parse::<u32>().ok()?;
            let patch_ok = parts.next().is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
            (patch_ok && parts.next().is_none()).then_some(minor)
        })
        .ok_or_else(|| VersionError::Malformed(value.to_owned()))?;
    if (OLDEST_MINOR..=NEWEST_MINOR).contains(&minor) { Ok(minor) } else { Err(VersionError::Unmodelled(minor)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_minor_of_the_modelled_releases() {
        for (text, minor) in [("1.34", 34), ("v1.35", 35), ("1.36.2", 36), (" 1.37 ", 37)] {
            assert_eq!(parse_minor(text), Ok(minor), "{text}");
        }
        assert_eq!(parse_minor("1.33"), Err(VersionError::Unmodelled(33)));
        assert_eq!(parse_minor("1.38.0"), Err(VersionError::Unmodelled(38)));
        for bad in ["", "1", "2.34", "1.x", "1.34.", "1.34.1.2", "1.34-rc.1", "134"] {
            assert_eq!(parse_minor(bad), Err(VersionError::Malformed(bad.to_owned())), "{bad}");
        }
    }
}
