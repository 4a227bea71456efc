//! One control-plane process: its own process group (so a command that
//! forks leaves nothing behind), killed with the group on drop, and killed
//! by the kernel if the test process dies first (parent-death signal).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use rustix::process::{Pid, Signal};

pub struct ControlPlaneProcess {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl ControlPlaneProcess {
    /// Starts `program args` with standard output and error in `log`.
    pub fn spawn(name: &'static str, program: &Path, args: &[String], log: PathBuf) -> std::io::Result<Self> {
        let out = std::fs::File::create(&log)?;
        let mut command = Command::new(program);
        command.args(args).stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out).process_group(0);
        // SAFETY: the closure only makes one async-signal-safe system call
        // (prctl) between fork and exec.
        unsafe {
            command.pre_exec(|| {
                rustix::process::set_parent_process_death_signal(Some(Signal::KILL)).map_err(std::io::Error::from)
            });
        }
        let child = command
            .spawn()
            .map_err(|e| std::io::Error::new(e.kind(), format!("starting {}: {e}", program.display())))?;
        Ok(Self { name, child, log })
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// `Some(description)` once the process has exited.
    pub fn exited(&mut self) -> Option<String> {
        self.child.try_wait().ok().flatten().map(|status| format!("{} exited: {status}", self.name))
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// SIGKILL to the whole group, then reap the leader.
    pub fn kill(&mut self) {
        if let Some(group) = i32::try_from(self.child.id()).ok().and_then(Pid::from_raw) {
            let _ = rustix::process::kill_process_group(group, Signal::KILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ControlPlaneProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
