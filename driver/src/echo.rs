//! Bounded echoes of input in messages: an error that quotes what it was
//! given quotes at most [`MAX_ECHO`] bytes of it, and then says how long
//! the whole was, so a 1 MiB claim UID or an HTML error page never floods
//! a kubelet event or a log line.

use std::fmt;

/// The most bytes of one input a message quotes.
pub const MAX_ECHO: usize = 200;

/// `value` quoted (as `{:?}` would) when short; its first [`MAX_ECHO`]
/// bytes and its length otherwise: `"aaaa…" (1048576 bytes)`.
pub fn quoted(value: &str) -> Quoted<'_> {
    Quoted(value)
}

/// `value` as is when short; cut like [`quoted`] otherwise, for text that
/// is prose rather than a value (a server's message).
pub fn text(value: &str) -> Text<'_> {
    Text(value)
}

/// The longest prefix of `value` within `max` bytes that ends on a
/// character boundary.
pub fn prefix(value: &str, max: usize) -> &str {
    if value.len() <= max {
        return value;
    }
    let mut end = max;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    &value[..end]
}

pub struct Quoted<'a>(&'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.len() <= MAX_ECHO {
            write!(f, "{:?}", self.0)
        } else {
            let shown = prefix(self.0, MAX_ECHO);
            write!(f, "{:?}… ({} bytes)", shown, self.0.len())
        }
    }
}

pub struct Text<'a>(&'a str);

impl fmt::Display for Text<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One line: a multi-line page would become many log lines.
        let shown = prefix(self.0, MAX_ECHO);
        let mut first = true;
        for line in shown.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if !first {
                f.write_str(" ")?;
            }
            f.write_str(line)?;
            first = false;
        }
        if shown.len() < self.0.len() {
            write!(f, "… ({} bytes)", self.0.len())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_are_quoted_whole() {
        assert_eq!(quoted("gpu-0").to_string(), "\"gpu-0\"");
        assert_eq!(text("service unavailable").to_string(), "service unavailable");
    }

    #[test]
    fn long_values_are_cut_with_their_length() {
        let uid = "a".repeat(1 << 20);
        let shown = quoted(&uid).to_string();
        assert!(shown.len() < MAX_ECHO + 40, "{}", shown.len());
        assert!(shown.ends_with("… (1048576 bytes)"), "{shown}");
    }

    #[test]
    fn a_cut_never_splits_a_character_and_pages_become_one_line() {
        let page = format!("<html>\n<body>\n{}\n</body></html>", "é".repeat(300));
        let shown = text(&page).to_string();
        assert!(!shown.contains('\n'), "{shown}");
        assert!(shown.starts_with("<html> <body> éé"), "{shown}");
        assert!(shown.ends_with(&format!("… ({} bytes)", page.len())), "{shown}");
    }
}
