//! Text from the API server made safe to print: its control characters
//! shown escaped, so that a device attribute, another user's selector or a
//! server's error message cannot move the cursor, retitle or clear the
//! terminal, or forge lines of our output. Printable Unicode is kept.
//!
//! Every printer goes through [`escape`]: the table's cells, `why`'s lines,
//! warnings and the error line. JSON and YAML keep the data as the server
//! sent it, in the encoders' own escapes ([`json`]).

use std::borrow::Cow;

/// A C0 control (tab and newline included: a cell or a message is one
/// line), DEL, or a C1 control (U+0080-U+009F, which some terminals obey
/// as the 8-bit form of ESC [ and the like).
fn is_control(c: char) -> bool {
    c.is_control()
}

/// `text` with each control character written as an escape: `\t`, `\n`,
/// `\r`, else `\x1b` for C0 and DEL, `\u{9b}` for C1. Borrowed when there
/// is none.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if u32::from(c) < 0x80 && is_control(c) => out.push_str(&format!("\\x{:02x}", u32::from(c))),
            c if is_control(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// serde_json's text with DEL and the C1 controls, which it writes raw
/// (JSON requires escapes only below U+0020), as `\u007f`, `\u009b`: the
/// same document, and no control reaches a terminal. They can only occur
/// inside strings, where `\uXXXX` means the same character.
pub fn json(text: String) -> String {
    if !text.chars().any(is_control_above_ascii_space) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_control_above_ascii_space(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// DEL and C1: the controls serde_json leaves raw.
fn is_control_above_ascii_space(c: char) -> bool {
    is_control(c) && u32::from(c) >= 0x7f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_printable_unicode_kept() {
        assert!(matches!(escape("NVIDIA H100 80GB – 测试 ✓"), Cow::Borrowed(_)));
        assert_eq!(escape("a\x1b]0;owned\x07b"), "a\\x1b]0;owned\\x07b");
        assert_eq!(escape("\x1b[2J\u{9b}2J\x7f"), "\\x1b[2J\\u{9b}2J\\x7f");
        assert_eq!(escape("two\nlines\tand\rback"), "two\\nlines\\tand\\rback");
        assert_eq!(escape("\u{85}\u{a0}é"), "\\u{85}\u{a0}é");
    }

    #[test]
    fn json_stays_the_same_document_without_raw_controls() {
        let value = serde_json::json!({"productName": "x\x1b[2J\u{9b}y\x7fé"});
        let text = json(serde_json::to_string(&value).unwrap());
        assert!(!text.chars().any(char::is_control), "{text:?}");
        assert_eq!(text, r#"{"productName":"x\u001b[2J\u009by\u007fé"}"#);
        assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap(), value);
    }

    #[test]
    fn yaml_escapes_them_itself() {
        let value = serde_json::json!({"productName": "x\x1b[2J\u{9b}y\x7f"});
        let text = serde_yaml_ng::to_string(&value).unwrap();
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{text:?}");
        assert_eq!(serde_yaml_ng::from_str::<serde_json::Value>(&text).unwrap(), value);
    }
}
