//! The control plane's binaries, built by `tests/kube-bins/build.sh` into a
//! cache outside the clone (once per machine and version) when missing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
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
    static BUILT: BuiltOnce<Binaries> = OnceLock::new();
    let banner =
        format!("real cluster: {{script}} {minor} (builds the Kubernetes {minor} binaries when the cache lacks them)");
    let need = "the real-cluster tests need Go and the Go module proxy";
    built_once(&BUILT, &[minor], &banner, need, |printed| {
        let (kube, etcd) = (printed.path("kube-bin-dir="), printed.path("etcd-bin-dir="));
        Binaries {
            kube_apiserver: kube.join("kube-apiserver"),
            kube_controller_manager: kube.join("kube-controller-manager"),
            kube_scheduler: kube.join("kube-scheduler"),
            etcd: etcd.join("etcd"),
        }
    })
}

impl Built for Binaries {
    fn files(&self) -> Vec<&Path> {
        vec![&self.kube_apiserver, &self.kube_controller_manager, &self.kube_scheduler, &self.etcd]
    }
}

/// What `tests/kube-bins/build.sh` builds: files it says where it put.
pub(crate) trait Built: Clone {
    fn files(&self) -> Vec<&Path>;
}

/// What builds gave, by the build script's arguments, for the life of the
/// process.
pub(crate) type BuiltOnce<T> = OnceLock<Mutex<HashMap<String, T>>>;

/// What `tests/kube-bins/build.sh args` builds, as `read` finds it in what
/// the script printed, built the first time only: the script takes seconds
/// even when its cache is full. The lock is held through the build, so that
/// tests asking at once build once. A file the script named but did not
/// make is the build's fault: it fails here.
pub(crate) fn built_once<T: Built>(
    cache: &BuiltOnce<T>,
    args: &[&str],
    banner: &str,
    need: &str,
    read: impl FnOnce(&Printed) -> T,
) -> T {
    let mut built = cache.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    let found = built.entry(args.join(" ")).or_insert_with(|| {
        let found = read(&run_build_script(args, banner, need));
        for path in found.files() {
            assert!(path.is_file(), "{} is missing after the build", path.display());
        }
        found
    });
    found.clone()
}

/// What a build script printed: `key=path` lines.
pub struct Printed {
    script: PathBuf,
    stdout: String,
}

impl Printed {
    /// The path printed after `key` (e.g. `kube-bin-dir=`).
    pub fn path(&self, key: &str) -> PathBuf {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(key).map(PathBuf::from))
            .unwrap_or_else(|| panic!("{} printed no {key}: {}", self.script.display(), self.stdout))
    }
}

/// Runs `tests/kube-bins/build.sh args` (see [`run_script`]).
fn run_build_script(args: &[&str], banner: &str, need: &str) -> Printed {
    run_script(&workspace_root().join("tests/kube-bins/build.sh"), args, banner, need)
}

/// Runs the build script `script` with `args`, announcing it with `banner`
/// (`{script}` stands for its path); a failure names what the tests `need`.
pub fn run_script(script: &Path, args: &[&str], banner: &str, need: &str) -> Printed {
    let script = script.to_path_buf();
    eprintln!("{}", banner.replace("{script}", &script.display().to_string()));
    let output = Command::new("bash")
        .arg(&script)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{} {} failed ({}): {need}; see docs/contributing.md\n{stdout}",
        script.display(),
        args.join(" "),
        output.status
    );
    Printed { script, stdout }
}

/// The release's binaries if the cache already holds them, without
/// building anything (`tests/kube-bins/build.sh` decides the same paths:
/// the versions pinned in its `go.mod` files, under `$GPU_DRA_KUBE_CACHE`,
/// else `${XDG_CACHE_HOME:-~/.cache}/gpu-dra-driver`). The error says what
/// is missing and the command that builds it.
pub fn cached_binaries(minor: &str) -> Result<Binaries, String> {
    let here = workspace_root().join("tests/kube-bins");
    let pinned = |module: &str, path: &str| -> Result<String, String> {
        let file = here.join(module).join("go.mod");
        let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        text.lines()
            .find_map(|l| {
                let version = l.trim().strip_prefix(path)?.split_whitespace().next()?;
                version.starts_with('v').then(|| version.to_string())
            })
            .ok_or_else(|| format!("{} pins no {path}", file.display()))
    };
    let kube_version = pinned(&format!("k8s-{minor}"), "k8s.io/kubernetes ")?;
    let etcd_version = pinned("etcd", "go.etcd.io/etcd/server/v3 ")?;
    let cache = match std::env::var_os("GPU_DRA_KUBE_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
            .ok_or("neither GPU_DRA_KUBE_CACHE, XDG_CACHE_HOME nor HOME is set")?
            .join("gpu-dra-driver"),
    };
    let kube = cache.join("kube").join(&kube_version).join("bin");
    let etcd = cache.join("etcd").join(&etcd_version).join("bin");
    let found = Binaries {
        kube_apiserver: kube.join("kube-apiserver"),
        kube_controller_manager: kube.join("kube-controller-manager"),
        kube_scheduler: kube.join("kube-scheduler"),
        etcd: etcd.join("etcd"),
    };
    let missing: Vec<String> =
        [&found.kube_apiserver, &found.kube_controller_manager, &found.kube_scheduler, &found.etcd]
            .into_iter()
            .filter(|p| !p.is_file())
            .map(|p| p.display().to_string())
            .collect();
    if missing.is_empty() {
        return Ok(found);
    }
    Err(format!(
        "the Kubernetes {minor} control plane is not built (missing {}); build it once with `{} {minor}` \
         (needs Go and the Go module proxy; about 10 minutes of CPU per release on a small machine)",
        missing.join(", "),
        here.join("build.sh").display()
    ))
}
