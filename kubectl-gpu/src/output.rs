//! Tables for people (colour only on a terminal, never with `NO_COLOR`),
//! JSON and YAML for programs.

use anyhow::Result;
use gpu_dra_simulate::Format;
use serde::Serialize;

/// ANSI colour, or none.
#[derive(Debug, Clone, Copy, Default)]
pub struct Paint {
    pub enabled: bool,
}

impl Paint {
    /// Colour when standard output is a terminal and `NO_COLOR` is unset or empty.
    pub fn for_stdout() -> Self {
        use std::io::IsTerminal;
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Paint { enabled: std::io::stdout().is_terminal() && !no_color }
    }

    fn wrap(&self, code: &str, text: &str) -> String {
        if self.enabled { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_string() }
    }

    pub fn red(&self, text: &str) -> String {
        self.wrap("31", text)
    }

    pub fn green(&self, text: &str) -> String {
        self.wrap("32", text)
    }

    pub fn bold(&self, text: &str) -> String {
        self.wrap("1", text)
    }
}

/// A colour a cell may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Colour {
    Red,
    Green,
}

/// One table cell: its text (escaped when printed, see
/// [`gpu_dra_driver::printable`]) and its colour, added by [`table`] so that
/// escaping never touches our own colour codes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cell {
    pub text: String,
    pub colour: Option<Colour>,
}

impl Cell {
    pub fn red(text: impl Into<String>) -> Self {
        Cell { text: text.into(), colour: Some(Colour::Red) }
    }

    pub fn green(text: impl Into<String>) -> Self {
        Cell { text: text.into(), colour: Some(Colour::Green) }
    }
}

impl From<String> for Cell {
    fn from(text: String) -> Self {
        Cell { text, colour: None }
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Self {
        Cell::from(text.to_string())
    }
}

impl PartialEq<&str> for Cell {
    fn eq(&self, other: &&str) -> bool {
        self.text == *other
    }
}

/// Columns aligned with three spaces between, as kubectl prints them;
/// each cell escaped, widths counted on the escaped, uncoloured text.
pub fn table(headers: &[&str], rows: &[Vec<Cell>], paint: &Paint) -> String {
    let escaped: Vec<Vec<(String, Option<Colour>)>> = rows
        .iter()
        .map(|row| row.iter().map(|c| (gpu_dra_driver::printable::escape(&c.text).into_owned(), c.colour)).collect())
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &escaped {
        for (w, (cell, _)) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[(String, Option<Colour>)], bold: bool| {
        let last = cells.len().saturating_sub(1);
        let mut text = String::new();
        for (i, ((cell, colour), w)) in cells.iter().zip(&widths).enumerate() {
            let shown = match (bold, colour) {
                (true, _) => paint.bold(cell),
                (false, Some(Colour::Red)) => paint.red(cell),
                (false, Some(Colour::Green)) => paint.green(cell),
                (false, None) => cell.clone(),
            };
            text.push_str(&shown);
            if i < last {
                text.push_str(&" ".repeat(w - cell.chars().count() + 3));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    let headers: Vec<(String, Option<Colour>)> = headers.iter().map(|h| (h.to_string(), None)).collect();
    line(&headers, true);
    for row in &escaped {
        line(row, false);
    }
    out
}

/// `value` as pretty JSON or YAML, the data as the server sent it with no
/// raw control character (see [`crate::printable::json`]).
pub fn document<T: Serialize>(value: &T, format: Format) -> Result<String> {
    Ok(match format {
        Format::Yaml => serde_yaml_ng::to_string(value)?,
        _ => crate::printable::json(format!("{}\n", serde_json::to_string_pretty(value)?)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_plain_text_has_no_escapes() {
        let rows: Vec<Vec<Cell>> = vec![vec!["node-a".into(), "4".into()], vec!["b".into(), "12".into()]];
        let t = table(&["NODE", "GPUS"], &rows, &Paint { enabled: false });
        assert_eq!(t, "NODE     GPUS\nnode-a   4\nb        12\n");
        let coloured = table(&["NODE"], &[], &Paint { enabled: true });
        assert_eq!(coloured, "\x1b[1mNODE\x1b[0m\n");
    }

    #[test]
    fn cells_are_escaped_and_colour_is_ours() {
        let rows = vec![vec![Cell::from("a\x1b]0;x\x07"), Cell::red("pending")]];
        let t = table(&["NAME", "STATE"], &rows, &Paint { enabled: true });
        assert_eq!(
            t,
            // The cell is 13 characters escaped: NAME and 9 + 3 spaces.
            "\x1b[1mNAME\x1b[0m".to_string()
                + &" ".repeat(12)
                + "\x1b[1mSTATE\x1b[0m\n"
                + "a\\x1b]0;x\\x07   \x1b[31mpending\x1b[0m\n"
        );
    }
}
