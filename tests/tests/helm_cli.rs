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

/// NVIDIA's documented install lines (its install guide, the GPU
/// Operator's DRA guide, its time-slicing, MPS and dynamic MIG guides and
/// its feature gates reference), each as its flags after the chart, with
/// the values files they pass: run by the real `helm` against this chart
/// with nothing changed but the chart and its version. `helm install
/// --dry-run=client` renders and validates as an install does without a
/// cluster; the `helm upgrade -i` and `helm upgrade` lines run as that
/// install with the same flags (an upgrade needs a release in a cluster;
/// `--reuse-values` has none to reuse and is left out).
fn nvidias_install_lines() -> Vec<(&'static str, &'static str, Vec<&'static str>, Option<Value>)> {
    let operator_values = json!({"image": {"pullPolicy": "IfNotPresent"},
        "kubeletPlugin": {"nodeSelector": {"nvidia.com/dra-kubelet-plugin": "true"}}});
    let gke_values = json!({"nvidiaDriverRoot": "/home/kubernetes/bin/nvidia",
        "controller": {"priorityClassName": "", "affinity": null},
        "image": {"pullPolicy": "IfNotPresent"},
        "kubeletPlugin": {"priorityClassName": "",
            "tolerations": [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}],
            "nodeSelector": {"nvidia.com/dra-kubelet-plugin": "true"}}});
    let ns = ["--create-namespace", "--namespace", "dra-driver-nvidia-gpu"];
    let operator_ns = ["--namespace", "nvidia-dra-driver-gpu", "--create-namespace"];
    let with = |base: &[&'static str], more: &[&'static str]| -> Vec<&'static str> { [base, more].concat() };
    vec![
        ("quickstart", "dra-driver-nvidia-gpu", with(&ns, &["--set", "gpuResourcesEnabledOverride=true"]), None),
        (
            "quickstart-webhook",
            "dra-driver-nvidia-gpu",
            with(&ns, &["--set", "gpuResourcesEnabledOverride=true", "--set", "webhook.enabled=true"]),
            None,
        ),
        (
            "gpu-operator",
            "nvidia-dra-driver-gpu",
            with(
                &operator_ns,
                &["--set", "nvidiaDriverRoot=/run/nvidia/driver", "--set", "gpuResourcesEnabledOverride=true"],
            ),
            Some(operator_values),
        ),
        (
            "gpu-operator-gke",
            "nvidia-dra-driver-gpu",
            with(&operator_ns, &["--set", "gpuResourcesEnabledOverride=true"]),
            Some(gke_values),
        ),
        (
            "compute-domains-operator",
            "nvidia-dra-driver-gpu",
            with(
                &["--create-namespace", "--namespace", "nvidia-dra-driver-gpu"],
                &["--set", "resources.gpus.enabled=false", "--set", "nvidiaDriverRoot=/run/nvidia/driver"],
            ),
            None,
        ),
        (
            "compute-domains-host",
            "nvidia-dra-driver-gpu",
            with(
                &["--create-namespace", "--namespace", "nvidia-dra-driver-gpu"],
                &["--set", "resources.gpus.enabled=false"],
            ),
            None,
        ),
        (
            "time-slicing",
            "dra-driver-nvidia-gpu",
            vec![
                "--namespace",
                "dra-driver-nvidia-gpu",
                "--set",
                "featureGates.TimeSlicingSettings=true",
                "--set",
                "gpuResourcesEnabledOverride=true",
            ],
            None,
        ),
        (
            "mps",
            "dra-driver-nvidia-gpu",
            vec!["--namespace", "dra-driver-nvidia-gpu", "--set", "featureGates.MPSSupport=true"],
            None,
        ),
        (
            "gates-reference",
            "dra-driver-nvidia-gpu",
            vec!["--namespace", "dra-driver-nvidia-gpu", "--set", "featureGates.TimeSlicingSettings=true"],
            None,
        ),
        (
            "dynamic-mig",
            "dra-driver-nvidia-gpu",
            with(
                &["--namespace", "dra-driver-nvidia-gpu", "--create-namespace"],
                &["--set", "featureGates.DynamicMIG=true", "--set", "gpuResourcesEnabledOverride=true"],
            ),
            None,
        ),
        (
            "health-checks",
            "dra-driver-nvidia-gpu",
            vec!["--namespace", "dra-driver-nvidia-gpu", "--set", "featureGates.NVMLDeviceHealthCheck=true"],
            None,
        ),
        (
            "no-compute-domains",
            "nvidia-dra-driver-gpu",
            with(
                &operator_ns,
                &[
                    "--set",
                    "gpuResourcesEnabledOverride=true",
                    "--set",
                    "resources.computeDomains.enabled=false",
                    "--set",
                    "featureGates.TimeSlicingSettings=true",
                ],
            ),
            None,
        ),
    ]
}

/// The objects `helm install --dry-run=client` prints (after `MANIFEST:`,
/// before `NOTES:`).
fn manifest(case: &str, stdout: &str) -> Vec<Value> {
    let after =
        stdout.split_once("MANIFEST:\n").map(|(_, m)| m).unwrap_or_else(|| panic!("{case}: no MANIFEST in {stdout}"));
    let text = after.split_once("\nNOTES:").map(|(m, _)| m).unwrap_or(after);
    integration_tests::helm::documents(case, text)
}

#[test]
fn nvidias_documented_install_commands_install_unchanged() {
    let dir = dir("nvidia-install-lines");
    let chart = chart();
    let version = std::fs::read_to_string(chart.join("Chart.yaml"))
        .expect("Chart.yaml")
        .lines()
        .find_map(|l| l.strip_prefix("version: ").map(|v| v.trim().trim_matches('"').to_string()))
        .expect("the chart's version");
    let chart_arg = chart.display().to_string();
    for (case, release, flags, values) in nvidias_install_lines() {
        let mut argv = vec!["install", release, &chart_arg, "--version", &version];
        argv.extend(flags.iter().copied());
        let file = values.map(|v| {
            let file = dir.join(format!("{case}.dra-values.yaml"));
            std::fs::write(&file, serde_json::to_vec(&v).expect("JSON")).expect("writing the values");
            file.display().to_string()
        });
        if let Some(file) = &file {
            argv.extend(["-f", file.as_str()]);
        }
        argv.push("--dry-run=client");
        let out = helm_cli::run(&dir, &argv);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{case}: helm {}\n{}", argv.join(" "), String::from_utf8_lossy(&out.stderr));
        let objects = manifest(case, &stdout);
        helm::check_types(&objects);
        let plugin = helm::one(&objects, "DaemonSet", "kubelet-plugin");
        let args = helm::args(helm::container(plugin, "plugin"));
        let classes: Vec<&str> = objects
            .iter()
            .filter(|o| o["kind"] == "DeviceClass")
            .filter_map(|o| o["metadata"]["name"].as_str())
            .collect();
        let gpus = !case.starts_with("compute-domains");
        assert_eq!(classes.contains(&"gpu.nvidia.com"), gpus, "{case}: {classes:?}");
        assert_eq!(args.contains(&"--gpus=false".to_string()), !gpus, "{case}: {args:?}");
        assert_eq!(classes.contains(&"compute-domain-default-channel.nvidia.com"), !gpus, "{case}: {classes:?}");
        let pod = &plugin["spec"]["template"]["spec"];
        match case {
            "gpu-operator" => {
                assert!(args.contains(&"--host-driver-root=/run/nvidia/driver".to_string()), "{args:?}");
                assert_eq!(pod["nodeSelector"], json!({"nvidia.com/dra-kubelet-plugin": "true"}));
            }
            "gpu-operator-gke" => {
                assert!(args.contains(&"--host-driver-root=/home/kubernetes/bin/nvidia".to_string()), "{args:?}");
                assert!(pod.get("priorityClassName").is_none(), "{pod}");
            }
            "mps" => assert!(helm::container(plugin, "mps-supervisor").is_object()),
            "dynamic-mig" => assert!(args.contains(&"--feature-gates=DynamicMIG=true".to_string()), "{args:?}"),
            _ => {}
        }
    }
}
