//! The apiserver's string formats (`k8s.io/apimachinery/pkg/util/validation`
//! and `pkg/apis/resource/validation`), as plain predicates.
//!
//! Each check returns the apiserver's own wording on failure, so an error we
//! raise before sending an object reads like the one the server would send.

/// Longest DNS-1123 label.
pub const DNS1123_LABEL_MAX: usize = 63;
/// Longest DNS-1123 subdomain.
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;
/// Longest label value and label-name part.
pub const LABEL_VALUE_MAX: usize = 63;
/// Most entries of a ResourceClaim's `status.reservedFor`
/// (`ResourceClaimReservedForMaxSize`, resource.k8s.io/v1): what we read,
/// keep or print of one is cut there, whatever a server sends.
pub const RESERVED_FOR_MAX: usize = 256;

/// A string that breaks one of the formats, worded as the apiserver words
/// it. The checks that run another (a qualified name's domain, a label
/// name's parts) wrap its error, so the text says which part broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("must not be empty")]
    Empty,
    #[error("must be no more than {max} characters")]
    TooLong { max: usize },
    #[error(
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters \
         or '-', and must start and end with an alphanumeric character \
         (e.g. 'my-name', or '123-abc')"
    )]
    NotDns1123Label,
    #[error(
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric \
         characters, '-' or '.', and must start and end with an alphanumeric \
         character (e.g. 'example.com')"
    )]
    NotDns1123Subdomain,
    #[error(
        "a valid C identifier must start with alphabetic character or '_', followed \
         by a string of alphanumeric characters or '_' (e.g. 'my_name')"
    )]
    NotCIdentifier,
    #[error("the domain must not be empty")]
    EmptyDomain,
    /// A qualified name's domain is not a driver name.
    #[error("domain {domain:?}: {rule}")]
    Domain { domain: String, rule: Box<FormatError> },
    #[error("the name must not be empty")]
    EmptyName,
    #[error("must not contain more than one slash")]
    MoreThanOneSlash,
    #[error(
        "a valid label must be an empty string or consist of alphanumeric \
         characters, '-', '_' or '.', and must start and end with an alphanumeric \
         character"
    )]
    NotLabelValue,
    #[error("prefix part must be non-empty")]
    EmptyPrefix,
    /// A label name's prefix is not a DNS subdomain.
    #[error("prefix part {0}")]
    Prefix(Box<FormatError>),
    #[error("name part must be non-empty")]
    EmptyNamePart,
    /// A label name's name part is not a label value.
    #[error("name part {0}")]
    NamePart(Box<FormatError>),
    #[error("must be a string compatible with semver.org spec 2.0.0")]
    NotSemver,
}

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn matches_label_body(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && is_lower_alnum(b[0])
        && is_lower_alnum(b[b.len() - 1])
        && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
}

/// A lowercase RFC 1123 label: device names, request names, counter names.
pub fn check_dns1123_label(s: &str) -> Result<(), FormatError> {
    if s.len() > DNS1123_LABEL_MAX {
        return Err(FormatError::TooLong { max: DNS1123_LABEL_MAX });
    }
    if !matches_label_body(s) {
        return Err(FormatError::NotDns1123Label);
    }
    Ok(())
}

/// A lowercase RFC 1123 subdomain: object names, node names, pool name parts.
pub fn check_dns1123_subdomain(s: &str) -> Result<(), FormatError> {
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        return Err(FormatError::TooLong { max: DNS1123_SUBDOMAIN_MAX });
    }
    if !s.split('.').all(matches_label_body) {
        return Err(FormatError::NotDns1123Subdomain);
    }
    Ok(())
}

/// A DRA driver name (the apiserver reuses the CSI driver name rule): at most
/// 63 characters and a DNS subdomain. We also require lower case, as the API
/// documentation asks, so that field selectors on `spec.driver` match.
pub fn check_driver_name(s: &str) -> Result<(), FormatError> {
    if s.is_empty() {
        return Err(FormatError::Empty);
    }
    if s.len() > DNS1123_LABEL_MAX {
        return Err(FormatError::TooLong { max: DNS1123_LABEL_MAX });
    }
    check_dns1123_subdomain(s)
}

/// A C identifier of at most 32 characters: the id part of attribute and
/// capacity names.
pub fn check_c_identifier(s: &str) -> Result<(), FormatError> {
    const MAX: usize = 32;
    if s.len() > MAX {
        return Err(FormatError::TooLong { max: MAX });
    }
    let b = s.as_bytes();
    let ok = !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_');
    if !ok {
        return Err(FormatError::NotCIdentifier);
    }
    Ok(())
}

/// A qualified attribute or capacity name: `<id>` or `<domain>/<id>`.
pub fn check_qualified_name(s: &str) -> Result<(), FormatError> {
    let parts: Vec<&str> = s.split('/').collect();
    match parts.as_slice() {
        [id] => check_c_identifier(id),
        [domain, id] => {
            if domain.is_empty() {
                return Err(FormatError::EmptyDomain);
            }
            check_driver_name(domain)
                .map_err(|rule| FormatError::Domain { domain: (*domain).to_string(), rule: Box::new(rule) })?;
            if id.is_empty() {
                return Err(FormatError::EmptyName);
            }
            check_c_identifier(id)
        }
        _ => Err(FormatError::MoreThanOneSlash),
    }
}

/// `(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?`, at most 63 characters.
pub fn check_label_value(s: &str) -> Result<(), FormatError> {
    if s.len() > LABEL_VALUE_MAX {
        return Err(FormatError::TooLong { max: LABEL_VALUE_MAX });
    }
    let b = s.as_bytes();
    let ok = b.is_empty()
        || (b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.')));
    if !ok {
        return Err(FormatError::NotLabelValue);
    }
    Ok(())
}

/// A label name (taint keys use it): an optional DNS-subdomain prefix and a
/// non-empty name part in the label-value alphabet.
pub fn check_label_name(s: &str) -> Result<(), FormatError> {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Err(FormatError::EmptyPrefix);
        }
        check_dns1123_subdomain(prefix).map_err(|e| FormatError::Prefix(Box::new(e)))?;
    }
    if name.is_empty() {
        return Err(FormatError::EmptyNamePart);
    }
    check_label_value(name).map_err(|e| FormatError::NamePart(Box::new(e)))
}

/// Semantic versioning 2.0.0, exactly as the apiserver's regular expression
/// for `version` attributes accepts it.
pub fn check_semver(s: &str) -> Result<(), FormatError> {
    let (core_and_pre, build) = match s.split_once('+') {
        Some((c, b)) => (c, Some(b)),
        None => (s, None),
    };
    let (core, pre) = match core_and_pre.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (core_and_pre, None),
    };
    let numeric = |p: &str| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()) && (p == "0" || !p.starts_with('0'));
    let core_parts: Vec<&str> = core.split('.').collect();
    if core_parts.len() != 3 || !core_parts.iter().all(|p| numeric(p)) {
        return Err(FormatError::NotSemver);
    }
    let ident_chars = |p: &str| !p.is_empty() && p.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-');
    if let Some(pre) = pre {
        let ok = pre.split('.').all(|p| ident_chars(p) && (numeric(p) || !p.bytes().all(|c| c.is_ascii_digit())));
        if !ok {
            return Err(FormatError::NotSemver);
        }
    }
    if let Some(build) = build
        && !build.split('.').all(ident_chars)
    {
        return Err(FormatError::NotSemver);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert!(check_dns1123_label("gpu-0").is_ok());
        assert!(check_dns1123_label("0").is_ok());
        assert!(check_dns1123_label("gpu-0-mig-1g10gb-me-20-0").is_ok());
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64)] {
            assert!(check_dns1123_label(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn subdomains_and_driver_names() {
        assert!(check_dns1123_subdomain("gpu.nvidia.com").is_ok());
        assert!(check_dns1123_subdomain("node-1").is_ok());
        for bad in ["", ".a", "a.", "a..b", "Node", "a_b"] {
            assert!(check_dns1123_subdomain(bad).is_err(), "{bad:?}");
        }
        assert!(check_driver_name("gpu.nvidia.com").is_ok());
        assert!(check_driver_name(&format!("{}.com", "a".repeat(60))).is_err());
    }

    #[test]
    fn qualified_names() {
        for good in ["memory", "resource.kubernetes.io/pciBusID", "_x1", "gpu.nvidia.com/nvlinkGroup"] {
            assert!(check_qualified_name(good).is_ok(), "{good:?}");
        }
        for bad in ["", "1abc", "a-b", "/x", "d/", "a/b/c", "Bad_Domain/x", &"a".repeat(33)] {
            assert!(check_qualified_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn label_names_and_values() {
        assert!(check_label_name("gpu.nvidia.com/xid").is_ok());
        assert!(check_label_name("plain").is_ok());
        assert!(check_label_name("/x").is_err());
        assert!(check_label_name("a/").is_err());
        assert!(check_label_value("").is_ok());
        assert!(check_label_value("79").is_ok());
        assert!(check_label_value("-79").is_err());
    }

    #[test]
    fn nested_rules_say_which_part_broke() {
        assert_eq!(
            check_qualified_name("Bad/x").unwrap_err().to_string(),
            "domain \"Bad\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, \
             '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com')"
        );
        assert_eq!(
            check_label_name("a/-b").unwrap_err().to_string(),
            "name part a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', \
             and must start and end with an alphanumeric character"
        );
        let long_prefix = format!("{}/x", "a".repeat(254));
        assert_eq!(
            check_label_name(&long_prefix).unwrap_err().to_string(),
            "prefix part must be no more than 253 characters"
        );
    }

    #[test]
    fn semver_matches_the_apiserver_regex() {
        for good in ["1.2.3", "0.0.0", "580.82.7", "1.0.0-alpha.1", "1.0.0-0a", "1.0.0+build.7", "1.0.0-x-y.2+b"] {
            assert!(check_semver(good).is_ok(), "{good:?}");
        }
        for bad in ["1.2", "1.2.3.4", "01.2.3", "580.82.07", "v1.2.3", "1.0.0-01", "1.0.0-", "1.0.0+", "1.0.0-a..b", ""]
        {
            assert!(check_semver(bad).is_err(), "{bad:?}");
        }
    }
}
