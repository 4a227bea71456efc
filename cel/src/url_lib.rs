//! URLs as a CEL value, and the apiserver's URL library
//! (`k8s.io/apiserver/pkg/cel/library/urls.go`): `url(s)`, `isURL(s)`,
//! `getScheme`, `getHost`, `getHostname`, `getPort`, `getEscapedPath`,
//! `getQuery`.
//!
//! Kubernetes parses with Go's `net/url`: a string is a URL when
//! `ParseRequestURI` accepts it (an absolute URI or an absolute path), and
//! the parts are those of `Parse` (which splits off a fragment first). This
//! module follows those two functions rule by rule (no maintained Rust crate
//! parses as Go does: the `url` crate follows the WHATWG standard, which
//! accepts and normalises differently), for what the library exposes.

use std::any::Any;
use std::collections::HashMap;

use cel::common::types::{CelBool, CelList, CelMap, CelMapKey, CelString, STRING_TYPE, Type};
use cel::common::value::{CowVal, StaticVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

use crate::meter::{bytes_units, charge};

/// The CEL type of URLs.
pub static URL_TYPE: Type = Type::new_unspecified_type("kubernetes.URL");

/// A text Go's `url.ParseRequestURI` or `url.Parse` refuses, in Go's words
/// (`parse "<text>": <reason>`), which CEL's `url()` error carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("parse {text:?}: {reason}")]
pub struct UrlError {
    text: String,
    reason: UrlReason,
}

/// What is wrong with a URL, as Go's `net/url` says it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlReason {
    #[error("net/url: invalid control character in URL")]
    ControlCharacter,
    #[error("empty url")]
    Empty,
    #[error("invalid URI for request")]
    NotForRequest,
    #[error("first path segment in URL cannot contain colon")]
    ColonInFirstSegment,
    #[error("net/url: invalid userinfo")]
    Userinfo,
    #[error("missing protocol scheme")]
    MissingScheme,
    #[error("missing ']' in host")]
    MissingBracket,
    #[error("invalid port {0:?} after host")]
    Port(String),
    #[error("invalid URL escape {0:?}")]
    Escape(String),
    #[error("invalid character {0:?} in host name")]
    HostCharacter(char),
    #[error("invalid UTF-8 after unescaping")]
    Utf8,
}

/// A URL, split as Go's `url.Parse` splits it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    scheme: String,
    opaque: String,
    /// `user:password@`, escaped as written.
    userinfo: Option<String>,
    host: String,
    path: String,
    /// The path as written, when it is a valid encoding of `path`.
    raw_path: String,
    raw_query: String,
    force_query: bool,
    fragment: Option<String>,
}

impl Url {
    /// `url.ParseRequestURI(s)` must accept `text`; the parts are then
    /// `url.Parse(s)`'s.
    pub fn parse(text: &str) -> Result<Url, UrlError> {
        let fail = |reason| UrlError { text: text.to_owned(), reason };
        parse(text, true).map_err(fail)?;
        let (before, fragment) = match text.split_once('#') {
            Some((u, f)) => (u, Some(f)),
            None => (text, None),
        };
        let mut url = parse(before, false).map_err(fail)?;
        if let Some(fragment) = fragment {
            url.fragment = Some(unescape(fragment, Mode::Fragment).map_err(fail)?);
        }
        Ok(url)
    }

    /// Whether Go's `url.ParseRequestURI` accepts `text`, with its error.
    pub fn parse_request_uri(text: &str) -> Result<(), UrlError> {
        parse(text, true).map(|_| ()).map_err(|reason| UrlError { text: text.to_owned(), reason })
    }

    /// `URL.Hostname()`: the host without port or IPv6 brackets.
    fn hostname(&self) -> &str {
        split_host_port(&self.host).0
    }

    /// `URL.Port()`.
    fn port(&self) -> &str {
        split_host_port(&self.host).1
    }

    /// `URL.EscapedPath()`.
    fn escaped_path(&self) -> String {
        if !self.raw_path.is_empty()
            && valid_encoded(&self.raw_path)
            && unescape(&self.raw_path, Mode::Path).is_ok_and(|p| p == self.path)
        {
            return self.raw_path.clone();
        }
        if self.path == "*" {
            return "*".to_owned();
        }
        escape(&self.path)
    }

    /// `URL.Query()`: `ParseQuery(RawQuery)`, pairs that fail to decode
    /// dropped.
    fn query(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for pair in self.raw_query.split('&') {
            if pair.is_empty() || pair.contains(';') {
                continue;
            }
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let (Ok(key), Ok(value)) = (query_unescape(key), query_unescape(value)) else { continue };
            match out.iter_mut().find(|(k, _)| *k == key) {
                Some((_, values)) => values.push(value),
                None => out.push((key, vec![value])),
            }
        }
        out
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Path,
    Host,
    Fragment,
    Query,
}

/// Go's `parse(rawURL, viaRequest)`.
fn parse(raw: &str, via_request: bool) -> Result<Url, UrlReason> {
    if raw.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err(UrlReason::ControlCharacter);
    }
    if raw.is_empty() && via_request {
        return Err(UrlReason::Empty);
    }
    let mut url = Url {
        scheme: String::new(),
        opaque: String::new(),
        userinfo: None,
        host: String::new(),
        path: String::new(),
        raw_path: String::new(),
        raw_query: String::new(),
        force_query: false,
        fragment: None,
    };
    if raw == "*" {
        url.path = "*".to_owned();
        return Ok(url);
    }
    let (scheme, mut rest) = scheme(raw)?;
    url.scheme = scheme.to_ascii_lowercase();
    if rest.ends_with('?') && rest.matches('?').count() == 1 {
        url.force_query = true;
        rest = &rest[..rest.len() - 1];
    } else if let Some((before, query)) = rest.split_once('?') {
        url.raw_query = query.to_owned();
        rest = before;
    }
    if !rest.starts_with('/') {
        if !url.scheme.is_empty() {
            url.opaque = rest.to_owned();
            return Ok(url);
        }
        if via_request {
            return Err(UrlReason::NotForRequest);
        }
        if rest.split('/').next().is_some_and(|segment| segment.contains(':')) {
            return Err(UrlReason::ColonInFirstSegment);
        }
    }
    if (!url.scheme.is_empty() || !via_request && !rest.starts_with("///")) && rest.starts_with("//") {
        let authority_and_path = &rest[2..];
        let (authority, path) = match authority_and_path.find('/') {
            Some(i) => authority_and_path.split_at(i),
            None => (authority_and_path, ""),
        };
        let (userinfo, host) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        if let Some(userinfo) = userinfo {
            if !userinfo.bytes().all(valid_userinfo_byte) {
                return Err(UrlReason::Userinfo);
            }
            url.userinfo = Some(userinfo.to_owned());
        }
        url.host = parse_host(host)?;
        rest = path;
    }
    url.path = unescape(rest, Mode::Path)?;
    if escape(&url.path) != rest {
        url.raw_path = rest.to_owned();
    }
    Ok(url)
}

/// Go's `getScheme`.
fn scheme(raw: &str) -> Result<(&str, &str), UrlReason> {
    for (i, c) in raw.bytes().enumerate() {
        match c {
            b'a'..=b'z' | b'A'..=b'Z' => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' if i > 0 => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' => return Ok(("", raw)),
            b':' if i == 0 => return Err(UrlReason::MissingScheme),
            b':' => return Ok((&raw[..i], &raw[i + 1..])),
            _ => return Ok(("", raw)),
        }
    }
    Ok(("", raw))
}

/// Go's `parseHost`.
fn parse_host(host: &str) -> Result<String, UrlReason> {
    if host.starts_with('[') {
        let Some(close) = host.rfind(']') else { return Err(UrlReason::MissingBracket) };
        let port = &host[close + 1..];
        if !valid_optional_port(port) {
            return Err(UrlReason::Port(port.to_owned()));
        }
    } else if let Some(colon) = host.rfind(':') {
        let port = &host[colon..];
        if !valid_optional_port(port) {
            return Err(UrlReason::Port(port.to_owned()));
        }
    }
    unescape(host, Mode::Host)
}

fn valid_optional_port(port: &str) -> bool {
    match port.strip_prefix(':') {
        _ if port.is_empty() => true,
        Some(digits) => digits.bytes().all(|b| b.is_ascii_digit()),
        None => false,
    }
}

/// Go's `splitHostPort`.
fn split_host_port(host_port: &str) -> (&str, &str) {
    let (mut host, mut port) = (host_port, "");
    if let Some(colon) = host_port.rfind(':')
        && valid_optional_port(&host_port[colon..])
    {
        host = &host_port[..colon];
        port = &host_port[colon + 1..];
    }
    if host.starts_with('[') && host.ends_with(']') && host.len() >= 2 {
        host = &host[1..host.len() - 1];
    }
    (host, port)
}

fn valid_userinfo_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._:~!$&'()*+,;=%@".contains(&b)
}

/// Go's `shouldEscape` for paths: what `EscapedPath` percent-encodes.
fn should_escape_in_path(b: u8) -> bool {
    !(b.is_ascii_alphanumeric() || b"-_.~$&+,/:;=@".contains(&b))
}

/// Go's `validEncoded(s, encodePath)`.
fn valid_encoded(s: &str) -> bool {
    s.bytes().all(|b| b"!$&'()*+,;=:@[]%".contains(&b) || !should_escape_in_path(b))
}

/// Go's `escape(s, encodePath)`.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if should_escape_in_path(b) {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push(b as char);
        }
    }
    out
}

/// Go's `unescape`: `%XX` decoded; a bad escape is an error; in a host,
/// only `%25` may encode an ASCII byte, and unsafe ASCII is refused.
fn unescape(s: &str, mode: Mode) -> Result<String, UrlReason> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
                let Some(value) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) else {
                    let end = (i + 3).min(s.len());
                    return Err(UrlReason::Escape(s.get(i..end).unwrap_or("%").to_owned()));
                };
                if mode == Mode::Host && value < 0x80 && &s[i..i + 3] != "%25" {
                    return Err(UrlReason::Escape(s[i..i + 3].to_owned()));
                }
                out.push(value);
                i += 3;
            }
            b'+' if mode == Mode::Query => {
                out.push(b' ');
                i += 1;
            }
            b if mode == Mode::Host && b < 0x80 && !valid_host_byte(b) => {
                return Err(UrlReason::HostCharacter(b as char));
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| UrlReason::Utf8)
}

fn valid_host_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:[]<>\"".contains(&b)
}

fn query_unescape(s: &str) -> Result<String, UrlReason> {
    unescape(s, Mode::Query)
}

impl Val for Url {
    fn get_type(&self) -> &Type {
        &URL_TYPE
    }

    fn cel_type() -> &'static Type {
        &URL_TYPE
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<Url>().is_some_and(|o| o == self)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for Url {}

type Args<'b, 'v> = Vec<CowVal<'b, 'v>>;
type Out<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

fn string_arg<'a>(function: &str, args: &'a [CowVal<'_, '_>]) -> Result<&'a str, ExecutionError> {
    let text = args
        .first()
        .and_then(|v| v.downcast_ref::<CelString>())
        .map(|s| s.inner())
        .ok_or_else(|| ExecutionError::function_error(function, "expects a string"))?;
    charge(bytes_units(text.len()))?;
    Ok(text)
}

fn url_arg<'a>(function: &str, args: &'a [CowVal<'_, '_>]) -> Result<&'a Url, ExecutionError> {
    args.first()
        .and_then(|v| v.downcast_ref::<Url>())
        .ok_or_else(|| ExecutionError::function_error(function, "expects a URL"))
}

fn url_fn<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let text = string_arg("url", &args)?;
    Url::parse(text).map(|u| CowVal::Owned(Box::new(u) as Box<dyn Val>)).map_err(|e| {
        ExecutionError::function_error("url", format!("URL parse error during conversion from string: {e}"))
    })
}

fn is_url<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let text = string_arg("isURL", &args)?;
    Ok(CowVal::Owned(Box::new(CelBool::from(parse(text, true).is_ok()))))
}

fn string_out<'b, 'v>(s: String) -> Out<'b, 'v> {
    Ok(CowVal::Owned(Box::new(CelString::from(s))))
}

fn get_scheme<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    string_out(url_arg("getScheme", &args)?.scheme.clone())
}

fn get_host<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    string_out(url_arg("getHost", &args)?.host.clone())
}

fn get_hostname<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    string_out(url_arg("getHostname", &args)?.hostname().to_owned())
}

fn get_port<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    string_out(url_arg("getPort", &args)?.port().to_owned())
}

fn get_escaped_path<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    string_out(url_arg("getEscapedPath", &args)?.escaped_path())
}

fn get_query<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let url = url_arg("getQuery", &args)?;
    let mut map: HashMap<CelMapKey<'v>, Box<dyn Val + 'v>> = HashMap::new();
    for (key, values) in url.query() {
        let values: Vec<Box<dyn Val + 'v>> =
            values.into_iter().map(|v| Box::new(CelString::from(v)) as Box<dyn Val + 'v>).collect();
        map.insert(CelMapKey::from(key), Box::new(CelList::from(values)));
    }
    Ok(CowVal::Owned(Box::new(CelMap::from(map))))
}

/// Registers the URL type and functions on `env`.
pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let u = || URL_TYPE.to_owned();
    env.add_type(u())?;
    env.add_overload("url", "string_to_url", vec![STRING_TYPE], url_fn)?;
    env.add_overload("isURL", "is_url_string", vec![STRING_TYPE], is_url)?;
    env.add_member_overload("getScheme", "url_get_scheme", u(), vec![], get_scheme)?;
    env.add_member_overload("getHost", "url_get_host", u(), vec![], get_host)?;
    env.add_member_overload("getHostname", "url_get_hostname", u(), vec![], get_hostname)?;
    env.add_member_overload("getPort", "url_get_port", u(), vec![], get_port)?;
    env.add_member_overload("getEscapedPath", "url_get_escaped_path", u(), vec![], get_escaped_path)?;
    env.add_member_overload("getQuery", "url_get_query", u(), vec![], get_query)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Go's `net/url` behaviour, as the apiserver's `urls_test.go` relies on it.
    #[test]
    fn parses_as_go_does() {
        let u = Url::parse("https://user:pw@kubernetes.io:80/docs/a%20b?a=1&a=2&b=x+y#frag").unwrap();
        assert_eq!(
            (u.scheme.as_str(), u.host.as_str(), u.hostname(), u.port()),
            ("https", "kubernetes.io:80", "kubernetes.io", "80")
        );
        assert_eq!(u.escaped_path(), "/docs/a%20b");
        assert_eq!(u.query(), vec![("a".into(), vec!["1".into(), "2".into()]), ("b".into(), vec!["x y".into()])]);
        let v6 = Url::parse("https://[::1]:8080/").unwrap();
        assert_eq!((v6.host.as_str(), v6.hostname(), v6.port()), ("[::1]:8080", "::1", "8080"));
        assert_eq!(Url::parse("/absolute/path").unwrap().escaped_path(), "/absolute/path");
        assert_eq!(Url::parse("mailto:someone@example.com").unwrap().opaque, "someone@example.com");
        for bad in
            ["", "relative/path", "https://a b.com/", "http://[::1/", "http://host:port/", ":missing", "https://x/%zz"]
        {
            assert!(Url::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Url::parse("https://x/a b").unwrap().escaped_path(), "/a%20b");
    }

    #[test]
    fn errors_read_as_gos() {
        let cases = [
            ("", r#"parse "": empty url"#),
            ("relative/path", r#"parse "relative/path": invalid URI for request"#),
            ("http://host:port/", r#"parse "http://host:port/": invalid port ":port" after host"#),
            ("https://x/%zz", r#"parse "https://x/%zz": invalid URL escape "%zz""#),
        ];
        for (text, message) in cases {
            assert_eq!(Url::parse(text).unwrap_err().to_string(), message, "{text:?}");
        }
    }
}
