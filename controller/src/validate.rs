//! `validate-slices`: the apiserver's ResourceSlice rules, offline, and
//! (1.35+, where counter sets live in slices of their own) that every
//! counter a device consumes is defined somewhere in its pool.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use std::collections::{BTreeMap, BTreeSet};

use gpu_dra_driver::slices::{ServerRules, validate_slice_for};
use k8s_openapi::api::resource::v1::ResourceSlice;

use gpu_dra_simulate::manifests;

/// A pool at one generation: the counters its slices define, and the
/// counters its devices consume (where, which set, which counter).
#[derive(Default)]
struct PoolCounters {
    defined: BTreeMap<String, BTreeSet<String>>,
    consumed: Vec<(String, String, String, String)>,
}

/// Validates every ResourceSlice in `files` for a server with `rules`;
/// returns whether all are valid.
pub fn run(files: &[PathBuf], rules: ServerRules, out: &mut impl Write, note: &mut impl Write) -> Result<bool> {
    let mut all_valid = true;
    let mut checked = 0;
    let mut pools: BTreeMap<(String, String, i64), PoolCounters> = BTreeMap::new();
    // Checked as read: a large List is never held whole.
    manifests::read_each::<anyhow::Error>(files, &mut |manifest| {
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
        let pool = pools
            .entry((slice.spec.driver.clone(), slice.spec.pool.name.clone(), slice.spec.pool.generation))
            .or_default();
        for set in slice.spec.shared_counters.iter().flatten() {
            pool.defined.entry(set.name.clone()).or_default().extend(set.counters.keys().cloned());
        }
        let at = format!("{}: ResourceSlice {:?}", manifest.origin, manifest.name());
        for (i, device) in slice.spec.devices.iter().flatten().enumerate() {
            for (c, consumption) in device.consumes_counters.iter().flatten().enumerate() {
                for counter in consumption.counters.keys() {
                    let field = format!("{at}: spec.devices[{i}].consumesCounters[{c}]");
                    pool.consumed.push((field, device.name.clone(), consumption.counter_set.clone(), counter.clone()));
                }
            }
        }
        let errors = validate_slice_for(&slice, rules);
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
    if rules.counters_in_own_slices() {
        for ((driver, pool, generation), counters) in &pools {
            for (field, device, set, counter) in &counters.consumed {
                let problem = match counters.defined.get(set) {
                    None => format!("counter set {set:?} is not defined in any slice of pool {driver}/{pool}"),
                    Some(names) if !names.contains(counter) => {
                        format!("counter {counter:?} is not in counter set {set:?} of pool {driver}/{pool}")
                    }
                    Some(_) => continue,
                };
                all_valid = false;
                writeln!(
                    out,
                    "{field}: device {device:?}: {problem} at generation {generation} (a scheduler treats the pool as invalid)"
                )?;
            }
        }
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
        let ok = run(&[file], ServerRules { minor: 34 }, &mut out, &mut note).unwrap();
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

    /// 1.35+: counter sets in slices of their own, checked across the pool.
    #[test]
    fn counters_are_checked_across_the_pool_from_1_35() {
        let counters = "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: c}\nspec: {driver: gpu.nvidia.com, nodeName: n, pool: {name: n, generation: 1, resourceSliceCount: 2}, sharedCounters: [{name: gpu-0-counter-set, counters: {memory-slice-0: {value: '1'}}}]}\n";
        let devices = |counter: &str| {
            format!(
                "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {{name: d}}\nspec: {{driver: gpu.nvidia.com, nodeName: n, pool: {{name: n, generation: 1, resourceSliceCount: 2}}, devices: [{{name: gpu-0-mig-1g10gb-19-0, consumesCounters: [{{counterSet: gpu-0-counter-set, counters: {{{counter}: {{value: '1'}}}}}}]}}]}}\n"
            )
        };
        let run_for = |text: &str, minor| {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("s.yaml");
            std::fs::write(&file, text).unwrap();
            let (mut out, mut note) = (Vec::new(), Vec::new());
            let ok = run(&[file], ServerRules { minor }, &mut out, &mut note).unwrap();
            (ok, String::from_utf8(out).unwrap())
        };
        let (ok, out) = run_for(&format!("{counters}---\n{}", devices("memory-slice-0")), 37);
        assert!(ok, "{out}");
        let (ok, out) = run_for(&format!("{counters}---\n{}", devices("memory-slice-1")), 37);
        assert!(!ok);
        assert!(
            out.contains("device \"gpu-0-mig-1g10gb-19-0\": counter \"memory-slice-1\" is not in counter set \"gpu-0-counter-set\" of pool gpu.nvidia.com/n"),
            "{out}"
        );
        let (ok, out) = run_for(&format!("{counters}---\n{}", devices("memory-slice-0")), 34);
        assert!(!ok, "1.34 wants the set in the device's own slice: {out}");
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
