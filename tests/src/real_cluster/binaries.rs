//! The control plane's binaries, built by `tests/kube-bins/build.sh` into a
//! cache outside the clone (once per machine and version) when missing.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

use crate::workspace_root;

/// Where one release's binaries are.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub kube_scheduler: PathBuf,
    pub etcd: PathBuf,
}

/// The binaries of Kubernetes `minor` (e.g. "1.37"), building them first if
/// the cache lacks them. Go is required: without it this fails, loudly.
pub fn binaries(minor: &str) -> Binaries {
    static BUILT: OnceLock<Mutex<HashMap<String, Binaries>>> = OnceLock::new();
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = built.get(minor) {
        return found.clone();
    }
    let script = workspace_root().join("tests/kube-bins/build.sh");
    eprintln!(
        "real cluster: {} {minor} (builds the Kubernetes {minor} binaries when the cache lacks them)",
        script.display()
    );
    let output = Command::new("bash")
        .arg(&script)
        .arg(minor)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{} {minor} failed ({}): the real-cluster tests need Go and the Go module proxy; see the README\n{stdout}",
        script.display(),
        output.status
    );
    let dir = |key: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key).map(PathBuf::from))
            .unwrap_or_else(|| panic!("{} printed no {key}: {stdout}", script.display()))
    };
    let kube = dir("kube-bin-dir=");
    let etcd = dir("etcd-bin-dir=");
    let found = Binaries {
        kube_apiserver: kube.join("kube-apiserver"),
        kube_controller_manager: kube.join("kube-controller-manager"),
        kube_scheduler: kube.join("kube-scheduler"),
        etcd: etcd.join("etcd"),
    };
    for path in [&found.kube_apiserver, &found.kube_controller_manager, &found.kube_scheduler, &found.etcd] {
        assert!(path.is_file(), "{} is missing after the build", path.display());
    }
    built.insert(minor.to_string(), found.clone());
    found
}
