//! A cheap guard against hostile nesting in YAML and JSON input.
//!
//! The YAML parser scans a whole document before the deserializer's
//! recursion limit (128 levels) refuses it, and that scan is quadratic in
//! the depth of flow collections: 80,000 nested `[` took seconds. This
//! linear pre-scan refuses such input first. It counts `[`/`{` against
//! `]`/`}` outside quotes and comments; brackets inside block scalars are
//! counted too, so a literal text with more than [`MAX_DEPTH`] unclosed
//! brackets is refused as well (no Kubernetes object needs that).

/// The deepest flow nesting accepted: the YAML deserializer's own limit,
/// so nothing it would accept is refused here.
pub const MAX_DEPTH: usize = 128;

/// Input nested deeper than [`MAX_DEPTH`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "nesting deeper than {MAX_DEPTH} levels at line {line}; no Kubernetes object is nested this deep: check the file"
)]
pub struct TooDeep {
    /// 1-based line where the limit was passed.
    pub line: usize,
}

/// Fails when `text` nests flow collections deeper than [`MAX_DEPTH`].
pub fn check(text: &str) -> Result<(), TooDeep> {
    let (mut depth, mut line) = (0usize, 1usize);
    let mut scan = QuoteScan::default();
    for &b in text.as_bytes() {
        if b == b'\n' {
            line += 1;
        }
        if scan.step(b) != Place::Plain {
            continue;
        }
        match b {
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(TooDeep { line });
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Where a byte of YAML text stands, as [`QuoteScan::step`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// Outside quotes and comments.
    Plain,
    /// A backslash starting an escape in double quotes.
    Escape,
    /// In (or opening or closing) quotes, or in a comment.
    Quoted,
}

/// The one reading of YAML quotes and comments that the byte-level
/// pre-scans share (this module's depth count, `json_escapes`): double
/// quotes with backslash escapes, single quotes where `''` is a quote, and
/// `#` after white space starting a comment to the end of the line.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QuoteScan {
    single: bool,
    double: bool,
    escaped: bool,
    comment: bool,
    previous: u8,
}

impl Default for QuoteScan {
    fn default() -> Self {
        QuoteScan { single: false, double: false, escaped: false, comment: false, previous: b'\n' }
    }
}

impl QuoteScan {
    /// Reads the next byte `b`: where it stands.
    pub(crate) fn step(&mut self, b: u8) -> Place {
        if b == b'\n' {
            self.comment = false;
        }
        let place = if self.comment {
            Place::Quoted
        } else if self.double {
            match (self.escaped, b) {
                (true, _) => self.escaped = false,
                (false, b'\\') => self.escaped = true,
                (false, b'"') => self.double = false,
                _ => {}
            }
            if self.escaped { Place::Escape } else { Place::Quoted }
        } else if self.single {
            // '' inside single quotes is an escaped quote: toggling twice is the same.
            self.single = b != b'\'';
            Place::Quoted
        } else {
            match b {
                b'"' => self.double = true,
                b'\'' => self.single = true,
                b'#' if self.previous.is_ascii_whitespace() => self.comment = true,
                _ => {}
            }
            if self.double || self.single || self.comment { Place::Quoted } else { Place::Plain }
        };
        self.previous = b;
        place
    }

    /// The escape just read (at [`Place::Escape`]) was consumed whole by
    /// the caller: the scan goes on after it, still in double quotes.
    pub(crate) fn skip_escape(&mut self) {
        self.escaped = false;
        self.previous = b'0';
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_manifests_pass() {
        let text =
            "kind: ResourceClaim # a [comment\nmetadata: {name: x, labels: {a: '[', b: \"}{[\"}}\nspec: [[1], [2]]\n";
        assert_eq!(check(text), Ok(()));
        let at_limit = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert_eq!(check(&at_limit), Ok(()));
    }

    #[test]
    fn deep_nesting_is_refused_with_its_line() {
        let text = format!("kind: A\nspec: {}", "[".repeat(80_000));
        assert_eq!(check(&text), Err(TooDeep { line: 2 }));
        let maps = format!("a: {}", "{b: ".repeat(MAX_DEPTH + 1));
        assert!(check(&maps).is_err());
        assert!(TooDeep { line: 2 }.to_string().contains("deeper than 128 levels at line 2"));
    }

    #[test]
    fn brackets_in_quotes_and_comments_do_not_count() {
        let quoted = format!("a: \"{}\"\nb: '{}'\n# {}\n", "[".repeat(500), "{".repeat(500), "[".repeat(500));
        assert_eq!(check(&quoted), Ok(()));
        assert_eq!(check(r#"a: "\"[[[" "#), Ok(()));
    }
}
