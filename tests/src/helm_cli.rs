//! The real `helm` command (Helm v4, built from the module pinned in
//! `tests/kube-bins/helm` into the per-machine cache by its `build.sh`),
//! for the tests that hold [`crate::helm`]'s rendering by Helm's library to
//! what users run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

use crate::helm::{NAMESPACE, RELEASE, documents};
use crate::workspace_root;

/// The helm binary, built on first use (minutes once per machine and
/// version; needs Go and the Go module proxy).
pub fn helm() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let printed = crate::real_cluster::run_script(
            &workspace_root().join("tests/kube-bins/helm/build.sh"),
            &[],
            "helm: {script} (builds helm when the cache lacks it)",
            "needs Go and the Go module proxy",
        );
        let bin = printed.path("helm-bin=");
        assert!(bin.is_file(), "{} is missing after the build", bin.display());
        bin
    })
}

/// Helm's version as pinned in `tests/kube-bins/helm/go.mod`.
pub fn pinned_version() -> String {
    let go_mod = workspace_root().join("tests/kube-bins/helm/go.mod");
    let text = std::fs::read_to_string(&go_mod).unwrap_or_else(|e| panic!("{}: {e}", go_mod.display()));
    text.lines()
        .find_map(|l| l.trim().strip_prefix("helm.sh/helm/v4 ")?.split_whitespace().next().map(String::from))
        .unwrap_or_else(|| panic!("{} pins no helm.sh/helm/v4", go_mod.display()))
}

/// `helm args...` with its configuration, cache and data under `home`
/// (nothing of the user's is read or written).
pub fn run(home: &Path, args: &[&str]) -> Output {
    Command::new(helm())
        .args(args)
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running helm: {e}"))
}

/// The values of one case as a file helm reads with `-f` (JSON is YAML).
fn values_file(dir: &Path, case: &str, values: &Value) -> PathBuf {
    let file = dir.join(format!("{case}.values.json"));
    std::fs::write(&file, serde_json::to_vec(values).expect("values as JSON")).expect("writing the values");
    file
}

/// `helm template` of `chart` for the tests' release and namespace, as an
/// install: the rendered objects, or helm's error.
pub fn template(dir: &Path, chart: &Path, case: &str, values: &Value) -> Result<Vec<Value>, String> {
    let file = values_file(dir, case, values);
    let out = run(
        dir,
        &[
            "template",
            RELEASE,
            &chart.display().to_string(),
            "--namespace",
            NAMESPACE,
            "-f",
            &file.display().to_string(),
        ],
    );
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(documents(case, &String::from_utf8_lossy(&out.stdout)))
}

/// `helm lint --strict` of `chart` with the case's values.
pub fn lint(dir: &Path, chart: &Path, case: &str, values: &Value) -> Output {
    let file = values_file(dir, case, values);
    run(
        dir,
        &[
            "lint",
            "--strict",
            &chart.display().to_string(),
            "--namespace",
            NAMESPACE,
            "-f",
            &file.display().to_string(),
        ],
    )
}
