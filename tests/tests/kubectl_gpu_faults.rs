//! `kubectl gpu` against a faulty or hostile API server: the real binary
//! reaches the API stand-in through the fault proxy (`fault_proxy`).
//!
//! - Bounded: a server that never answers, answers 503 or 429 forever, or
//!   sends a body short of its Content-Length and holds the connection,
//!   ends every command (`nodes`, `claims`, `why`, `fit`) with an error
//!   naming the server and what to do, within `--request-timeout` (a
//!   watchdog far above it fails the test instead of hanging it).
//! - Safe: control characters the server chose (a device attribute,
//!   another user's selector echoed by `why`, a `Status` message) are
//!   printed escaped, in tables, messages and errors; JSON and YAML stay
//!   valid and carry no raw control character.
//! - Paged: lists are read with `limit` and followed by `continue`.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use integration_tests::apiserver::ApiServer;
use integration_tests::claim_fixtures::{pending_claim, shipped_device_class};
use integration_tests::fault_proxy::{Fault, FaultProxy, Rule};
use integration_tests::webhook_process::gpus_slice;
use integration_tests::{kubectl_gpu, run_or_kill, stdout_ok};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

/// The `--request-timeout` the bounded commands get.
const LIMIT: &str = "2s";
/// Only a hang reaches this: far above [`LIMIT`] and the client's 30 s
/// read timeout.
const WATCHDOG: Duration = Duration::from_secs(120);

/// ESC ] 0 ; ... BEL retitles a terminal; ESC [ 2 J clears it; U+009B is
/// the 8-bit CSI.
const HOSTILE: &str = "x\u{1b}]0;pwned\u{7}\u{1b}[2J\u{9b}2J";
/// [`HOSTILE`] as printed.
const HOSTILE_ESCAPED: &str = "x\\x1b]0;pwned\\x07\\x1b[2J\\u{9b}2J";

fn has_raw_control(text: &str) -> bool {
    text.chars().any(|c| c.is_control() && c != '\n')
}

fn slice(node: &str, product: &str, devices: usize) -> ResourceSlice {
    gpus_slice(node, devices, json!({"productName": {"string": product}}))
}

/// The shipped `gpu.nvidia.com` DeviceClass.
fn gpu_class() -> DeviceClass {
    shipped_device_class("gpu.nvidia.com")
}

fn claim(name: &str, selector: Option<&str>) -> ResourceClaim {
    pending_claim(name, "gpu.nvidia.com", 1, selector)
}

/// A one-node cluster with one pending claim, `c`.
async fn cluster() -> (ApiServer, FaultProxy) {
    let server = ApiServer::start().await.unwrap();
    server.create(&slice("node-a", "NVIDIA H100 80GB HBM3", 8)).unwrap();
    server.create(&claim("c", None)).unwrap();
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    (server, proxy)
}

/// `fit`'s input.
const CLAIMS_FILE: &str = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: new}\n\
    spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}\n";

/// Runs `kubectl gpu` with the kubeconfig `write_kubeconfig` writes (off
/// the runtime that serves the proxy); `CLAIMS_FILE` in `args` is a file
/// holding [`CLAIMS_FILE`].
async fn kubectl_gpu_at(write_kubeconfig: impl FnOnce(&Path), args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    write_kubeconfig(&kubeconfig);
    let claims = dir.path().join("claims.yaml");
    std::fs::write(&claims, CLAIMS_FILE).unwrap();
    let mut all: Vec<String> = vec!["--kubeconfig".into(), kubeconfig.display().to_string()];
    all.extend(args.iter().map(|a| if *a == "CLAIMS_FILE" { claims.display().to_string() } else { a.to_string() }));
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = all.iter().map(String::as_str).collect();
        run_or_kill(kubectl_gpu(), &args, WATCHDOG)
    })
    .await
    .unwrap();
    drop(dir);
    out
}

const COMMANDS: [&[&str]; 4] = [&["nodes"], &["claims"], &["why", "c"], &["fit", "-f", "CLAIMS_FILE"]];

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Every command fails with `expect` in its error, which also names the
/// server, and prints nothing raw.
async fn every_command_fails(proxy: &FaultProxy, expect: &[&str]) {
    for command in COMMANDS {
        let mut args = command.to_vec();
        args.extend(["--request-timeout", LIMIT]);
        let out = kubectl_gpu_at(|p| proxy.write_kubeconfig(p).unwrap(), &args).await;
        let err = stderr(&out);
        assert!(!out.status.success(), "{command:?} succeeded: {err}");
        assert!(err.starts_with("error: "), "{command:?}: {err}");
        for needle in expect {
            assert!(err.contains(needle), "{command:?}: {needle:?} not in: {err}");
        }
        assert_eq!(err.lines().count(), 1, "{command:?}: one line: {err}");
        assert!(!has_raw_control(&err), "{command:?}: {err:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_ends_each_command_within_its_request_timeout() {
    let (_server, proxy) = cluster().await;
    proxy.inject(Rule::any(), Fault::Stall);
    let timed_out = format!("did not answer within --request-timeout {LIMIT}");
    every_command_fails(&proxy, &[&proxy.url(), &timed_out, "raise --request-timeout"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_cut_short_and_held_ends_each_command_within_its_request_timeout() {
    let (_server, proxy) = cluster().await;
    proxy.inject(Rule::path("GET", "/apis/resource.k8s.io/"), Fault::TruncateThenStall);
    let timed_out = format!("did not answer within --request-timeout {LIMIT}");
    every_command_fails(&proxy, &[&proxy.url(), &timed_out]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_answering_503_or_429_forever_ends_each_command_with_its_answer() {
    let (_server, proxy) = cluster().await;
    proxy.inject(Rule::any(), Fault::Status(503));
    every_command_fails(&proxy, &["503"]).await;
    proxy.clear();
    proxy.inject(Rule::any(), Fault::Status(429));
    every_command_fails(&proxy, &["429", "too many requests"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_message_with_control_characters_is_printed_escaped() {
    let (_server, proxy) = cluster().await;
    let message: &'static str = Box::leak(format!("resourceslices is forbidden: User {HOSTILE}").into_boxed_str());
    proxy.inject(Rule::any(), Fault::StatusMessage(403, message));
    let escaped = format!("User {HOSTILE_ESCAPED}");
    every_command_fails(&proxy, &[&escaped, "(403 Forbidden)"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_attribute_with_control_characters_is_printed_escaped_by_nodes() {
    let server = ApiServer::start().await.unwrap();
    server.create(&slice("node-a", HOSTILE, 2)).unwrap();
    let table = kubectl_gpu_at(|p| server.write_kubeconfig(p).unwrap(), &["nodes"]).await;
    let table = stdout_ok(&table);
    assert!(!has_raw_control(&table), "{table:?}");
    assert!(table.contains(&format!("2x {HOSTILE_ESCAPED}")), "{table}");
    // The columns line up on the escaped text.
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines[0].find("MIG"), lines[1].find("   -   ").map(|i| i + 3), "{table}");
    // JSON and YAML carry the server's string itself, in their own escapes.
    for format in ["json", "yaml"] {
        let out = kubectl_gpu_at(|p| server.write_kubeconfig(p).unwrap(), &["nodes", "-o", format]).await;
        let text = stdout_ok(&out);
        assert!(!has_raw_control(&text), "{format}: {text:?}");
        let value: Value = if format == "json" {
            serde_json::from_str(&text).unwrap()
        } else {
            serde_yaml_ng::from_str(&text).unwrap()
        };
        assert_eq!(value[0]["gpus"][HOSTILE], 2, "{format}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_users_selector_with_control_characters_is_printed_escaped_by_why() {
    let server = ApiServer::start().await.unwrap();
    server.create(&slice("node-a", "NVIDIA H100 80GB HBM3", 2)).unwrap();
    server.create(&gpu_class()).unwrap();
    let selector = format!("device.attributes[\"gpu.nvidia.com\"].{HOSTILE} == \"H100\"");
    server.create(&claim("theirs", Some(&selector))).unwrap();
    let out = kubectl_gpu_at(|p| server.write_kubeconfig(p).unwrap(), &["why", "theirs"]).await;
    let text = stdout_ok(&out);
    assert!(!has_raw_control(&text), "{text:?}");
    assert!(text.contains("pwned"), "the selector is echoed: {text}");
    assert!(text.contains("\\x1b"), "{text}");
    let out = kubectl_gpu_at(|p| server.write_kubeconfig(p).unwrap(), &["why", "theirs", "-o", "json"]).await;
    let json = stdout_ok(&out);
    assert!(!has_raw_control(&json), "{json:?}");
    let value: Value = serde_json::from_str(&json).unwrap();
    assert!(value["results"][0]["reason"].as_str().unwrap().contains(HOSTILE), "{json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_are_read_page_by_page() {
    let server = ApiServer::start().await.unwrap();
    // More slices than one page holds.
    let nodes = 120;
    for n in 0..nodes {
        server.create(&slice(&format!("node-{n:03}"), "NVIDIA H100 80GB HBM3", 1)).unwrap();
    }
    let out = kubectl_gpu_at(|p| server.write_kubeconfig(p).unwrap(), &["nodes", "-o", "json"]).await;
    let value: Value = serde_json::from_str(&stdout_ok(&out)).unwrap();
    assert_eq!(value.as_array().unwrap().len(), nodes, "every page's nodes");
    let lists: Vec<_> = server
        .faults()
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.ends_with("/resourceslices"))
        .collect();
    assert!(lists.iter().all(|r| r.query.contains("limit=")), "{lists:?}");
    assert!(lists.len() > 1 && lists.iter().skip(1).all(|r| r.query.contains("continue=")), "{lists:?}");
}
