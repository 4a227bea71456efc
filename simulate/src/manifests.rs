//! Reading Kubernetes manifests: files, directories and standard input, as
//! YAML document streams or JSON, with `List`s unpacked.
//!
//! Objects are handed to a sink one at a time as they are parsed: a `List`
//! of thousands of ResourceSlices (`kubectl get resourceslices -o json`) is
//! never held whole, neither as text (JSON is read through a buffer) nor as
//! a tree (each item is its own small tree, passed on and dropped).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

mod document;
mod error;
mod manifest;
mod object;
mod split;

pub use error::ReadError;
pub use manifest::{Manifest, Sink};
pub use object::{Body, DecodeError, Head};

#[cfg(test)]
/// Reads every object from `paths` (files, directories of `.yaml`/`.yml`/
/// `.json` files, or `-` for standard input), in order.
pub fn read_all(paths: &[PathBuf]) -> Result<Vec<Manifest>, ReadError> {
    let mut out = Vec::new();
    read_each(paths, &mut |m| {
        out.push(m);
        Ok(())
    })?;
    Ok(out)
}

/// Hands every object from `paths` to `sink` as soon as it is read.
pub fn read_each<E: From<ReadError>>(paths: &[PathBuf], sink: &mut Sink<'_, E>) -> Result<(), E> {
    for path in paths {
        if path.as_os_str() == "-" {
            read_stream("<stdin>", std::io::stdin().lock(), sink)?;
        } else if path.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| ReadError::io(format!("{}: cannot list directory", path.display()), e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml" || e == "json"))
                .collect();
            entries.sort();
            for entry in entries {
                read_file(&entry, sink)?;
            }
        } else {
            read_file(path, sink)?;
        }
    }
    Ok(())
}

fn read_file<E: From<ReadError>>(path: &Path, sink: &mut Sink<'_, E>) -> Result<(), E> {
    let file =
        std::fs::File::open(path).map_err(|e| ReadError::io(format!("{}: cannot read file", path.display()), e))?;
    read_stream(&path.display().to_string(), file, sink)
}

/// JSON is decided by content (its first character), whatever the file is
/// called: JSON is read as it streams in; YAML is read whole (its parser
/// needs the whole text) and checked for hostile nesting first.
fn read_stream<E: From<ReadError>>(origin: &str, input: impl Read, sink: &mut Sink<'_, E>) -> Result<(), E> {
    let mut reader = BufReader::with_capacity(1 << 20, input);
    let cannot_read = |e| ReadError::io(format!("{origin}: cannot read"), e);
    if starts_as_json(&mut reader).map_err(cannot_read)? {
        return document::json_stream(origin, reader, sink);
    }
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes).map_err(cannot_read)?;
    let text = String::from_utf8(bytes).map_err(|e| {
        ReadError::Invalid(format!(
            "{origin}: not UTF-8 text (byte {} is not valid UTF-8); fix: save the file as UTF-8",
            e.utf8_error().valid_up_to()
        ))
    })?;
    parse_each(origin, &text, sink)
}

/// Whether the first non-blank character is `{` or `[` (blanks consumed).
fn starts_as_json(reader: &mut impl BufRead) -> std::io::Result<bool> {
    loop {
        let buf = reader.fill_buf()?;
        let Some(first) = buf.iter().position(|b| !b.is_ascii_whitespace()) else {
            if buf.is_empty() {
                return Ok(false);
            }
            let n = buf.len();
            reader.consume(n);
            continue;
        };
        let json = matches!(buf.get(first), Some(b'{' | b'['));
        reader.consume(first);
        return Ok(json);
    }
}

/// Parses a YAML stream (or JSON text) into objects, unpacking `List`s.
#[cfg(test)]
pub fn parse_into(origin: &str, text: &str, out: &mut Vec<Manifest>) -> Result<(), ReadError> {
    parse_each(origin, text, &mut |m| {
        out.push(m);
        Ok(())
    })
}

/// [`parse_into`], handing each object to `sink`.
pub fn parse_each<E: From<ReadError>>(origin: &str, text: &str, sink: &mut Sink<'_, E>) -> Result<(), E> {
    if text.trim_start().starts_with(['{', '[']) {
        return document::json_stream(origin, text.as_bytes(), sink);
    }
    let text = gpu_dra_driver::safe_yaml::prepare(text).map_err(|e| ReadError::Invalid(format!("{origin}: {e}")))?;
    document::yaml_stream(origin, &text, sink)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_and_lists_are_unpacked() {
        let mut out = Vec::new();
        parse_into(
            "a.yaml",
            "kind: A\nmetadata: {name: x}\n---\n---\nkind: List\nitems: [{kind: B}, {kind: C}]\n",
            &mut out,
        )
        .unwrap();
        let kinds: Vec<_> = out.iter().map(|m| (m.origin.as_str(), m.kind())).collect();
        assert_eq!(kinds, [("a.yaml", "A"), ("a.yaml#3 items[0]", "B"), ("a.yaml#3 items[1]", "C")]);
        assert_eq!(out[0].name(), "x");
    }

    #[test]
    fn kubectl_lists_put_items_before_kind() {
        let mut out = Vec::new();
        let list = r#"{"apiVersion": "v1", "items": [{"kind": "B"}, {"kind": "C"}], "kind": "List", "metadata": {}}"#;
        parse_into("l.json", list, &mut out).unwrap();
        let kinds: Vec<_> = out.iter().map(|m| (m.origin.as_str(), m.kind())).collect();
        assert_eq!(kinds, [("l.json items[0]", "B"), ("l.json items[1]", "C")]);
        let typed = r#"{"kind": "ResourceSliceList", "items": [{"kind": "ResourceSlice"}]}"#;
        parse_into("t.json", typed, &mut out).unwrap();
        assert_eq!(out.last().map(Manifest::kind), Some("ResourceSlice"));
    }

    #[test]
    fn json_files_stream_from_a_reader_whatever_their_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("slices.yaml");
        std::fs::write(
            &path,
            "\n  {\"kind\": \"A\", \"metadata\": {\"name\": \"\\ud83d\\ude00\"}}\n{\"kind\": \"B\"}\n",
        )
        .unwrap();
        let out = read_all(&[path]).unwrap();
        let kinds: Vec<_> = out.iter().map(|m| (m.kind(), m.name())).collect();
        assert_eq!(kinds, [("A", "\u{1f600}"), ("B", "<unnamed>")]);
        assert!(out[1].origin.ends_with("slices.yaml#2"), "{}", out[1].origin);
    }

    #[test]
    fn malformed_input_names_the_document() {
        let mut out = Vec::new();
        let err = parse_into("a.yaml", "kind: A\n---\nkind: [\n", &mut out).unwrap_err().to_string();
        assert!(err.starts_with("a.yaml: document 2: malformed YAML"), "{err}");
        let err = parse_into("b.yaml", "- 1\n", &mut out).unwrap_err().to_string();
        assert!(err.contains("expected a Kubernetes object"), "{err}");
        let err = parse_into("d.json", "{\"kind\": \"A\"} {\"kind\": ", &mut out).unwrap_err().to_string();
        assert!(err.starts_with("d.json: document 2: malformed JSON"), "{err}");
        let err = parse_into("e.yaml", "kind: List\nmetadata: {}\n", &mut out).unwrap_err().to_string();
        assert_eq!(err, "e.yaml: a List needs an items array; fix: list the objects under items:");
        let err =
            parse_into("f.json", r#"{"items": [{"kind": "A"}], "kind": "Pod"}"#, &mut out).unwrap_err().to_string();
        assert_eq!(
            err,
            "f.json: kind \"Pod\" has a top-level items list, which only a List (or a kind ending in List) has; fix: \
             write the objects as a List or one document each"
        );
    }

    #[test]
    fn deep_nesting_is_refused_at_once_in_yaml_and_json() {
        let mut out = Vec::new();
        let deep = format!("kind: A\nspec: {}", "[".repeat(80_000));
        let started = std::time::Instant::now();
        let err = parse_into("c.yaml", &deep, &mut out).unwrap_err().to_string();
        assert_eq!(
            err,
            "c.yaml: nesting deeper than 128 levels at line 2; no Kubernetes object is nested this deep: check the file"
        );
        let deep = format!("{{\"kind\": \"A\",\n\"spec\": {}", "[".repeat(80_000));
        let err = parse_into("c.json", &deep, &mut out).unwrap_err().to_string();
        assert_eq!(
            err,
            "c.json: document 1: nesting deeper than 128 levels at line 2; no Kubernetes object is nested this deep: \
             check the file"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "refused without scanning for long");
    }

    #[test]
    fn json_surrogate_pairs_in_yaml_are_read() {
        let mut out = Vec::new();
        parse_into("s.yaml", "kind: A\nmetadata: {name: \"\\ud83d\\ude00\"}\n", &mut out).unwrap();
        assert_eq!(out[0].name(), "\u{1f600}");
    }
}
