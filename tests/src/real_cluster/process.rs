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

    /// The process's id (the leader of its group).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(description)` once the process has exited.
    pub fn exited(&mut self) -> Option<String> {
        self.child.try_wait().ok().flatten().map(|status| format!("{} exited: {status}", self.name))
    }

    /// The last `lines` lines of its log.
    /// The last `lines` lines of the log, a run of lines that differ only
    /// in their klog header (`E1126 18:55:52.440616   13555 `) shown once
    /// with its count, so that a retry loop does not hide what came before.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let collapsed = collapse_repeats(text.lines());
        collapsed[collapsed.len().saturating_sub(lines)..].join("\n")
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

/// Lines with runs of repeats (the same message under another klog
/// header) folded into the first, with how many followed.
fn collapse_repeats<'a>(lines: impl Iterator<Item = &'a str>) -> Vec<String> {
    // klog: severity+date, time, thread id, then the message.
    let message = |line: &'a str| -> &'a str {
        let mut rest = line;
        for _ in 0..3 {
            rest = rest.trim_start().split_once(char::is_whitespace).map_or("", |(_, r)| r);
        }
        if rest.is_empty() { line } else { rest }
    };
    let mut out: Vec<String> = Vec::new();
    let mut previous: Option<&str> = None;
    let mut repeats = 0usize;
    let flush = |out: &mut Vec<String>, repeats: usize| {
        if repeats > 0 {
            out.push(format!("    (the line above {repeats} more times)"));
        }
    };
    for line in lines {
        if previous.is_some_and(|p| message(p) == message(line)) {
            repeats += 1;
            continue;
        }
        flush(&mut out, repeats);
        repeats = 0;
        out.push(line.to_string());
        previous = Some(line);
    }
    flush(&mut out, repeats);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn repeated_klog_messages_are_folded() {
        let log = "I1126 18:54:18.1   1 a.go:1] start\n\
                   E1126 18:55:52.4   13555 c.go:435] failed: not created yet\n\
                   E1126 18:55:52.5   13555 c.go:435] failed: not created yet\n\
                   E1126 18:55:52.6   13555 c.go:435] failed: not created yet\n\
                   I1126 18:55:53.0   1 a.go:2] done";
        let lines: Vec<&str> = log.lines().map(str::trim).collect();
        assert_eq!(
            super::collapse_repeats(lines.into_iter()),
            [
                "I1126 18:54:18.1   1 a.go:1] start",
                "E1126 18:55:52.4   13555 c.go:435] failed: not created yet",
                "    (the line above 2 more times)",
                "I1126 18:55:53.0   1 a.go:2] done",
            ]
        );
    }
}
