//! Runs the real `gpu-dra-controller run` binary against the API stand-in.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::controller;

/// The controller's own environment variables: removed from a test's
/// child so that only the flags it is given count.
pub const CONTROLLER_ENV: [&str; 6] =
    ["KUBECONFIG", "POD_NAMESPACE", "DRIVER_NAME", "EXPLAIN_AFTER", "LEADER_ELECT", "METRICS_ADDR"];

/// A running controller; killed (SIGKILL) when dropped.
pub struct ControllerProcess {
    child: Child,
    log: PathBuf,
}

impl ControllerProcess {
    /// Starts `gpu-dra-controller run --kubeconfig KUBECONFIG` with
    /// `extra_args`; standard error goes to a log file next to the
    /// kubeconfig. Lease timings are short so that tests see a failover in
    /// seconds.
    pub fn spawn(kubeconfig: &Path, identity: &str, extra_args: &[&str]) -> std::io::Result<Self> {
        Self::spawn_serving(kubeconfig, identity, "off", extra_args)
    }

    /// [`Self::spawn`] with `--metrics-addr metrics_addr` (e.g.
    /// `127.0.0.1:0`; the log's `serving /metrics` line has the port).
    pub fn spawn_serving(
        kubeconfig: &Path,
        identity: &str,
        metrics_addr: &str,
        extra_args: &[&str],
    ) -> std::io::Result<Self> {
        let dir = kubeconfig.parent().unwrap_or(Path::new("."));
        let log = dir.join(format!("controller-{identity}.log"));
        let stderr = std::fs::File::create(&log)?;
        let mut cmd = Command::new(controller());
        cmd.arg("run")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--namespace", "gpu-dra-driver", "--metrics-addr", metrics_addr, "--identity", identity])
            .args(["--leader-elect-lease-duration", "3s", "--leader-elect-renew-deadline", "2s"])
            .args(["--leader-elect-retry-period", "500ms"])
            .args(extra_args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        for var in CONTROLLER_ENV {
            cmd.env_remove(var);
        }
        Ok(Self { child: cmd.spawn()?, log })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, as a crash.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
