//! What an MPS daemon is made of on the node: directories, a tmpfs, the
//! `nvidia-cuda-mps-control` daemon and its client. Behind a trait so the
//! preparer's ordering and crash recovery are tested with a recorder; the
//! real thing is [`LocalMps`], exercised by the integration tests with a
//! fake `nvidia-cuda-mps-control`.

use std::fmt;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpu_dra_driver::bounded_file::{self, Links};

use super::error::Error;
use crate::process::read_stat;
use crate::state::checkpoint::{DaemonProcess, MpsDaemon};

/// The pid file `nvidia-cuda-mps-control -d` writes in its pipe directory.
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// The most of a pid file read (a number and a newline).
const PID_FILE_MAX: u64 = 64;
/// The most of a process's `/proc/<pid>/environ` read: the kernel caps
/// one process's arguments and environment at a quarter of its stack limit
/// (2 MiB by default); a larger one is not a process we started.
const ENVIRON_MAX: u64 = 4 << 20;
/// The most of the launcher's log quoted back in an error.
const LAUNCHER_LOG_MAX: u64 = 1 << 20;

/// The node side of an MPS daemon. Every method is idempotent: start-up
/// replays them after a crash at any point.
pub trait MpsHost: Send + Sync + fmt::Debug {
    /// Creates the root, `pipe/`, `log/` and `shm/` directories.
    fn create_dirs(&self, daemon: &MpsDaemon) -> Result<(), Error>;
    /// Mounts a tmpfs on `shm/` unless one is there.
    fn mount_shm(&self, daemon: &MpsDaemon) -> Result<(), Error>;
    /// Runs `nvidia-cuda-mps-control -d` (which daemonizes) and waits for
    /// the launcher to return.
    fn start(&self, daemon: &MpsDaemon) -> Result<(), Error>;
    /// Sends one command line to the daemon through its client; its answer.
    fn control(&self, daemon: &MpsDaemon, command: &str) -> Result<String, Error>;
    /// The daemon process named by the pid file, if it runs.
    fn find_process(&self, daemon: &MpsDaemon) -> Option<DaemonProcess>;
    /// Every running process started for the daemon's pipe directory (the
    /// daemon, a launcher or client a dead plugin left behind), found by
    /// its environment rather than by the pid file.
    fn strays(&self, daemon: &MpsDaemon) -> Vec<DaemonProcess>;
    /// Whether `process` still runs (same pid and start time, not a zombie).
    fn is_running(&self, process: &DaemonProcess) -> bool;
    /// Whether `process` runs and is the one the plugin started for
    /// `daemon`: same pid and start time, and its environment names the
    /// daemon's pipe directory. Only such a process is ever signalled.
    fn is_daemon_of(&self, daemon: &MpsDaemon, process: &DaemonProcess) -> bool;
    /// SIGKILL, if `process` still runs.
    fn kill(&self, process: &DaemonProcess);
    /// Unmounts `shm/` if mounted.
    fn unmount_shm(&self, daemon: &MpsDaemon) -> Result<(), Error>;
    /// Removes the root directory and everything under it.
    fn remove_dirs(&self, daemon: &MpsDaemon) -> Result<(), Error>;
}

/// The driver root's `nvidia-cuda-mps-control`, run on this node.
#[derive(Debug, Clone)]
pub struct LocalMps {
    control: PathBuf,
    /// Where the driver's libraries are (its `libcuda.so.1`), for
    /// `LD_LIBRARY_PATH`: the binary runs from the driver root without a
    /// chroot.
    library_dir: Option<PathBuf>,
    /// Bound on one client call and on the launcher.
    command_timeout: Duration,
    /// This program, to start the daemon through `mps-launch` (its own
    /// mount namespace with the claim's tmpfs on `/dev/shm`); `None`: run
    /// the daemon directly (it then shares the plugin's `/dev/shm`).
    launcher: Option<PathBuf>,
    /// Ask `mps-supervisor` to launch daemons (waiting this long for it)
    /// instead of launching them from this process.
    supervised: Option<Duration>,
}

impl LocalMps {
    pub fn new(control: PathBuf, library_dir: Option<PathBuf>) -> Self {
        Self { control, library_dir, command_timeout: Duration::from_secs(10), launcher: None, supervised: None }
    }

    /// The driver root's `nvidia-cuda-mps-control`, as
    /// [`crate::host::driver_files`] found it, launched through this
    /// program's `mps-launch`; none (with a warning) when this program
    /// cannot be found.
    pub fn from_driver(tool: crate::host::driver_files::DriverTool) -> Option<Self> {
        let host = Self::new(tool.binary, tool.library_dir);
        match std::env::current_exe() {
            Ok(program) => Some(host.with_launcher(program)),
            Err(error) => {
                tracing::warn!(%error, "cannot find this program to launch MPS daemons: claims asking for MPS will fail");
                None
            }
        }
    }

    /// Has daemons launched by the pod's `mps-supervisor` (see
    /// [`super::supervisor`]).
    pub fn supervised(mut self) -> Self {
        self.supervised = Some(self.command_timeout * 3);
        self
    }

    /// Starts daemons through `<program> mps-launch`.
    pub fn with_launcher(mut self, program: PathBuf) -> Self {
        self.launcher = Some(program);
        self
    }

    fn command(&self, daemon: &MpsDaemon) -> Command {
        let mut command = Command::new(&self.control);
        self.with_env(&mut command, daemon);
        command
    }

    fn with_env(&self, command: &mut Command, daemon: &MpsDaemon) {
        command.env("CUDA_MPS_PIPE_DIRECTORY", daemon.pipe_dir()).env("CUDA_MPS_LOG_DIRECTORY", daemon.log_dir());
        if let Some(dir) = &self.library_dir {
            command.env("LD_LIBRARY_PATH", dir);
        }
    }

    fn wait(&self, child: &mut Child, what: &str) -> Result<std::process::ExitStatus, Error> {
        let deadline = Instant::now() + self.command_timeout;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(Error::TimedOut { what: what.to_owned(), after: self.command_timeout });
                }
                Err(source) => return Err(Error::Wait { what: what.to_owned(), source }),
            }
        }
    }
}

/// Refuses a daemon whose root, `pipe/`, `log/` or `shm/` is a symlink or
/// not a directory (missing ones are fine): the plugin made them as real
/// directories, and nothing is mounted, written, unmounted or removed
/// through a link someone put there.
pub fn check_real_dirs(daemon: &MpsDaemon) -> Result<(), Error> {
    for dir in [daemon.root.clone(), daemon.pipe_dir(), daemon.log_dir(), daemon.shm_dir()] {
        match fs::symlink_metadata(&dir) {
            Ok(meta) if meta.file_type().is_symlink() => return Err(Error::LinkedDir(dir)),
            Ok(meta) if !meta.is_dir() => return Err(Error::NotADir(dir)),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(Error::Inspect { path: dir, source }),
        }
    }
    Ok(())
}

impl MpsHost for LocalMps {
    fn create_dirs(&self, daemon: &MpsDaemon) -> Result<(), Error> {
        check_real_dirs(daemon)?;
        for dir in [daemon.root.clone(), daemon.pipe_dir(), daemon.log_dir(), daemon.shm_dir()] {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&dir)
                .map_err(|source| Error::CreateDir { path: dir.clone(), source })?;
        }
        check_real_dirs(daemon)
    }

    fn mount_shm(&self, daemon: &MpsDaemon) -> Result<(), Error> {
        check_real_dirs(daemon)?;
        let shm = daemon.shm_dir();
        if is_mounted(&shm)? {
            return Ok(());
        }
        use rustix::mount::{MountFlags, mount};
        // Half the node's memory, as NVIDIA sizes it; pages are used only
        // when written.
        let data = c"size=50%,mode=1777";
        mount("shm", &shm, "tmpfs", MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC, data)
            .map_err(|source| Error::Mount { path: shm.clone(), source })
    }

    fn start(&self, daemon: &MpsDaemon) -> Result<(), Error> {
        if let Some(within) = self.supervised {
            return super::launch_request::request_launch(daemon, within);
        }
        check_real_dirs(daemon)?;
        let launcher_log = daemon.log_dir().join("launcher.log");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&launcher_log)
            .and_then(|file| {
                if file.metadata()?.is_file() { Ok(file) } else { Err(std::io::Error::other("not a regular file")) }
            })
            .map_err(|source| Error::OpenLog { path: launcher_log.clone(), source })?;
        let err = log.try_clone().map_err(|source| Error::OpenLog { path: launcher_log.clone(), source })?;
        let mut command = match &self.launcher {
            Some(program) => {
                let mut command = Command::new(program);
                command
                    .arg("mps-launch")
                    .arg("--shm")
                    .arg(daemon.shm_dir())
                    .arg("--mps-dir")
                    .arg(daemon.root.parent().unwrap_or(&daemon.root))
                    .arg("--")
                    .arg(&self.control);
                self.with_env(&mut command, daemon);
                command
            }
            None => self.command(daemon),
        };
        // Its own process group: a signal to the plugin's group does not
        // reach the daemon, which must outlive the plugin.
        command
            .arg("-d")
            .env("CUDA_VISIBLE_DEVICES", daemon.visible.join(","))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .process_group(0);
        let mut child = command.spawn().map_err(|source| Error::Launch { program: self.control.clone(), source })?;
        let what = format!("{} -d", self.control.display());
        let status = self.wait(&mut child, &what)?;
        if status.success() {
            return Ok(());
        }
        let said = bounded_file::read_to_string(&launcher_log, LAUNCHER_LOG_MAX, Links::Refuse)
            .unwrap_or_else(|e| e.problem.to_string());
        Err(Error::Failed { what, status, said: last_lines(&said) })
    }

    fn control(&self, daemon: &MpsDaemon, line: &str) -> Result<String, Error> {
        let what = format!("echo {line} | {}", self.control.display());
        let mut child = self
            .command(daemon)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| Error::Spawn { what: what.clone(), source })?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(format!("{line}\n").as_bytes())
                .map_err(|source| Error::WriteStdin { what: what.clone(), source })?;
        }
        let status = self.wait(&mut child, &what)?;
        let mut out = String::new();
        let mut complaint = String::new();
        if let Some(mut stdout) = child.stdout.take() {
            let _ = stdout.read_to_string(&mut out);
        }
        if let Some(mut stderr) = child.stderr.take() {
            let _ = stderr.read_to_string(&mut complaint);
        }
        if status.success() {
            Ok(out.trim().to_owned())
        } else {
            Err(Error::Failed { what, status, said: format!("{out} {complaint}").trim().to_owned() })
        }
    }

    fn find_process(&self, daemon: &MpsDaemon) -> Option<DaemonProcess> {
        check_real_dirs(daemon).ok()?;
        let text = bounded_file::read_to_string(&daemon.pipe_dir().join(PID_FILE), PID_FILE_MAX, Links::Refuse).ok()?;
        let pid: i32 = text.trim().parse().ok()?;
        // The pid file may outlive its daemon and the pid be reused: only a
        // process started for this pipe directory is ours.
        started_for(pid, &daemon.pipe_dir())
    }

    fn strays(&self, daemon: &MpsDaemon) -> Vec<DaemonProcess> {
        let me = std::process::id();
        let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
            .filter(|pid| u32::try_from(*pid).ok() != Some(me))
            .filter_map(|pid| started_for(pid, &daemon.pipe_dir()))
            .collect()
    }

    fn is_running(&self, process: &DaemonProcess) -> bool {
        read_stat(process.pid).is_some_and(|s| s.state != 'Z' && s.start_time == process.start_time)
    }

    fn is_daemon_of(&self, daemon: &MpsDaemon, process: &DaemonProcess) -> bool {
        started_for(process.pid, &daemon.pipe_dir()) == Some(*process)
    }

    fn kill(&self, process: &DaemonProcess) {
        if !self.is_running(process) {
            return;
        }
        if let Some(pid) = rustix::process::Pid::from_raw(process.pid) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }

    fn unmount_shm(&self, daemon: &MpsDaemon) -> Result<(), Error> {
        check_real_dirs(daemon)?;
        let shm = daemon.shm_dir();
        if !is_mounted(&shm)? {
            return Ok(());
        }
        use rustix::mount::{UnmountFlags, unmount};
        match unmount(&shm, UnmountFlags::empty()) {
            // A container that still has it open keeps it until it exits.
            Err(rustix::io::Errno::BUSY) => unmount(&shm, UnmountFlags::DETACH),
            other => other,
        }
        .map_err(|source| Error::Unmount { path: shm, source })
    }

    fn remove_dirs(&self, daemon: &MpsDaemon) -> Result<(), Error> {
        // `remove_dir_all` never follows a link inside; the root itself is
        // checked too.
        check_real_dirs(daemon)?;
        if is_mounted(&daemon.shm_dir())? {
            return Err(Error::StillMounted { shm: daemon.shm_dir(), root: daemon.root.clone() });
        }
        match fs::remove_dir_all(&daemon.root) {
            Err(source) if source.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::RemoveDir { path: daemon.root.clone(), source })
            }
            _ => Ok(()),
        }
    }
}

/// `pid`, if it runs and was started with `CUDA_MPS_PIPE_DIRECTORY=pipe`.
fn started_for(pid: i32, pipe: &Path) -> Option<DaemonProcess> {
    let stat = read_stat(pid)?;
    let environ = bounded_file::read(Path::new(&format!("/proc/{pid}/environ")), ENVIRON_MAX, Links::Refuse).ok()?;
    let ours = format!("CUDA_MPS_PIPE_DIRECTORY={}", pipe.display());
    let is_ours = environ.split(|b| *b == 0).any(|var| var == ours.as_bytes());
    (stat.state != 'Z' && is_ours).then_some(DaemonProcess { pid, start_time: stat.start_time })
}

fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" / ")
}

/// Whether `path` is a mount point in this mount namespace.
pub fn is_mounted(path: &Path) -> Result<bool, Error> {
    let target = match fs::canonicalize(path) {
        Ok(target) => target,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => return Err(Error::Resolve { path: path.to_path_buf(), source }),
    };
    let table = fs::read_to_string("/proc/self/mountinfo").map_err(Error::MountInfo)?;
    Ok(mount_points(&table).any(|p| Path::new(&p) == target))
}

/// The mount points of a `mountinfo` table (field 5, octal escapes
/// decoded).
pub fn mount_points(table: &str) -> impl Iterator<Item = String> + '_ {
    table.lines().filter_map(|line| line.split(' ').nth(4)).map(unescape)
}

fn unescape(field: &str) -> String {
    let mut out = Vec::with_capacity(field.len());
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(code) = field.get(i + 1..i + 4).and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(code);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_unescaped() {
        let table = "36 35 98:0 / /mnt/with\\040space rw - tmpfs shm rw\n37 35 98:0 / /run rw - tmpfs t rw\n";
        assert_eq!(mount_points(table).collect::<Vec<_>>(), ["/mnt/with space", "/run"]);
    }

    #[test]
    fn strays_are_found_by_their_pipe_directory() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = MpsDaemon::at(dir.path().to_path_buf());
        let host = LocalMps::new("/nonexistent".into(), None);
        let mut stray =
            Command::new("sleep").arg("30").env("CUDA_MPS_PIPE_DIRECTORY", daemon.pipe_dir()).spawn().unwrap();
        // Its environment is readable only once its exec is done.
        crate::process::wait_for_exec(stray.id());
        let found = host.strays(&daemon);
        assert_eq!(found.iter().map(|p| p.pid).collect::<Vec<_>>(), [stray.id() as i32]);
        host.kill(&found[0]);
        assert!(!stray.wait().unwrap().success());
        assert!(host.strays(&daemon).is_empty());
    }

    #[test]
    fn this_process_is_running_and_a_recycled_pid_is_not() {
        let host = LocalMps::new("/nonexistent".into(), None);
        let pid = std::process::id() as i32;
        let stat = read_stat(pid).unwrap();
        let me = DaemonProcess { pid, start_time: stat.start_time };
        assert!(host.is_running(&me));
        assert!(!host.is_running(&DaemonProcess { start_time: stat.start_time + 1, ..me }));
    }
}
