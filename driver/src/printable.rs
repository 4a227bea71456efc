//! Text from a server or a file made safe to print on one line: its
//! control characters shown escaped, so that a device attribute, another
//! user's selector or a server's error message cannot move the cursor,
//! retitle or clear the terminal, or forge lines of our output. Printable
//! Unicode is kept. Every binary's error line and `kubectl gpu`'s printers
//! go through [`escape`].

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
}
