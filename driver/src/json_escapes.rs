//! JSON's way of writing a character outside the Basic Multilingual Plane,
//! a UTF-16 surrogate pair (`"\ud83d\ude00"`), inside YAML text.
//!
//! YAML's double-quoted scalars take `\u` escapes too, but only of Unicode
//! scalar values: the YAML parser refuses each half of a pair. Tools that
//! emit JSON-style escapes into YAML (and JSON pasted into a YAML document)
//! are common, so each pair inside double quotes is rewritten as the one
//! `\UXXXXXXXX` escape YAML reads as the same character. Nothing else is
//! touched; a lone half is left for the parser to refuse.

use std::borrow::Cow;

use crate::nesting::{Place, QuoteScan};

/// `text` with every surrogate-pair escape in double quotes rewritten.
pub fn to_yaml(text: &str) -> Cow<'_, str> {
    if !text.contains("\\u") && !text.contains("\\U") {
        return Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut out: Option<String> = None;
    // Bytes of `text` already copied to `out`.
    let mut copied = 0;
    let mut scan = QuoteScan::default();
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if scan.step(b) == Place::Escape
            && let Some(c) = surrogate_pair(bytes.get(i..).unwrap_or_default())
        {
            let out = out.get_or_insert_with(|| String::with_capacity(text.len()));
            out.push_str(text.get(copied..i).unwrap_or_default());
            out.push_str(&format!("\\U{:08X}", u32::from(c)));
            i += 12;
            copied = i;
            scan.skip_escape();
            continue;
        }
        i += 1;
    }
    match out {
        None => Cow::Borrowed(text),
        Some(mut out) => {
            out.push_str(text.get(copied..).unwrap_or_default());
            Cow::Owned(out)
        }
    }
}

/// The character of `\uD8xx\uDCxx` at the start of `s`, if it is a valid pair.
fn surrogate_pair(s: &[u8]) -> Option<char> {
    let unit = |at: usize| -> Option<u16> {
        let escape = s.get(at..at + 6)?;
        if escape.first() != Some(&b'\\') || escape.get(1) != Some(&b'u') {
            return None;
        }
        u16::from_str_radix(std::str::from_utf8(escape.get(2..)?).ok()?, 16).ok()
    };
    let (high, low) = (unit(0)?, unit(6)?);
    char::decode_utf16([high, low]).next()?.ok().filter(|_| (0xD800..0xDC00).contains(&high))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_in_double_quotes_become_one_escape() {
        assert_eq!(to_yaml(r#"a: "x\ud83d\ude00y""#), r#"a: "x\U0001F600y""#);
        assert_eq!(to_yaml(r#"a: "\uD83D\uDE00\n\u00e9""#), r#"a: "\U0001F600\n\u00e9""#);
    }

    #[test]
    fn everything_else_is_untouched() {
        for text in [
            r#"a: '\ud83d\ude00'"#,
            r#"a: \ud83d\ude00"#,
            "# \"\\ud83d\\ude00\"",
            r#"a: "\\ud83d\ude00""#,
            r#"a: "\ud83d""#,
            r#"a: "\ude00\ud83d""#,
            "a: plain",
        ] {
            assert!(matches!(to_yaml(text), Cow::Borrowed(t) if t == text), "{text}");
        }
    }
}
