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
//!
//! The supervisor runs as root beside the plugin, so it trusts nothing in
//! the directory it watches: it acts only on `<state-dir>/mps/<claimUID>`
//! for a claim whose checkpoint record has an MPS daemon (the plugin
//! records it before it asks), launches that record's devices in the
//! directory derived from the UID, opens nothing through a symlink, and
//! writes only inside that directory. Anything else is left alone, with
//! one log line.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpu_dra_driver::bounded_file::Dir;
use gpu_dra_driver::names::ClaimUid;

use super::error::Error;
use super::host::{LocalMps, MpsHost};
use super::launch_request::{MESSAGE_MAX, Outcome, REQUEST, RESULT, Request};
use crate::state::checkpoint::{CheckpointDir, MpsDaemon};
use crate::state::durable;

/// Where the supervisor looks: the plugin's state directory.
#[derive(Debug, Clone)]
pub struct Watched {
    /// `<state-dir>/mps`: one directory per claim's daemon.
    pub mps_dir: PathBuf,
    /// `<state-dir>/checkpoint`: which claims have daemons (read only).
    pub checkpoint: CheckpointDir,
}

impl Watched {
    pub fn new(state_dir: &Path) -> Self {
        Self { mps_dir: state_dir.join("mps"), checkpoint: CheckpointDir::existing(state_dir.join("checkpoint")) }
    }
}

/// Entries refused, with why, so each is logged once while it stays.
pub type Refused = HashMap<String, String>;

/// Launches the pending requests under `watched.mps_dir` once.
pub fn serve_once(host: &LocalMps, watched: &Watched, refused: &mut Refused) {
    let Ok(dir) = Dir::open(&watched.mps_dir) else { return };
    let Ok(entries) = std::fs::read_dir(&watched.mps_dir) else { return };
    let mut present = Vec::new();
    for name in entries.flatten().filter_map(|e| e.file_name().to_str().map(str::to_owned)) {
        present.push(name.clone());
        match pending(&dir, watched, &name) {
            Ok(None) => {
                refused.remove(&name);
            }
            Ok(Some(daemon)) => {
                refused.remove(&name);
                answer(host, &daemon);
            }
            Err(reason) => {
                if refused.get(&name) != Some(&reason) {
                    tracing::warn!(dir = %watched.mps_dir.join(&name).display(), %reason, "MPS launch request refused; left alone");
                    refused.insert(name, reason);
                }
            }
        }
    }
    refused.retain(|name, _| present.contains(name));
}

/// The daemon `name`'s pending request asks for (taking the request), if
/// any; an error when there is something there the supervisor must not
/// act on.
fn pending(dir: &Dir, watched: &Watched, name: &str) -> Result<Option<MpsDaemon>, String> {
    let root = dir.subdir(name).map_err(|e| format!("not a directory the plugin made (a symbolic link?): {e}"))?;
    match root.entry_kind(REQUEST).map_err(|e| e.to_string())? {
        None => return Ok(None),
        Some(rustix::fs::FileType::RegularFile) => {}
        Some(_) => return Err(format!("{REQUEST} is not a regular file")),
    }
    let uid = ClaimUid::new(name).map_err(|e| format!("the directory is not named by a claim UID: {e}"))?;
    let record = watched
        .checkpoint
        .read_one(&uid)
        .map_err(|e| format!("the claim's checkpoint record is unusable: {e}"))?
        .ok_or_else(|| "no claim with this UID is in the checkpoint: nothing to launch".to_owned())?;
    let recorded = record.mps.ok_or_else(|| "the claim's checkpoint record has no MPS daemon".to_owned())?;
    let bytes = root.read(REQUEST, MESSAGE_MAX).map_err(|e| e.problem.to_string())?;
    root.remove_file(REQUEST).map_err(|e| format!("removing {REQUEST}: {e}"))?;
    serde_json::from_slice::<Request>(&bytes).map_err(|e| format!("unreadable {REQUEST}: {e}"))?;
    // The devices are the record's and the directory derived from the UID:
    // nothing the request file says leads elsewhere.
    Ok(Some(daemon_at(watched.mps_dir.join(uid.as_str()), recorded.visible)))
}

/// Launches `daemon` and writes the outcome in its directory.
fn answer(host: &LocalMps, daemon: &MpsDaemon) {
    let outcome = match host.start(daemon) {
        Ok(()) => {
            tracing::info!(dir = %daemon.root.display(), "launched an MPS daemon");
            Outcome { error: None }
        }
        Err(error) => Outcome { error: Some(error.to_string()) },
    };
    // Written in the directory itself (checked again: not a symlink).
    let written = Dir::open(&daemon.root)
        .and_then(|_| serde_json::to_vec(&outcome).map_err(std::io::Error::other))
        .and_then(|bytes| durable::write(&daemon.root, RESULT, &bytes, 0o600));
    if let Err(error) = written {
        tracing::error!(dir = %daemon.root.display(), %error, "cannot answer a launch request");
    }
}

fn daemon_at(root: PathBuf, visible: Vec<String>) -> MpsDaemon {
    MpsDaemon { visible, ..MpsDaemon::at(root) }
}

/// Serves launch requests until the process is stopped: the daemons it
/// launches become its children (child subreaper), reaped as they exit.
pub fn run(host: &LocalMps, state_dir: &Path) -> Result<(), Error> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).map_err(Error::Subreaper)?;
    let watched = Watched::new(state_dir);
    tracing::info!(dir = %watched.mps_dir.display(), "serving MPS launch requests");
    let mut refused = Refused::new();
    loop {
        serve_once(host, &watched, &mut refused);
        while let Ok(Some(_)) = rustix::process::waitpid(None, rustix::process::WaitOptions::NOHANG) {}
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::mps::launch_request::request_launch;
    use crate::state::checkpoint::test_support::record;

    const UID: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";

    fn has_request(dir: &Path) -> bool {
        std::fs::read_dir(dir).into_iter().flatten().flatten().any(|e| e.path().join(REQUEST).exists())
    }

    /// A state directory whose checkpoint holds `uid` with an MPS daemon.
    fn state_with_claim(uid: &str) -> (tempfile::TempDir, Watched, MpsDaemon) {
        let state = tempfile::tempdir().unwrap();
        let watched = Watched::new(state.path());
        let daemon = daemon_at(watched.mps_dir.join(uid), vec!["GPU-0".into()]);
        let mut r = record(uid, &["gpu-0"]);
        r.mps = Some(daemon.clone());
        let checkpoint = CheckpointDir::open(watched.checkpoint.path()).unwrap();
        checkpoint.write(&ClaimUid::new(uid).unwrap(), &r).unwrap();
        std::fs::create_dir_all(daemon.log_dir()).unwrap();
        (state, watched, daemon)
    }

    #[test]
    fn a_request_is_answered_with_the_launch_outcome() {
        let (_state, watched, daemon) = state_with_claim(UID);
        for (program, ok) in [("/bin/true", true), ("/bin/false", false)] {
            let host = LocalMps::new(program.into(), None);
            let answer = std::thread::scope(|scope| {
                scope.spawn(|| {
                    while !has_request(&watched.mps_dir) {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    serve_once(&host, &watched, &mut Refused::new());
                });
                request_launch(&daemon, Duration::from_secs(10))
            });
            assert_eq!(answer.is_ok(), ok, "{answer:?}");
            if let Err(error) = answer.map_err(|e| e.to_string()) {
                assert!(error.contains("the MPS supervisor could not launch the daemon"), "{error}");
            }
        }
        let error = request_launch(&daemon, Duration::from_millis(100)).unwrap_err().to_string();
        assert!(error.contains("no MPS supervisor answered"), "{error}");
        assert!(!has_request(&watched.mps_dir), "an unanswered request is withdrawn");
    }

    /// Requests in directories no claim owns, through symlinks, or whose
    /// log directory leads elsewhere launch nothing and write nothing
    /// outside; each is noted once.
    #[test]
    fn requests_it_must_not_act_on_are_left_alone() {
        let (state, watched, daemon) = state_with_claim(UID);
        let outside = state.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join(REQUEST), br#"{"visible":["GPU-X"]}"#).unwrap();
        let request = br#"{"visible":["GPU-0"]}"#;
        // No such claim.
        let stranger = watched.mps_dir.join("1b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a");
        std::fs::create_dir_all(stranger.join("log")).unwrap();
        std::fs::write(stranger.join(REQUEST), request).unwrap();
        // A claim's directory that is a symlink to the outside.
        let (_other_state, _, linked) = state_with_claim("2b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a");
        let linked = watched.mps_dir.join(linked.root.file_name().unwrap());
        std::os::unix::fs::symlink(&outside, &linked).unwrap();
        // The claim's own directory with its log directory linked outside.
        std::fs::remove_dir(daemon.log_dir()).unwrap();
        std::os::unix::fs::symlink(&outside, daemon.log_dir()).unwrap();
        std::fs::write(daemon.root.join(REQUEST), request).unwrap();
        let host = LocalMps::new("/bin/true".into(), None);
        let mut refused = Refused::new();
        for _ in 0..3 {
            serve_once(&host, &watched, &mut refused);
        }
        assert!(refused[&stranger.file_name().unwrap().to_string_lossy().into_owned()].contains("no claim"));
        assert!(refused[&linked.file_name().unwrap().to_string_lossy().into_owned()].contains("not a directory"));
        assert!(stranger.join(REQUEST).exists() && !stranger.join(RESULT).exists());
        let mut outside_now: Vec<_> = std::fs::read_dir(&outside).unwrap().flatten().map(|e| e.file_name()).collect();
        outside_now.sort();
        assert_eq!(outside_now, [REQUEST], "nothing written outside");
        // The claim's own request is answered (in its directory) with why.
        let result = std::fs::read_to_string(daemon.root.join(RESULT)).unwrap();
        assert!(result.contains("is a symbolic link"), "{result}");
    }
}
