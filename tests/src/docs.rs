//! The README and the guide under `docs/`, as the tests read the commands,
//! claims and values they print: a command the tests run is found on
//! whichever page holds it, so moving text between pages never leaves it
//! untested.

use std::path::PathBuf;

use crate::workspace_root;

/// One page: its path from the workspace root (`README.md`,
/// `docs/install.md`, ...) and its text.
pub struct Page {
    pub path: PathBuf,
    pub text: String,
}

/// `README.md`, then every `docs/*.md` in name order.
pub fn pages() -> Vec<Page> {
    let root = workspace_root();
    let dir = root.join("docs");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| p.strip_prefix(&root).expect("under the workspace").to_path_buf())
        .collect();
    paths.sort();
    paths.insert(0, PathBuf::from("README.md"));
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(root.join(&path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            Page { path, text }
        })
        .collect()
}

/// The text of `path` (from the workspace root, e.g. `docs/install.md`).
pub fn page(path: &str) -> String {
    std::fs::read_to_string(workspace_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every page, one after the other (each ends with a newline).
pub fn docs_text() -> String {
    pages().into_iter().map(|p| p.text).collect()
}

/// The headings of a Markdown text outside fenced code blocks (where `#`
/// starts a shell comment): the line index, the level and the title.
pub fn headings(text: &str) -> Vec<(usize, usize, &str)> {
    let mut found = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let level = line.chars().take_while(|c| *c == '#').count();
        if !fenced && level > 0 && line[level..].starts_with(' ') {
            found.push((i, level, line[level + 1..].trim()));
        }
    }
    found
}

/// The section titled `title` on whichever page holds it: its heading
/// line and what follows, up to the next heading of the same or a higher
/// level. Exactly one page must hold it.
pub fn section(title: &str) -> String {
    let mut found = Vec::new();
    for page in pages() {
        let lines: Vec<&str> = page.text.lines().collect();
        let headings = headings(&page.text);
        for (n, (start, level, heading)) in headings.iter().enumerate() {
            if *heading != title {
                continue;
            }
            let end = headings[n + 1..].iter().find(|(_, l, _)| l <= level).map_or(lines.len(), |(i, _, _)| *i);
            found.push((page.path.clone(), lines[*start..end].join("\n") + "\n"));
        }
    }
    match found.len() {
        1 => found.remove(0).1,
        0 => panic!("no page of the README and docs/ has a section titled {title:?}"),
        _ => panic!("several sections titled {title:?}: {:?}", found.iter().map(|(p, _)| p).collect::<Vec<_>>()),
    }
}

/// GitHub's anchor for a heading: lower case, spaces to `-`, and every
/// character but letters, digits, `-` and `_` dropped.
pub fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The lines of `text` outside fenced code blocks (```), where inline
/// links and code spans stand.
pub fn prose(text: &str) -> String {
    let mut prose = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    prose
}
