//! The Helm chart, rendered and linted by Helm v4's own engine (PyPI
//! `helm-python-sdk`, which bundles Helm's library: no helm binary, no
//! cluster) for the default values and each documented option. Every
//! rendered object must parse as its Kubernetes type with no field dropped,
//! and the RBAC rules must be exactly the API calls the binaries make
//! against the API-server stand-in.
//!
//! Needs `python3`; helm-python-sdk comes from the system when it has it,
//! else from PyPI into a virtual environment under the target directory
//! (`--ignore-requires-python`: it declares 3.12 but runs on 3.11).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use integration_tests::apiserver::audit::{ApiCall, calls_by};
use integration_tests::apiserver::{ApiServer, Matcher};
use integration_tests::controller_process::ControllerProcess;
use integration_tests::plugin_process::{PluginDirs, PluginOptions, PluginProcess};
use integration_tests::workspace_root;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const NAMESPACE: &str = "gpu-dra-driver";
const RELEASE: &str = "gpu-dra-driver";
const WAIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------- rendering

/// A Python that can `import helm_python`.
fn python_with_helm() -> PathBuf {
    let imports = |python: &PathBuf| {
        Command::new(python).args(["-c", "import helm_python"]).output().is_ok_and(|o| o.status.success())
    };
    let system = PathBuf::from("python3");
    if imports(&system) {
        return system;
    }
    let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("python-helm");
    let python = venv.join("bin/python");
    if !imports(&python) {
        let made = Command::new("python3").arg("-m").arg("venv").arg(&venv).status().expect("python3 runs");
        assert!(made.success(), "python3 -m venv {} failed", venv.display());
        let pip = Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--ignore-requires-python",
                "helm-python-sdk==0.2.2",
            ])
            .status()
            .expect("pip runs");
        assert!(pip.success(), "pip install helm-python-sdk failed");
    }
    python
}

/// What Helm made of one set of values.
#[derive(Debug)]
enum Outcome {
    Rendered { objects: Vec<Value>, notes: String, lint: Value },
    Refused(String),
}

/// Renders every case in one Python process (loading Helm's library once).
fn render_all(cases: &[(&str, Value)]) -> BTreeMap<String, Outcome> {
    render_chart(&workspace_root().join("charts/gpu-dra-driver"), cases)
}

fn render_chart(chart: &std::path::Path, cases: &[(&str, Value)]) -> BTreeMap<String, Outcome> {
    let request = json!({
        "chart": chart,
        "namespace": NAMESPACE,
        "release": RELEASE,
        "kube_version": "1.34.0",
        "cases": cases.iter().map(|(name, values)| json!({"name": name, "values": values})).collect::<Vec<_>>(),
    });
    let mut child = Command::new(python_with_helm())
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

fn documents(template: &str, text: &str) -> Vec<Value> {
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

fn rendered(outcomes: &BTreeMap<String, Outcome>, case: &str) -> (Vec<Value>, String) {
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
fn parses_as<K: DeserializeOwned + Serialize>(value: &Value) {
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
fn check_types(objects: &[Value]) {
    use k8s_openapi::api::admissionregistration::v1 as adm;
    use k8s_openapi::api::{apps::v1 as apps, core::v1 as core, rbac::v1 as rbac};
    for object in objects {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        match (api_version, object["kind"].as_str().unwrap_or_default()) {
            ("v1", "ServiceAccount") => parses_as::<core::ServiceAccount>(object),
            ("v1", "Service") => parses_as::<core::Service>(object),
            ("v1", "ConfigMap") => parses_as::<core::ConfigMap>(object),
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

fn kinds(objects: &[Value]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for object in objects {
        *counts.entry(object["kind"].as_str().unwrap_or_default().to_string()).or_default() += 1;
    }
    counts
}

fn one<'a>(objects: &'a [Value], kind: &str, name_ends: &str) -> &'a Value {
    let found: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == kind && o["metadata"]["name"].as_str().is_some_and(|n| n.ends_with(name_ends)))
        .collect();
    assert_eq!(found.len(), 1, "expected one {kind} named *{name_ends}, found {}", found.len());
    found[0]
}

fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn args(container: &Value) -> Vec<String> {
    container["args"].as_array().into_iter().flatten().filter_map(|a| a.as_str().map(String::from)).collect()
}

fn volume<'a>(workload: &'a Value, name: &str) -> Option<&'a Value> {
    workload["spec"]["template"]["spec"]["volumes"].as_array()?.iter().find(|v| v["name"] == name)
}

fn mount<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["volumeMounts"].as_array()?.iter().find(|m| m["name"] == name)
}

/// The cases the tests render: the defaults and each documented option.
fn outcomes() -> &'static BTreeMap<String, Outcome> {
    static OUTCOMES: OnceLock<BTreeMap<String, Outcome>> = OnceLock::new();
    OUTCOMES.get_or_init(|| {
        render_all(&[
            ("default", json!({})),
            (
                "secret-tls",
                json!({"webhook": {"tls": {"mode": "secret", "secret": {"name": "my-tls", "caBundle": "Q0EK"}}}}),
            ),
            ("own-issuer", json!({"webhook": {"tls": {"certManager": {"issuerName": "corp-ca", "issuerKind": "ClusterIssuer"}}}})),
            ("no-webhook", json!({"webhook": {"enabled": false}})),
            ("fake-inventory", json!({"fakeInventory": {"enabled": true}})),
            ("extended-resource", json!({"deviceClasses": {"extendedResourceName": true}})),
            ("gpu-operator", json!({"nvidiaDriverRoot": "/run/nvidia/driver", "nvidiaCDIHookPath": "/usr/local/nvidia/toolkit/nvidia-cdi-hook"})),
            ("feature-gates", json!({"featureGates": {"TimeSlicingSettings": true}})),
            ("mps", json!({"featureGates": {"MPSSupport": true, "ConsumableCapacity": true}})),
            ("service-monitor", json!({"metrics": {"serviceMonitor": {"enabled": true}}})),
            ("single-replica", json!({"controller": {"replicas": 1, "leaderElection": false}})),
            ("json-logs", json!({"logFormat": "json", "logLevel": "debug"})),
            ("no-classes", json!({"deviceClasses": {"create": false}})),
            (
                "custom",
                json!({
                    "driverName": "gpu.example.com",
                    "image": {"repository": "registry.example.com/gpu-dra", "tag": "1.2.3", "pullPolicy": "Always"},
                    "imagePullSecrets": [{"name": "regcred"}],
                    "kubeletPlugin": {"pluginsDir": "/var/lib/k0s/kubelet/plugins", "priorityClassName": "gpu-critical",
                                      "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
                                      "resources": {"limits": {"memory": "32Mi"}}},
                    "controller": {"priorityClassName": "ops-high", "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
                                   "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
                                   "explainAfter": "0s", "metricsPort": 9090},
                    "webhook": {"failurePolicy": "Ignore", "timeoutSeconds": 5},
                }),
            ),
            // Refused, each naming the value and the fix.
            ("bad-gate", json!({"featureGates": {"Bogus": true}})),
            ("bad-policy", json!({"webhook": {"failurePolicy": "fail"}})),
            ("secret-without-ca", json!({"webhook": {"tls": {"mode": "secret", "secret": {"name": "my-tls"}}}})),
            ("bad-driver-root", json!({"nvidiaDriverRoot": "run/nvidia/driver"})),
            ("shares-without-mps", json!({"featureGates": {"ConsumableCapacity": true}})),
        ])
    })
}

// -------------------------------------------------------------------- tests

#[test]
fn every_case_renders_lint_clean_and_parses_as_kubernetes_types() {
    for (name, outcome) in outcomes() {
        if let Outcome::Rendered { .. } = outcome {
            let (objects, _) = rendered(outcomes(), name);
            check_types(&objects);
            for role in objects.iter().filter(|o| o["kind"] == "Role" || o["kind"] == "ClusterRole") {
                let rules = role["rules"].to_string();
                assert!(!rules.contains("\"*\""), "{name}: a wildcard in {rules}");
            }
        }
    }
}

#[test]
fn the_default_install() {
    let (objects, notes) = rendered(outcomes(), "default");
    let expected: BTreeMap<String, usize> = [
        ("Certificate", 1),
        ("ClusterRole", 2),
        ("ClusterRoleBinding", 2),
        ("DaemonSet", 1),
        ("Deployment", 1),
        ("DeviceClass", 2),
        ("Issuer", 1),
        ("Role", 1),
        ("RoleBinding", 1),
        ("Service", 3),
        ("ServiceAccount", 2),
        ("ValidatingAdmissionPolicy", 1),
        ("ValidatingAdmissionPolicyBinding", 1),
        ("ValidatingWebhookConfiguration", 1),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_string(), n))
    .collect();
    assert_eq!(kinds(&objects), expected);

    // The plugin: kubelet directories, the driver root (propagated: the GPU
    // Operator mounts its driver after the pod starts), the host's /dev.
    let daemonset = one(&objects, "DaemonSet", "kubelet-plugin");
    let plugin = container(daemonset, "plugin");
    for (volume_name, path) in [
        ("plugins", "/var/lib/kubelet/plugins"),
        ("registry", "/var/lib/kubelet/plugins_registry"),
        ("cdi", "/var/run/cdi"),
    ] {
        let v = volume(daemonset, volume_name).expect(volume_name);
        assert_eq!(v["hostPath"], json!({"path": path, "type": "DirectoryOrCreate"}));
        assert_eq!(mount(plugin, volume_name).expect(volume_name)["mountPath"], path, "same path inside and out");
    }
    assert_eq!(volume(daemonset, "driver-root").unwrap()["hostPath"]["path"], "/");
    let driver_root = mount(plugin, "driver-root").unwrap();
    assert_eq!((&driver_root["mountPropagation"], &driver_root["readOnly"]), (&json!("HostToContainer"), &json!(true)));
    assert_eq!(volume(daemonset, "host-dev").unwrap()["hostPath"]["path"], "/dev");
    // MPS daemons' tmpfs under the state directory reach the host.
    assert_eq!(mount(plugin, "plugins").unwrap()["mountPropagation"], "Bidirectional");
    assert_eq!(daemonset["spec"]["template"]["spec"]["containers"].as_array().unwrap().len(), 1);
    let plugin_args = args(plugin);
    for arg in [
        "run",
        "--driver-name=gpu.nvidia.com",
        "--driver-root=/driver-root",
        "--host-driver-root=/",
        "--dev-root=/host",
    ] {
        assert!(plugin_args.contains(&arg.to_string()), "{arg} missing from {plugin_args:?}");
    }
    assert!(!plugin_args.iter().any(|a| a.starts_with("--fake-inventory") || a.starts_with("--feature-gates")));
    assert_eq!(plugin["securityContext"]["privileged"], true);
    assert_eq!(plugin["env"][0]["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    assert_eq!(plugin["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(plugin["readinessProbe"]["httpGet"]["path"], "/readyz");
    // One plugin per node at a time (its state-directory lock).
    assert_eq!(daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"], 0);
    let pod = &daemonset["spec"]["template"]["spec"];
    let terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        .to_string();
    assert!(terms.contains("feature.node.kubernetes.io/pci-10de.present") && terms.contains("nvidia.com/gpu.present"));
    assert_eq!(pod["tolerations"][0]["key"], "nvidia.com/gpu");
    assert_eq!(pod["priorityClassName"], "system-node-critical");

    // The controller: replicas with leader election, non-root, the
    // webhook's certificate from cert-manager.
    let deployment = one(&objects, "Deployment", "controller");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let controller = container(deployment, "controller");
    let controller_args = args(controller);
    for arg in [
        "run",
        "--namespace=gpu-dra-driver",
        "--leader-elect=true",
        "--explain-after=30s",
        "--webhook-port=8443",
        "--tls-cert-file=/tls/tls.crt",
    ] {
        assert!(controller_args.contains(&arg.to_string()), "{arg} missing from {controller_args:?}");
    }
    assert_eq!(deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"], true);
    assert_eq!(controller["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(controller["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert!(mount(controller, "tls").unwrap()["subPath"].is_null(), "a subPath mount never sees a renewed certificate");
    assert_eq!(volume(deployment, "tls").unwrap()["secret"]["secretName"], "gpu-dra-driver-webhook-tls");

    let webhook = one(&objects, "ValidatingWebhookConfiguration", "webhook");
    assert_eq!(
        webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "gpu-dra-driver/gpu-dra-driver-webhook"
    );
    let hook = &webhook["webhooks"][0];
    assert_eq!(hook["failurePolicy"], "Fail");
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(hook["admissionReviewVersions"], json!(["v1"]));
    assert_eq!(hook["clientConfig"]["service"]["path"], "/validate");
    assert_eq!(hook["rules"][0]["resources"], json!(["resourceclaims", "resourceclaimtemplates"]));
    assert_eq!(hook["rules"][0]["operations"], json!(["CREATE", "UPDATE"]));
    let service = one(&objects, "Service", "webhook");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "webhook");
    let certificate = one(&objects, "Certificate", "webhook");
    assert_eq!(certificate["spec"]["secretName"], "gpu-dra-driver-webhook-tls");
    assert_eq!(certificate["spec"]["dnsNames"][0], "gpu-dra-driver-webhook.gpu-dra-driver.svc");
    assert_eq!(certificate["spec"]["issuerRef"]["name"], one(&objects, "Issuer", "selfsigned")["metadata"]["name"]);

    // A plugin may touch only its own node's slices.
    let policy = one(&objects, "ValidatingAdmissionPolicy", "resourceslices");
    let policy_text = policy.to_string();
    assert!(policy_text.contains("authentication.kubernetes.io/node-name"), "{policy_text}");
    assert!(policy_text.contains("system:serviceaccount:gpu-dra-driver:gpu-dra-driver-kubelet-plugin"));
    let binding = one(&objects, "ValidatingAdmissionPolicyBinding", "resourceslices");
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);

    // The DeviceClasses are the ones in deviceclasses/ (NVIDIA's names),
    // with no extended resource unless asked.
    for name in ["gpu.nvidia.com", "mig.nvidia.com"] {
        let file = std::fs::read_to_string(workspace_root().join(format!("deviceclasses/{name}.yaml"))).unwrap();
        let applied: DeviceClass = serde_yaml_ng::from_str(&file).unwrap();
        let chart: DeviceClass = serde_json::from_value(one(&objects, "DeviceClass", name).clone()).unwrap();
        assert_eq!(chart.spec, applied.spec, "{name}: the chart and deviceclasses/ disagree");
        assert!(chart.spec.and_then(|s| s.extended_resource_name).is_none());
    }
    assert!(
        notes.contains("kubectl get resourceslices") && notes.contains("kubectl describe resourceclaim"),
        "{notes}"
    );
}

#[test]
fn each_option_changes_what_it_says() {
    let all = outcomes();

    let (objects, _) = rendered(all, "secret-tls");
    assert!(!objects.iter().any(|o| o["kind"] == "Certificate" || o["kind"] == "Issuer"));
    let webhook = one(&objects, "ValidatingWebhookConfiguration", "webhook");
    assert_eq!(webhook["webhooks"][0]["clientConfig"]["caBundle"], "Q0EK");
    assert!(webhook["metadata"]["annotations"].is_null());
    assert_eq!(volume(one(&objects, "Deployment", "controller"), "tls").unwrap()["secret"]["secretName"], "my-tls");

    let (objects, _) = rendered(all, "own-issuer");
    assert!(!objects.iter().any(|o| o["kind"] == "Issuer"));
    assert_eq!(
        one(&objects, "Certificate", "webhook")["spec"]["issuerRef"],
        json!({"name": "corp-ca", "kind": "ClusterIssuer"})
    );

    let (objects, _) = rendered(all, "no-webhook");
    assert!(!objects.iter().any(|o| {
        ["ValidatingWebhookConfiguration", "Certificate", "Issuer"].contains(&o["kind"].as_str().unwrap_or_default())
    }));
    let controller = one(&objects, "Deployment", "controller");
    assert!(args(container(controller, "controller")).contains(&"--webhook-port=0".to_string()));
    assert!(volume(controller, "tls").is_none());

    // No GPUs: the plugin reads a ConfigMap, runs on any node, with no
    // privilege; the inventory is one the plugin accepts.
    let (objects, _) = rendered(all, "fake-inventory");
    let daemonset = one(&objects, "DaemonSet", "kubelet-plugin");
    let plugin = container(daemonset, "plugin");
    assert!(args(plugin).contains(&"--fake-inventory=/config/inventory.yaml".to_string()));
    assert!(!args(plugin).iter().any(|a| a.starts_with("--driver-root")));
    assert!(daemonset["spec"]["template"]["spec"]["affinity"].is_null());
    assert!(volume(daemonset, "driver-root").is_none() && volume(daemonset, "host-dev").is_none());
    assert!(mount(plugin, "plugins").unwrap()["mountPropagation"].is_null(), "no privilege, no propagation");
    assert_eq!(plugin["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert!(plugin["securityContext"]["privileged"].is_null());
    let config_map = one(&objects, "ConfigMap", "fake-inventory");
    assert_eq!(volume(daemonset, "inventory").unwrap()["configMap"]["name"], config_map["metadata"]["name"]);
    let dir = tempfile::tempdir().unwrap();
    let inventory = dir.path().join("inventory.yaml");
    std::fs::write(&inventory, config_map["data"]["inventory.yaml"].as_str().unwrap()).unwrap();
    let printed = integration_tests::run(
        integration_tests::kubelet_plugin(),
        &["print-slices", "--node-name", "n", "--fake-inventory", inventory.to_str().unwrap()],
        None,
    );
    assert!(integration_tests::stdout_ok(&printed).contains("H100"));

    let (objects, _) = rendered(all, "extended-resource");
    assert_eq!(one(&objects, "DeviceClass", "gpu.nvidia.com")["spec"]["extendedResourceName"], "nvidia.com/gpu");
    assert!(one(&objects, "DeviceClass", "mig.nvidia.com")["spec"]["extendedResourceName"].is_null());

    let (objects, _) = rendered(all, "gpu-operator");
    let daemonset = one(&objects, "DaemonSet", "kubelet-plugin");
    assert_eq!(volume(daemonset, "driver-root").unwrap()["hostPath"]["path"], "/run/nvidia/driver");
    let plugin_args = args(container(daemonset, "plugin"));
    assert!(plugin_args.contains(&"--host-driver-root=/run/nvidia/driver".to_string()));
    assert!(plugin_args.contains(&"--nvidia-cdi-hook-path=/usr/local/nvidia/toolkit/nvidia-cdi-hook".to_string()));

    let (objects, _) = rendered(all, "feature-gates");
    for (kind, name, c) in [("DaemonSet", "kubelet-plugin", "plugin"), ("Deployment", "controller", "controller")] {
        let a = args(container(one(&objects, kind, name), c));
        assert!(a.contains(&"--feature-gates=TimeSlicingSettings=true".to_string()), "{c}: {a:?}");
    }

    // MPS: the daemons run in a second container that outlives the
    // plugin's restarts, sharing its processes and state directory.
    let (objects, _) = rendered(all, "mps");
    let daemonset = one(&objects, "DaemonSet", "kubelet-plugin");
    assert_eq!(daemonset["spec"]["template"]["spec"]["shareProcessNamespace"], true);
    assert!(args(container(daemonset, "plugin")).contains(&"--mps-supervisor".to_string()));
    let supervisor = container(daemonset, "mps-supervisor");
    assert_eq!(
        args(supervisor),
        [
            "mps-supervisor",
            "--state-dir=/var/lib/kubelet/plugins/gpu.nvidia.com",
            "--driver-root=/driver-root",
            "--log-format=text",
            "--log-level=info"
        ]
    );
    assert_eq!(mount(supervisor, "plugins").unwrap()["mountPropagation"], "Bidirectional");
    assert_eq!(mount(supervisor, "driver-root").unwrap()["readOnly"], true);
    assert_eq!(supervisor["resources"]["limits"]["memory"], "1Gi");

    let (objects, _) = rendered(all, "service-monitor");
    assert_eq!(kinds(&objects)["ServiceMonitor"], 2);
    let monitor = one(&objects, "ServiceMonitor", "controller");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");

    let (objects, _) = rendered(all, "single-replica");
    assert_eq!(one(&objects, "Deployment", "controller")["spec"]["replicas"], 1);
    assert!(!objects.iter().any(|o| o["kind"] == "Role" || o["kind"] == "RoleBinding"));
    assert!(
        args(container(one(&objects, "Deployment", "controller"), "controller"))
            .contains(&"--leader-elect=false".to_string())
    );

    let (objects, _) = rendered(all, "json-logs");
    let controller = container(one(&objects, "Deployment", "controller"), "controller");
    assert!(args(controller).contains(&"--log-format=json".to_string()));
    assert_eq!(controller["env"][1], json!({"name": "RUST_LOG", "value": "debug"}));
    assert!(
        args(container(one(&objects, "DaemonSet", "kubelet-plugin"), "plugin"))
            .contains(&"--log-level=debug".to_string())
    );

    // Names, images, directories, scheduling and resources as given.
    let (objects, _) = rendered(all, "custom");
    let daemonset = one(&objects, "DaemonSet", "kubelet-plugin");
    let deployment = one(&objects, "Deployment", "controller");
    let plugin = container(daemonset, "plugin");
    let controller = container(deployment, "controller");
    for c in [plugin, controller] {
        assert_eq!(
            (&c["image"], &c["imagePullPolicy"]),
            (&json!("registry.example.com/gpu-dra:1.2.3"), &json!("Always"))
        );
        assert!(args(c).contains(&"--driver-name=gpu.example.com".to_string()));
    }
    for workload in [daemonset, deployment] {
        assert_eq!(workload["spec"]["template"]["spec"]["imagePullSecrets"], json!([{"name": "regcred"}]));
    }
    assert_eq!(volume(daemonset, "plugins").unwrap()["hostPath"]["path"], "/var/lib/k0s/kubelet/plugins");
    assert_eq!(mount(plugin, "plugins").unwrap()["mountPath"], "/var/lib/k0s/kubelet/plugins");
    assert!(args(plugin).contains(&"--plugins-dir=/var/lib/k0s/kubelet/plugins".to_string()));
    assert_eq!(daemonset["spec"]["template"]["spec"]["priorityClassName"], "gpu-critical");
    assert_eq!(daemonset["spec"]["template"]["spec"]["tolerations"][0]["key"], "dedicated");
    // Helm merges maps: the given limit, the default requests.
    assert_eq!(
        plugin["resources"],
        json!({"limits": {"memory": "32Mi"}, "requests": {"cpu": "10m", "memory": "24Mi"}})
    );
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["priorityClassName"], "ops-high");
    assert_eq!(pod["nodeSelector"], json!({"node-role.kubernetes.io/control-plane": ""}));
    assert_eq!(pod["tolerations"][0]["operator"], "Exists");
    assert!(args(controller).contains(&"--explain-after=0s".to_string()));
    assert!(args(controller).contains(&"--metrics-addr=0.0.0.0:9090".to_string()));
    let hook = &one(&objects, "ValidatingWebhookConfiguration", "webhook")["webhooks"][0];
    assert_eq!(
        (&hook["name"], &hook["failurePolicy"], &hook["timeoutSeconds"]),
        (&json!("resourceclaims.gpu.example.com"), &json!("Ignore"), &json!(5))
    );
    for class in objects.iter().filter(|o| o["kind"] == "DeviceClass") {
        let expression = class["spec"]["selectors"][0]["cel"]["expression"].as_str().unwrap();
        assert!(
            expression.contains("device.driver == 'gpu.example.com'")
                && expression.contains("attributes['gpu.example.com']"),
            "{expression}"
        );
    }

    let (objects, _) = rendered(all, "no-classes");
    assert!(!objects.iter().any(|o| o["kind"] == "DeviceClass"));
}

#[test]
fn bad_values_are_refused_naming_the_value() {
    for (case, expected) in [
        ("bad-gate", "'Bogus' not allowed"),
        ("bad-policy", "/webhook/failurePolicy"),
        ("secret-without-ca", "webhook.tls.secret.caBundle"),
        ("bad-driver-root", "/nvidiaDriverRoot"),
        ("shares-without-mps", "featureGates.ConsumableCapacity needs featureGates.MPSSupport"),
    ] {
        match &outcomes()[case] {
            Outcome::Refused(error) => assert!(error.contains(expected), "{case}: {error}"),
            Outcome::Rendered { .. } => panic!("{case} rendered"),
        }
    }
}

// --------------------------------------------------------------------- RBAC

/// (verb, group, resource) an RBAC rule allows, and the namespace it is
/// limited to (a Role's) or none (a ClusterRole's).
type Grant = (String, String, String, Option<String>);

/// What the rendered RBAC grants each service account.
fn grants(objects: &[Value]) -> BTreeMap<String, BTreeSet<Grant>> {
    let mut by_account: BTreeMap<String, BTreeSet<Grant>> = BTreeMap::new();
    for binding in objects.iter().filter(|o| o["kind"] == "ClusterRoleBinding" || o["kind"] == "RoleBinding") {
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap();
        let role = one(objects, role_kind, binding["roleRef"]["name"].as_str().unwrap());
        let namespace = role["metadata"]["namespace"].as_str().map(String::from);
        for subject in binding["subjects"].as_array().unwrap() {
            assert_eq!(subject["kind"], "ServiceAccount");
            let account = by_account.entry(subject["name"].as_str().unwrap().to_string()).or_default();
            for rule in role["rules"].as_array().unwrap() {
                for group in rule["apiGroups"].as_array().unwrap() {
                    for resource in rule["resources"].as_array().unwrap() {
                        for verb in rule["verbs"].as_array().unwrap() {
                            account.insert((
                                verb.as_str().unwrap().to_string(),
                                group.as_str().unwrap().to_string(),
                                resource.as_str().unwrap().to_string(),
                                namespace.clone(),
                            ));
                        }
                    }
                }
            }
        }
    }
    by_account
}

fn allows(grants: &BTreeSet<Grant>, call: &ApiCall) -> bool {
    grants.iter().any(|(verb, group, resource, namespace)| {
        verb == call.verb
            && *group == call.group
            && *resource == call.resource
            && namespace.as_ref().is_none_or(|ns| call.namespace.as_ref() == Some(ns))
    })
}

/// The calls the README's demo makes (the whole system: publishing,
/// delegated allocation, explanations, leader election, prepare).
fn demo_calls() -> Vec<(String, ApiCall)> {
    let demo = escargot::CargoBuild::new()
        .manifest_path(workspace_root().join("Cargo.toml"))
        .package("integration-tests")
        .example("demo")
        .current_target()
        .run()
        .expect("building the demo");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("calls.jsonl");
    let output = Command::new(demo.path()).env("DEMO_API_CALLS_FILE", &file).output().expect("running the demo");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap();
            let text = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            let verb: &'static str =
                ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]
                    .into_iter()
                    .find(|verb| v["verb"] == *verb)
                    .expect("a known verb");
            let call = ApiCall {
                verb,
                group: text("group"),
                resource: text("resource"),
                namespace: v["namespace"].as_str().map(String::from),
            };
            (text("agent"), call)
        })
        .collect()
}

fn wait_until(what: &str, log: &dyn Fn() -> String, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}; log:\n{}", log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The calls of the paths the demo does not take: a plugin that finds a
/// stale slice of its node and loses an update to a conflict; a controller
/// whose allocation write conflicts.
fn fault_path_calls() -> Vec<(String, ApiCall)> {
    let server = ApiServer::start_in_thread().unwrap();
    let inventory = include_str!("../../examples/inventories/dgx-h100.yaml");
    let stale: ResourceSlice = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu.nvidia.com-stale"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "node-a",
                 "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1}, "devices": []}
    }))
    .unwrap();
    server.create(&stale).unwrap();
    let dirs = PluginDirs::new(inventory).unwrap();
    server.write_kubeconfig(&dirs.kubeconfig).unwrap();
    let mut plugin = PluginProcess::spawn(&dirs, &PluginOptions::default()).unwrap();
    let slices = || server.list::<ResourceSlice>(None, "spec.nodeName=node-a").unwrap_or_default();
    wait_until("the stale slice to be replaced", &|| plugin.log(), || {
        let names: Vec<String> = slices().into_iter().filter_map(|s| s.metadata.name).collect();
        !names.is_empty() && !names.iter().any(|n| n.ends_with("-stale"))
    });
    // A driver upgrade changes every device: the slice is updated, the
    // first write conflicts, the plugin reads it again.
    server.faults().fail_next(Matcher::new("PUT", "/resourceslices/"), 1, 409);
    std::fs::write(&dirs.inventory, inventory.replace("580.82.07", "580.95.05")).unwrap();
    wait_until("the upgraded driver version to be published", &|| plugin.log(), || {
        serde_json::to_string(&slices()).unwrap_or_default().contains("580.95.5")
    });

    for entry in std::fs::read_dir(workspace_root().join("deviceclasses")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let class: DeviceClass = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            server.create(&class).unwrap();
        }
    }
    server.faults().fail_next(Matcher::new("PUT", "/resourceclaims/delegated/status"), 1, 409);
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "delegated", "namespace": "default", "annotations": {"gpu.nvidia.com/allocate": "true"}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}
    }))
    .unwrap();
    server.create(&claim).unwrap();
    let kubeconfig = dirs.root.path().join("controller-kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let mut controller = ControllerProcess::spawn(&kubeconfig, "rbac", &["--explain-after", "0s"]).unwrap();
    wait_until("the delegated claim to be allocated", &|| controller.log(), || {
        server
            .get::<ResourceClaim>(Some("default"), "delegated")
            .ok()
            .and_then(|c| c.status)
            .and_then(|s| s.allocation)
            .is_some()
    });
    controller.kill();
    plugin.kill().unwrap();
    let records = server.faults().requests();
    let mut calls = Vec::new();
    for agent in ["gpu-kubelet-plugin", "gpu-dra-controller"] {
        calls.extend(calls_by(&records, &format!("{agent}/")).into_iter().map(|c| (agent.to_string(), c)));
    }
    calls
}

#[test]
fn rbac_is_exactly_the_calls_the_binaries_make() {
    let (objects, _) = rendered(outcomes(), "default");
    let granted = grants(&objects);
    let accounts =
        [("gpu-kubelet-plugin", "gpu-dra-driver-kubelet-plugin"), ("gpu-dra-controller", "gpu-dra-driver-controller")];
    assert_eq!(granted.keys().cloned().collect::<BTreeSet<_>>(), accounts.iter().map(|(_, a)| a.to_string()).collect());

    let mut made: BTreeMap<String, BTreeSet<ApiCall>> = BTreeMap::new();
    for (agent, call) in demo_calls().into_iter().chain(fault_path_calls()) {
        made.entry(agent).or_default().insert(call);
    }
    for (agent, account) in accounts {
        let calls = &made[agent];
        let grants = &granted[account];
        let denied: Vec<&ApiCall> = calls.iter().filter(|c| !allows(grants, c)).collect();
        assert!(denied.is_empty(), "{agent} makes calls its RBAC ({account}) does not allow: {denied:#?}");
        let unused: Vec<&Grant> = grants
            .iter()
            .filter(|(verb, group, resource, _)| {
                !calls.iter().any(|c| c.verb == verb && c.group == *group && c.resource == *resource)
            })
            .collect();
        assert!(unused.is_empty(), "{account} is granted what {agent} never does: {unused:#?}");
    }
}

/// The refusal to install next to NVIDIA's device plugin or DRA driver.
/// Offline, Helm's `lookup` sees no cluster, so a copy of the chart reads
/// the DaemonSets it would have found from a value instead; the rest of
/// the template is the shipped one.
#[test]
fn the_chart_refuses_to_install_next_to_nvidias_drivers_unless_told() {
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("gpu-dra-driver");
    let source = workspace_root().join("charts/gpu-dra-driver");
    for entry in walk(&source) {
        let target = chart.join(entry.strip_prefix(&source).unwrap());
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(&entry, &target).unwrap();
    }
    // The schema refuses unknown values such as the stand-in for lookup.
    std::fs::remove_file(chart.join("values.schema.json")).unwrap();
    let check = chart.join("templates/coexistence-check.yaml");
    let text = std::fs::read_to_string(&check).unwrap();
    let lookup = r#"(lookup "apps/v1" "DaemonSet" "" "")"#;
    assert!(text.contains(lookup), "the check no longer looks DaemonSets up: {text}");
    std::fs::write(&check, text.replace(lookup, "(dict \"items\" .Values.clusterDaemonSets)")).unwrap();

    let daemonset = |namespace: &str, name: &str, labels: Value| json!({"metadata": {"namespace": namespace, "name": name, "labels": labels}});
    let operator =
        daemonset("gpu-operator", "nvidia-device-plugin-daemonset", json!({"app": "nvidia-device-plugin-daemonset"}));
    let dra = daemonset(
        "nvidia-dra",
        "nvidia-dra-driver-gpu-kubelet-plugin",
        json!({"app.kubernetes.io/name": "nvidia-dra-driver-gpu"}),
    );
    let unrelated = daemonset("kube-system", "kube-proxy", json!({"k8s-app": "kube-proxy"}));
    let outcomes = render_chart(
        &chart,
        &[
            ("operator", json!({"clusterDaemonSets": [unrelated.clone(), operator.clone()]})),
            ("nvidia-dra", json!({"clusterDaemonSets": [dra.clone()]})),
            ("unrelated", json!({"clusterDaemonSets": [unrelated.clone()]})),
            ("allowed", json!({"clusterDaemonSets": [operator, dra], "allowCoexistence": true})),
        ],
    );
    for (case, found) in [
        ("operator", "gpu-operator/nvidia-device-plugin-daemonset"),
        ("nvidia-dra", "nvidia-dra/nvidia-dra-driver-gpu-kubelet-plugin"),
    ] {
        let Outcome::Refused(error) = &outcomes[case] else { panic!("{case}: installed next to {found}") };
        assert!(error.contains(found), "{case}: {error}");
        assert!(error.contains("hand out the same GPUs") && error.contains("allowCoexistence=true"), "{case}: {error}");
    }
    for case in ["unrelated", "allowed"] {
        assert!(matches!(outcomes[case], Outcome::Rendered { .. }), "{case}: {:?}", outcomes[case]);
    }
}

fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() { files.extend(walk(&path)) } else { files.push(path) }
    }
    files
}
