//! Every value and feature gate of NVIDIA's chart (`dra-driver-nvidia-gpu`:
//! its values.yaml, Helm values reference and feature gates reference),
//! held to `charts/gpu-dra-driver/NVIDIA-VALUES.md` and to the chart: each
//! has a row in the table; each accepted one renders (through Helm v4's
//! engine) and each refused one is refused with a message naming what this
//! chart does instead; the table says "Accepted" or "Refused" as the chart
//! does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use integration_tests::helm::{Outcome, check_types, render_chart};
use integration_tests::workspace_root;
use serde_json::{Value, json};

fn chart() -> PathBuf {
    workspace_root().join("charts/gpu-dra-driver")
}

/// What the chart does with a value: renders it, or refuses it with a
/// message holding this text (this chart's equivalent).
#[derive(Clone, Copy)]
enum Verdict {
    Accepted,
    Refused(&'static str),
}
use Verdict::{Accepted, Refused};

/// `{"a": {"b": value}}` for the path `a.b`, merged into `base`.
fn at(mut base: Value, path: &str, value: Value) -> Value {
    let mut keys: Vec<&str> = path.split('.').collect();
    let last = keys.pop().expect("a path");
    let mut here = &mut base;
    for key in keys {
        here = here.as_object_mut().expect("an object on the path").entry(key).or_insert(json!({}));
    }
    here[last] = value;
    base
}

/// NVIDIA's value paths and gates (a table row names each), a value of
/// each that asks for something, the other values it needs, and what the
/// chart does. A path may have two cases (one value accepted, another
/// refused).
fn nvidia_values() -> Vec<(&'static str, Value, Value, Verdict)> {
    let none = json!({});
    let cert_manager = json!({"webhook": {"tls": {"mode": "cert-manager"}}});
    let secret = json!({"webhook": {"tls": {"mode": "secret", "secret": {"name": "tls", "caBundle": "Q0EK"}}}});
    let resources = json!({"limits": {"memory": "1Gi"}});
    let env = json!([{"name": "A", "value": "b"}]);
    let privileged = json!({"privileged": true});
    let toleration = json!([{"key": "a", "operator": "Exists"}]);
    let affinity = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "a", "operator": "Exists"}]}]}}});
    let strategy = json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}});
    let named = "helm install NAME";
    let webhook_in_controller = "controller.";
    let plugin_container = "kubeletPlugin.resources";
    let gate = |name: &str| format!("featureGates.{name}");
    let mut cases = vec![
        ("nvidiaDriverRoot", json!("/run/nvidia/driver"), none.clone(), Accepted),
        ("nvidiaDriverRoot", json!("/home/kubernetes/bin/nvidia"), none.clone(), Accepted),
        ("nvidiaCDIHookPath", json!("/usr/local/nvidia/toolkit/nvidia-cdi-hook"), none.clone(), Accepted),
        ("altProcDevices", json!("/var/lib/nvml-mock/proc-devices"), none.clone(), Refused("fakeInventory")),
        ("nvidiaCtkPath", json!("/usr/bin/nvidia-ctk"), none.clone(), Refused("nvidiaCDIHookPath")),
        ("nameOverride", json!("nvidia-dra-driver-gpu"), none.clone(), Refused(named)),
        ("fullnameOverride", json!("x"), none.clone(), Refused(named)),
        ("namespaceOverride", json!("x"), none.clone(), Refused("helm install --namespace")),
        ("selectorLabelsOverride", json!({"a": "b"}), none.clone(), Refused("app.kubernetes.io/instance")),
        ("gpuResourcesEnabledOverride", json!(true), none.clone(), Accepted),
        ("allowDefaultNamespace", json!(true), none.clone(), Accepted),
        ("resourceApiVersion", json!("resource.k8s.io/v1"), none.clone(), Accepted),
        ("resourceApiVersion", json!("resource.k8s.io/v1beta1"), none.clone(), Refused("Kubernetes 1.34 or newer")),
        ("consumableShares", json!("memory"), json!({"featureGates": {"ConsumableShares": true}}), Accepted),
        ("consumableShares", json!(""), none.clone(), Accepted),
        ("imagePullSecrets", json!([{"name": "regcred"}]), none.clone(), Accepted),
        ("image.repository", json!("registry.example.com/gpu"), none.clone(), Accepted),
        ("image.pullPolicy", json!("Always"), none.clone(), Accepted),
        ("image.tag", json!("v1.2.3"), none.clone(), Accepted),
        ("serviceAccount.create", json!(true), none.clone(), Accepted),
        ("serviceAccount.create", json!(false), none.clone(), Refused("its own service account")),
        ("serviceAccount.name", json!("x"), none.clone(), Refused("named after the release")),
        ("serviceAccount.annotations", json!({"a": "b"}), none.clone(), Refused("not supported")),
        ("resources.gpus.enabled", json!(false), none.clone(), Accepted),
        (
            "resources.gpus.enabled",
            json!(false),
            json!({"resources": {"computeDomains": {"enabled": false}}}),
            Refused("nothing to install"),
        ),
        ("resources.computeDomains.enabled", json!(true), none.clone(), Accepted),
        ("resources.computeDomains.imex.mode", json!("driverManaged"), none.clone(), Accepted),
        (
            "resources.computeDomains.imex.mode",
            json!("hostManaged"),
            json!({"featureGates": {"HostManagedIMEXDaemon": true}}),
            Accepted,
        ),
        ("resources.computeDomains.imex.isolation", json!("domain"), none.clone(), Accepted),
        ("resources.computeDomains.imex.isolation", json!("channel"), none.clone(), Refused("use domain")),
        (
            "resources.computeDomains.imex.hostSocketPath",
            json!("/etc/nvidia-imex/imex_ctrl.sock"),
            none.clone(),
            Accepted,
        ),
        (
            "resources.computeDomains.imex.hostSocketPath",
            json!("/run/imex.sock"),
            none.clone(),
            Refused("nvidia-imex-ctl"),
        ),
        (
            "resources.computeDomains.imex.config",
            json!({"IMEX_ENABLE_AUTH_ENCRYPTION": "1"}),
            none.clone(),
            Refused("writes each domain's IMEX configuration"),
        ),
        ("featureGates", json!({"TimeSlicingSettings": true}), none.clone(), Accepted),
        ("logVerbosity", json!("6"), none.clone(), Accepted),
        ("vgpu.profiles", json!(["A100-4C"]), none.clone(), Refused("featureGates.VGPUSupport")),
        ("gpuDriverConfig.default", json!("container"), none.clone(), Refused("kubeletPlugin.nodeAffinity")),
        ("gpuDriverConfig.map", json!({"container": "x"}), none.clone(), Refused("kubeletPlugin.nodeAffinity")),
        ("webhook.enabled", json!(true), none.clone(), Accepted),
        ("webhook.failurePolicy", json!("Fail"), none.clone(), Accepted),
        ("webhook.tls.mode", json!("cert-manager"), none.clone(), Accepted),
        ("webhook.tls.certManager.issuerType", json!("selfsigned"), cert_manager.clone(), Accepted),
        (
            "webhook.tls.certManager.issuerName",
            json!("corp"),
            at(cert_manager.clone(), "webhook.tls.certManager.issuerType", json!("clusterissuer")),
            Accepted,
        ),
        ("webhook.tls.certManager.dnsNames", json!(["gpu.example.com"]), cert_manager, Accepted),
        ("webhook.tls.secret.name", json!("my-tls"), secret.clone(), Accepted),
        ("webhook.tls.secret.caBundle", json!("QUJD"), secret, Accepted),
        ("webhook.servicePort", json!(443), none.clone(), Accepted),
        ("webhook.servicePort", json!(8443), none.clone(), Refused("webhook.port")),
        ("webhook.containerPort", json!(443), none.clone(), Refused("webhook.port")),
        ("webhook.replicas", json!(2), none.clone(), Refused("controller.replicas")),
        ("webhook.priorityClassName", json!("x"), none.clone(), Refused("controller.priorityClassName")),
        ("webhook.strategy", strategy.clone(), none.clone(), Refused("controller.podDisruptionBudget")),
        ("webhook.podAnnotations", json!({"a": "b"}), none.clone(), Refused("not supported")),
        ("webhook.podSecurityContext", json!({"runAsUser": 1}), none.clone(), Refused("read-only root file system")),
        ("webhook.nodeSelector", json!({"a": "b"}), none.clone(), Refused("controller.nodeSelector")),
        ("webhook.tolerations", toleration.clone(), none.clone(), Refused("controller.tolerations")),
        ("webhook.affinity", affinity.clone(), none.clone(), Refused(webhook_in_controller)),
        (
            "webhook.containers.webhook.securityContext",
            privileged.clone(),
            none.clone(),
            Refused("controller.resources"),
        ),
        ("webhook.containers.webhook.resources", resources.clone(), none.clone(), Refused("controller.resources")),
        ("webhook.serviceAccount.create", json!(true), none.clone(), Refused("its service account")),
        ("webhook.serviceAccount.name", json!("x"), none.clone(), Refused("its service account")),
        ("controller.replicas", json!(3), none.clone(), Accepted),
        ("controller.leaderElection.enabled", json!(false), none.clone(), Accepted),
        ("controller.leaderElection.leaseDuration", json!("20s"), none.clone(), Accepted),
        ("controller.leaderElection.renewDeadline", json!("5s"), none.clone(), Accepted),
        ("controller.leaderElection.retryPeriod", json!("1s"), none.clone(), Accepted),
        ("controller.priorityClassName", json!("system-node-critical"), none.clone(), Accepted),
        ("controller.nodeSelector", json!({"pool": "ops"}), none.clone(), Accepted),
        ("controller.tolerations", toleration.clone(), none.clone(), Accepted),
        ("controller.podAnnotations", json!({"a": "b"}), none.clone(), Refused("not supported")),
        ("controller.podSecurityContext", json!({"runAsUser": 1}), none.clone(), Refused("read-only root file system")),
        (
            "controller.containers.computeDomain.securityContext",
            privileged.clone(),
            none.clone(),
            Refused("controller.resources"),
        ),
        ("controller.containers.computeDomain.env", env.clone(), none.clone(), Refused("controller.env")),
        (
            "controller.containers.computeDomain.resources",
            resources.clone(),
            none.clone(),
            Refused("controller.resources"),
        ),
        ("controller.affinity", affinity.clone(), none.clone(), Refused("controller.nodeSelector")),
        ("controller.networkPolicy.enabled", json!(true), none.clone(), Refused("not supported")),
        ("kubeletPlugin.kubeletPluginsDirectoryPath", json!("/var/lib/k0s/kubelet/plugins"), none.clone(), Accepted),
        (
            "kubeletPlugin.kubeletRegistrarDirectoryPath",
            json!("/var/lib/k0s/kubelet/plugins_registry"),
            none.clone(),
            Accepted,
        ),
        ("kubeletPlugin.priorityClassName", json!(""), none.clone(), Accepted),
        ("kubeletPlugin.tolerations", json!([{"operator": "Exists"}]), none.clone(), Accepted),
        ("kubeletPlugin.nodeSelector", json!({"nvidia.com/dra-kubelet-plugin": "true"}), none.clone(), Accepted),
        ("kubeletPlugin.affinity", affinity, none.clone(), Refused("kubeletPlugin.nodeAffinity")),
        ("kubeletPlugin.updateStrategy", strategy, none.clone(), Refused("maxSurge 0")),
        ("kubeletPlugin.podAnnotations", json!({"a": "b"}), none.clone(), Refused("not supported")),
        (
            "kubeletPlugin.podSecurityContext",
            json!({"runAsUser": 1}),
            none.clone(),
            Refused("follows from the inventory"),
        ),
        ("kubeletPlugin.networkPolicy.enabled", json!(true), none.clone(), Refused("not supported")),
    ];
    for field in ["enabled", "gpuHttpEndpoint", "computeDomainHttpEndpoint", "metricsPath"] {
        let value = if field == "enabled" { json!(true) } else { json!(":9090") };
        cases.push((
            leak(format!("kubeletPlugin.metrics.{field}")),
            value,
            none.clone(),
            Refused("kubeletPlugin.metricsPort"),
        ));
    }
    for field in ["enabled", "httpEndpoint", "metricsPath", "profilePath"] {
        let value = if field == "enabled" { json!(true) } else { json!("/debug") };
        cases.push((
            leak(format!("controller.metrics.{field}")),
            value,
            none.clone(),
            Refused("controller.metricsPort"),
        ));
    }
    let containers = [
        ("init", &["securityContext", "resources"][..]),
        ("gpus", &["env", "securityContext", "resources", "healthcheckPort"][..]),
        ("computeDomains", &["env", "securityContext", "resources", "healthcheckPort", "gpuCliqueLabelEnabled"][..]),
    ];
    for (container, fields) in containers {
        for field in fields {
            let value = match *field {
                "env" => env.clone(),
                "securityContext" => privileged.clone(),
                "resources" => resources.clone(),
                "healthcheckPort" => json!(-1),
                _ => json!(true),
            };
            cases.push((
                leak(format!("kubeletPlugin.containers.{container}.{field}")),
                value,
                none.clone(),
                Refused(plugin_container),
            ));
        }
    }
    let gates = [
        ("TimeSlicingSettings", true, Accepted),
        ("MPSSupport", true, Accepted),
        ("DynamicMIG", true, Accepted),
        ("DRAListTypeAttributes", true, Accepted),
        ("HostManagedIMEXDaemon", true, Accepted),
        ("HostManagedIMEXDaemon", false, Accepted),
        ("NVMLDeviceHealthCheck", true, Accepted),
        ("NVMLDeviceHealthCheck", false, Refused("kubeletPlugin.additionalXidsToIgnore")),
        ("DeviceHealthCheck", true, Accepted),
        ("DeviceHealthCheck", false, Refused("kubeletPlugin.additionalXidsToIgnore")),
        ("IMEXDaemonsWithDNSNames", false, Accepted),
        ("IMEXDaemonsWithDNSNames", true, Refused("listed by address")),
        ("ComputeDomainCliques", false, Accepted),
        ("ComputeDomainCliques", true, Refused("one fabric clique")),
        ("CrashOnNVLinkFabricErrors", false, Accepted),
        ("CrashOnNVLinkFabricErrors", true, Refused("without a cliqueID")),
        ("FabricManagerPartitioning", false, Accepted),
        ("FabricManagerPartitioning", true, Refused("gpu.nvidia.com/nvlinkGroup")),
        ("VGPUSupport", false, Accepted),
        ("VGPUSupport", true, Refused("dynamicMig")),
        ("DRADeviceCompatibilityGroups", false, Accepted),
        ("DRADeviceCompatibilityGroups", true, Refused("shared counters")),
        ("NodeLocalFabricIPC", false, Accepted),
        ("NodeLocalFabricIPC", true, Refused("NVLink fabric clique")),
        ("PassthroughSupport", true, Accepted),
        ("PassthroughSupport", false, Accepted),
        ("DeviceMetadata", false, Accepted),
        ("DeviceMetadata", true, Refused("resource.kubernetes.io/pciBusID")),
        ("PerNodeGPUConfig", false, Accepted),
        ("PerNodeGPUConfig", true, Refused("kubeletPlugin.nodeAffinity")),
        ("ContextualLogging", true, Accepted),
        ("ContextualLogging", false, Accepted),
        ("LoggingAlphaOptions", true, Accepted),
        ("LoggingBetaOptions", false, Accepted),
    ];
    for (name, on, verdict) in gates {
        cases.push((leak(gate(name)), json!(on), none.clone(), verdict));
    }
    // Their shares gate needs its mode (as in NVIDIA's chart).
    cases.push(("featureGates.ConsumableShares", json!(true), json!({"consumableShares": "4"}), Accepted));
    cases
}

fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

/// The table's rows: each backquoted name of a row's first cell (a name
/// after the first may be a last segment, `a.b.c`, `d`, meaning `a.b.d`),
/// with the row's second cell.
fn table_rows(text: &str) -> BTreeMap<String, String> {
    let mut rows = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
        let (names, verdict) = (cells[0], cells.get(1).copied().unwrap_or_default().trim());
        let mut prefix = String::new();
        for name in names.split('`').skip(1).step_by(2) {
            let full =
                if name.contains('.') || prefix.is_empty() { name.to_string() } else { format!("{prefix}{name}") };
            prefix = full.rsplit_once('.').map(|(p, _)| format!("{p}.")).unwrap_or_default();
            rows.insert(full, verdict.to_string());
        }
    }
    rows
}

#[test]
fn every_nvidia_value_and_gate_is_in_the_table_and_the_chart_does_what_it_says() {
    let table = std::fs::read_to_string(chart().join("NVIDIA-VALUES.md")).expect("NVIDIA-VALUES.md");
    let rows = table_rows(&table);
    let cases = nvidia_values();
    let values: Vec<(String, Value)> = cases
        .iter()
        .enumerate()
        .map(|(i, (path, value, context, _))| (format!("{i}-{path}"), at(context.clone(), path, value.clone())))
        .collect();
    let borrowed: Vec<(&str, Value)> = values.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
    let outcomes = render_chart(Path::new(env!("CARGO_TARGET_TMPDIR")), &chart(), &borrowed);

    let mut accepted_paths = BTreeMap::new();
    for ((case, _), (path, value, _, verdict)) in values.iter().zip(&cases) {
        let row = rows.get(*path).unwrap_or_else(|| panic!("{path} has no row in NVIDIA-VALUES.md"));
        match (verdict, &outcomes[case]) {
            (Accepted, Outcome::Rendered { objects, .. }) => check_types(objects),
            (Accepted, Outcome::Refused(error)) => panic!("{path}={value} is refused: {error}"),
            (Refused(_), Outcome::Rendered { .. }) => panic!("{path}={value} renders; the table says: {row}"),
            (Refused(ours), Outcome::Refused(error)) => {
                assert!(error.contains(ours), "{path}={value}: the refusal does not name {ours:?}: {error}");
                let top = path.split('.').next().unwrap_or_default();
                assert!(error.contains(top), "{path}: the refusal does not name the value: {error}");
            }
        }
        let accepted = accepted_paths.entry(*path).or_insert(false);
        *accepted |= matches!(verdict, Accepted);
    }
    // The table's word agrees with the chart: a path with any accepted
    // value reads "Accepted", one with none "Refused".
    for (path, accepted) in accepted_paths {
        let row = &rows[path];
        let word = if accepted { "Accepted" } else { "Refused" };
        assert!(row.starts_with(word), "{path}: the chart says {word}, the table says: {row}");
    }
    // And the table has no row the cases do not test.
    for path in rows.keys() {
        assert!(cases.iter().any(|(p, ..)| p == path), "the table's {path} is not tested here");
    }
}
