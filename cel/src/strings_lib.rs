//! String functions: the cel-go `ext.Strings` functions of the Kubernetes base
//! environment, and metered versions of the size-dependent standard ones
//! (`contains`, `startsWith`, `endsWith`, `matches`, `size`).
//!
//! Written here rather than taken from the `cel` crate's extension so that
//! each one charges the cost meter for the bytes it scans or builds and
//! refuses results above the size caps (see `cost`), and so that `matches`
//! uses a cached compiled regex instead of compiling the pattern on every
//! call. Indices are in code points, as in CEL.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use cel::common::types::{CelBytes, CelInt, CelList, CelString, DYN_TYPE, INT_TYPE, LIST_TYPE, STRING_TYPE};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};
use regex::Regex;

use crate::meter::{bytes_units, charge, check_list_len, check_string_len};

type Args<'b, 'v> = Vec<CowVal<'b, 'v>>;
type Out<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

fn error(function: &str, message: impl ToString) -> ExecutionError {
    ExecutionError::function_error(function, message)
}

fn str_at<'a>(function: &str, args: &'a [CowVal<'_, '_>], i: usize) -> Result<&'a str, ExecutionError> {
    args.get(i)
        .and_then(|v| v.downcast_ref::<CelString>())
        .map(|s| s.inner())
        .ok_or_else(|| error(function, format!("argument {i} must be a string")))
}

fn int_at(function: &str, args: &[CowVal<'_, '_>], i: usize) -> Result<i64, ExecutionError> {
    args.get(i)
        .and_then(|v| v.downcast_ref::<CelInt>())
        .map(|n| *n.inner())
        .ok_or_else(|| error(function, format!("argument {i} must be an int")))
}

fn string<'b, 'v>(function: &str, s: String) -> Out<'b, 'v> {
    check_string_len(function, s.len())?;
    charge(bytes_units(s.len()))?;
    Ok(CowVal::owned(CelString::from(s)))
}

fn int<'b, 'v>(n: usize) -> Out<'b, 'v> {
    Ok(CowVal::owned(CelInt::from(n as i64)))
}

fn boolean<'b, 'v>(b: bool) -> Out<'b, 'v> {
    Ok(crate::meter::boolean(b))
}

/// A code-point index into `s`, checked against `0..=len`.
fn char_index(function: &str, s: &str, index: i64) -> Result<usize, ExecutionError> {
    let len = s.chars().count();
    usize::try_from(index)
        .ok()
        .filter(|i| *i <= len)
        .ok_or_else(|| error(function, format!("index out of range: {index}")))
}

/// The byte offset of code point `index` (`index <= len`).
fn byte_offset(s: &str, index: usize) -> usize {
    s.char_indices().nth(index).map_or(s.len(), |(b, _)| b)
}

fn char_at<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let s = str_at("charAt", &args, 0)?;
    charge(bytes_units(s.len()))?;
    let i = char_index("charAt", s, int_at("charAt", &args, 1)?)?;
    string("charAt", s.chars().nth(i).map(String::from).unwrap_or_default())
}

fn index_of<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let s = str_at("indexOf", &args, 0)?;
    let needle = str_at("indexOf", &args, 1)?;
    charge(bytes_units(s.len()) * bytes_units(needle.len()).clamp(1, 64))?;
    let start = match args.get(2) {
        Some(_) => char_index("indexOf", s, int_at("indexOf", &args, 2)?)?,
        None => 0,
    };
    let from = byte_offset(s, start);
    let found = s
        .get(from..)
        .and_then(|tail| tail.find(needle))
        .and_then(|b| s.get(..from + b))
        .map(|head| head.chars().count());
    Ok(CowVal::owned(CelInt::from(found.map_or(-1, |i| i as i64))))
}

fn last_index_of<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let s = str_at("lastIndexOf", &args, 0)?;
    let needle = str_at("lastIndexOf", &args, 1)?;
    charge(bytes_units(s.len()) * bytes_units(needle.len()).clamp(1, 64))?;
    let len = s.chars().count();
    let last_start = match args.get(2) {
        Some(_) => char_index("lastIndexOf", s, int_at("lastIndexOf", &args, 2)?)?,
        None => len,
    };
    // The match may start at or before `last_start`, so it may end after it.
    let end = byte_offset(s, (last_start + needle.chars().count()).min(len));
    let found =
        s.get(..end).and_then(|head| head.rfind(needle)).and_then(|b| s.get(..b)).map(|head| head.chars().count());
    Ok(CowVal::owned(CelInt::from(found.map_or(-1, |i| i as i64))))
}

fn lower_ascii<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    string("lowerAscii", str_at("lowerAscii", &args, 0)?.to_ascii_lowercase())
}

fn upper_ascii<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    string("upperAscii", str_at("upperAscii", &args, 0)?.to_ascii_uppercase())
}

fn trim<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    string("trim", str_at("trim", &args, 0)?.trim().to_owned())
}

fn replace<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let s = str_at("replace", &args, 0)?;
    let from = str_at("replace", &args, 1)?;
    let to = str_at("replace", &args, 2)?;
    let limit = match args.get(3) {
        Some(_) => int_at("replace", &args, 3)?,
        None => -1,
    };
    // Size the result before building it: an empty `from` matches between every code point.
    let matches = if from.is_empty() { s.chars().count() + 1 } else { s.matches(from).count() };
    let replaced = if limit < 0 { matches } else { matches.min(limit as usize) };
    let len = s.len() + replaced * to.len();
    check_string_len("replace", len)?;
    charge(bytes_units(s.len()))?;
    let result = if limit < 0 { s.replace(from, to) } else { s.replacen(from, to, limit as usize) };
    string("replace", result)
}

fn split<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let s = str_at("split", &args, 0)?;
    let sep = str_at("split", &args, 1)?;
    let limit = match args.get(2) {
        Some(_) => int_at("split", &args, 2)?,
        None => -1,
    };
    charge(bytes_units(s.len()))?;
    let parts: Vec<String> = match (limit, sep.is_empty()) {
        (0, _) => Vec::new(),
        (l, true) if l < 0 => s.chars().map(String::from).collect(),
        (l, true) => {
            // Go's SplitN with an empty separator: n-1 code points, then the rest.
            let n = l as usize;
            let mut parts: Vec<String> = s.chars().take(n.saturating_sub(1)).map(String::from).collect();
            let rest: String = s.chars().skip(n.saturating_sub(1)).collect();
            if !rest.is_empty() {
                parts.push(rest);
            }
            parts
        }
        (l, false) if l < 0 => s.split(sep).map(str::to_owned).collect(),
        (l, false) => s.splitn(l as usize, sep).map(str::to_owned).collect(),
    };
    check_list_len("split", parts.len())?;
    charge(1 + parts.len() as u64)?;
    let list: Vec<Box<dyn Val>> = parts.into_iter().map(|p| Box::new(CelString::from(p)) as Box<dyn Val>).collect();
    Ok(CowVal::owned(CelList::from(list)))
}

fn substring<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let s = str_at("substring", &args, 0)?;
    charge(bytes_units(s.len()))?;
    let start = char_index("substring", s, int_at("substring", &args, 1)?)?;
    let end = match args.get(2) {
        Some(_) => char_index("substring", s, int_at("substring", &args, 2)?)?,
        None => s.chars().count(),
    };
    if start > end {
        return Err(error("substring", format!("invalid substring range. start: {start}, end: {end}")));
    }
    string("substring", s.chars().skip(start).take(end - start).collect())
}

fn join<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let sep = match args.get(1) {
        Some(_) => str_at("join", &args, 1)?,
        None => "",
    };
    let list = args
        .first()
        .and_then(|v| v.downcast_ref::<CelList>())
        .ok_or_else(|| error("join", "expects a list of strings"))?;
    let mut parts = Vec::with_capacity(list.inner().len());
    let mut len = 0usize;
    for element in list.inner() {
        let part = element.downcast_ref::<CelString>().ok_or_else(|| {
            error("join", format!("list element of type {} is not a string", element.get_type().name()))
        })?;
        len += part.inner().len() + sep.len();
        check_string_len("join", len)?;
        parts.push(part.inner());
    }
    string("join", parts.join(sep))
}

fn contains<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let s = str_at("contains", &args, 0)?;
    let needle = str_at("contains", &args, 1)?;
    charge(bytes_units(s.len()))?;
    boolean(s.contains(needle))
}

fn starts_with<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let s = str_at("startsWith", &args, 0)?;
    let prefix = str_at("startsWith", &args, 1)?;
    charge(bytes_units(prefix.len()))?;
    boolean(s.starts_with(prefix))
}

fn ends_with<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let s = str_at("endsWith", &args, 0)?;
    let suffix = str_at("endsWith", &args, 1)?;
    charge(bytes_units(suffix.len()))?;
    boolean(s.ends_with(suffix))
}

fn size<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let value = args.first().ok_or_else(|| error("size", "expects an argument"))?;
    if let Some(s) = value.downcast_ref::<CelString>() {
        charge(bytes_units(s.inner().len()))?;
        return int(s.inner().chars().count());
    }
    if let Some(b) = value.downcast_ref::<CelBytes>() {
        return int(b.inner().len());
    }
    match value.as_sizer() {
        Some(sizer) => Ok(CowVal::owned(sizer.size())),
        None => Err(ExecutionError::no_such_overload("size", vec![value.get_type().name().to_owned()])),
    }
}

/// Most distinct patterns kept compiled per thread.
const REGEX_CACHE_SIZE: usize = 64;

thread_local! {
    static REGEX_CACHE: RefCell<HashMap<String, Arc<Regex>>> = RefCell::new(HashMap::new());
}

/// Compiles a CEL (RE2) pattern; the size limit keeps a pathological pattern
/// from taking long or much memory to compile. Matching is linear in Rust's
/// `regex`, so no pattern can backtrack catastrophically.
pub fn compile_regex(pattern: &str) -> Result<Regex, RegexError> {
    regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .map_err(|reason| RegexError { pattern: pattern.to_owned(), reason })
}

/// A pattern that does not compile (bad syntax, or over the size limit).
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid regular expression {pattern:?}: {reason}")]
pub struct RegexError {
    pattern: String,
    reason: regex::Error,
}

pub fn cached_regex(pattern: &str) -> Result<Arc<Regex>, ExecutionError> {
    REGEX_CACHE.with(|cache| {
        if let Some(re) = cache.borrow().get(pattern) {
            return Ok(Arc::clone(re));
        }
        let re = Arc::new(compile_regex(pattern).map_err(|e| error("regex", e))?);
        let mut cache = cache.borrow_mut();
        if cache.len() >= REGEX_CACHE_SIZE {
            cache.clear();
        }
        cache.insert(pattern.to_owned(), Arc::clone(&re));
        Ok(re)
    })
}

fn matches<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let s = str_at("matches", &args, 0)?;
    let pattern = str_at("matches", &args, 1)?;
    charge(bytes_units(s.len()) + bytes_units(pattern.len()))?;
    boolean(cached_regex(pattern)?.is_match(s))
}

/// `strings.quote(s)`: `s` as a double-quoted CEL string literal, escaping
/// as cel-go's strings extension does (`\a \b \f \n \r \t \v \\ \"`).
fn quote<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let s = str_at("strings.quote", &args, 0)?;
    charge(bytes_units(s.len()))?;
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out.push('"');
    string("strings.quote", out)
}

/// Registers the string functions on `env`.
pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let s = || STRING_TYPE;
    env.add_member_overload("charAt", "string_char_at_int", s(), vec![INT_TYPE], char_at)?;
    env.add_member_overload("indexOf", "string_index_of_string", s(), vec![s()], index_of)?;
    env.add_member_overload("indexOf", "string_index_of_string_int", s(), vec![s(), INT_TYPE], index_of)?;
    env.add_member_overload("lastIndexOf", "string_last_index_of_string", s(), vec![s()], last_index_of)?;
    env.add_member_overload("lastIndexOf", "string_last_index_of_string_int", s(), vec![s(), INT_TYPE], last_index_of)?;
    env.add_member_overload("lowerAscii", "string_lower_ascii", s(), vec![], lower_ascii)?;
    env.add_member_overload("upperAscii", "string_upper_ascii", s(), vec![], upper_ascii)?;
    env.add_member_overload("trim", "string_trim", s(), vec![], trim)?;
    env.add_overload("strings.quote", "strings_quote", vec![s()], quote)?;
    env.add_member_overload("replace", "string_replace", s(), vec![s(), s()], replace)?;
    env.add_member_overload("replace", "string_replace_n", s(), vec![s(), s(), INT_TYPE], replace)?;
    env.add_member_overload("split", "string_split", s(), vec![s()], split)?;
    env.add_member_overload("split", "string_split_n", s(), vec![s(), INT_TYPE], split)?;
    env.add_member_overload("substring", "string_substring", s(), vec![INT_TYPE], substring)?;
    env.add_member_overload("substring", "string_substring_range", s(), vec![INT_TYPE, INT_TYPE], substring)?;
    env.add_member_overload("join", "list_join", LIST_TYPE, vec![], join)?;
    env.add_member_overload("join", "list_join_string", LIST_TYPE, vec![s()], join)?;
    env.add_member_overload("@contains", "metered_contains", s(), vec![s()], contains)?;
    env.add_member_overload("@startsWith", "metered_starts_with", s(), vec![s()], starts_with)?;
    env.add_member_overload("@endsWith", "metered_ends_with", s(), vec![s()], ends_with)?;
    env.add_member_overload("@matches", "metered_matches_member", s(), vec![s()], matches)?;
    env.add_overload("@matches", "metered_matches", vec![s(), s()], matches)?;
    env.add_member_overload("@size", "metered_size_member", DYN_TYPE, vec![], size)?;
    env.add_overload("@size", "metered_size", vec![DYN_TYPE], size)?;
    Ok(())
}
