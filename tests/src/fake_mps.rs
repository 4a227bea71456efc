//! A fake driver root for MPS: `nvidia-smi` and `nvidia-cuda-mps-control`
//! are small shell programs that record every invocation and answer like
//! the real ones, so tests assert the exact commands without a GPU.
//!
//! - `nvidia-cuda-mps-control -d` logs `start <CUDA_VISIBLE_DEVICES>
//!   <CUDA_MPS_PIPE_DIRECTORY> <CUDA_MPS_LOG_DIRECTORY>`, then starts a
//!   detached background process (the "daemon") and writes its pid to
//!   `<pipe>/nvidia-cuda-mps-control.pid`, as the real one does, and
//!   returns.
//! - `nvidia-cuda-mps-control` (the client) logs `<pipe> <command>` for
//!   each stdin line, fails like the real one when no daemon runs for the
//!   pipe directory, kills the daemon on `quit`, remembers
//!   `set_default_active_thread_percentage` and answers it on `get_…`.
//! - `nvidia-smi -i <uuid> -c <MODE>` logs its arguments.
//!
//! Widening the windows for a SIGKILL: while `<root>/mps.hang-<word>`
//! exists (`<word>`: `start` or a command's first word), or
//! `<root>/nvidia-smi.hang` for `-c EXCLUSIVE_PROCESS`, the program waits
//! (after logging), and gives up when its parent (the plugin) dies, so it
//! never acts for a dead plugin. `<root>/mps.never-ready` makes the daemon
//! never answer `get_default_active_thread_percentage`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use gpu_dra_driver::driver_root::fake_tree;

const COMMON: &str = r#"root="$(cd "$(dirname "$0")/../.." && pwd)"
parent=$PPID
# Waits while the file $1 exists; exits if the parent (the plugin) died.
hang() {
  while [ -e "$1" ]; do
    state=$(cut -d' ' -f3 /proc/$parent/stat 2>/dev/null)
    if [ -z "$state" ] || [ "$state" = Z ]; then exit 1; fi
    sleep 0.05
  done
}
alive() {
  [ -n "$1" ] || return 1
  state=$(cut -d' ' -f3 /proc/$1/stat 2>/dev/null)
  [ -n "$state" ] && [ "$state" != Z ]
}
"#;

const MPS_CONTROL: &str = r#"
log="$root/mps-control.log"
pipe="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
if [ "$1" = "-d" ]; then
  echo "start $CUDA_VISIBLE_DEVICES $pipe $CUDA_MPS_LOG_DIRECTORY" >> "$log"
  echo "$LD_LIBRARY_PATH" > "$root/mps-control.ld-library-path"
  hang "$root/mps.hang-start"
  [ -d "$pipe" ] || { echo "pipe directory $pipe missing" >&2; exit 1; }
  ( trap 'exit 0' TERM; while :; do sleep 0.2; done ) </dev/null >/dev/null 2>&1 &
  echo $! > "$pipe/nvidia-cuda-mps-control.pid"
  echo "daemon started" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
  exit 0
fi
pid=$(cat "$pipe/nvidia-cuda-mps-control.pid" 2>/dev/null)
while IFS= read -r line; do
  echo "$pipe $line" >> "$log"
  word=${line%% *}
  hang "$root/mps.hang-$word"
  alive "$pid" || { echo "Cannot find MPS control daemon process" >&2; exit 1; }
  case "$word" in
    quit) kill "$pid";;
    get_default_active_thread_percentage)
      [ -e "$root/mps.never-ready" ] && { echo "daemon not ready" >&2; exit 1; }
      cat "$pipe/fake-percentage" 2>/dev/null || echo 100.0;;
    set_default_active_thread_percentage) echo "${line#* }" > "$pipe/fake-percentage"; echo "${line#* }";;
    set_default_device_pinned_mem_limit) echo "${line#* }" >> "$pipe/fake-pinned";;
    *) echo "unknown command: $line" >&2; exit 1;;
  esac
done
"#;

const NVIDIA_SMI: &str = r#"
echo "$*" >> "$root/nvidia-smi.log"
case "$*" in
  *"-c EXCLUSIVE_PROCESS") hang "$root/nvidia-smi.hang"; echo "Set compute mode to EXCLUSIVE_PROCESS for GPU $2.";;
  *"-c DEFAULT") echo "Set compute mode to DEFAULT for GPU $2.";;
  compute-policy*) echo "Successfully set the timeslice for GPU $3 to $5.";;
  *) echo "unexpected arguments: $*" >&2; exit 2;;
esac
"#;

/// Builds a driver root in `dir/driver-root` with the fake programs.
pub fn driver_root(dir: &Path) -> PathBuf {
    let root = dir.join("driver-root");
    fake_tree::build(&root, "580.82.07", &[("libcuda.so", "libcuda.so.1"), ("libnvidia-ml.so", "libnvidia-ml.so.1")])
        .unwrap_or_else(|e| panic!("fake driver root: {e}"));
    install_programs(&root);
    root
}

/// Puts the fake `nvidia-cuda-mps-control` and `nvidia-smi` in `root`'s
/// `usr/bin` (a driver root made elsewhere, e.g. the mock NVML's).
pub fn install_programs(root: &Path) {
    std::fs::create_dir_all(root.join("usr/bin")).unwrap_or_else(|e| panic!("usr/bin: {e}"));
    for (name, body) in [("nvidia-cuda-mps-control", MPS_CONTROL), ("nvidia-smi", NVIDIA_SMI)] {
        let path = root.join("usr/bin").join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{COMMON}{body}")).unwrap_or_else(|e| panic!("{name}: {e}"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap_or_else(|e| panic!("{e}"));
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_owned).collect()
}

/// Every `nvidia-smi` invocation, in order.
pub fn smi_calls(root: &Path) -> Vec<String> {
    lines(&root.join("nvidia-smi.log"))
}

/// Every `nvidia-cuda-mps-control` invocation, in order.
pub fn mps_calls(root: &Path) -> Vec<String> {
    lines(&root.join("mps-control.log"))
}

/// The `LD_LIBRARY_PATH` the last daemon was started with.
pub fn daemon_library_path(root: &Path) -> String {
    std::fs::read_to_string(root.join("mps-control.ld-library-path")).unwrap_or_default().trim().to_owned()
}

/// The mount points under `dir` in this mount namespace.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    table.lines().filter_map(|l| l.split(' ').nth(4)).map(PathBuf::from).filter(|p| p.starts_with(&dir)).collect()
}

/// Whether `pid` runs (and is not a zombie).
pub fn is_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with(|c| c != 'Z')))
        .unwrap_or(false)
}

/// The pids in the fake daemons' pid files under `dir` that still run.
pub fn running_daemons(dir: &Path) -> Vec<i32> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(next) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&next) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == "nvidia-cuda-mps-control.pid")
                && let Some(pid) = std::fs::read_to_string(&path).ok().and_then(|t| t.trim().parse().ok())
                && is_alive(pid)
            {
                found.push(pid);
            }
        }
    }
    found
}

/// Kills the fake daemons and detaches the mounts under `dir`, so that a
/// failed test leaves nothing behind (use as a guard: runs on drop).
pub struct Cleanup(pub PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for pid in running_daemons(&self.0) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        for mount in mounts_under(&self.0) {
            let _ = rustix::mount::unmount(&mount, rustix::mount::UnmountFlags::DETACH);
        }
    }
}
