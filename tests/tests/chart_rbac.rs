//! The chart's RBAC is exactly the API calls the binaries make against the
//! API-server stand-in (no wildcard, no verb the code does not use), and
//! the chart refuses to install next to NVIDIA's device plugin or DRA
//! driver unless told.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use integration_tests::apiserver::audit::{ApiCall, calls_by};
use integration_tests::apiserver::{ApiServer, Matcher};
use integration_tests::build::{Artifact, cargo_build};
use integration_tests::controller_process::ControllerProcess;
use integration_tests::helm::{Outcome, one, render_all, render_chart, rendered};
use integration_tests::plugin_process::{PluginDirs, PluginOptions, PluginProcess};
use integration_tests::rbac::{Grant, allows, role_grants};
use integration_tests::wait;
use integration_tests::workspace_root;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

// --------------------------------------------------------------------- RBAC

/// What the rendered RBAC grants each service account.
fn grants(objects: &[Value]) -> BTreeMap<String, BTreeSet<Grant>> {
    let mut by_account: BTreeMap<String, BTreeSet<Grant>> = BTreeMap::new();
    for binding in objects.iter().filter(|o| o["kind"] == "ClusterRoleBinding" || o["kind"] == "RoleBinding") {
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap();
        let role = one(objects, role_kind, binding["roleRef"]["name"].as_str().unwrap());
        for subject in binding["subjects"].as_array().unwrap() {
            assert_eq!(subject["kind"], "ServiceAccount");
            by_account.entry(subject["name"].as_str().unwrap().to_string()).or_default().extend(role_grants(role));
        }
    }
    by_account
}

/// What the real authorizer checks for `agent`'s `call`: the call itself
/// and, for a claim's status write, what Kubernetes 1.36+ checks besides
/// (DRAResourceClaimGranularStatusAuthorization, `resourceclaimStatusStrategy.ValidateUpdate`
/// in `pkg/registry/resource/resourceclaim/strategy.go`, with
/// `AuthorizedForBinding` and `AuthorizedForDeviceStatus` in
/// `pkg/registry/resource/utils.go`): a change of status.allocation is
/// also checked as the same verb on resourceclaims/binding (the
/// controller's delegated allocations); a change of status.devices as
/// `associated-node:<verb>` on resourceclaims/driver, named by the driver,
/// when the writer's token is bound to the claim's node (the node agent
/// writes only its own node's claims, on its node's token). The stand-in
/// authorizes nothing and records the status write alone.
fn authorization_checks(agent: &str, call: ApiCall) -> Vec<ApiCall> {
    let mut checks = vec![call.clone()];
    if call.verb == "update" && call.resource == "resourceclaims/status" {
        checks.push(match agent {
            "gpu-kubelet-plugin" => {
                ApiCall { verb: "associated-node:update", resource: "resourceclaims/driver".into(), ..call }
            }
            _ => ApiCall { resource: "resourceclaims/binding".into(), ..call },
        });
    }
    checks
}

/// The calls the README's demo makes (the whole system: publishing,
/// delegated allocation, explanations, leader election, prepare).
fn demo_calls() -> Vec<(String, ApiCall)> {
    let demo = cargo_build(Artifact::Example { package: "integration-tests", example: "demo" }, None);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("calls.jsonl");
    let output = Command::new(&demo).env("DEMO_API_CALLS_FILE", &file).output().expect("running the demo");
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

fn wait_until(what: &str, log: &dyn Fn() -> String, check: impl FnMut() -> bool) {
    wait::wait_until(what, WAIT, check, log);
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
    agents_calls(&server)
}

/// The calls of the idle-claim watch (on by default with NVML, which the
/// demo's fake inventories lack): a claim on the mock NVML held idle past
/// a 1 s window gets its Events, then busy again loses them.
fn idle_warning_calls() -> Vec<(String, ApiCall)> {
    use integration_tests::kubelet::{KubeletConfig, claim};
    use integration_tests::mock_nvml_node::{Load, MockNvmlNode};
    use integration_tests::node::{DRIVER, NODE, RunningNode};
    use k8s_openapi::api::events::v1::Event;

    let gpus = MockNvmlNode::new(
        "driverVersion: \"580.82.07\"\ncudaDriverVersion: \"13.0\"\ngpus:\n  - model: H100-80GB\n    count: 1\n",
    );
    let uuid = gpus.uuid("gpu-0");
    gpus.set_loads(&[(&uuid, Load::gpu(0))]);
    let mut extra_args = gpus.args();
    extra_args.extend(
        ["--telemetry-interval-ms", "200", "--idle-window-seconds", "1", "--idle-threshold-percent", "5"]
            .map(String::from),
    );
    let options = PluginOptions { fake_inventory: false, extra_args, env: gpus.env(), ..PluginOptions::default() };
    let node = RunningNode::start("gpus: []\n", KubeletConfig::new("", DRIVER), options);
    let mut object = integration_tests::claim_fixtures::allocated_claim(
        "default",
        "idle",
        &[integration_tests::claim_fixtures::Allocated::new("gpu", NODE, "gpu-0")],
        vec![],
    );
    if let Some(status) = object.status.as_mut() {
        status.reserved_for = Some(vec![k8s_openapi::api::resource::v1::ResourceClaimConsumerReference {
            api_group: None,
            resource: "pods".into(),
            name: "idle-pod".into(),
            uid: "uid-idle-pod".into(),
        }]);
    }
    let uid = integration_tests::claim_fixtures::store(&node.server, &object).unwrap();
    let answers = node.prepare(&[claim("default", "idle", &uid)]);
    assert!(answers[&uid].is_ok(), "{answers:?}");
    let events = || node.server.list::<Event>(Some("default"), "").unwrap_or_default().len();
    wait_until("the idle-claim Events", &|| node.process.log(), || events() == 2);
    gpus.set_loads(&[(&uuid, Load::gpu(90))]);
    wait_until("the idle-claim Events to go", &|| node.process.log(), || events() == 0);
    let records = node.server.faults().requests();
    calls_by(&records, "gpu-kubelet-plugin/").into_iter().map(|c| ("gpu-kubelet-plugin".to_string(), c)).collect()
}

/// Every call the plugin and the controller made to `server`, by agent.
fn agents_calls(server: &ApiServer) -> Vec<(String, ApiCall)> {
    let records = server.faults().requests();
    let mut calls = Vec::new();
    for agent in ["gpu-kubelet-plugin", "gpu-dra-controller"] {
        calls.extend(calls_by(&records, &format!("{agent}/")).into_iter().map(|c| (agent.to_string(), c)));
    }
    calls
}

#[test]
fn rbac_is_exactly_the_calls_the_binaries_make() {
    let outcomes = render_all(tmp_dir(), &[("default", json!({}))]);
    let (objects, _) = rendered(&outcomes, "default");
    let granted = grants(&objects);
    let accounts =
        [("gpu-kubelet-plugin", "gpu-dra-driver-kubelet-plugin"), ("gpu-dra-controller", "gpu-dra-driver-controller")];
    assert_eq!(granted.keys().cloned().collect::<BTreeSet<_>>(), accounts.iter().map(|(_, a)| a.to_string()).collect());

    let mut made: BTreeMap<String, BTreeSet<ApiCall>> = BTreeMap::new();
    for (agent, call) in demo_calls().into_iter().chain(fault_path_calls()).chain(idle_warning_calls()) {
        made.entry(agent.clone()).or_default().extend(authorization_checks(&agent, call));
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

/// The calls of ComputeDomains (`--compute-domains` on both binaries): a
/// one-node domain on a fake GB200 tray (fake `nvidia-imex` in a fake
/// driver root) made, its channel prepared (the first condition write
/// refused, so explained) until the domain is Ready, then unprepared and
/// the domain deleted.
fn compute_domain_calls() -> Vec<(String, ApiCall)> {
    use gpu_dra_driver::compute_domain::api::{ComputeDomain, ComputeDomainSpec, Readiness};
    use integration_tests::kubelet::{Kubelet, KubeletConfig, claim};
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::api::resource::v1::ResourceClaimTemplate;

    const CD_DRIVER: &str = "compute-domain.nvidia.com";
    let server = ApiServer::start_in_thread().unwrap();
    let dirs = PluginDirs::new(include_str!("../../examples/inventories/gb200-clique.yaml")).unwrap();
    server.write_kubeconfig(&dirs.kubeconfig).unwrap();
    let imex = integration_tests::imex_host::ImexHost::build(dirs.root.path()).unwrap();
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "node-a"},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}}))
    .unwrap();
    server.create_with_status(&node).unwrap();
    let options = PluginOptions { extra_args: imex.plugin_args(20_000), ..PluginOptions::default() };
    let mut plugin = PluginProcess::spawn(&dirs, &options).unwrap();
    let kubeconfig = dirs.root.path().join("controller-kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let mut controller = ControllerProcess::spawn(&kubeconfig, "rbac", &["--compute-domains"]).unwrap();
    let logs = || format!("{}\n{}", plugin.log(), controller.log());

    let spec = ComputeDomainSpec::with_template(1, "job-channel");
    let domain = server.create(&ComputeDomain::new("default", "job", spec)).unwrap();
    let template = || server.get::<ResourceClaimTemplate>(Some("default"), "job-channel").ok();
    wait_until("the domain's template", &logs, || template().is_some());
    // The pod's claim from the template, as the scheduler leaves it.
    let from_template = template().unwrap().spec.unwrap();
    let mut object = serde_json::to_value(&from_template).unwrap();
    object["metadata"]["namespace"] = json!("default");
    object["metadata"]["name"] = json!("worker-channel");
    let config = &from_template.spec.as_ref().unwrap().devices.as_ref().unwrap().config;
    let allocated: Vec<Value> = config
        .iter()
        .flatten()
        .map(|c| json!({"source": "FromClaim", "requests": c.requests, "opaque": c.opaque}))
        .collect();
    object["status"] = json!({
        "allocation": {"devices": {"results": [{"request": "channel", "driver": CD_DRIVER, "pool": "node-a", "device": "channel-0"}],
                                   "config": allocated}},
        "reservedFor": [{"resource": "pods", "name": "worker", "uid": "worker-uid"}]});
    // Another pod's channel, allocated on node-b (which publishes no
    // clique, so it cannot join), waits for binding: the controller fails
    // its binding through the claim's status.devices (made once the domain
    // is Ready: the node without a clique keeps it NotReady).
    let mut stray = object.clone();
    stray["metadata"]["name"] = json!("stray-channel");
    stray["status"]["allocation"]["devices"]["results"] = json!([{"request": "channel", "driver": CD_DRIVER,
        "pool": "node-b", "device": "channel-0", "bindingConditions": ["Ready"], "bindingFailureConditions": ["ImexDaemonFailed"]}]);
    stray["status"]["reservedFor"] = json!([{"resource": "pods", "name": "stray", "uid": "stray-uid"}]);
    let stored = server.create_with_status(&serde_json::from_value::<ResourceClaim>(object).unwrap()).unwrap();
    let request = claim("default", "worker-channel", stored.metadata.uid.as_deref().unwrap());
    // The agent's first write of the channel's condition is refused, as
    // without the resourceclaims/driver grant: it explains that with an
    // Event, and the health loop's next write lands.
    server.faults().fail_next(Matcher::new("PUT", "/resourceclaims/worker-channel/status"), 1, 403);

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let kubelet = Kubelet::new(KubeletConfig::new(&dirs.registry, CD_DRIVER));
    let registered = runtime.block_on(kubelet.wait_and_register(WAIT)).unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    let answers = runtime.block_on(kubelet.prepare(&registered, std::slice::from_ref(&request)));
    answers.unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    let ready = || {
        let domain = server.get::<ComputeDomain>(Some("default"), "job").ok();
        domain.and_then(|d| d.status).is_some_and(|s| s.status == Readiness::Ready)
    };
    wait_until("the domain Ready", &logs, ready);
    server.create_with_status(&serde_json::from_value::<ResourceClaim>(stray).unwrap()).unwrap();
    let refused = || {
        let claim = server.get::<ResourceClaim>(Some("default"), "stray-channel").ok();
        let devices = claim.and_then(|c| c.status).and_then(|s| s.devices).unwrap_or_default();
        devices.iter().flat_map(|d| d.conditions.iter().flatten()).any(|c| c.type_ == "ImexDaemonFailed")
    };
    wait_until("the stray channel's binding refused", &logs, refused);
    server.delete::<ResourceClaim>(Some("default"), "stray-channel").unwrap();
    runtime.block_on(kubelet.unprepare(&registered, &[request])).unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    server.delete::<ResourceClaim>(Some("default"), "worker-channel").unwrap();
    server.delete::<ComputeDomain>(Some("default"), "job").unwrap();
    wait_until("the domain released", &logs, || {
        server.get::<ComputeDomain>(Some("default"), domain.metadata.name.as_deref().unwrap()).is_err()
    });
    controller.kill();
    plugin.kill().unwrap();
    agents_calls(&server)
}

/// With `resources.computeDomains.enabled`, the chart's `-compute-domains`
/// roles grant what ComputeDomains need beyond the main roles, no more:
/// every call is allowed by the account's roles together, and each grant
/// of a `-compute-domains` role is used.
#[test]
fn compute_domain_rbac_is_exactly_the_calls_they_make() {
    let outcomes =
        render_all(tmp_dir(), &[("compute-domains", json!({"resources": {"computeDomains": {"enabled": true}}}))]);
    let (objects, _) = rendered(&outcomes, "compute-domains");
    let granted = grants(&objects);
    let extra_objects: Vec<Value> = objects
        .iter()
        .filter(|o| o["metadata"]["name"].as_str().is_some_and(|n| n.ends_with("-compute-domains")))
        .cloned()
        .collect();
    let extra = grants(&extra_objects);
    let mut made: BTreeMap<String, BTreeSet<ApiCall>> = BTreeMap::new();
    for (agent, call) in compute_domain_calls() {
        // Here the controller's only claim status write is a refused
        // binding: status.devices, on a token bound to no node.
        let checks = if agent == "gpu-dra-controller" && call.resource == "resourceclaims/status" {
            let driver =
                ApiCall { verb: "arbitrary-node:update", resource: "resourceclaims/driver".into(), ..call.clone() };
            vec![call, driver]
        } else {
            authorization_checks(&agent, call)
        };
        made.entry(agent.clone()).or_default().extend(checks);
    }
    let accounts =
        [("gpu-kubelet-plugin", "gpu-dra-driver-kubelet-plugin"), ("gpu-dra-controller", "gpu-dra-driver-controller")];
    for (agent, account) in accounts {
        let calls = &made[agent];
        let denied: Vec<&ApiCall> = calls.iter().filter(|c| !allows(&granted[account], c)).collect();
        assert!(denied.is_empty(), "{agent} makes calls its RBAC ({account}) does not allow: {denied:#?}");
        let unused: Vec<&Grant> = extra[account]
            .iter()
            .filter(|(verb, group, resource, _)| {
                !calls.iter().any(|c| c.verb == verb && c.group == *group && c.resource == *resource)
            })
            .collect();
        assert!(unused.is_empty(), "{account}'s compute-domain role grants what {agent} never does: {unused:#?}");
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
    // NVIDIA's current chart (dra-driver-nvidia-gpu), by its name label alone.
    let current = daemonset(
        "dra",
        "dra-driver-nvidia-gpu-kubelet-plugin",
        json!({"app.kubernetes.io/name": "dra-driver-nvidia-gpu"}),
    );
    let unrelated = daemonset("kube-system", "kube-proxy", json!({"k8s-app": "kube-proxy"}));
    // This release's own DaemonSet, on an upgrade.
    let ours = daemonset(
        "gpu-dra-driver",
        "gpu-dra-driver-kubelet-plugin",
        json!({"app.kubernetes.io/name": "gpu-dra-driver", "app.kubernetes.io/instance": "gpu-dra-driver"}),
    );
    let outcomes = render_chart(
        tmp_dir(),
        &chart,
        &[
            ("operator", json!({"clusterDaemonSets": [unrelated.clone(), operator.clone()]})),
            ("nvidia-dra", json!({"clusterDaemonSets": [dra.clone()]})),
            ("current", json!({"clusterDaemonSets": [current.clone()]})),
            ("unrelated", json!({"clusterDaemonSets": [unrelated.clone(), ours]})),
            ("allowed", json!({"clusterDaemonSets": [operator, dra, current], "allowCoexistence": true})),
        ],
    );
    for (case, found) in [
        ("operator", "gpu-operator/nvidia-device-plugin-daemonset"),
        ("nvidia-dra", "nvidia-dra/nvidia-dra-driver-gpu-kubelet-plugin"),
        ("current", "dra/dra-driver-nvidia-gpu-kubelet-plugin"),
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

fn tmp_dir() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
}
