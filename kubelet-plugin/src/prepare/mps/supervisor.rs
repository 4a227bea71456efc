//! MPS daemons started by a longer-lived process than the plugin.
//!
//! A detached daemon still belongs to the plugin container's cgroup, which
//! the container runtime kills when the plugin's container restarts. With
//! `--mps-supervisor`, the plugin asks `gpu-kubelet-plugin mps-supervisor`
//! (a second container of the plugin's pod, sharing its process namespace
//! and state directory) to launch each daemon instead: the daemon then
//! lives in the supervisor's container and outlives the plugin's restarts.
//! Everything else (readiness, limits, `quit`, crash recovery) stays with
//! the plugin, through the pipe directory and the shared pids.
//!
//! The request is a file in the daemon's directory: the plugin writes
//! `launch.request` (the devices), the supervisor launches and answers in
//! `launch.result`. Both vanish with the directory on tear-down.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::host::{LocalMps, MpsHost};
use crate::checkpoint::MpsDaemon;
use crate::durable;

const REQUEST: &str = "launch.request";
const RESULT: &str = "launch.result";

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Request {
    visible: Vec<String>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Outcome {
    error: Option<String>,
}

/// Asks the supervisor to launch `daemon` and waits (up to `within`) for
/// its answer.
pub fn request_launch(daemon: &MpsDaemon, within: Duration) -> Result<(), String> {
    let _ = std::fs::remove_file(daemon.root.join(RESULT));
    let request = serde_json::to_vec(&Request { visible: daemon.visible.clone() })
        .map_err(|e| format!("encoding the launch request: {e}"))?;
    durable::write(&daemon.root, REQUEST, &request, 0o600)
        .map_err(|e| format!("writing {}: {e}", daemon.root.join(REQUEST).display()))?;
    let deadline = Instant::now() + within;
    let result = daemon.root.join(RESULT);
    loop {
        if let Ok(bytes) = std::fs::read(&result) {
            let _ = std::fs::remove_file(&result);
            let outcome: Outcome =
                serde_json::from_slice(&bytes).map_err(|e| format!("reading {}: {e}", result.display()))?;
            return match outcome.error {
                None => Ok(()),
                Some(error) => Err(format!("the MPS supervisor could not launch the daemon: {error}")),
            };
        }
        if Instant::now() >= deadline {
            let _ = std::fs::remove_file(daemon.root.join(REQUEST));
            return Err(format!(
                "no MPS supervisor answered within {within:?} (the plugin runs with --mps-supervisor: is the \
                 `gpu-kubelet-plugin mps-supervisor` container of its pod running on {}?)",
                daemon.root.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Launches the pending requests under `mps_dir` once.
pub fn serve_once(host: &LocalMps, mps_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(mps_dir) else { return };
    for root in entries.flatten().map(|e| e.path()) {
        let Ok(bytes) = std::fs::read(root.join(REQUEST)) else { continue };
        let _ = std::fs::remove_file(root.join(REQUEST));
        let outcome = match serde_json::from_slice::<Request>(&bytes) {
            Ok(request) => {
                let daemon = daemon_at(root.clone(), request.visible);
                match host.start(&daemon) {
                    Ok(()) => {
                        tracing::info!(dir = %root.display(), "launched an MPS daemon");
                        Outcome { error: None }
                    }
                    Err(error) => Outcome { error: Some(error) },
                }
            }
            Err(error) => Outcome { error: Some(format!("unreadable request: {error}")) },
        };
        let written = serde_json::to_vec(&outcome)
            .map_err(std::io::Error::other)
            .and_then(|bytes| durable::write(&root, RESULT, &bytes, 0o600));
        if let Err(error) = written {
            tracing::error!(dir = %root.display(), %error, "cannot answer a launch request");
        }
    }
}

fn daemon_at(root: PathBuf, visible: Vec<String>) -> MpsDaemon {
    MpsDaemon {
        root,
        devices: Vec::new(),
        visible,
        gpus: Vec::new(),
        active_thread_percentage: None,
        pinned_limits: Vec::new(),
        process: None,
    }
}

/// Serves launch requests until the process is stopped: the daemons it
/// launches become its children (child subreaper), reaped as they exit.
pub fn run(host: &LocalMps, mps_dir: &Path) -> Result<(), String> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(|e| format!("becoming the daemons' subreaper: {e}"))?;
    tracing::info!(dir = %mps_dir.display(), "serving MPS launch requests");
    loop {
        serve_once(host, mps_dir);
        while let Ok(Some(_)) = rustix::process::waitpid(None, rustix::process::WaitOptions::NOHANG) {}
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(dir: &Path) -> bool {
        std::fs::read_dir(dir).into_iter().flatten().flatten().any(|e| e.path().join(REQUEST).exists())
    }

    #[test]
    fn a_request_is_answered_with_the_launch_outcome() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = daemon_at(dir.path().join("uid"), vec!["GPU-0".into()]);
        std::fs::create_dir_all(daemon.log_dir()).unwrap();
        for (program, ok) in [("/bin/true", true), ("/bin/false", false)] {
            let host = LocalMps::new(program.into(), None);
            let answer = std::thread::scope(|scope| {
                scope.spawn(|| {
                    while !pending(dir.path()) {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    serve_once(&host, dir.path());
                });
                request_launch(&daemon, Duration::from_secs(10))
            });
            assert_eq!(answer.is_ok(), ok, "{answer:?}");
            if let Err(error) = answer {
                assert!(error.contains("the MPS supervisor could not launch the daemon"), "{error}");
            }
        }
        let error = request_launch(&daemon, Duration::from_millis(100)).unwrap_err();
        assert!(error.contains("no MPS supervisor answered"), "{error}");
        assert!(!pending(dir.path()), "an unanswered request is withdrawn");
    }
}
