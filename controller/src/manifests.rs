//! Reading Kubernetes manifests: files, directories and standard input, as
//! YAML document streams or JSON, with `List`s unpacked.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

/// One object read from a manifest, with where it came from.
#[derive(Debug)]
pub struct Manifest {
    /// `file` or `file#doc` for documents after the first.
    pub origin: String,
    pub object: serde_json::Value,
}

impl Manifest {
    pub fn kind(&self) -> &str {
        self.object.get("kind").and_then(|k| k.as_str()).unwrap_or("")
    }

    pub fn name(&self) -> &str {
        self.object.pointer("/metadata/name").and_then(|k| k.as_str()).unwrap_or("<unnamed>")
    }
}

/// Reads every object from `paths` (files, directories of `.yaml`/`.yml`/
/// `.json` files, or `-` for standard input), in order.
pub fn read_all(paths: &[PathBuf]) -> Result<Vec<Manifest>> {
    let mut out = Vec::new();
    for path in paths {
        if path.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text).context("reading standard input")?;
            parse_into("<stdin>", &text, &mut out)?;
        } else if path.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
                .with_context(|| format!("{}: cannot list directory", path.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml" || e == "json"))
                .collect();
            entries.sort();
            for entry in entries {
                read_file(&entry, &mut out)?;
            }
        } else {
            read_file(path, &mut out)?;
        }
    }
    Ok(out)
}

fn read_file(path: &Path, out: &mut Vec<Manifest>) -> Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}: cannot read file", path.display()))?;
    parse_into(&path.display().to_string(), &text, out)
}

/// Parses a YAML stream (JSON is YAML) into objects, unpacking `List`s.
pub fn parse_into(origin: &str, text: &str, out: &mut Vec<Manifest>) -> Result<()> {
    gpu_dra_driver::nesting::check(text).map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
    // JSON is YAML, but the JSON parser reads it an order of magnitude faster.
    let values: Box<dyn Iterator<Item = Result<serde_json::Value>>> = if text.trim_start().starts_with(['{', '[']) {
        Box::new(serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>().enumerate().map(
            move |(i, v)| {
                v.map_err(|e| {
                    anyhow::anyhow!("{origin}: document {}: malformed JSON: {e}; fix the syntax there", i + 1)
                })
            },
        ))
    } else {
        Box::new(serde_yaml_ng::Deserializer::from_str(text).enumerate().map(move |(i, doc)| {
            serde_json::Value::deserialize(doc)
                .map_err(|e| anyhow::anyhow!("{origin}: document {}: malformed YAML: {e}; fix the syntax there", i + 1))
        }))
    };
    for (i, value) in values.enumerate() {
        let value = value?;
        let origin = if i == 0 { origin.to_string() } else { format!("{origin}#{}", i + 1) };
        match value {
            serde_json::Value::Null => {}
            serde_json::Value::Object(mut map) if map.get("kind").and_then(|k| k.as_str()) == Some("List") => {
                let Some(serde_json::Value::Array(items)) = map.remove("items") else {
                    bail!("{origin}: a List needs an items array");
                };
                for (j, item) in items.into_iter().enumerate() {
                    out.push(Manifest { origin: format!("{origin} items[{j}]"), object: item });
                }
            }
            serde_json::Value::Object(_) => out.push(Manifest { origin, object: value }),
            _ => bail!("{origin}: expected a Kubernetes object (a mapping with apiVersion and kind)"),
        }
    }
    Ok(())
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
    fn malformed_input_names_the_document() {
        let mut out = Vec::new();
        let err = parse_into("a.yaml", "kind: A\n---\nkind: [\n", &mut out).unwrap_err().to_string();
        assert!(err.starts_with("a.yaml: document 2: malformed YAML"), "{err}");
        let err = parse_into("b.yaml", "- 1\n", &mut out).unwrap_err().to_string();
        assert!(err.contains("expected a Kubernetes object"), "{err}");
        let err = parse_into("d.json", "{\"kind\": \"A\"} {\"kind\": ", &mut out).unwrap_err().to_string();
        assert!(err.starts_with("d.json: document 2: malformed JSON"), "{err}");
        let deep = format!("kind: A\nspec: {}", "[".repeat(80_000));
        let err = parse_into("c.yaml", &deep, &mut out).unwrap_err().to_string();
        assert_eq!(
            err,
            "c.yaml: nesting deeper than 128 levels at line 2; no Kubernetes object is nested this deep: check the file"
        );
    }
}
