//! Which program a process runs and who owns it, as the kernel says:
//! never by its name or command line, which any process may choose.
//!
//! A process runs a [`Program`] when `/proc/<pid>/exe` is that very file
//! (same device and inode; a path or a copy does not count), or, when the
//! program is a `#!` script, when its executable is the script's
//! interpreter and the script argument resolves (through the process's own
//! root) to that file. A process is told apart from a later one of the
//! same pid by its start time (field 22 of `/proc/<pid>/stat`).

use std::io::Read as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use gpu_dra_driver::bounded_file::{self, Links};

/// The most of a command line or environment read.
const ARGS_MAX: u64 = 256 * 1024;

/// A file, by what it is rather than where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

/// `path`'s file (links followed) and its owner.
fn file_id(path: &Path) -> Option<(FileId, u32)> {
    let stat = rustix::fs::stat(path).ok()?;
    Some((FileId { dev: stat.st_dev, ino: stat.st_ino }, stat.st_uid))
}

/// A program on disk, e.g. the driver root's `nvidia-imex`.
#[derive(Debug, Clone)]
pub struct Program {
    pub path: PathBuf,
    file: FileId,
    owner: u32,
    /// A `#!` script's interpreter.
    interpreter: Option<FileId>,
}

impl Program {
    /// `None` when `path` is missing.
    pub fn at(path: &Path) -> Option<Self> {
        let (file, owner) = file_id(path)?;
        let mut head = [0u8; 256];
        let read = std::fs::File::open(path).and_then(|mut f| f.read(&mut head)).unwrap_or(0);
        let interpreter = head[..read]
            .strip_prefix(b"#!")
            .and_then(|line| line.split(|b| *b == b'\n').next())
            .and_then(|line| std::str::from_utf8(line).ok())
            .and_then(|line| line.split_whitespace().next())
            .and_then(|interpreter| file_id(Path::new(interpreter)))
            .map(|(id, _)| id);
        Some(Self { path: path.to_path_buf(), file, owner, interpreter })
    }

    /// Whether root owns the program file (a host's daemon runs one).
    pub fn owned_by_root(&self) -> bool {
        self.owner == 0
    }

    /// Whether `process` (read from `proc_dir`) runs this program.
    pub fn runs_in(&self, proc_dir: &Path, process: &Process) -> bool {
        if process.exe_file == self.file {
            return true;
        }
        // A script: the kernel runs `<interpreter> [arg] <script> <args>`.
        self.interpreter == Some(process.exe_file)
            && process.args.iter().skip(1).take(2).any(|arg| {
                let arg = Path::new(std::ffi::OsStr::from_bytes(arg));
                let seen = match arg.strip_prefix("/") {
                    Ok(relative) => proc_dir.join("root").join(relative),
                    Err(_) => proc_dir.join("cwd").join(arg),
                };
                file_id(&seen).is_some_and(|(id, _)| id == self.file)
            })
    }
}

/// A live process, as `/proc/<pid>` shows it.
#[derive(Debug, Clone)]
pub struct Process {
    pub pid: i32,
    pub start_time: u64,
    /// Real and effective user ids.
    pub uid: (u32, u32),
    /// Where `/proc/<pid>/exe` points, for records and messages.
    pub exe: PathBuf,
    exe_file: FileId,
    pub args: Vec<Vec<u8>>,
}

impl Process {
    /// `None` when it is gone, a zombie, or not ours to look at.
    pub fn read(proc_dir: &Path) -> Option<Self> {
        let pid = proc_dir.file_name()?.to_str()?.parse().ok()?;
        let stat = bounded_file::read_to_string(&proc_dir.join("stat"), 4096, Links::Follow).ok()?;
        let stat = parse_stat(&stat)?;
        if matches!(stat.state, 'Z' | 'X' | 'x') {
            return None;
        }
        let status = bounded_file::read_to_string(&proc_dir.join("status"), 64 * 1024, Links::Follow).ok()?;
        let uid = parse_uids(&status)?;
        let (exe_file, _) = file_id(&proc_dir.join("exe"))?;
        let exe = std::fs::read_link(proc_dir.join("exe")).ok()?;
        let cmdline = bounded_file::read(&proc_dir.join("cmdline"), ARGS_MAX, Links::Follow).ok()?;
        let mut args: Vec<Vec<u8>> = cmdline.split(|b| *b == 0).map(<[u8]>::to_vec).collect();
        if args.last().is_some_and(Vec::is_empty) {
            args.pop();
        }
        Some(Self { pid, start_time: stat.start_time, uid, exe, exe_file, args })
    }

    /// Whether `KEY=value` is in its environment (readable for our own
    /// user's processes only).
    pub fn has_env(proc_dir: &Path, entry: &str) -> bool {
        bounded_file::read(&proc_dir.join("environ"), ARGS_MAX, Links::Follow)
            .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == entry.as_bytes()))
    }
}

/// The real and effective uid of a `/proc/<pid>/status`.
fn parse_uids(status: &str) -> Option<(u32, u32)> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    let mut ids = line.split_whitespace().map(str::parse::<u32>);
    Some((ids.next()?.ok()?, ids.next()?.ok()?))
}

/// The numbered entries of a `/proc`.
pub fn pids(proc_root: &Path) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir(proc_root) else { return Vec::new() };
    let mut pids: Vec<i32> =
        entries.flatten().filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok())).collect();
    pids.sort_unstable();
    pids
}

/// The fields of `/proc/<pid>/stat` that identify a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    pub state: char,
    pub start_time: u64,
}

/// `pid`'s identifying fields, if it runs and may be read.
pub fn read_stat(pid: i32) -> Option<ProcStat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Parses `pid (comm) state ... starttime ...`; `comm` may hold spaces and
/// parentheses, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After comm: state is field 3, starttime field 22 (1-based).
    let state = fields.first()?.chars().next()?;
    let start_time = fields.get(22 - 3)?.parse().ok()?;
    Some(ProcStat { state, start_time })
}

/// Waits until the child `pid` has finished its `execve`, for tests that read
/// its `/proc` entries right after `spawn`. `spawn` returns once the child
/// has let go of the parent's memory (fs/exec.c: `exec_mmap` wakes a vfork
/// parent, and a fork's close-on-exec pipe closes right after), which is
/// before the new image's arguments and environment are laid out
/// (`create_elf_tables`); until then `/proc/<pid>/cmdline` and `environ`
/// read empty (fs/proc/base.c). Its executable and start time are already
/// final (`set_mm_exe_file` runs before `exec_mmap`).
#[cfg(test)]
pub fn wait_for_exec(pid: u32) {
    use std::time::{Duration, Instant};
    let cmdline = format!("/proc/{pid}/cmdline");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read(&cmdline).map_or(true, |args| args.is_empty()) {
        assert!(Instant::now() < deadline, "pid {pid} did not finish its exec within 10 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;
    use std::process::Command;

    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let text = "4242 (nvidia (mps) ctl) S 1 4242 4242 0 -1 4194560 97 0 0 0 0 0 0 0 20 0 1 0 987654 1 2 3";
        assert_eq!(parse_stat(text), Some(ProcStat { state: 'S', start_time: 987654 }));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn uids_are_read_from_the_status() {
        assert_eq!(parse_uids("Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t1\t1\t1\t1\n"), Some((1000, 0)));
        assert_eq!(parse_uids("Name:\tx\n"), None);
    }

    /// A script run by its interpreter runs the script's program; a copy
    /// of the script, and the interpreter itself, do not.
    #[test]
    fn a_process_runs_a_program_by_its_file_not_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("nvidia-imex");
        std::fs::write(&script, "#!/bin/sh\nsleep 30\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let copy = dir.path().join("copy/nvidia-imex");
        std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
        std::fs::copy(&script, &copy).unwrap();
        let program = Program::at(&script).unwrap();
        let mut ours = Command::new(&script).arg("-c").arg("x").spawn().unwrap();
        let mut other = Command::new(&copy).arg("-c").arg("x").spawn().unwrap();
        wait_for_exec(ours.id());
        wait_for_exec(other.id());
        let read = |pid: u32| {
            let proc_dir = PathBuf::from(format!("/proc/{pid}"));
            (Process::read(&proc_dir).unwrap(), proc_dir)
        };
        let (process, proc_dir) = read(ours.id());
        assert!(program.runs_in(&proc_dir, &process), "{process:?}");
        assert_eq!(process.uid, (rustix::process::getuid().as_raw(), rustix::process::geteuid().as_raw()));
        let (process, proc_dir) = read(other.id());
        assert!(!program.runs_in(&proc_dir, &process), "a copy named the same is another program");
        let me = Process::read(Path::new(&format!("/proc/{}", std::process::id()))).unwrap();
        assert!(Program::at(&me.exe).unwrap().runs_in(Path::new("/proc/self"), &me));
        assert!(!program.runs_in(Path::new("/proc/self"), &me));
        for child in [&mut ours, &mut other] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
        assert!(Process::read(&PathBuf::from(format!("/proc/{}", ours.id()))).is_none(), "gone");
    }
}
