//! The chart as the real `helm` command renders and lints it (Helm v4,
//! built from `tests/kube-bins/helm`), against what the other chart tests
//! check: Helm's library through `tests/src/helm.rs` must render the same
//! objects, so that what those tests assert holds for `helm install`.
//!
//! The first run on a machine builds helm (minutes; Go and the Go module
//! proxy); later runs take it from the cache.

use std::path::{Path, PathBuf};

use integration_tests::helm::{self, Outcome};
use integration_tests::helm_cli;
use integration_tests::workspace_root;
use serde_json::{Value, json};

/// The values the chart tests render, by case (tests/tests/chart.rs).
fn cases() -> Vec<(&'static str, Value)> {
    vec![
        ("default", json!({})),
        (
            "secret-tls",
            json!({"webhook": {"tls": {"mode": "secret", "secret": {"name": "my-tls", "caBundle": "Q0EK"}}}}),
        ),
        ("cert-manager", json!({"webhook": {"tls": {"mode": "cert-manager"}}})),
        ("no-webhook", json!({"webhook": {"enabled": false}})),
        ("fake-inventory", json!({"fakeInventory": {"enabled": true}})),
        (
            "gpu-operator",
            json!({"nvidiaDriverRoot": "/run/nvidia/driver", "nvidiaCDIHookPath": "/usr/local/nvidia/toolkit/nvidia-cdi-hook"}),
        ),
        ("mps", json!({"featureGates": {"MPSSupport": true, "ConsumableCapacity": true}})),
        ("service-monitor", json!({"metrics": {"serviceMonitor": {"enabled": true}}})),
        ("compute-domains", json!({"resources": {"computeDomains": {"enabled": true}}})),
        ("dynamic-mig", json!({"dynamicMig": {"enabled": true}})),
    ]
}

fn dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("helm-cli").join(name);
    std::fs::create_dir_all(&dir).expect("the test's directory");
    dir
}

fn chart() -> PathBuf {
    workspace_root().join("charts/gpu-dra-driver")
}

/// What Helm generates anew on every render (the webhook's self-signed
/// CA, certificate and key), replaced by a marker: the rest must be equal.
fn without_generated(mut value: Value) -> Value {
    const GENERATED: [&str; 4] = ["tls.crt", "tls.key", "ca.crt", "caBundle"];
    fn walk(value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, inner) in map.iter_mut() {
                    if GENERATED.contains(&key.as_str()) && inner.is_string() {
                        *inner = json!("<generated>");
                    } else {
                        walk(inner);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut value);
    value
}

/// The objects in a fixed order (kind, namespace, name), as pretty JSON
/// for a readable difference.
fn sorted(objects: Vec<Value>) -> Vec<String> {
    let mut objects: Vec<Value> = objects.into_iter().map(without_generated).collect();
    objects.sort_by_key(|o| {
        let field = |v: &Value| v.as_str().unwrap_or_default().to_string();
        (field(&o["kind"]), field(&o["metadata"]["namespace"]), field(&o["metadata"]["name"]))
    });
    objects.iter().map(|o| serde_json::to_string_pretty(o).expect("JSON")).collect()
}

#[test]
fn helm_is_the_pinned_version() {
    let out = helm_cli::run(&dir("version"), &["version", "--short"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.trim().starts_with(&helm_cli::pinned_version()), "helm version says {said}");
}

#[test]
fn the_real_helm_renders_the_objects_helms_library_renders() {
    let dir = dir("template");
    let cases = cases();
    let library = helm::render_chart_unlinted(Path::new(env!("CARGO_TARGET_TMPDIR")), &chart(), &cases);
    for (case, values) in &cases {
        let by_library = match &library[*case] {
            Outcome::Rendered { objects, .. } => objects.clone(),
            Outcome::Refused(error) => panic!("{case}: Helm's library refused the chart: {error}"),
        };
        let by_helm = helm_cli::template(&dir, &chart(), case, values)
            .unwrap_or_else(|error| panic!("{case}: helm template refused the chart: {error}"));
        let (by_helm, by_library) = (sorted(by_helm), sorted(by_library));
        assert!(!by_helm.is_empty(), "{case}: helm rendered nothing");
        assert_eq!(by_helm.len(), by_library.len(), "{case}: how many objects");
        for (from_helm, from_library) in by_helm.iter().zip(&by_library) {
            assert_eq!(from_helm, from_library, "{case}: helm template and Helm's library differ");
        }
    }
}

#[test]
fn the_real_helm_lints_the_chart_clean_in_strict_mode() {
    let dir = dir("lint");
    for (case, values) in cases() {
        let out = helm_cli::lint(&dir, &chart(), case, &values);
        let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{case}: helm lint --strict failed:\n{said}");
        assert!(said.contains("1 chart(s) linted, 0 chart(s) failed"), "{case}:\n{said}");
        for level in ["[ERROR]", "[WARNING]"] {
            assert!(!said.contains(level), "{case}: helm lint says {level}:\n{said}");
        }
    }
}

#[test]
fn the_real_helm_refuses_what_helms_library_refuses() {
    let dir = dir("refused");
    let cases = [
        ("bad-gate", json!({"featureGates": {"Bogus": true}})),
        ("secret-without-ca", json!({"webhook": {"tls": {"mode": "secret", "secret": {"name": "my-tls"}}}})),
    ];
    let library = helm::render_chart_unlinted(Path::new(env!("CARGO_TARGET_TMPDIR")), &chart(), &cases);
    for (case, values) in &cases {
        let Outcome::Refused(by_library) = &library[*case] else { panic!("{case}: Helm's library rendered it") };
        let by_helm = match helm_cli::template(&dir, &chart(), case, values) {
            Err(error) => error,
            Ok(_) => panic!("{case}: helm template rendered it; Helm's library said: {by_library}"),
        };
        assert!(by_helm.contains(by_library.trim()), "{case}: helm said {by_helm}\nHelm's library said {by_library}");
    }
}
