//! Tables for people (colour only on a terminal, never with `NO_COLOR`),
//! JSON and YAML for programs.

use anyhow::Result;
use serde::Serialize;

/// Output format (`-o`): the same choices as `simulate`'s.
pub use gpu_dra_controller::simulate::Format;

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

/// Columns aligned with three spaces between, as kubectl prints them;
/// widths counted on the uncoloured text.
pub fn table(headers: &[&str], rows: &[Vec<String>], paint: &Paint) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<String>, bold: bool| {
        let last = cells.len().saturating_sub(1);
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            let shown = if bold { paint.bold(cell) } else { cell.clone() };
            text.push_str(&shown);
            if i < last {
                text.push_str(&" ".repeat(w - cell.chars().count() + 3));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(headers.iter().map(|h| h.to_string()).collect(), true);
    for row in rows {
        line(row.clone(), false);
    }
    out
}

/// `value` as pretty JSON or YAML.
pub fn document<T: Serialize>(value: &T, format: Format) -> Result<String> {
    Ok(match format {
        Format::Yaml => serde_yaml_ng::to_string(value)?,
        _ => format!("{}\n", serde_json::to_string_pretty(value)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_plain_text_has_no_escapes() {
        let rows = vec![vec!["node-a".to_string(), "4".into()], vec!["b".into(), "12".into()]];
        let t = table(&["NODE", "GPUS"], &rows, &Paint { enabled: false });
        assert_eq!(t, "NODE     GPUS\nnode-a   4\nb        12\n");
        let coloured = table(&["NODE"], &[], &Paint { enabled: true });
        assert_eq!(coloured, "\x1b[1mNODE\x1b[0m\n");
    }
}
