//! Hostile and foreign chart values, rendered by Helm v4's engine: every
//! value that reaches a command line, a path or a field is refused naming
//! the value, or reaches the objects only as data; host paths outside what
//! each mount needs are refused by the schema *and* at render time; the
//! durations the chart renders are exactly the ones the controller
//! accepts; NVIDIA's values and feature gates are accepted where they mean
//! the same and refused naming ours otherwise; the certificate the chart
//! generates serves the webhook's DNS name; the webhook sees only this
//! driver's claims.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use integration_tests::helm::{
    Outcome, args, chart_without_schema, check_types, container, one, render_chart, render_chart_unlinted, rendered,
};
use integration_tests::workspace_root;
use serde_json::{Value, json};

fn tmp_dir() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

fn chart() -> PathBuf {
    workspace_root().join("charts/gpu-dra-driver")
}

/// `over` merged into `base`, maps key by key.
fn merge(base: Value, over: Value) -> Value {
    match (base, over) {
        (Value::Object(mut base), Value::Object(over)) => {
            for (key, value) in over {
                let merged = merge(base.remove(&key).unwrap_or(Value::Null), value);
                base.insert(key, merged);
            }
            Value::Object(base)
        }
        (_, over) => over,
    }
}

/// The sweeps' base: a given certificate, so that no case spends its time
/// generating RSA keys (the generated one is tested in chart_webhook.rs).
fn sweep_base() -> Value {
    json!({"webhook": {"tls": {"mode": "secret", "secret": {"name": "tls", "caBundle": "Q0EK"}}}})
}

/// `{"a": {"b": value}}` for the path `a.b` (a `[0]` suffix makes a
/// one-element list), merged into `base`.
fn set(mut base: Value, path: &str, value: Value) -> Value {
    let keys: Vec<&str> = path.split('.').collect();
    let mut at = &mut base;
    for key in &keys[..keys.len() - 1] {
        at = at.as_object_mut().unwrap().entry(*key).or_insert(json!({}));
    }
    let last = keys[keys.len() - 1];
    match last.strip_suffix("[0]") {
        Some(list) => at[list] = json!([value]),
        None => at[last] = value,
    }
    base
}

/// The shape of the objects: every key path, with list lengths, without
/// the string values. A value that stays data leaves it unchanged.
fn shape(value: &Value, path: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                shape(v, format!("{path}.{k}"), out);
            }
        }
        Value::Array(items) => {
            out.push(format!("{path}[{}]", items.len()));
            for (i, v) in items.iter().enumerate() {
                shape(v, format!("{path}[{i}]"), out);
            }
        }
        _ => out.push(path),
    }
}

fn shapes(objects: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, object) in objects.iter().enumerate() {
        shape(object, format!("{i}"), &mut out);
    }
    out.sort();
    out
}

fn strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

/// Newlines, quotes and YAML that would add an argument or a field if a
/// template pasted the value unquoted.
const HOSTILE: &[&str] = &[
    "x\n- --kubeconfig=/etc/evil",
    "x\"\n      hostPID: true\n      x: \"",
    "info: {x",
    "x'\n        workingDir: /\n",
    "x\n  hostNetwork: true",
];

/// Every string value that reaches the objects, with the values it needs
/// to be used at all, and a benign value of its kind.
fn string_values() -> Vec<(&'static str, Value, Value)> {
    let cert_manager = json!({"webhook": {"tls": {"mode": "cert-manager"}}});
    let secret = json!({"webhook": {"tls": {"mode": "secret", "secret": {"name": "tls", "caBundle": "Q0EK"}}}});
    let fake = json!({"fakeInventory": {"enabled": true}});
    let monitor = json!({"metrics": {"serviceMonitor": {"enabled": true}}});
    let no_le = json!({"controller": {"leaderElection": false}});
    let dynamic_mig = json!({"dynamicMig": {"enabled": true}});
    vec![
        ("driverName", json!({}), json!("gpu.example.com")),
        ("image.repository", json!({}), json!("registry.example.com/gpu")),
        ("image.tag", json!({}), json!("1.2.3")),
        ("image.pullPolicy", json!({}), json!("Always")),
        ("imagePullSecrets[0]", json!({}), json!({"name": "regcred"})),
        ("nvidiaDriverRoot", json!({}), json!("/run/nvidia/driver")),
        ("nvidiaCDIHookPath", json!({}), json!("/usr/bin/nvidia-cdi-hook")),
        ("logLevel", json!({}), json!("debug")),
        ("logFormat", json!({}), json!("json")),
        ("logVerbosity", json!({}), json!("5")),
        ("kubeletPlugin.pluginsDir", json!({}), json!("/var/lib/k0s/kubelet/plugins")),
        ("kubeletPlugin.registryDir", json!({}), json!("/var/lib/k0s/kubelet/plugins_registry")),
        ("kubeletPlugin.cdiDir", json!({}), json!("/etc/cdi")),
        ("kubeletPlugin.kubeletPluginsDirectoryPath", json!({}), json!("/var/lib/k0s/kubelet/plugins")),
        ("kubeletPlugin.priorityClassName", json!({}), json!("gpu-critical")),
        ("kubeletPlugin.extraArgs[0]", json!({}), json!("--mps-ready-timeout-ms=30000")),
        ("dynamicMig.gpus", dynamic_mig.clone(), json!("none")),
        ("dynamicMig.gpus[0]", dynamic_mig, json!("GPU-4f1c2a00-0000-0000-0000-000000000001")),
        ("controller.priorityClassName", json!({}), json!("ops-high")),
        ("controller.explainAfter", json!({}), json!("1m")),
        ("controller.deallocateAfter", json!({}), json!("10m")),
        ("controller.leaseDuration", json!({}), json!("20s")),
        ("controller.renewDeadline", no_le.clone(), json!("5s")),
        ("controller.retryPeriod", no_le, json!("1s")),
        ("controller.extraArgs[0]", json!({}), json!("--identity=a")),
        ("webhook.deviceClassNames[0]", json!({}), json!("gpu-h100")),
        ("webhook.failurePolicy", json!({}), json!("Fail")),
        ("webhook.tls.secret.name", secret.clone(), json!("my-tls")),
        ("webhook.tls.secret.caBundle", secret, json!("QUJD")),
        ("webhook.tls.certManager.issuerName", cert_manager.clone(), json!("corp-ca")),
        ("webhook.tls.certManager.dnsNames[0]", cert_manager, json!("gpu.example.com")),
        ("metrics.serviceMonitor.interval", monitor, json!("1m")),
        // Free text: data wherever it goes.
        ("fakeInventory.inventory", fake, json!("gpus: []\n")),
        ("controller.env[0]", json!({}), json!({"name": "A", "value": "b"})),
        ("kubeletPlugin.env[0]", json!({}), json!({"name": "A", "value": "b"})),
        ("controller.nodeSelector", json!({}), json!({"pool": "ops"})),
        ("kubeletPlugin.tolerations[0]", json!({}), json!({"key": "a", "operator": "Equal", "value": "b"})),
    ]
}

/// Where a hostile string goes in a value of this kind: itself, or inside
/// the object the path takes.
fn hostile_value(benign: &Value, hostile: &str) -> Value {
    match benign {
        Value::Object(map) if map.contains_key("name") && map.contains_key("value") => {
            json!({"name": "A", "value": hostile})
        }
        Value::Object(map) if map.contains_key("name") => json!({"name": hostile}),
        Value::Object(map) if map.contains_key("key") => json!({"key": "a", "operator": "Equal", "value": hostile}),
        Value::Object(_) => json!({"pool": hostile}),
        _ => json!(hostile),
    }
}

fn schema_path(path: &str) -> String {
    format!("/{}", path.trim_end_matches("[0]").replace('.', "/"))
}

/// The sweep, on the chart as shipped and on a copy without its schema:
/// each hostile value is refused naming its path, or renders objects of
/// the same shape as the benign value, holding it as one string.
#[test]
fn hostile_values_are_refused_or_stay_data() {
    let dir = tempfile::tempdir().unwrap();
    let bare = chart_without_schema(dir.path());
    let mut cases = Vec::new();
    for (path, context, benign) in string_values() {
        let context = merge(sweep_base(), context);
        cases.push((format!("{path} benign"), set(context.clone(), path, benign.clone())));
        for (i, hostile) in HOSTILE.iter().enumerate() {
            cases.push((format!("{path} hostile {i}"), set(context.clone(), path, hostile_value(&benign, hostile))));
        }
    }
    let borrowed: Vec<(&str, Value)> = cases.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
    let mut refused_by_schema = 0;
    let mut stayed_data = 0;
    for (chart_dir, with_schema) in [(chart(), true), (bare, false)] {
        let outcomes = render_chart_unlinted(tmp_dir(), &chart_dir, &borrowed);
        for (path, _, _) in string_values() {
            let (benign_objects, _) = rendered(&outcomes, &format!("{path} benign"));
            check_types(&benign_objects);
            let benign_shape = shapes(&benign_objects);
            for (i, hostile) in HOSTILE.iter().enumerate() {
                let case = format!("{path} hostile {i}");
                match &outcomes[&case] {
                    Outcome::Refused(error) => {
                        let dotted = path.trim_end_matches("[0]");
                        assert!(
                            error.contains(&schema_path(path)) || error.contains(dotted),
                            "{case} (schema: {with_schema}): refused without naming {path}: {error}"
                        );
                        refused_by_schema += usize::from(with_schema);
                    }
                    Outcome::Rendered { objects, .. } => {
                        check_types(objects);
                        assert_eq!(
                            shapes(objects),
                            benign_shape,
                            "{case} (schema: {with_schema}) changed the objects' fields"
                        );
                        let mut all = Vec::new();
                        objects.iter().for_each(|o| strings(o, &mut all));
                        let hostile = hostile.trim_end_matches('\n');
                        assert!(
                            all.iter().any(|s| s.contains(hostile)),
                            "{case} (schema: {with_schema}): the value is in no string"
                        );
                        stayed_data += 1;
                    }
                }
            }
        }
    }
    println!("hostile values: {refused_by_schema} refused by the schema, {stayed_data} rendered as data");
    assert!(refused_by_schema > 100 && stayed_data > 10, "{refused_by_schema} {stayed_data}");
}

/// Host paths the privileged plugin mounts read-write: refused by the
/// schema, and at render time without it, naming the value and why.
#[test]
fn host_paths_outside_the_kubelets_and_cdis_directories_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bare = chart_without_schema(dir.path());
    let cases = [
        ("plugins-root", "kubeletPlugin.pluginsDir", "/"),
        ("plugins-etc", "kubeletPlugin.pluginsDir", "/etc"),
        ("plugins-dotdot", "kubeletPlugin.pluginsDir", "/var/lib/kubelet/../../../etc/kubelet/plugins"),
        ("plugins-nvidia-name", "kubeletPlugin.kubeletPluginsDirectoryPath", "/root"),
        ("cdi-etc", "kubeletPlugin.cdiDir", "/etc"),
        ("cdi-relative", "kubeletPlugin.cdiDir", "etc/cdi"),
        ("registry-root", "kubeletPlugin.registryDir", "/root"),
        ("registry-nvidia-name", "kubeletPlugin.kubeletRegistrarDirectoryPath", "/"),
        ("driver-root-relative", "nvidiaDriverRoot", "run/nvidia/driver"),
        ("driver-root-dotdot", "nvidiaDriverRoot", "/run/../etc"),
    ];
    let values: Vec<(&str, Value)> = cases.iter().map(|(n, p, v)| (*n, set(json!({}), p, json!(v)))).collect();
    let with_schema = render_chart(tmp_dir(), &chart(), &values);
    let without = render_chart(tmp_dir(), &bare, &values);
    for (name, path, value) in cases {
        let Outcome::Refused(error) = &with_schema[name] else { panic!("{name}: {value} rendered") };
        assert!(error.contains(&schema_path(path)), "{name}: {error}");
        let Outcome::Refused(error) = &without[name] else { panic!("{name}: {value} rendered without the schema") };
        assert!(error.contains(&format!("{path} is {value:?}")), "{name}: {error}");
        assert!(error.contains("must be"), "{name}: says why: {error}");
    }
    // What the documented installs use is accepted.
    let fine = [
        (
            "k0s",
            json!({"kubeletPlugin": {"pluginsDir": "/var/lib/k0s/kubelet/plugins", "registryDir": "/var/lib/k0s/kubelet/plugins_registry"}}),
        ),
        ("microk8s", json!({"kubeletPlugin": {"pluginsDir": "/var/snap/microk8s/common/var/lib/kubelet/plugins"}})),
        ("etc-cdi", json!({"kubeletPlugin": {"cdiDir": "/etc/cdi"}})),
        ("operator", json!({"nvidiaDriverRoot": "/run/nvidia/driver"})),
    ];
    let outcomes = render_chart(tmp_dir(), &chart(), &fine);
    for (name, _) in fine {
        let (objects, _) = rendered(&outcomes, name);
        check_types(&objects);
    }
}

#[test]
fn two_servers_never_share_a_port() {
    let outcomes = render_chart(
        tmp_dir(),
        &chart(),
        &[
            ("same", json!({"controller": {"metricsPort": 9443}, "webhook": {"port": 9443}})),
            ("no-webhook", json!({"controller": {"metricsPort": 8443}, "webhook": {"enabled": false}})),
        ],
    );
    let Outcome::Refused(error) = &outcomes["same"] else { panic!("rendered two servers on one port") };
    assert!(error.contains("controller.metricsPort and webhook.port are both 9443"), "{error}");
    rendered(&outcomes, "no-webhook");
}

/// The durations the chart renders are exactly the ones the controller
/// starts with: one table of inputs, through the chart (schema and
/// render-time range) and through `gpu-dra-controller run`'s parser.
#[test]
fn the_chart_and_the_controller_accept_the_same_durations() {
    let inputs = [
        "0",
        "0s",
        "30s",
        "1.5s",
        "0.5h",
        "1h30m",
        "250ms",
        "100ms",
        "99ms",
        "499ms",
        "500ms",
        "1µs",
        "1us",
        "1ns",
        "24h",
        "24h0.001s",
        "25h",
        "168h",
        "169h",
        "1h1h",
        "999999h",
        "1000000h",
        "1.000000001s",
        "1.0000000001s",
        "18446744073709551615s18446744073709551615s",
        "99999999999999999h",
        "1d",
        "-1s",
        "+1s",
        "1.s",
        ".5s",
        "5",
        "",
        " 1s",
        "1s ",
        "1e3s",
        "1s\n- --kubeconfig=/x",
        "1h0m0s0ms0us0ns0s0m0h0s",
    ];
    // (chart value path, context, controller flag)
    let flags = [
        ("controller.explainAfter", json!({}), "--explain-after"),
        ("controller.deallocateAfter", json!({}), "--deallocate-after"),
        (
            "controller.leaseDuration",
            json!({"controller": {"renewDeadline": "500ms", "retryPeriod": "100ms"}}),
            "--leader-elect-lease-duration",
        ),
        ("controller.renewDeadline", json!({"controller": {"leaderElection": false}}), "--leader-elect-renew-deadline"),
        ("controller.retryPeriod", json!({"controller": {"leaderElection": false}}), "--leader-elect-retry-period"),
    ];
    let mut cases = Vec::new();
    for (path, context, _) in &flags {
        for (i, input) in inputs.iter().enumerate() {
            cases.push((format!("{path} {i}"), set(merge(sweep_base(), context.clone()), path, json!(input))));
        }
    }
    let borrowed: Vec<(&str, Value)> = cases.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
    let outcomes = render_chart_unlinted(tmp_dir(), &chart(), &borrowed);
    let mut disagreements = Vec::new();
    let mut accepted = 0;
    for (path, _, flag) in &flags {
        for (i, input) in inputs.iter().enumerate() {
            let chart_accepts = matches!(outcomes[&format!("{path} {i}")], Outcome::Rendered { .. });
            let binary_accepts = controller_accepts(flag, input);
            accepted += usize::from(chart_accepts);
            if chart_accepts != binary_accepts {
                disagreements.push(format!("{flag}={input:?}: chart {chart_accepts}, controller {binary_accepts}"));
            }
        }
    }
    assert!(disagreements.is_empty(), "{disagreements:#?}");
    assert!(accepted > 40, "{accepted}");
}

/// Whether `gpu-dra-controller run` gets past its flags with this value
/// (it then fails on the missing kubeconfig, at once).
fn controller_accepts(flag: &str, value: &str) -> bool {
    let out = std::process::Command::new(integration_tests::controller())
        .args(["run", "--kubeconfig", "/nonexistent/kubeconfig", "--metrics-addr", "off", "--leader-elect", "false"])
        .arg(format!("{flag}={value}"))
        .env_clear()
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{flag}={value:?} started: {stderr}");
    assert!(!stderr.contains("panicked"), "{flag}={value:?}: {stderr}");
    match out.status.code() {
        Some(2) => {
            assert!(stderr.contains("invalid value"), "{flag}={value:?}: {stderr}");
            false
        }
        _ => true,
    }
}

/// NVIDIA's chart's values: accepted where they mean the same, refused
/// naming ours otherwise; NVIDIA's gates likewise.
#[test]
fn nvidias_values_and_gates_are_mapped_or_refused_naming_ours() {
    let accepted = [
        ("gpus-enabled", json!({"resources": {"gpus": {"enabled": true}, "computeDomains": {"enabled": false}}})),
        ("verbosity", json!({"logVerbosity": "6"})),
        // NVIDIA's switch for ComputeDomains turns ours on (CRD and classes).
        ("compute-domains", json!({"resources": {"computeDomains": {"enabled": true}}})),
        (
            "compute-domains-mps",
            json!({"resources": {"computeDomains": {"enabled": true}}, "featureGates": {"MPSSupport": true}}),
        ),
        ("verbosity-int", json!({"logVerbosity": 4})),
        (
            "driver-root",
            json!({"nvidiaDriverRoot": "/run/nvidia/driver", "nvidiaCDIHookPath": "/usr/bin/nvidia-cdi-hook"}),
        ),
        (
            "kubelet-dirs",
            json!({"kubeletPlugin": {"kubeletPluginsDirectoryPath": "/var/lib/k0s/kubelet/plugins", "kubeletRegistrarDirectoryPath": "/var/lib/k0s/kubelet/plugins_registry"}}),
        ),
        (
            "leader-election",
            json!({"controller": {"leaderElection": {"enabled": true, "leaseDuration": "20s", "renewDeadline": "15s", "retryPeriod": "3s"}}}),
        ),
        (
            "issuer-type",
            json!({"webhook": {"tls": {"mode": "cert-manager", "certManager": {"issuerType": "clusterissuer", "issuerName": "corp", "dnsNames": ["gpu.example.com"]}}}}),
        ),
        (
            "selfsigned-type",
            json!({"webhook": {"tls": {"mode": "cert-manager", "certManager": {"issuerType": "selfsigned"}}}}),
        ),
        (
            "gates",
            json!({"featureGates": {"TimeSlicingSettings": true, "MPSSupport": true, "NVMLDeviceHealthCheck": true, "DynamicMIG": false, "PassthroughSupport": false}}),
        ),
        ("api-version", json!({"resourceApiVersion": "resource.k8s.io/v1"})),
        ("dynamic-mig", json!({"featureGates": {"DynamicMIG": true}})),
        ("passthrough", json!({"featureGates": {"PassthroughSupport": true}})),
        ("consumable-shares", json!({"featureGates": {"ConsumableShares": true}, "consumableShares": "4"})),
        (
            "driver-capabilities",
            json!({"driverCapabilities": "compute,utility", "disableCDIHooks": ["enable-cuda-compat"]}),
        ),
    ];
    let refused = [
        (
            "no-driver",
            json!({"resources": {"gpus": {"enabled": false}, "computeDomains": {"enabled": false}}}),
            "nothing to install",
        ),
        ("verbosity-word", json!({"logVerbosity": "verbose"}), "/logVerbosity"),
        // A word that is not a level would filter every log out.
        ("level-word", json!({"logLevel": "verbose"}), "'/logLevel': 'verbose' does not match"),
        ("api-v1beta1", json!({"resourceApiVersion": "resource.k8s.io/v1beta1"}), "resource.k8s.io/v1 only"),
        ("name-override", json!({"nameOverride": "x"}), "nameOverride is a value of NVIDIA's chart"),
        ("webhook-port", json!({"webhook": {"containerPort": 443}}), "use webhook.port"),
        ("webhook-replicas", json!({"webhook": {"replicas": 2}}), "controller.replicas"),
        ("controller-metrics", json!({"controller": {"metrics": {"enabled": true}}}), "controller.metricsPort"),
        ("plugin-affinity", json!({"kubeletPlugin": {"affinity": {"nodeAffinity": {}}}}), "kubeletPlugin.nodeAffinity"),
        (
            "plugin-containers",
            json!({"kubeletPlugin": {"containers": {"gpus": {"resources": {}}}}}),
            "kubeletPlugin.resources",
        ),
        (
            "issuer-without-name",
            json!({"webhook": {"tls": {"mode": "cert-manager", "certManager": {"issuerType": "issuer"}}}}),
            "needs webhook.tls.certManager.issuerName",
        ),
        ("shares-without-mode", json!({"featureGates": {"ConsumableShares": true}}), "needs consumableShares"),
        ("mode-without-gate", json!({"consumableShares": "memory"}), "needs featureGates.ConsumableShares=true"),
        (
            "two-share-gates",
            json!({"featureGates": {"ConsumableShares": true, "ConsumableCapacity": true, "MPSSupport": true}, "consumableShares": "4"}),
            "turn on one of them",
        ),
        ("no-health", json!({"featureGates": {"NVMLDeviceHealthCheck": false}}), "additionalXidsToIgnore"),
        (
            "passthrough-with-dynamic-mig",
            json!({"featureGates": {"PassthroughSupport": true, "DynamicMIG": true}}),
            "turn on one of them",
        ),
        ("device-metadata", json!({"featureGates": {"DeviceMetadata": true}}), "pciBusID"),
        ("imex", json!({"featureGates": {"IMEXDaemonsWithDNSNames": true}}), "listed by address"),
        ("vgpu-gate", json!({"featureGates": {"VGPUSupport": true}}), "dynamicMig"),
    ];
    let mut cases: Vec<(&str, Value)> = accepted.to_vec();
    cases.extend(refused.iter().map(|(n, v, _)| (*n, v.clone())));
    let outcomes = render_chart(tmp_dir(), &chart(), &cases);
    for (name, expected) in refused.iter().map(|(n, _, e)| (*n, *e)) {
        let Outcome::Refused(error) = &outcomes[name] else { panic!("{name} rendered") };
        assert!(error.contains(expected), "{name}: {error}");
    }
    let objects: BTreeMap<&str, Vec<Value>> =
        accepted.iter().map(|(name, _)| (*name, rendered(&outcomes, name).0)).collect();
    for list in objects.values() {
        check_types(list);
    }
    let crd = |name: &str| {
        objects[name].iter().any(|o| {
            o["kind"] == "CustomResourceDefinition" && o["metadata"]["name"] == "computedomains.resource.nvidia.com"
        })
    };
    assert!(
        crd("compute-domains") && !crd("gpus-enabled"),
        "the ComputeDomain CRD follows resources.computeDomains.enabled"
    );
    // The IMEX daemon runs in the plugin's container: the node's network
    // (peers dial its InternalIP) and the host's PIDs (a host-managed
    // nvidia-imex is seen); never hostPID beside shareProcessNamespace,
    // which the API refuses.
    let pod_spec = |case: &str| one(&objects[case], "DaemonSet", "kubelet-plugin")["spec"]["template"]["spec"].clone();
    for case in ["compute-domains", "compute-domains-mps"] {
        let spec = pod_spec(case);
        assert_eq!((&spec["hostNetwork"], &spec["hostPID"]), (&json!(true), &json!(true)), "{case}: {spec}");
        assert_eq!(spec["dnsPolicy"], "ClusterFirstWithHostNet", "{case}");
        assert!(spec.get("shareProcessNamespace").is_none(), "{case}: {spec}");
    }
    let mps = pod_spec("gates");
    assert_eq!(mps["shareProcessNamespace"], json!(true), "{mps}");
    assert!(mps.get("hostPID").is_none() && mps.get("hostNetwork").is_none(), "{mps}");
    let plugin_args = |case: &str| args(container(one(&objects[case], "DaemonSet", "kubelet-plugin"), "plugin"));
    let controller_args = |case: &str| args(container(one(&objects[case], "Deployment", "controller"), "controller"));
    assert!(plugin_args("verbosity").contains(&"--log-level=trace".to_string()));
    assert!(plugin_args("verbosity-int").contains(&"--log-level=debug".to_string()));
    assert!(plugin_args("kubelet-dirs").contains(&"--plugins-dir=/var/lib/k0s/kubelet/plugins".to_string()));
    assert!(plugin_args("kubelet-dirs").contains(&"--registry-dir=/var/lib/k0s/kubelet/plugins_registry".to_string()));
    for arg in
        ["--leader-elect-lease-duration=20s", "--leader-elect-renew-deadline=15s", "--leader-elect-retry-period=3s"]
    {
        assert!(controller_args("leader-election").contains(&arg.to_string()), "{arg}");
    }
    let certificate = one(&objects["issuer-type"], "Certificate", "webhook");
    assert_eq!(certificate["spec"]["issuerRef"], json!({"name": "corp", "kind": "ClusterIssuer"}));
    assert_eq!(certificate["spec"]["dnsNames"][2], "gpu.example.com");
    assert!(objects["selfsigned-type"].iter().any(|o| o["kind"] == "Issuer"));
    // Only this driver's gates reach the binaries.
    let gates = plugin_args("gates");
    assert!(
        gates.contains(
            &"--feature-gates=DynamicMIG=false,MPSSupport=true,PassthroughSupport=false,TimeSlicingSettings=true"
                .to_string()
        ),
        "{gates:?}"
    );
    // DynamicMIG is this driver's too (MIG devices made per claim).
    assert!(plugin_args("dynamic-mig").contains(&"--feature-gates=DynamicMIG=true".to_string()));
    // NVIDIA's consumable shares reach the plugin as its gate and mode.
    let shares = plugin_args("consumable-shares");
    assert!(shares.contains(&"--feature-gates=ConsumableShares=true".to_string()), "{shares:?}");
    assert!(shares.contains(&"--consumable-shares=4".to_string()), "{shares:?}");
    assert!(!plugin_args("gates").iter().any(|a| a.starts_with("--consumable-shares")));
    let capabilities = plugin_args("driver-capabilities");
    assert!(capabilities.contains(&"--driver-capabilities=compute,utility".to_string()), "{capabilities:?}");
    assert!(capabilities.contains(&"--disable-cdi-hooks=enable-cuda-compat".to_string()), "{capabilities:?}");
    assert!(plugin_args("gates").contains(&"--driver-capabilities=all".to_string()));
}

/// Flags the docs document (docs/binaries.md) are reachable as values or
/// extraArgs/env.
#[test]
fn every_documented_flag_is_reachable() {
    let values = json!({
        "kubeletPlugin": {"additionalXidsToIgnore": [48, 79], "extraArgs": ["--mps-ready-timeout-ms=30000"],
                          "env": [{"name": "STATE_DIR", "value": "/var/lib/kubelet/plugins/gpu.nvidia.com"}]},
        "controller": {"deallocateAfter": "10m", "eventQPS": 50, "extraArgs": ["--identity=ctl"],
                       "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]},
    });
    let outcomes = render_chart(tmp_dir(), &chart(), &[("flags", values)]);
    let (objects, _) = rendered(&outcomes, "flags");
    let plugin = container(one(&objects, "DaemonSet", "kubelet-plugin"), "plugin");
    let controller = container(one(&objects, "Deployment", "controller"), "controller");
    for arg in ["--additional-xids-to-ignore=48,79", "--mps-ready-timeout-ms=30000"] {
        assert!(args(plugin).contains(&arg.to_string()), "{arg}: {:?}", args(plugin));
    }
    for arg in ["--deallocate-after=10m", "--event-qps=50", "--identity=ctl"] {
        assert!(args(controller).contains(&arg.to_string()), "{arg}: {:?}", args(controller));
    }
    assert_eq!(plugin["env"][1]["name"], "STATE_DIR");
    assert_eq!(controller["env"][2]["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    // Each rendered command line parses as the binary's flags.
    let out = std::process::Command::new(integration_tests::controller())
        .args(args(controller))
        .args(["--kubeconfig", "/nonexistent/kubeconfig"])
        .env_clear()
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let out = std::process::Command::new(integration_tests::kubelet_plugin())
        .args(args(plugin))
        .args(["--help"])
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
