//! Runs the real `gpu-kubelet-plugin run` binary in temporary kubelet
//! directories, for the cross-process tests (registration, gRPC, crash).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::kubelet_plugin;

/// The directories a plugin instance uses, under one temporary root that
/// outlives restarts of the process.
pub struct PluginDirs {
    pub root: tempfile::TempDir,
    pub plugins: PathBuf,
    pub registry: PathBuf,
    pub cdi: PathBuf,
    pub inventory: PathBuf,
    pub kubeconfig: PathBuf,
}

/// Whatever a plugin started under these directories (IMEX daemons, which
/// outlive a plugin by design so that the next one adopts them) ends with
/// them: a test leaves no process behind, passed or failed.
impl Drop for PluginDirs {
    fn drop(&mut self) {
        kill_processes_naming(self.root.path());
    }
}

/// SIGKILLs every process (but this one) whose command line names `dir`.
pub fn kill_processes_naming(dir: &Path) {
    // With the separator: `/tmp/.tmpAbc` must not match `/tmp/.tmpAbcd`.
    let mut needle = dir.as_os_str().as_encoded_bytes().to_vec();
    needle.push(b'/');
    let Ok(entries) = std::fs::read_dir("/proc") else { return };
    let me = std::process::id();
    for pid in entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
        if pid == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        if cmdline.windows(needle.len()).any(|w| w == needle.as_slice())
            && let Ok(pid) = i32::try_from(pid)
        {
            // SAFETY: kill(2) with a pid read from /proc; a process gone meanwhile is ESRCH.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

impl PluginDirs {
    /// Fresh directories; `inventory_yaml` becomes the fake inventory file.
    pub fn new(inventory_yaml: &str) -> std::io::Result<Self> {
        let root = tempfile::tempdir()?;
        let plugins = root.path().join("plugins");
        let registry = root.path().join("plugins_registry");
        let cdi = root.path().join("cdi");
        let inventory = root.path().join("inventory.yaml");
        std::fs::write(&inventory, inventory_yaml)?;
        let kubeconfig = root.path().join("kubeconfig");
        Ok(Self { root, plugins, registry, cdi, inventory, kubeconfig })
    }

    /// `<plugins>/<driver>`: the plugin's own directory (sockets, state).
    pub fn plugin_dir(&self, driver: &str) -> PathBuf {
        self.plugins.join(driver)
    }

    pub fn dra_socket(&self, driver: &str) -> PathBuf {
        self.plugin_dir(driver).join("dra.sock")
    }

    pub fn registration_socket(&self, driver: &str) -> PathBuf {
        self.registry.join(format!("{driver}-reg.sock"))
    }
}

/// Options beyond the directories.
#[derive(Debug, Clone)]
pub struct PluginOptions {
    pub node: String,
    pub driver: String,
    /// `--metrics-addr`; `off` by default so that tests can run in parallel.
    pub metrics_addr: String,
    pub log_level: String,
    pub extra_args: Vec<String>,
    /// Pass `--fake-inventory` (the directories' file); without it the
    /// plugin discovers through NVML (a mock one, see `tests/mock-nvml`).
    pub fake_inventory: bool,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
}

impl Default for PluginOptions {
    fn default() -> Self {
        Self {
            node: "node-a".into(),
            driver: "gpu.nvidia.com".into(),
            metrics_addr: "off".into(),
            log_level: "info".into(),
            extra_args: Vec::new(),
            fake_inventory: true,
            env: Vec::new(),
        }
    }
}

impl PluginOptions {
    /// The same options with `GPU_DRA_KILL_AT=<step>`: the plugin kills
    /// itself with SIGKILL when it reaches that step.
    pub fn killing_at(&self, step: &str) -> Self {
        let mut options = self.clone();
        options.env.push(("GPU_DRA_KILL_AT".into(), step.into()));
        options
    }
}

/// A running plugin process; killed (SIGKILL) when dropped.
pub struct PluginProcess {
    child: Child,
    log: PathBuf,
}

impl PluginProcess {
    /// Starts `gpu-kubelet-plugin run` with the directories and options.
    /// Standard error goes to a log file in the root (see [`Self::log`]);
    /// the environment is cleared of the plugin's variables.
    pub fn spawn(dirs: &PluginDirs, options: &PluginOptions) -> std::io::Result<Self> {
        let log = dirs.root.path().join(format!("plugin-{}.log", unique()));
        let stderr = std::fs::File::create(&log)?;
        let mut cmd = Command::new(kubelet_plugin());
        cmd.arg("run")
            .arg("--node-name")
            .arg(&options.node)
            .arg("--driver-name")
            .arg(&options.driver)
            .arg("--plugins-dir")
            .arg(&dirs.plugins)
            .arg("--registry-dir")
            .arg(&dirs.registry)
            .arg("--cdi-dir")
            .arg(&dirs.cdi)
            .args(if options.fake_inventory {
                vec!["--fake-inventory".into(), dirs.inventory.clone().into_os_string()]
            } else {
                Vec::new()
            })
            .arg("--fake-inventory-poll-ms")
            .arg("100")
            .arg("--kubeconfig")
            .arg(&dirs.kubeconfig)
            .arg("--metrics-addr")
            .arg(&options.metrics_addr)
            .arg("--log-level")
            .arg(&options.log_level)
            .args(&options.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        for var in [
            "NODE_NAME",
            "DRIVER_NAME",
            "FAKE_INVENTORY",
            "CDI_DIR",
            "PLUGINS_DIR",
            "REGISTRY_DIR",
            "STATE_DIR",
            "METRICS_ADDR",
            "KUBECONFIG",
            "LOG_FORMAT",
            "LOG_LEVEL",
        ] {
            cmd.env_remove(var);
        }
        cmd.envs(options.env.iter().map(|(k, v)| (k, v)));
        Ok(Self { child: cmd.spawn()?, log })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the plugin logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, signal: rustix::process::Signal) -> std::io::Result<()> {
        let pid = i32::try_from(self.child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .ok_or_else(|| std::io::Error::other("invalid pid"))?;
        rustix::process::kill_process(pid, signal).map_err(std::io::Error::from)
    }

    /// Waits for the process to exit, polling; `None` on timeout.
    pub fn wait_timeout(&mut self, timeout: Duration) -> std::io::Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then waits up to `timeout` for the exit.
    pub fn terminate(&mut self, timeout: Duration) -> std::io::Result<Option<ExitStatus>> {
        self.signal(rustix::process::Signal::TERM)?;
        self.wait_timeout(timeout)
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) -> std::io::Result<ExitStatus> {
        let _ = self.child.kill();
        self.child.wait()
    }

    /// Polls the log until `needle` appears or the process exits; returns
    /// the log line (or `None`).
    pub fn wait_for_log(&mut self, needle: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.log().lines().find(|l| l.contains(needle)) {
                return Some(line.to_owned());
            }
            if Instant::now() >= deadline || self.child.try_wait().ok().flatten().is_some() {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The address `--metrics-addr 127.0.0.1:0` bound, from the log's
    /// `serving /metrics` line (`None` if it never came).
    pub fn metrics_addr(&mut self, timeout: Duration) -> Option<String> {
        let line = self.wait_for_log("serving /metrics", timeout)?;
        line.split_whitespace().find_map(|w| w.strip_prefix("addr=")).map(str::to_owned)
    }
}

/// The body of `GET /metrics` at `addr` (a minimal blocking HTTP/1.1 GET).
pub fn scrape_metrics(addr: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    if !response.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(format!("GET /metrics: {response}")));
    }
    Ok(response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default())
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits until `path` exists (or not), polling.
pub fn wait_for_path(path: &Path, exists: bool, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while path.exists() != exists {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}
