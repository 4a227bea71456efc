//! Builds the workspace's binaries and examples for the cross-process tests
//! and the demo, in the same target directory and with the same features as
//! the command that runs them, so that nothing is compiled twice (the
//! `workspace-hack` crate unifies features across every build of the
//! workspace). Cargo's own progress goes to the terminal while it builds:
//! a first run on a fresh machine compiles for minutes, and says so.

use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// What to build: a binary of a package, or an example.
#[derive(Debug, Clone, Copy)]
pub enum Artifact<'a> {
    Bin { package: &'a str, bin: &'a str },
    Example { package: &'a str, example: &'a str },
}

impl Artifact<'_> {
    fn name(&self) -> &str {
        match self {
            Artifact::Bin { bin, .. } => bin,
            Artifact::Example { example, .. } => example,
        }
    }
}

/// Builds `artifact` with `cargo build` in `profile` (`None`: the dev
/// profile) and returns the path of its executable. Panics with cargo's exit
/// status when the build fails: callers are tests and examples.
pub fn cargo_build(artifact: Artifact<'_>, profile: Option<&str>) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(crate::workspace_root().join("Cargo.toml"))
        .arg("--message-format=json-render-diagnostics");
    match artifact {
        Artifact::Bin { package, bin } => cmd.args(["-p", package, "--bin", bin]),
        Artifact::Example { package, example } => cmd.args(["-p", package, "--example", example]),
    };
    if let Some(profile) = profile {
        cmd.args(["--profile", profile]);
    }
    // What cargo sets for the running test (its package's name, version and
    // directory): build scripts such as ring's rerun when these change, so
    // inheriting them would rebuild ring, rustls, kube ... here, and again
    // in the next `cargo test`, which runs without them.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let set_for_the_test = ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_CRATE_", "CARGO_BIN_"]
            .iter()
            .any(|prefix| key.starts_with(prefix))
            || ["CARGO_PRIMARY_PACKAGE", "CARGO_TARGET_TMPDIR", "OUT_DIR"].contains(&&*key);
        if set_for_the_test {
            cmd.env_remove(&*key);
        }
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("running cargo to build {}: {e}", artifact.name()));
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut executable = None;
    let mut said_building = false;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("reading cargo's messages");
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        // Said once, and only when something is compiled (cargo's own
        // "Compiling" lines show what).
        if !said_building && message["reason"] == "compiler-artifact" && message["fresh"] == false {
            eprintln!("building {} (cargo build; the first build on a machine takes minutes)", artifact.name());
            said_building = true;
        }
        if message["reason"] == "compiler-artifact"
            && message["target"]["name"] == artifact.name()
            && let Some(path) = message["executable"].as_str()
        {
            executable = Some(PathBuf::from(path));
        }
    }
    let status = child.wait().expect("waiting for cargo");
    assert!(status.success(), "building {} failed: cargo exited with {status}", artifact.name());
    executable.unwrap_or_else(|| panic!("cargo built {} but named no executable for it", artifact.name()))
}
