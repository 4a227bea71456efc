//! Crash-safe file updates: a reader sees the old file or the new one,
//! never a mix, and a completed call survives power loss.
//!
//! The recipe is the classic one: write a temporary file in the same
//! directory, fsync it, rename it over the target, fsync the directory (the
//! rename lives in the directory's metadata). Temporary names start with a
//! dot and end in `.tmp`, so CDI scanners (which read `*.json` and
//! `*.yaml`) never pick one up, and start-up can sweep leftovers.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Suffix of temporary files, for the start-up sweep.
pub const TEMP_SUFFIX: &str = ".tmp";

static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

/// Counts fsyncs, so the prepare benchmark can report how many a prepare
/// costs (its target is relative to that cost).
static FSYNCS: AtomicU64 = AtomicU64::new(0);

/// fsyncs done by this process so far.
pub fn fsync_count() -> u64 {
    FSYNCS.load(Ordering::Relaxed)
}

fn sync_file(file: &File) -> io::Result<()> {
    FSYNCS.fetch_add(1, Ordering::Relaxed);
    file.sync_all()
}

/// fsyncs a directory, making renames and unlinks in it durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    sync_file(&File::open(dir)?)
}

/// Replaces `dir/name` with `bytes` atomically and durably; the file gets
/// `mode`.
pub fn write(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> io::Result<()> {
    plain_name(name)?;
    let temp = temp_path(dir, name);
    let result = write_temp(&temp, bytes, mode).and_then(|()| fs::rename(&temp, dir.join(name)));
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result?;
    sync_dir(dir)
}

/// Removes `dir/name` durably; a missing file is not an error. Returns
/// whether there was a file. `name` must be a plain file name: a path
/// (`/x`, `../x`, `a/b`) is refused, so nothing outside `dir` goes; a
/// symlink named `name` goes itself, never what it names.
pub fn remove(dir: &Path, name: &str) -> io::Result<bool> {
    plain_name(name)?;
    match fs::remove_file(dir.join(name)) {
        Ok(()) => {
            sync_dir(dir)?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Refuses a `name` that is not a plain entry of its directory.
fn plain_name(name: &str) -> io::Result<()> {
    if gpu_dra_driver::bounded_file::is_plain_name(name) {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{name:?} is not a plain file name (no `/`, not `.` or `..`): refused, as it would leave its directory"
            ),
        ))
    }
}

/// Whether `file_name` is one of our temporary files for a target whose
/// name starts with `prefix`.
pub fn is_temp_for(file_name: &str, prefix: &str) -> bool {
    file_name.strip_prefix('.').is_some_and(|rest| rest.starts_with(prefix)) && file_name.ends_with(TEMP_SUFFIX)
}

fn temp_path(dir: &Path, name: &str) -> PathBuf {
    let n = NEXT_TEMP.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(".{name}.{}-{n}{TEMP_SUFFIX}", std::process::id()))
}

fn write_temp(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).create_new(true).mode(mode).open(path)?;
    file.write_all(bytes)?;
    sync_file(&file)
}

/// Creates `dir` (and parents) if needed, with `mode` on the last component.
pub fn create_dir(dir: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    fs::DirBuilder::new().recursive(true).mode(mode).create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn write_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.json", b"one", 0o600).unwrap();
        write(dir.path(), "a.json", b"two", 0o600).unwrap();
        assert_eq!(fs::read(dir.path().join("a.json")).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["a.json"]);
        let mode = fs::metadata(dir.path().join("a.json")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn remove_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.json", b"x", 0o644).unwrap();
        assert!(remove(dir.path(), "a.json").unwrap());
        assert!(!remove(dir.path(), "a.json").unwrap());
    }

    #[test]
    fn paths_are_refused_and_nothing_outside_goes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("dir");
        fs::create_dir(&dir).unwrap();
        let outside = tmp.path().join("outside");
        fs::write(&outside, b"keep").unwrap();
        for name in ["../outside", outside.to_str().unwrap(), "a/b", "..", ".", ""] {
            let error = remove(&dir, name).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{name}");
            assert!(error.to_string().contains("not a plain file name"), "{error}");
            assert!(write(&dir, name, b"x", 0o600).is_err(), "{name}");
        }
        std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();
        assert!(remove(&dir, "link").unwrap());
        assert_eq!(fs::read(&outside).unwrap(), b"keep");
    }

    #[test]
    fn temp_names_are_recognised() {
        let dir = Path::new("/x");
        let temp = temp_path(dir, "k8s.gpu.nvidia.com-claim_u.json");
        let name = temp.file_name().unwrap().to_str().unwrap();
        assert!(is_temp_for(name, "k8s.gpu.nvidia.com-claim_"));
        assert!(!is_temp_for(name, "other"));
        assert!(!is_temp_for("k8s.gpu.nvidia.com-claim_u.json", "k8s.gpu.nvidia.com-claim_"));
    }
}
