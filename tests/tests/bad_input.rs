//! Bad input to the binaries: one line on standard error that names the
//! file, the field and the fix; a non-zero exit; never a panic.

use std::path::Path;
use std::process::Output;

use integration_tests::{controller, kubelet_plugin, run, workspace_root};

fn one_error_line(out: &Output) -> String {
    let stderr = String::from_utf8(out.stderr.clone()).unwrap();
    assert!(!out.status.success(), "should fail; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one line: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing on stdout when failing");
    lines[0].to_string()
}

fn print_slices_with(dir: &Path, yaml: &str) -> (String, String) {
    let file = dir.join("inventory.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = run(
        kubelet_plugin(),
        &["print-slices", "--node-name", "node-a", "--fake-inventory", file.to_str().unwrap()],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    (one_error_line(&out), file.display().to_string())
}

#[test]
fn unknown_model() {
    let dir = tempfile::tempdir().unwrap();
    let (line, file) = print_slices_with(dir.path(), "gpus:\n  - model: H100-SXM\n    count: 8\n");
    assert!(line.contains(&file), "{line}");
    assert!(line.contains("gpus[0].model"), "{line}");
    assert!(line.contains("unknown GPU model \"H100-SXM\""), "{line}");
    assert!(line.contains("fix: use one of:") && line.contains("H100-80GB"), "{line}");
}

#[test]
fn impossible_mig_layout() {
    let dir = tempfile::tempdir().unwrap();
    let (line, file) = print_slices_with(
        dir.path(),
        "gpus:\n  - model: A100-SXM4-80GB\n    count: 2\n    mig:\n      - gpus: [1]\n        instances: [4g.40gb, 3g.40gb, 1g.10gb]\n",
    );
    assert!(line.contains(&file), "{line}");
    assert!(line.contains("gpus[0].mig[0].instances[2]"), "{line}");
    assert!(line.contains("GPU 1 (A100-SXM4-80GB), MIG profile 1g.10gb"), "{line}");
    assert!(line.contains("fix: "), "{line}");
}

#[test]
fn malformed_yaml() {
    let dir = tempfile::tempdir().unwrap();
    let (line, file) = print_slices_with(dir.path(), "gpus:\n  - model: H100-80GB\n   count: 2\n");
    assert!(line.contains(&file), "{line}");
    assert!(line.contains("malformed inventory") && line.contains("line 3"), "{line}");
    assert!(line.contains("fix: "), "{line}");

    let (line, _) = print_slices_with(dir.path(), "gpus:\n  - model: H100-80GB\n    cnt: 2\n");
    assert!(line.contains("gpus[0]: malformed inventory: unknown field `cnt`"), "{line}");
    assert!(line.contains("fix: remove or correct that field"), "{line}");
}

#[test]
fn missing_file() {
    let out = run(
        kubelet_plugin(),
        &["print-slices", "--node-name", "n", "--fake-inventory", "/nonexistent/node.yaml"],
        None,
    );
    let line = one_error_line(&out);
    assert!(line.contains("/nonexistent/node.yaml: cannot read the file"), "{line}");
}

#[test]
fn missing_nvml_points_to_the_fake_source() {
    // This machine has no NVIDIA driver: without --fake-inventory the plugin
    // must say so once and say how to run anyway.
    if Path::new("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").exists() {
        return;
    }
    let out = run(kubelet_plugin(), &["print-slices", "--node-name", "n"], None);
    let line = one_error_line(&out);
    assert!(line.contains("NVML"), "{line}");
    assert!(line.contains("--fake-inventory FILE"), "{line}");
}

/// `print-cdi` on the DGX example for one device of a claim.
fn print_cdi(claim_uid: &str, device: &str) -> Output {
    let inventory = workspace_root().join("examples/inventories/dgx-h100.yaml");
    run(
        kubelet_plugin(),
        &[
            "print-cdi",
            "--node-name",
            "n",
            "--fake-inventory",
            inventory.to_str().unwrap(),
            "--claim-uid",
            claim_uid,
            "--device",
            device,
        ],
        None,
    )
}

#[test]
fn unknown_device_for_cdi() {
    let out = print_cdi("0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a", "gpu-9");
    let line = one_error_line(&out);
    assert!(line.contains("device gpu-9 is not on this node"), "{line}");
}

#[test]
fn invalid_flags_are_usage_errors() {
    let out = print_cdi("../../etc/passwd", "gpu-0");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("--claim-uid") && stderr.contains("invalid claim UID"), "{stderr}");
    assert!(!stderr.contains("panicked"));
}

/// 80,000 nested brackets: refused by a linear pre-scan before the YAML
/// parser's quadratic scan starts (it took seconds), with the file and line.
#[test]
fn deeply_nested_input_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let deep = format!("gpus: {}\n", "[".repeat(80_000));
    let (line, file) = print_slices_with(dir.path(), &deep);
    assert!(line.contains(&file), "{line}");
    assert!(line.contains("nesting deeper than 128 levels at line 1"), "{line}");

    let claims = dir.path().join("claims.yaml");
    std::fs::write(&claims, format!("kind: ResourceClaim\nspec: {}\n", "{a: ".repeat(80_000))).unwrap();
    let out = run(integration_tests::controller(), &["simulate", "-f", claims.to_str().unwrap()], None);
    let line = one_error_line(&out);
    assert!(line.contains(&claims.display().to_string()), "{line}");
    assert!(line.contains("nesting deeper than 128 levels at line 2"), "{line}");
}

/// A control character in what an error quotes (here a file's name; a
/// server's message takes the same path) is printed escaped: the error
/// line cannot clear the screen or forge a line.
#[test]
fn control_characters_in_an_error_are_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("x\x1b[2J\u{9b}y.yaml");
    let missing = missing.to_str().unwrap();
    let plugin = run(kubelet_plugin(), &["print-slices", "--node-name", "node-a", "--fake-inventory", missing], None);
    let controller = run(controller(), &["simulate", "-f", missing], None);
    for out in [plugin, controller] {
        let line = one_error_line(&out);
        assert!(!line.chars().any(char::is_control), "{line:?}");
        assert!(line.contains("x\\x1b[2J\\u{9b}y.yaml"), "{line}");
    }
}
