//! Semantic versions as a CEL value, and the apiserver's semver library
//! (`k8s.io/apiserver/pkg/cel/library/semverlib.go`): `semver(s)`,
//! `semver(s, normalize)`, `isSemver(s)`, `isSemver(s, normalize)`, `major`,
//! `minor`, `patch`, `compareTo`, `isGreaterThan`, `isLessThan`.
//!
//! Parsing is strict SemVer 2.0.0 (what `blang/semver`'s `Parse` accepts);
//! with `normalize` a leading `v` is dropped, missing minor/patch parts are
//! filled with zeros and leading zeros are removed first. Ordering is SemVer
//! precedence: build metadata is ignored, as in `blang/semver`'s `Compare`.

use std::any::Any;
use std::cmp::Ordering;

use cel::common::traits::Comparer;
use cel::common::types::{BOOL_TYPE, CelBool, CelInt, CelString, STRING_TYPE, Type};
use cel::common::value::{CowVal, StaticVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

/// The CEL type of semantic versions.
pub static SEMVER_TYPE: Type = Type::new_unspecified_type("kubernetes.Semver");

/// A parsed semantic version.
#[derive(Clone, Debug)]
pub struct Semver(semver::Version);

/// Why a text is not a semantic version; the text is the apiserver's, which
/// CEL's `semver()` error carries.
#[derive(Debug, thiserror::Error)]
pub enum SemverError {
    /// Not SemVer 2.0.0 (after normalizing, when asked to).
    #[error("{text:?} is not a valid semantic version: {reason}")]
    Invalid { text: String, reason: semver::Error },
    /// With `normalize`, `1.2-rc.1`: a short version takes no suffix.
    #[error("short version cannot contain PreRelease/Build meta data")]
    ShortWithSuffix,
}

impl Semver {
    /// Parses a strict SemVer 2.0.0 version, or, with `normalize`, a loose one.
    pub fn parse(text: &str, normalize: bool) -> Result<Self, SemverError> {
        let normalized;
        let text = if normalize {
            normalized = normalize_version(text)?;
            normalized.as_str()
        } else {
            text
        };
        semver::Version::parse(text)
            .map(Semver)
            .map_err(|reason| SemverError::Invalid { text: text.to_owned(), reason })
    }

    fn precedence(&self, other: &Semver) -> Ordering {
        self.0.cmp_precedence(&other.0)
    }
}

/// `normalizeAndParse` of the apiserver's semver library: drop a leading
/// `v`, split into at most three dot-separated parts, strip leading zeros of
/// each, and fill a short version with `.0` parts (a short version with a
/// pre-release or build suffix is an error).
fn normalize_version(text: &str) -> Result<String, SemverError> {
    let text = text.strip_prefix('v').unwrap_or(text);
    let mut parts: Vec<String> = text
        .splitn(3, '.')
        .map(|p| {
            if p.len() <= 1 {
                return p.to_owned();
            }
            let trimmed = p.trim_start_matches('0');
            if trimmed.as_bytes().first().is_some_and(u8::is_ascii_digit) {
                trimmed.to_owned()
            } else {
                format!("0{trimmed}")
            }
        })
        .collect();
    if parts.len() < 3 {
        if parts.last().is_some_and(|p| p.contains(['+', '-'])) {
            return Err(SemverError::ShortWithSuffix);
        }
        parts.resize(3, "0".to_owned());
    }
    Ok(parts.join("."))
}

impl Val for Semver {
    fn get_type(&self) -> &Type {
        &SEMVER_TYPE
    }

    fn cel_type() -> &'static Type {
        &SEMVER_TYPE
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<Semver>().is_some_and(|o| self.precedence(o) == Ordering::Equal)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }

    /// Serves `isGreaterThan` / `isLessThan` rewritten to `>` / `<`, as for
    /// quantities.
    fn as_comparer(&self) -> Option<&dyn Comparer> {
        Some(self)
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for Semver {}

impl Comparer for Semver {
    fn compare(&self, rhs: &dyn Val) -> Result<Ordering, ExecutionError> {
        rhs.downcast_ref::<Semver>().map(|other| self.precedence(other)).ok_or_else(|| {
            ExecutionError::no_such_member_overload(
                "isGreaterThan",
                vec![SEMVER_TYPE.name().to_owned(), rhs.get_type().name().to_owned()],
            )
        })
    }
}

fn error(function: &str, message: impl ToString) -> ExecutionError {
    ExecutionError::function_error(function, message)
}

fn version_arg<'a>(function: &str, value: Option<&'a CowVal<'_, '_>>) -> Result<&'a Semver, ExecutionError> {
    value.and_then(|v| v.downcast_ref::<Semver>()).ok_or_else(|| error(function, "expects a semver"))
}

/// The string and the optional `normalize` flag of `semver`/`isSemver`.
fn parse_args(function: &str, args: &[CowVal<'_, '_>]) -> Result<Result<Semver, SemverError>, ExecutionError> {
    let text = args
        .first()
        .and_then(|v| v.downcast_ref::<CelString>())
        .map(|s| s.inner())
        .ok_or_else(|| error(function, "expects a string"))?;
    crate::meter::charge(crate::meter::bytes_units(text.len()))?;
    let normalize = args.get(1).and_then(|v| v.downcast_ref::<CelBool>()).is_some_and(|b| *b.inner());
    Ok(Semver::parse(text, normalize))
}

fn semver_fn<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let version = parse_args("semver", &args)?.map_err(|e| error("semver", e))?;
    Ok(CowVal::owned(version))
}

fn is_semver<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(crate::meter::boolean(parse_args("isSemver", &args)?.is_ok()))
}

fn component(
    function: &str,
    args: &[CowVal<'_, '_>],
    pick: fn(&semver::Version) -> u64,
) -> Result<CelInt, ExecutionError> {
    let v = version_arg(function, args.first())?;
    let value = i64::try_from(pick(&v.0)).map_err(|_| error(function, "version component overflows int"))?;
    Ok(CelInt::from(value))
}

fn major<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(CowVal::owned(component("major", &args, |v| v.major)?))
}

fn minor<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(CowVal::owned(component("minor", &args, |v| v.minor)?))
}

fn patch<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(CowVal::owned(component("patch", &args, |v| v.patch)?))
}

fn compare(function: &str, args: &[CowVal<'_, '_>]) -> Result<Ordering, ExecutionError> {
    Ok(version_arg(function, args.first())?.precedence(version_arg(function, args.get(1))?))
}

fn compare_to<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(CowVal::owned(CelInt::from(compare("compareTo", &args)? as i64)))
}

fn is_greater_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(crate::meter::boolean(compare("isGreaterThan", &args)? == Ordering::Greater))
}

fn is_less_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(crate::meter::boolean(compare("isLessThan", &args)? == Ordering::Less))
}

/// Registers the semver library on `env`.
pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let s = || SEMVER_TYPE.to_owned();
    env.add_type(s())?;
    env.add_overload("semver", "string_to_semver", vec![STRING_TYPE], semver_fn)?;
    env.add_overload("semver", "string_bool_to_semver", vec![STRING_TYPE, BOOL_TYPE], semver_fn)?;
    env.add_overload("isSemver", "is_semver_string", vec![STRING_TYPE], is_semver)?;
    env.add_overload("isSemver", "is_semver_string_bool", vec![STRING_TYPE, BOOL_TYPE], is_semver)?;
    env.add_member_overload("major", "semver_major", s(), vec![], major)?;
    env.add_member_overload("minor", "semver_minor", s(), vec![], minor)?;
    env.add_member_overload("patch", "semver_patch", s(), vec![], patch)?;
    env.add_member_overload("compareTo", "semver_compare_to", s(), vec![s()], compare_to)?;
    env.add_member_overload("isGreaterThan", "semver_greater_than", s(), vec![s()], is_greater_than)?;
    env.add_member_overload("isLessThan", "semver_less_than", s(), vec![s()], is_less_than)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_parsing_rejects_what_normalization_accepts() {
        assert!(Semver::parse("1.2.3-rc.1+build.5", false).is_ok());
        for loose in ["v1.2.3", "1.2", "01.2.3", "1"] {
            assert!(Semver::parse(loose, false).is_err(), "{loose}");
            assert!(Semver::parse(loose, true).is_ok(), "{loose}");
        }
        assert_eq!(Semver::parse("v01.2", true).unwrap().0.to_string(), "1.2.0");
        assert_eq!(Semver::parse("1.02.003-rc.1", true).unwrap().0.to_string(), "1.2.3-rc.1");
        assert!(Semver::parse("1.2-rc.1", true).is_err(), "short versions take no suffix");
    }

    #[test]
    fn errors_read_as_the_apiservers() {
        let short = Semver::parse("1.2-rc", true).unwrap_err();
        assert_eq!(short.to_string(), "short version cannot contain PreRelease/Build meta data");
        let invalid = Semver::parse("1.2", false).unwrap_err().to_string();
        assert!(invalid.starts_with(r#""1.2" is not a valid semantic version: "#), "{invalid}");
    }

    #[test]
    fn precedence_ignores_build_metadata_and_ranks_prereleases_lower() {
        let v = |s| Semver::parse(s, false).unwrap();
        assert_eq!(v("1.0.0+a").precedence(&v("1.0.0+b")), Ordering::Equal);
        assert_eq!(v("1.0.0-rc.1").precedence(&v("1.0.0")), Ordering::Less);
        assert_eq!(v("1.10.0").precedence(&v("1.9.9")), Ordering::Greater);
    }
}
