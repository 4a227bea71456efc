//! The Helm chart, rendered and linted by Helm v4's own engine for the
//! default values and each documented option: every rendered object must
//! parse as its Kubernetes type with no field dropped, and each option
//! must change what it says. RBAC and the coexistence check are in
//! `chart_rbac.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use integration_tests::docs::{docs_text, section};
use integration_tests::helm::{Outcome, args, check_types, container, kinds, mount, one, render_all, rendered, volume};
use integration_tests::workspace_root;
use k8s_openapi::api::resource::v1::DeviceClass;
use serde_json::{Value, json};

/// The cases the tests render: the defaults and each documented option.
fn outcomes() -> &'static BTreeMap<String, Outcome> {
    static OUTCOMES: OnceLock<BTreeMap<String, Outcome>> = OnceLock::new();
    OUTCOMES.get_or_init(|| {
        render_all(tmp_dir(), &[
            ("default", json!({})),
            (
                "secret-tls",
                json!({"webhook": {"tls": {"mode": "secret", "secret": {"name": "my-tls", "caBundle": "Q0EK"}}}}),
            ),
            ("cert-manager", json!({"webhook": {"tls": {"mode": "cert-manager"}}})),
            (
                "own-issuer",
                json!({"webhook": {"tls": {"mode": "cert-manager", "certManager": {"issuerName": "corp-ca", "issuerKind": "ClusterIssuer"}}}}),
            ),
            ("no-webhook", json!({"webhook": {"enabled": false}})),
            ("fake-inventory", json!({"fakeInventory": {"enabled": true}})),
            ("extended-resource", json!({"deviceClasses": {"extendedResourceName": true}})),
            ("gpu-operator", json!({"nvidiaDriverRoot": "/run/nvidia/driver", "nvidiaCDIHookPath": "/usr/local/nvidia/toolkit/nvidia-cdi-hook"})),
            ("feature-gates", json!({"featureGates": {"TimeSlicingSettings": true}})),
            ("mps", json!({"featureGates": {"MPSSupport": true, "ConsumableCapacity": true}})),
            ("service-monitor", json!({"metrics": {"serviceMonitor": {"enabled": true}}})),
            ("single-replica", json!({"controller": {"replicas": 1, "leaderElection": false}})),
            ("json-logs", json!({"logFormat": "json", "logLevel": "debug"})),
            ("no-viewer-roles", json!({"kubectlGpu": {"viewerRoles": false}})),
            ("no-classes", json!({"deviceClasses": {"create": false}})),
            ("compute-domains", json!({"resources": {"computeDomains": {"enabled": true}}})),
            ("host-network", json!({"kubeletPlugin": {"hostNetwork": true}, "controller": {"hostNetwork": true}})),
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
        ("ClusterRole", 3),
        ("ClusterRoleBinding", 2),
        ("DaemonSet", 1),
        ("Deployment", 1),
        ("DeviceClass", 2),
        ("PodDisruptionBudget", 1),
        ("Role", 2),
        ("RoleBinding", 1),
        ("Secret", 1),
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
    // webhook's certificate generated by the chart.
    let deployment = one(&objects, "Deployment", "controller");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let controller = container(deployment, "controller");
    let controller_args = args(controller);
    for arg in [
        "run",
        "--namespace=gpu-dra-driver",
        "--leader-elect=true",
        "--explain-after=30s",
        "--deallocate-after=5m",
        "--event-qps=20",
        "--leader-elect-lease-duration=15s",
        "--leader-elect-renew-deadline=10s",
        "--leader-elect-retry-period=2s",
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
    assert!(webhook["metadata"]["annotations"].is_null(), "no cert-manager by default");
    let hook = &webhook["webhooks"][0];
    // The CA of the chart's own Secret (the handshake is checked in
    // chart_values.rs).
    let secret = one(&objects, "Secret", "webhook-tls");
    assert_eq!(hook["clientConfig"]["caBundle"], secret["data"]["ca.crt"]);
    assert_eq!(secret["type"], "kubernetes.io/tls");
    assert_eq!(hook["failurePolicy"], "Ignore");
    assert_eq!(hook["matchConditions"][0]["name"], "uses-this-driver");
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(hook["admissionReviewVersions"], json!(["v1"]));
    assert_eq!(hook["clientConfig"]["service"]["path"], "/validate");
    assert_eq!(hook["rules"][0]["resources"], json!(["resourceclaims", "resourceclaimtemplates"]));
    assert_eq!(hook["rules"][0]["operations"], json!(["CREATE", "UPDATE"]));
    let service = one(&objects, "Service", "webhook");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "webhook");
    // A drain takes one controller replica at a time; replicas may run on
    // the control plane.
    let budget = one(&objects, "PodDisruptionBudget", "controller");
    assert_eq!(budget["spec"]["maxUnavailable"], 1);
    assert_eq!(budget["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"], "controller");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["tolerations"][0]["key"],
        "node-role.kubernetes.io/control-plane"
    );

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
        notes.contains("kubectl get resourceslices") && notes.contains("describe resourceclaim <claim>"),
        "{notes}"
    );
    assert!(
        notes.contains("the ClusterRole\n   gpu-dra-driver-gpu-viewer")
            && notes.contains("gpu-dra-driver-gpu-metrics-reader\n   in namespace gpu-dra-driver"),
        "{notes}"
    );
}

#[test]
fn each_option_changes_what_it_says() {
    let all = outcomes();

    // cert-manager: a Certificate from the release's own self-signed
    // Issuer, injected into the webhook configuration.
    let (objects, _) = rendered(all, "cert-manager");
    assert!(!objects.iter().any(|o| o["kind"] == "Secret"));
    let webhook = one(&objects, "ValidatingWebhookConfiguration", "webhook");
    assert_eq!(
        webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "gpu-dra-driver/gpu-dra-driver-webhook"
    );
    assert!(webhook["webhooks"][0]["clientConfig"]["caBundle"].is_null());
    let certificate = one(&objects, "Certificate", "webhook");
    assert_eq!(certificate["spec"]["secretName"], "gpu-dra-driver-webhook-tls");
    assert_eq!(certificate["spec"]["dnsNames"][0], "gpu-dra-driver-webhook.gpu-dra-driver.svc");
    assert_eq!(certificate["spec"]["issuerRef"]["name"], one(&objects, "Issuer", "selfsigned")["metadata"]["name"]);

    let (objects, _) = rendered(all, "secret-tls");
    assert!(
        !objects.iter().any(|o| ["Certificate", "Issuer", "Secret"].contains(&o["kind"].as_str().unwrap_or_default()))
    );
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
        ["ValidatingWebhookConfiguration", "Certificate", "Issuer", "Secret"]
            .contains(&o["kind"].as_str().unwrap_or_default())
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

    // ComputeDomains (NVIDIA's value): the CRD NVIDIA's manifests need,
    // its two classes as shipped in deviceclasses/, the controller's
    // reconciler and its rights; none of it by default.
    let (objects, _) = rendered(all, "compute-domains");
    let crd = one(&objects, "CustomResourceDefinition", "computedomains.resource.nvidia.com");
    assert_eq!(crd["spec"]["group"], "resource.nvidia.com");
    assert_eq!(crd["spec"]["versions"][0]["name"], "v1beta1");
    assert_eq!(crd["spec"]["versions"][0]["subresources"], json!({"status": {}}));
    // helm uninstall keeps it, and with it the ComputeDomains (docs/install.md,
    // "Upgrade, roll back, uninstall"; real_chart_lifecycle).
    assert_eq!(crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep");
    for class in ["compute-domain-daemon.nvidia.com", "compute-domain-default-channel.nvidia.com"] {
        let shipped: DeviceClass = serde_yaml_ng::from_str(
            &std::fs::read_to_string(workspace_root().join(format!("deviceclasses/{class}.yaml"))).unwrap(),
        )
        .unwrap();
        assert_eq!(
            one(&objects, "DeviceClass", class)["spec"]["selectors"],
            serde_json::to_value(&shipped.spec.unwrap().selectors).unwrap()
        );
    }
    assert!(
        args(container(one(&objects, "Deployment", "controller"), "controller"))
            .contains(&"--compute-domains".to_string())
    );
    let roles: Vec<String> = objects
        .iter()
        .filter(|o| {
            o["kind"] == "ClusterRole"
                && o["metadata"]["name"].as_str().unwrap_or_default().ends_with("-compute-domains")
        })
        .map(|o| o["rules"].to_string())
        .collect();
    assert_eq!(roles.len(), 2, "the controller's and the plugin's");
    assert!(roles.iter().any(|r| r.contains("computedomains/status")), "{roles:?}");
    assert!(
        args(container(one(&objects, "DaemonSet", "kubelet-plugin"), "plugin"))
            .contains(&"--compute-domains".to_string())
    );
    let (objects, _) = rendered(all, "default");
    assert!(!objects.iter().any(|o| o["kind"] == "CustomResourceDefinition"));
    assert!(
        !args(container(one(&objects, "Deployment", "controller"), "controller"))
            .contains(&"--compute-domains".to_string())
    );

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
    let leader_election = |o: &&Value| {
        (o["kind"] == "Role" || o["kind"] == "RoleBinding")
            && !o["metadata"]["name"].as_str().is_some_and(|n| n.ends_with("-gpu-metrics-reader"))
    };
    assert!(!objects.iter().any(|o| leader_election(&o)));

    assert!(
        args(container(one(&objects, "Deployment", "controller"), "controller"))
            .contains(&"--leader-elect=false".to_string())
    );

    // kubectl gpu's viewer roles: made (reads only; the pod proxy only in
    // the release's namespace), never bound; left out when asked.
    let (objects, _) = rendered(all, "default");
    let viewer = one(&objects, "ClusterRole", "gpu-viewer");
    let verbs: BTreeSet<&str> = viewer["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["verbs"].as_array().unwrap())
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(verbs, BTreeSet::from(["get", "list"]), "{viewer}");
    let metrics = one(&objects, "Role", "gpu-metrics-reader");
    assert_eq!(metrics["metadata"]["namespace"], "gpu-dra-driver");
    assert_eq!(metrics["rules"], json!([{"apiGroups": [""], "resources": ["pods/proxy"], "verbs": ["get"]}]));
    let bound_to = |name: &str| {
        objects.iter().any(|o| {
            o["kind"].as_str().is_some_and(|k| k.ends_with("Binding"))
                && o["roleRef"]["name"].as_str().is_some_and(|r| r.ends_with(name))
        })
    };
    assert!(!bound_to("-gpu-viewer") && !bound_to("-gpu-metrics-reader"));
    let (objects, _) = rendered(all, "no-viewer-roles");
    assert_eq!(kinds(&objects)["ClusterRole"], 2);
    assert_eq!(kinds(&objects)["Role"], 1);

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

    // The node's network: each pod listens on its node's address only
    // (test nodes sharing a host keep to their own), which the kubelet
    // puts in $(POD_IP); by default, a pod network and every address.
    let (objects, _) = rendered(all, "host-network");
    for (kind, name, container_name, listens) in [
        ("DaemonSet", "kubelet-plugin", "plugin", vec!["--metrics-addr=$(POD_IP):8080"]),
        ("Deployment", "controller", "controller", vec!["--metrics-addr=$(POD_IP):8080", "--webhook-host=$(POD_IP)"]),
    ] {
        let workload = one(&objects, kind, name);
        let spec = &workload["spec"]["template"]["spec"];
        assert_eq!((&spec["hostNetwork"], &spec["dnsPolicy"]), (&json!(true), &json!("ClusterFirstWithHostNet")));
        let c = container(workload, container_name);
        for arg in listens {
            assert!(args(c).contains(&arg.to_string()), "{name}: {:?}", args(c));
        }
        let pod_ip = c["env"].as_array().unwrap().iter().find(|e| e["name"] == "POD_IP").unwrap();
        assert_eq!(pod_ip["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");
    }
    let (objects, _) = rendered(all, "default");
    for (kind, name, container_name) in
        [("DaemonSet", "kubelet-plugin", "plugin"), ("Deployment", "controller", "controller")]
    {
        let workload = one(&objects, kind, name);
        assert!(workload["spec"]["template"]["spec"]["hostNetwork"].is_null(), "{name}");
        let c = container(workload, container_name);
        assert!(args(c).contains(&"--metrics-addr=0.0.0.0:8080".to_string()), "{name}: {:?}", args(c));
        assert!(!args(c).iter().any(|a| a.starts_with("--webhook-host")), "{name}");
    }
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

fn tmp_dir() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// The `helm install` commands of the README's "Install on a cluster" and
/// of the guide (`docs/install.md`: NVIDIA's install lines), as written:
/// each renders with its `--set` values (the schema refuses a misspelt
/// one).
#[test]
fn the_docs_install_commands_render() {
    // One command per `helm install` of this chart, continued lines joined.
    let joined = docs_text().replace("\\\n", " ");
    let commands: Vec<&str> = joined
        .lines()
        .filter(|l| l.trim_start().starts_with("helm install") && l.contains("charts/gpu-dra-driver"))
        .collect();
    // The README's host and GPU Operator installs and kind's, NVIDIA's
    // quickstart.
    assert!(commands.len() >= 4, "{commands:?}");
    let install = section("Install on a cluster").replace("\\\n", " ");
    let in_readme = install.lines().filter(|l| l.trim_start().starts_with("helm install")).count();
    assert!(in_readme >= 3, "the README's install commands: {install}");
    let cases: Vec<(String, serde_json::Value)> = commands
        .iter()
        .enumerate()
        .map(|(i, command)| {
            let mut values = json!({});
            let mut words = command.split_whitespace();
            while let Some(word) = words.next() {
                if word != "--set" {
                    continue;
                }
                let (path, value) = words.next().unwrap().split_once('=').unwrap();
                let value = match value {
                    "true" => json!(true),
                    "false" => json!(false),
                    other => json!(other),
                };
                let mut at = &mut values;
                let keys: Vec<&str> = path.split('.').collect();
                for key in &keys[..keys.len() - 1] {
                    at = at.as_object_mut().unwrap().entry(*key).or_insert(json!({}));
                }
                at[keys[keys.len() - 1]] = value;
            }
            (format!("readme-{i}"), values)
        })
        .collect();
    let cases: Vec<(&str, serde_json::Value)> = cases.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
    let outcomes = render_all(tmp_dir(), &cases);
    for (name, values) in &cases {
        let (objects, _) = rendered(&outcomes, name);
        check_types(&objects);
        // Every string it sets reaches the objects (an image, a path).
        let text = serde_json::to_string(&objects).unwrap();
        let mut strings = vec![values.clone()];
        while let Some(value) = strings.pop() {
            match value {
                serde_json::Value::Object(map) => strings.extend(map.into_iter().map(|(_, v)| v)),
                serde_json::Value::String(s) => assert!(text.contains(&s), "{name}: {s} is in no object"),
                _ => {}
            }
        }
    }
}
