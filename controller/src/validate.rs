//! `validate-slices`: the apiserver's ResourceSlice rules, offline.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use gpu_dra_driver::slices::validate_slice;
use k8s_openapi::api::resource::v1::ResourceSlice;

use crate::manifests;

/// Validates every ResourceSlice in `files`; returns whether all are valid.
pub fn run(files: &[PathBuf], out: &mut impl Write, note: &mut impl Write) -> Result<bool> {
    let mut all_valid = true;
    let mut checked = 0;
    // Checked as read: a large List is never held whole.
    manifests::read_each(files, &mut |manifest| {
        if manifest.kind() != "ResourceSlice" {
            writeln!(
                note,
                "{}: skipping {} {:?}: not a ResourceSlice",
                manifest.origin,
                manifest.kind(),
                manifest.name()
            )?;
            return Ok(());
        }
        checked += 1;
        let slice: ResourceSlice = match manifest.decode() {
            Ok(slice) => slice,
            Err(e) => {
                all_valid = false;
                writeln!(
                    out,
                    "{}: ResourceSlice {:?}: cannot be read as resource.k8s.io/v1: {}: {}",
                    manifest.origin,
                    manifest.name(),
                    e.path,
                    e.message
                )?;
                return Ok(());
            }
        };
        let errors = validate_slice(&slice);
        if errors.is_empty() {
            writeln!(out, "{}: ResourceSlice {:?}: valid", manifest.origin, manifest.name())?;
        } else {
            all_valid = false;
            for e in errors {
                writeln!(out, "{}: ResourceSlice {:?}: {e}", manifest.origin, manifest.name())?;
            }
        }
        Ok(())
    })?;
    if checked == 0 {
        writeln!(note, "no ResourceSlice found")?;
    }
    Ok(all_valid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_on(text: &str) -> (bool, String, String) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("s.yaml");
        std::fs::write(&file, text).unwrap();
        let (mut out, mut note) = (Vec::new(), Vec::new());
        let ok = run(&[file], &mut out, &mut note).unwrap();
        (ok, String::from_utf8(out).unwrap(), String::from_utf8(note).unwrap())
    }

    const GOOD: &str = "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: s}\nspec: {driver: gpu.nvidia.com, nodeName: n, pool: {name: n, generation: 1, resourceSliceCount: 1}, devices: [{name: gpu-0}]}\n";

    #[test]
    fn valid_slices_pass_and_other_kinds_are_skipped() {
        let (ok, out, note) = run_on(&format!("{GOOD}---\napiVersion: v1\nkind: Node\nmetadata: {{name: n}}\n"));
        assert!(ok);
        assert!(out.contains("ResourceSlice \"s\": valid"), "{out}");
        assert!(note.contains("skipping Node \"n\""), "{note}");
    }

    #[test]
    fn invalid_slices_fail_with_the_field() {
        let (ok, out, _) = run_on(&GOOD.replace("gpu-0", "GPU_0"));
        assert!(!ok);
        assert!(out.contains("spec.devices[0].name"), "{out}");
        let (ok, out, _) = run_on(&GOOD.replace("generation: 1", "generation: one"));
        assert!(!ok);
        assert!(
            out.contains(
                "ResourceSlice \"s\": cannot be read as resource.k8s.io/v1: spec.pool.generation: invalid type: string \"one\", expected i64"
            ),
            "{out}"
        );
    }
}
