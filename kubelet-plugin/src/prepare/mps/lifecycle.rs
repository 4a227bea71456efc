//! Bringing a claim's MPS daemon up and down, in an order that a crash at
//! any step leaves recoverable: the whole daemon (directories, mount,
//! limits) is in the claim's `PrepareStarted` record before the first step,
//! and every step of [`tear_down`] works on whatever part exists, so
//! start-up rolls an interrupted prepare back by tearing down, and brings
//! a completed claim's vanished daemon up again with the same limits.

use std::time::{Duration, Instant};

use super::error::Error;
use super::host::MpsHost;
use crate::prepare::sharing::{ComputeMode, GpuControl};
use crate::state::checkpoint::{CheckpointError, MpsDaemon};

/// How long prepare waits for a daemon to answer, and unprepare for it to
/// exit after `quit`.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub ready: Duration,
    pub exit: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self { ready: Duration::from_secs(20), exit: Duration::from_secs(10) }
    }
}

/// The daemon's limits as NVIDIA's control daemon template pipes them.
pub fn limit_commands(daemon: &MpsDaemon) -> Vec<String> {
    daemon
        .active_thread_percentage
        .map(|p| format!("set_default_active_thread_percentage {p}"))
        .into_iter()
        .chain(
            daemon.pinned_limits.iter().map(|l| format!("set_default_device_pinned_mem_limit {} {}M", l.uuid, l.mib)),
        )
        .collect()
}

/// Sets the GPUs to `EXCLUSIVE_PROCESS`, creates the directories and the
/// tmpfs, starts the daemon, waits until it answers, records its process
/// (`record` writes the checkpoint), then applies the limits.
pub fn bring_up(
    host: &dyn MpsHost,
    gpus: &dyn GpuControl,
    daemon: &mut MpsDaemon,
    timeouts: Timeouts,
    record: &mut dyn FnMut(&MpsDaemon) -> Result<(), CheckpointError>,
) -> Result<(), Error> {
    for gpu in &daemon.gpus {
        gpus.set_compute_mode(gpu, ComputeMode::ExclusiveProcess)
            .map_err(|source| Error::ExclusiveMode { gpu: gpu.clone(), source })?;
    }
    host.create_dirs(daemon)?;
    host.mount_shm(daemon)?;
    host.start(daemon).map_err(|e| Error::Start(Box::new(e)))?;
    wait_ready(host, daemon, timeouts.ready)?;
    daemon.process = host.find_process(daemon);
    record(daemon)?;
    for command in limit_commands(daemon) {
        host.control(daemon, &command).map_err(|e| Error::Limit { command: command.clone(), source: Box::new(e) })?;
    }
    Ok(())
}

/// Polls `get_default_active_thread_percentage` until the daemon answers.
fn wait_ready(host: &dyn MpsHost, daemon: &MpsDaemon, within: Duration) -> Result<(), Error> {
    let deadline = Instant::now() + within;
    loop {
        let error = match host.control(daemon, "get_default_active_thread_percentage") {
            Ok(_) => return Ok(()),
            Err(error) => error,
        };
        if Instant::now() >= deadline {
            return Err(Error::NotReady {
                pipe_dir: daemon.pipe_dir(),
                within,
                last: Box::new(error),
                log_dir: daemon.log_dir(),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Stops the daemon (`quit`, then SIGKILL if it has not exited within
/// `timeouts.exit`), unmounts the tmpfs and removes the directories. Works
/// on a daemon in any state, including one never started. The recorded
/// process is signalled only if it is still the one started for this
/// daemon (pid, start time and its environment naming the pipe directory).
pub fn tear_down(host: &dyn MpsHost, daemon: &MpsDaemon, timeouts: Timeouts) -> Result<(), Error> {
    let process = daemon.process.filter(|p| host.is_daemon_of(daemon, p)).or_else(|| host.find_process(daemon));
    if let Some(process) = process {
        if let Err(error) = host.control(daemon, "quit") {
            tracing::warn!(dir = %daemon.root.display(), %error, "the MPS daemon did not take `quit`; killing it");
        }
        let deadline = Instant::now() + timeouts.exit;
        while host.is_running(&process) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        host.kill(&process);
    }
    for stray in host.strays(daemon) {
        tracing::warn!(pid = stray.pid, dir = %daemon.root.display(), "killing a leftover process of an MPS daemon");
        host.kill(&stray);
    }
    host.unmount_shm(daemon)?;
    host.remove_dirs(daemon)
}

/// What is left of a daemon from before a reboot: no process survived
/// (and its pid may belong to another now), only the directories.
pub fn remove_leftovers(host: &dyn MpsHost, daemon: &MpsDaemon) -> Result<(), Error> {
    host.unmount_shm(daemon)?;
    host.remove_dirs(daemon)
}

/// Whether a completed claim's daemon still runs and answers.
pub fn is_healthy(host: &dyn MpsHost, daemon: &MpsDaemon) -> bool {
    daemon.process.is_some_and(|p| host.is_daemon_of(daemon, &p))
        && host.control(daemon, "get_default_active_thread_percentage").is_ok()
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::sync::Mutex;

    use std::os::unix::process::ExitStatusExt;

    use super::*;
    use crate::state::checkpoint::DaemonProcess;

    /// What a failing fake step answers.
    fn failed(what: &str) -> Error {
        Error::Failed { what: what.to_owned(), status: std::process::ExitStatus::from_raw(256), said: String::new() }
    }

    /// Records every call as text and keeps the daemon's state in memory;
    /// `fail` makes the named step fail.
    #[derive(Debug, Default)]
    pub struct FakeHost {
        pub calls: Mutex<Vec<String>>,
        pub running: Mutex<Option<DaemonProcess>>,
        pub fail: Mutex<Option<&'static str>>,
        pub next_pid: Mutex<i32>,
    }

    impl FakeHost {
        fn step(&self, call: String, name: &'static str) -> Result<(), Error> {
            self.calls.lock().unwrap().push(call);
            if *self.fail.lock().unwrap() == Some(name) { Err(failed(name)) } else { Ok(()) }
        }
    }

    impl MpsHost for FakeHost {
        fn create_dirs(&self, d: &MpsDaemon) -> Result<(), Error> {
            self.step(format!("dirs {}", d.root.display()), "dirs")
        }
        fn mount_shm(&self, _: &MpsDaemon) -> Result<(), Error> {
            self.step("mount".into(), "mount")
        }
        fn start(&self, d: &MpsDaemon) -> Result<(), Error> {
            self.step(format!("start {}", d.visible.join(",")), "start")?;
            let mut pid = self.next_pid.lock().unwrap();
            *pid += 1;
            *self.running.lock().unwrap() = Some(DaemonProcess { pid: 1000 + *pid, start_time: 7 });
            Ok(())
        }
        fn control(&self, _: &MpsDaemon, command: &str) -> Result<String, Error> {
            let name = command.split(' ').next().unwrap_or_default();
            let name: &'static str = match name {
                "quit" => "quit",
                "get_default_active_thread_percentage" => "get",
                _ => "set",
            };
            if self.running.lock().unwrap().is_none() {
                self.calls.lock().unwrap().push(format!("control {command} (no daemon)"));
                return Err(failed("no daemon"));
            }
            self.step(format!("control {command}"), name)?;
            if command == "quit" {
                *self.running.lock().unwrap() = None;
            }
            Ok("100.0".into())
        }
        fn find_process(&self, _: &MpsDaemon) -> Option<DaemonProcess> {
            *self.running.lock().unwrap()
        }
        fn strays(&self, _: &MpsDaemon) -> Vec<DaemonProcess> {
            Vec::new()
        }
        fn is_running(&self, p: &DaemonProcess) -> bool {
            *self.running.lock().unwrap() == Some(*p)
        }
        fn is_daemon_of(&self, _: &MpsDaemon, p: &DaemonProcess) -> bool {
            self.is_running(p)
        }
        fn kill(&self, p: &DaemonProcess) {
            if self.is_running(p) {
                self.calls.lock().unwrap().push("kill".into());
                *self.running.lock().unwrap() = None;
            }
        }
        fn unmount_shm(&self, _: &MpsDaemon) -> Result<(), Error> {
            self.step("unmount".into(), "unmount")
        }
        fn remove_dirs(&self, _: &MpsDaemon) -> Result<(), Error> {
            self.step("rmdirs".into(), "rmdirs")
        }
    }
}
