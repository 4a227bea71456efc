//! Kubernetes' format library (`k8s.io/apiserver/pkg/cel/library/format.go`):
//! named formats (`format.dns1123Label()`, ..., `format.named("...")`) and
//! `validate(s)`, which returns `optional.none()` for a valid string and
//! the validation messages otherwise, in apimachinery's words.

use std::any::Any;
use std::sync::LazyLock;

use cel::common::types::{CelList, CelOptional, CelString, STRING_TYPE, Type};
use cel::common::value::{CowVal, StaticVal, Val};
use cel::{DeclarationError, Env, ExecutionError};
use regex::Regex;

use super::url_lib::Url;
use crate::meter::{bytes_units, charge};

pub static FORMAT_TYPE: Type = Type::new_unspecified_type("kubernetes.NamedFormat");

/// A named format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamedFormat {
    name: &'static str,
}

/// The formats, by the name `format.named` takes.
const FORMATS: [&str; 13] = [
    "dns1123Label",
    "dns1123Subdomain",
    "dns1035Label",
    "qualifiedName",
    "dns1123LabelPrefix",
    "dns1123SubdomainPrefix",
    "dns1035LabelPrefix",
    "labelValue",
    "uri",
    "uuid",
    "byte",
    "date",
    "datetime",
];

const DNS1123_LABEL: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_SUBDOMAIN: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1035_LABEL: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const LABEL_KEY: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_VALUE: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";

fn anchored(pattern: &str) -> Regex {
    // The patterns are constants of this file; a failure is a bug that the
    // tests below catch, and matches nothing rather than panicking.
    Regex::new(&format!("^(?:{pattern})$")).unwrap_or_else(|_| Regex::new("$^").expect("an empty pattern compiles"))
}

static DNS1123_LABEL_RE: LazyLock<Regex> = LazyLock::new(|| anchored(DNS1123_LABEL));
static DNS1123_SUBDOMAIN_RE: LazyLock<Regex> = LazyLock::new(|| anchored(DNS1123_SUBDOMAIN));
static DNS1035_LABEL_RE: LazyLock<Regex> = LazyLock::new(|| anchored(DNS1035_LABEL));
static LABEL_KEY_RE: LazyLock<Regex> = LazyLock::new(|| anchored(LABEL_KEY));
static LABEL_VALUE_RE: LazyLock<Regex> = LazyLock::new(|| anchored(LABEL_VALUE));
static UUID_RE: LazyLock<Regex> =
    LazyLock::new(|| anchored("(?i)[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}"));
static BASE64_RE: LazyLock<Regex> =
    LazyLock::new(|| anchored("(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})"));
static TIME_RE: LazyLock<Regex> =
    LazyLock::new(|| anchored("([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))"));

/// apimachinery's `RegexError`.
fn regex_error(message: &str, pattern: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{message} (regex used for validation is '{pattern}')");
    }
    let shown: Vec<String> = examples.iter().map(|e| format!("'{e}', ")).collect();
    format!("{message} (e.g. {}regex used for validation is '{pattern}')", shown.join("or "))
}

fn is_dns1123_label(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 63 {
        errors.push("must be no more than 63 characters".to_owned());
    }
    if !DNS1123_LABEL_RE.is_match(value) {
        if DNS1123_SUBDOMAIN_RE.is_match(value) {
            errors.push("must not contain dots".to_owned());
        } else {
            errors.push(regex_error(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
                DNS1123_LABEL,
                &["my-name", "123-abc"],
            ));
        }
    }
    errors
}

/// `IsDNS1123Subdomain`; `bytes` is the unit word of the length message
/// (apimachinery's two copies of it say "characters" and "bytes").
fn is_dns1123_subdomain(value: &str, unit: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 253 {
        errors.push(format!("must be no more than 253 {unit}"));
    }
    if !DNS1123_SUBDOMAIN_RE.is_match(value) {
        errors.push(regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            DNS1123_SUBDOMAIN,
            &["example.com"],
        ));
    }
    errors
}

fn is_dns1035_label(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 63 {
        errors.push("must be no more than 63 characters".to_owned());
    }
    if !DNS1035_LABEL_RE.is_match(value) {
        errors.push(regex_error(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character",
            DNS1035_LABEL,
            &["my-name", "abc-123"],
        ));
    }
    errors
}

/// apimachinery's `IsLabelKey` (`IsQualifiedName`).
fn is_qualified_name(value: &str) -> Vec<String> {
    const MESSAGE: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
    let examples = ["MyName", "my.name", "123-abc"];
    let mut errors = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errors.push("prefix part must be non-empty".to_owned());
            } else {
                errors.extend(is_dns1123_subdomain(prefix, "bytes").into_iter().map(|m| format!("prefix part {m}")));
            }
            *name
        }
        _ => {
            errors.push(format!(
                "a valid label key {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(MESSAGE, LABEL_KEY, &examples)
            ));
            return errors;
        }
    };
    if name.is_empty() {
        errors.push("name part must be non-empty".to_owned());
    } else if name.len() > 63 {
        errors.push("name part must be no more than 63 bytes".to_owned());
    }
    if !LABEL_KEY_RE.is_match(name) {
        errors.push(format!("name part {}", regex_error(MESSAGE, LABEL_KEY, &examples)));
    }
    errors
}

fn is_label_value(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 63 {
        errors.push("must be no more than 63 bytes".to_owned());
    }
    if !LABEL_VALUE_RE.is_match(value) {
        errors.push(regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            LABEL_VALUE,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errors
}

/// `maskTrailingDash`: a generated-name prefix may end in a dash.
fn mask_trailing_dash(name: &str) -> String {
    if name.len() > 1 && name.ends_with('-') {
        // Go slices bytes: the character before the dash is replaced too.
        let cut = name.len() - 2;
        if name.is_char_boundary(cut) {
            return format!("{}a", &name[..cut]);
        }
    }
    name.to_owned()
}

/// Go's `time.Parse("2006-01-02", s)`.
fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let number = |r: std::ops::Range<usize>| {
        s.get(r).filter(|t| t.bytes().all(|c| c.is_ascii_digit())).and_then(|t| t.parse::<u32>().ok())
    };
    let (Some(year), Some(month), Some(day)) = (number(0..4), number(5..7), number(8..10)) else { return false };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&day)
}

/// kube-openapi's `IsDateTime`.
fn is_datetime(s: &str) -> bool {
    if s.len() < 4 {
        return false;
    }
    let lower = s.to_lowercase();
    let parts: Vec<&str> = lower.split('t').collect();
    if parts.len() < 2 || !is_date(parts[0]) {
        return false;
    }
    let Some(caps) = TIME_RE.captures(parts[1]) else { return false };
    let field = |i: usize| caps.get(i).map_or("", |m| m.as_str());
    field(1) <= "23" && field(2) <= "59" && field(3) <= "59"
}

impl NamedFormat {
    fn named(name: &str) -> Option<NamedFormat> {
        FORMATS.iter().find(|f| **f == name).map(|name| NamedFormat { name })
    }

    /// The messages for `value`, none when it is valid.
    fn validate(self, value: &str) -> Vec<String> {
        match self.name {
            "dns1123Label" => is_dns1123_label(value),
            "dns1123Subdomain" => is_dns1123_subdomain(value, "characters"),
            "dns1035Label" => is_dns1035_label(value),
            "qualifiedName" => is_qualified_name(value),
            "dns1123LabelPrefix" => is_dns1123_label(&mask_trailing_dash(value)),
            "dns1123SubdomainPrefix" => is_dns1123_subdomain(&mask_trailing_dash(value), "characters"),
            "dns1035LabelPrefix" => is_dns1035_label(&mask_trailing_dash(value)),
            "labelValue" => is_label_value(value),
            "uri" => Url::parse_request_uri(value).err().map(|e| e.to_string()).into_iter().collect(),
            "uuid" if !UUID_RE.is_match(value) => vec!["does not match the UUID format".to_owned()],
            "byte" if !BASE64_RE.is_match(value) => vec!["invalid base64".to_owned()],
            "date" if !is_date(value) => vec!["invalid date".to_owned()],
            "datetime" if !is_datetime(value) => vec!["invalid datetime".to_owned()],
            _ => Vec::new(),
        }
    }
}

impl Val for NamedFormat {
    fn get_type(&self) -> &Type {
        &FORMAT_TYPE
    }

    fn cel_type() -> &'static Type {
        &FORMAT_TYPE
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<NamedFormat>().is_some_and(|o| o == self)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(*self)
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for NamedFormat {}

type Args<'b, 'v> = Vec<CowVal<'b, 'v>>;
type Out<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

fn text_at<'a>(function: &str, args: &'a [CowVal<'_, '_>], i: usize) -> Result<&'a str, ExecutionError> {
    let text = args
        .get(i)
        .and_then(|v| v.downcast_ref::<CelString>())
        .map(|s| s.inner())
        .ok_or_else(|| ExecutionError::function_error(function, "expects a string"))?;
    charge(bytes_units(text.len()))?;
    Ok(text)
}

fn named<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let name = text_at("format.named", &args, 0)?;
    let optional = match NamedFormat::named(name) {
        Some(format) => CelOptional::of(Box::new(format)),
        None => CelOptional::none(),
    };
    Ok(CowVal::Owned(Box::new(optional)))
}

fn validate<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let format = args
        .first()
        .and_then(|v| v.downcast_ref::<NamedFormat>())
        .copied()
        .ok_or_else(|| ExecutionError::function_error("validate", "expects a named format"))?;
    let value = text_at("validate", &args, 1)?;
    let messages = format.validate(value);
    let optional = if messages.is_empty() {
        CelOptional::none()
    } else {
        let list: Vec<Box<dyn Val>> =
            messages.into_iter().map(|m| Box::new(CelString::from(m)) as Box<dyn Val>).collect();
        CelOptional::of(Box::new(CelList::from(list)))
    };
    Ok(CowVal::Owned(Box::new(optional)))
}

type Constructor = for<'b, 'v> fn(Args<'b, 'v>) -> Out<'b, 'v>;

/// `format.<name>()`: one function per format (the crate takes plain `fn`s).
macro_rules! constructors {
    ($($function:ident => $name:literal),* $(,)?) => {
        $(
            fn $function<'b, 'v>(_: Args<'b, 'v>) -> Out<'b, 'v> {
                Ok(CowVal::Owned(Box::new(NamedFormat { name: $name })))
            }
        )*
        const CONSTRUCTORS: [(&str, Constructor); FORMATS.len()] = [$(($name, $function)),*];
    };
}

constructors! {
    dns1123_label => "dns1123Label",
    dns1123_subdomain => "dns1123Subdomain",
    dns1035_label => "dns1035Label",
    qualified_name => "qualifiedName",
    dns1123_label_prefix => "dns1123LabelPrefix",
    dns1123_subdomain_prefix => "dns1123SubdomainPrefix",
    dns1035_label_prefix => "dns1035LabelPrefix",
    label_value => "labelValue",
    uri => "uri",
    uuid => "uuid",
    byte => "byte",
    date => "date",
    datetime => "datetime",
}

/// Registers the named formats, `format.named` and `validate` on `env`.
pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_type(FORMAT_TYPE.to_owned())?;
    for (name, constructor) in CONSTRUCTORS {
        let function = format!("format.{name}");
        env.add_overload(&function, &function, vec![], constructor)?;
    }
    env.add_overload("format.named", "format-named", vec![STRING_TYPE], named)?;
    env.add_member_overload("validate", "format-validate", FORMAT_TYPE.to_owned(), vec![STRING_TYPE], validate)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validators_answer_as_apimachinery_does() {
        assert!(is_dns1123_label("my-name").is_empty());
        assert_eq!(is_dns1123_label("a.b"), vec!["must not contain dots".to_owned()]);
        assert_eq!(
            is_dns1123_label("My-Name"),
            vec![
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
                    .replace(",  or", ", or")
            ]
        );
        assert!(is_qualified_name("example.com/MyName").is_empty());
        assert_eq!(is_qualified_name("/x"), vec!["prefix part must be non-empty".to_owned()]);
        assert!(is_label_value("").is_empty());
        assert!(mask_trailing_dash("abc-") == "aba");
        assert!(is_date("2024-02-29") && !is_date("2023-02-29") && !is_date("2024-13-01"));
        assert!(is_datetime("2024-01-01T10:00:00Z") && !is_datetime("2024-01-01T25:00:00Z"));
        assert!(BASE64_RE.is_match("aGVsbG8=") && !BASE64_RE.is_match("aGVsbG8"));
        assert!(UUID_RE.is_match("123E4567-E89B-12D3-A456-426614174000"));
    }
}
