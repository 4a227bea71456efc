//! Things the tests install on first use (a Python virtual environment,
//! a wheel), installed once per machine under a lock.
//!
//! Tests of one binary run on parallel threads, and several test binaries
//! share the target directory's installs. Without a lock, two tests that
//! both find a tool missing install it at once, and one of them executes the
//! file while the other's `pip` is still writing it: "Text file busy"
//! (ETXTBSY), on the first run on a fresh machine only. A marker written
//! after a complete install is the only proof of one; a partial install
//! (a killed run) is done again.

use std::fs::File;
use std::io;
use std::path::Path;

/// Runs `install` unless `marker` already exists, holding an exclusive lock
/// on `<marker>.lock` meanwhile (across threads and processes), and writes
/// `marker` once `install` has returned. A caller that finds the marker
/// needs no lock: the marker is written only after the install is complete.
pub fn install_once(marker: &Path, install: impl FnOnce()) {
    if marker.exists() {
        return;
    }
    let lock_path = marker.with_extension("lock");
    if let Some(dir) = marker.parent() {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    }
    let lock = File::create(&lock_path).unwrap_or_else(|e| panic!("creating {}: {e}", lock_path.display()));
    lock.lock().unwrap_or_else(|e| panic!("locking {}: {e}", lock_path.display()));
    // Another holder of the lock may have finished meanwhile.
    if !marker.exists() {
        install();
        write_marker(marker).unwrap_or_else(|e| panic!("writing {}: {e}", marker.display()));
    }
    // The lock goes with the file handle.
}

/// The marker appears whole or not at all.
fn write_marker(marker: &Path) -> io::Result<()> {
    let partial = marker.with_extension("partial");
    std::fs::write(&partial, b"installed\n")?;
    std::fs::rename(&partial, marker)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;
    use std::process::Command;
    use std::sync::Barrier;

    /// The failure first runs met: one thread executes a tool another is
    /// still writing. Each thread "installs" a script (written slowly, as
    /// pip does) only when it is missing, then runs it. Without the lock the
    /// threads write and run the file at once (ETXTBSY, or a half-written
    /// script); with it every run succeeds.
    #[test]
    fn parallel_first_uses_install_once_and_never_run_a_half_written_tool() {
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("bin/tool");
        let marker = dir.path().join("tool.installed");
        let installs = std::sync::atomic::AtomicUsize::new(0);
        let start = Barrier::new(8);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    start.wait();
                    install_once(&marker, || {
                        installs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        std::fs::create_dir_all(tool.parent().unwrap()).unwrap();
                        let mut script = String::from("#!/bin/sh\n");
                        for i in 0..200 {
                            script.push_str(&format!(": line {i}\n"));
                        }
                        script.push_str("echo ok\n");
                        std::fs::write(&tool, &script[..10]).unwrap();
                        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
                        std::thread::sleep(std::time::Duration::from_millis(50));
                        std::fs::write(&tool, &script).unwrap();
                    });
                    let out = Command::new(&tool).output().expect("the installed tool runs");
                    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
                });
            }
        });
        assert_eq!(installs.into_inner(), 1, "installed once");
    }

    #[test]
    fn a_present_marker_skips_the_install() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("done");
        std::fs::write(&marker, "installed\n").unwrap();
        install_once(&marker, || panic!("must not install again"));
    }

    #[test]
    fn an_install_that_panics_leaves_no_marker_and_is_tried_again() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("done");
        let failed = std::panic::catch_unwind(|| install_once(&marker, || panic!("pip failed")));
        assert!(failed.is_err());
        assert!(!marker.exists());
        let mut ran = false;
        install_once(&marker, || ran = true);
        assert!(ran && marker.exists());
    }
}
