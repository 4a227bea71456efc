//! One plugin process per state directory. During a DaemonSet update with
//! surge, or a manual second start, two processes would otherwise prepare
//! claims against the same checkpoint, each blind to the other's locks.
//! NVIDIA's driver takes a node-wide `flock` around every prepare; holding
//! one for the life of the process gives the same safety without
//! serializing claims. The kernel drops the lock when the holder dies, even
//! by SIGKILL, so a crash never leaves it stuck.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{FlockOperation, flock};

/// Name of the lock file in the state directory.
pub const LOCK_FILE: &str = "plugin.lock";

/// How often a waiting process retries, and how often it says it waits.
const RETRY: Duration = Duration::from_millis(100);
const REPORT_EVERY: u32 = 100;

/// The held lock; released when dropped or when the process ends.
#[derive(Debug)]
pub struct InstanceLock {
    _file: File,
    pub path: PathBuf,
}

/// Takes the lock if no other process holds it.
pub fn try_acquire(state_dir: &Path) -> io::Result<Option<InstanceLock>> {
    let path = state_dir.join(LOCK_FILE);
    // Not through a symlink, never blocking on a FIFO: only a regular file.
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::other(format!("{} is not a regular file", path.display())));
    }
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(InstanceLock { _file: file, path })),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Waits (without bound: the other process is expected to stop) until the
/// lock is free, logging while it waits.
pub async fn acquire(state_dir: &Path) -> io::Result<InstanceLock> {
    let mut attempts: u32 = 0;
    loop {
        if let Some(lock) = try_acquire(state_dir)? {
            return Ok(lock);
        }
        if attempts.is_multiple_of(REPORT_EVERY) {
            tracing::warn!(
                lock = %state_dir.join(LOCK_FILE).display(),
                "another plugin process uses this state directory; waiting for it to stop"
            );
        }
        attempts = attempts.wrapping_add(1);
        tokio::time::sleep(RETRY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = try_acquire(dir.path()).unwrap().expect("free at first");
        assert!(try_acquire(dir.path()).unwrap().is_none(), "held by the first");
        drop(first);
        assert!(try_acquire(dir.path()).unwrap().is_some(), "free again");
    }

    #[tokio::test]
    async fn acquire_waits_for_the_release() {
        let dir = tempfile::tempdir().unwrap();
        let first = try_acquire(dir.path()).unwrap().unwrap();
        let path = dir.path().to_path_buf();
        let waiter = tokio::spawn(async move { acquire(&path).await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(first);
        assert!(waiter.await.unwrap().is_ok());
    }
}
