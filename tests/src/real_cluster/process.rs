//! One control-plane process: its own process group (so a command that
//! forks leaves nothing behind), killed with the group on drop, and killed
//! by the kernel if the test process dies first (parent-death signal).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

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

    /// CPU time (user and system) the process has used so far, from
    /// `/proc/<pid>/stat`, in clock ticks' resolution; `None` once it is gone.
    pub fn cpu_time(&self) -> Option<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).ok()?;
        // Fields after the command name, which is in parentheses and may hold spaces.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        // SAFETY: sysconf only reads a configuration value.
        let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok().filter(|&t| t > 0)?;
        Some(Duration::from_micros(ticks * 1_000_000 / per_second))
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
