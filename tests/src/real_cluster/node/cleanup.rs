//! What a node makes outside its own processes, and taking it apart: its
//! cgroup in every hierarchy, the processes in it, containerd's shims,
//! the mounts under its directory, and the few paths the kubelet writes
//! whatever its flags. Each touches only what is the node's: its cgroup
//! root, its socket, its directory.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

/// Where the cgroup hierarchies are mounted.
const CGROUP_MOUNTS: &str = "/sys/fs/cgroup";
/// Where the kubelet links container logs (a path it does not let us
/// change).
const LOG_LINKS_DIR: &str = "/var/log/containers";
/// Where the kubelet's device manager always makes its socket.
const DEVICE_PLUGINS_DIR: &str = "/var/lib/kubelet/device-plugins";
/// The directories outside the node's own that the kubelet writes to
/// whatever its flags, children before parents.
pub const FIXED_DIRS: [&str; 3] = [LOG_LINKS_DIR, DEVICE_PLUGINS_DIR, "/var/lib/kubelet"];

/// Makes cgroup `root` (e.g. `/gpu-dra-realnode-1`) in every hierarchy
/// where it is missing (a restarted kubelet finds it there): the kubelet
/// refuses a `cgroupRoot` missing in any.
pub fn make_cgroups(root: &str) -> std::io::Result<()> {
    let relative = root.trim_start_matches('/');
    for hierarchy in std::fs::read_dir(CGROUP_MOUNTS)?.flatten() {
        if hierarchy.path().join("cgroup.procs").is_file() {
            let dir = hierarchy.path().join(relative);
            std::fs::create_dir_all(&dir)
                .map_err(|e| std::io::Error::new(e.kind(), format!("making cgroup {}: {e}", dir.display())))?;
        }
    }
    Ok(())
}

/// Cgroup `root`'s directory in each hierarchy that has it.
fn cgroup_dirs(root: &str) -> Vec<PathBuf> {
    let relative = root.trim_start_matches('/');
    let entries = std::fs::read_dir(CGROUP_MOUNTS).into_iter().flatten().flatten();
    entries.map(|e| e.path().join(relative)).filter(|d| d.is_dir()).collect()
}

/// Whether cgroup `root` exists in any hierarchy.
pub fn cgroup_exists(root: &str) -> bool {
    !cgroup_dirs(root).is_empty()
}

/// SIGKILL to every process in cgroup `root` and below (the pods'
/// containers and sandboxes), until none is left or 10 s have passed.
pub fn kill_cgroup_processes(root: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut pids = Vec::new();
        for dir in cgroup_dirs(root) {
            for cgroup in walkdir(&dir) {
                if let Ok(text) = std::fs::read_to_string(cgroup.join("cgroup.procs")) {
                    pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
                }
            }
        }
        if pids.is_empty() || Instant::now() > deadline {
            return;
        }
        for pid in pids.into_iter().filter_map(Pid::from_raw) {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILL to the containerd shims serving the containerd at `socket`:
/// the processes whose command line names that socket (shims leave
/// containerd's process group).
pub fn kill_shims(socket: &Path) {
    let socket = socket.as_os_str().as_encoded_bytes();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let ours = args.first().is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2")) && args.contains(&socket);
        if ours && let Some(pid) = Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
    }
}

/// Detaches every mount at or under `dir`, deepest first (container root
/// filesystems, sandboxes' /dev/shm, the kubelet's shared bind mount of
/// its root directory).
pub fn unmount_under(dir: &Path) {
    let root = dir.display().to_string();
    let inside = format!("{root}/");
    for _ in 0..5 {
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut mounts: Vec<String> = mount_points(&table).filter(|m| *m == root || m.starts_with(&inside)).collect();
        if mounts.is_empty() {
            return;
        }
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for mount in mounts {
            let _ = rustix::mount::unmount(mount.as_str(), rustix::mount::UnmountFlags::DETACH);
        }
    }
}

/// Removes cgroup `root` in every hierarchy, children first (each empty
/// once its processes are gone).
pub fn remove_cgroups(root: &str) {
    for dir in cgroup_dirs(root) {
        let mut all = walkdir(&dir);
        all.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for cgroup in all {
            let _ = std::fs::remove_dir(&cgroup);
        }
    }
}

/// Removes what the kubelet wrote outside the node's directory `dir`: its
/// links to the node's container logs, its device manager's socket (when
/// the node made that directory: `made` lists the [`FIXED_DIRS`] that did
/// not exist before), and the directories in `made`, if empty.
pub fn remove_fixed_paths(dir: &Path, made: &[&Path]) {
    for entry in std::fs::read_dir(LOG_LINKS_DIR).into_iter().flatten().flatten() {
        if std::fs::read_link(entry.path()).is_ok_and(|target| target.starts_with(dir)) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    if made.contains(&Path::new(DEVICE_PLUGINS_DIR)) {
        let _ = std::fs::remove_file(Path::new(DEVICE_PLUGINS_DIR).join("kubelet.sock"));
    }
    for dir in made {
        let _ = std::fs::remove_dir(dir);
    }
}

/// `dir` and every directory below it (cgroup trees are shallow).
fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut found = vec![dir.to_path_buf()];
    let mut next = 0;
    while next < found.len() {
        if let Ok(entries) = std::fs::read_dir(&found[next]) {
            found.extend(entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()));
        }
        next += 1;
    }
    found
}

/// The mount points of a `/proc/self/mountinfo` table (the fifth field).
fn mount_points(table: &str) -> impl Iterator<Item = String> + '_ {
    table.lines().filter_map(|l| l.split(' ').nth(4).map(unescape_mount_path))
}

/// A path as `/proc/self/mountinfo` writes it: space, tab, newline and
/// backslash as three-digit octal escapes.
fn unescape_mount_path(field: &str) -> String {
    let mut out = Vec::with_capacity(field.len());
    let mut rest = field.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        let code = tail.get(..3).and_then(|o| std::str::from_utf8(o).ok()).and_then(|o| u8::from_str_radix(o, 8).ok());
        match (first, code) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                rest = &tail[3..];
            }
            _ => {
                out.push(first);
                rest = tail;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_unescaped() {
        let table = "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw\n\
                     37 35 0:5 / /tmp/real-node-x/kubelet rw shared:2 - ext4 /dev/vda rw\n\
                     38 35 0:6 / /back\\134slash\\011tab rw - tmpfs tmpfs rw\n";
        let points: Vec<String> = mount_points(table).collect();
        assert_eq!(points, ["/mnt/with space", "/tmp/real-node-x/kubelet", "/back\\slash\ttab"]);
    }

    #[test]
    fn a_backslash_without_octal_digits_stays() {
        assert_eq!(unescape_mount_path("/a\\b\\12"), "/a\\b\\12");
    }
}
