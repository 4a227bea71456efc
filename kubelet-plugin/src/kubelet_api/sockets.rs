//! The plugin's two unix sockets: where they live, how they are created and
//! removed.
//!
//! Conventions of the Go helper (`kubeletplugin/draplugin.go`): the service
//! socket is `<plugins-dir>/<driver>/dra.sock`, in a directory not shared
//! with other plugins; the registration socket is
//! `<registry-dir>/<driver>-reg.sock` (the kubelet's plugin watcher ignores
//! names starting with '.'). A stale file from a previous run is removed
//! before binding, and both are removed on exit; removing the registration
//! socket is how a plugin deregisters.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use gpu_dra_driver::names::DriverName;
use tokio::net::UnixListener;

/// Mode of the sockets: only root (the kubelet) may connect.
const SOCKET_MODE: u32 = 0o600;
/// Mode of directories the plugin creates or owns.
const DIR_MODE: u32 = 0o700;

/// Where the two sockets go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketPaths {
    /// `<plugins-dir>/<driver>`: the plugin's own directory.
    pub plugin_dir: PathBuf,
    /// `<plugin_dir>/dra.sock`: DRAPlugin v1 + v1beta1 and DRAResourceHealth.
    pub dra: PathBuf,
    /// `<registry-dir>/<driver>-reg.sock`: the kubelet's Registration service.
    pub registration: PathBuf,
}

impl SocketPaths {
    pub fn new(plugins_dir: &Path, registry_dir: &Path, driver: &DriverName) -> Self {
        let plugin_dir = plugins_dir.join(driver.as_str());
        Self {
            dra: plugin_dir.join("dra.sock"),
            plugin_dir,
            registration: registry_dir.join(format!("{driver}-reg.sock")),
        }
    }
}

/// Why a socket could not be set up. Each names the path and the fix.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("cannot create directory {}: {source}; fix: check that the parent exists and is writable", path.display())]
    CreateDir { path: PathBuf, source: io::Error },
    #[error("cannot set mode {mode:o} on {}: {source}", path.display())]
    Chmod { path: PathBuf, mode: u32, source: io::Error },
    #[error("{} exists and is not a socket; fix: remove it or choose another directory", path.display())]
    NotASocket { path: PathBuf },
    #[error("cannot remove stale socket {}: {source}", path.display())]
    RemoveStale { path: PathBuf, source: io::Error },
    #[error("cannot listen on {}: {source}", path.display())]
    Bind { path: PathBuf, source: io::Error },
    #[error("{} has no parent directory", path.display())]
    NoParent { path: PathBuf },
}

/// Creates `dir` (and missing parents) with mode 0700. With `own` set, an
/// existing directory is also set to 0700: the plugin's own directory holds
/// its socket, checkpoint and lock files. Shared directories such as the
/// kubelet's registry directory are created if missing but left as they are.
pub fn ensure_dir(dir: &Path, own: bool) -> Result<(), SocketError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(|source| SocketError::CreateDir { path: dir.to_path_buf(), source })?;
    if own {
        chmod(dir, DIR_MODE)?;
    }
    Ok(())
}

fn chmod(path: &Path, mode: u32) -> Result<(), SocketError> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|source| SocketError::Chmod {
        path: path.to_path_buf(),
        mode,
        source,
    })
}

/// Removes a socket file; a missing one is fine. Refuses anything that is
/// not a socket so that a wrong flag cannot delete a user's file.
pub fn remove_socket(path: &Path) -> Result<(), SocketError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(SocketError::RemoveStale { path: path.to_path_buf(), source }),
        Ok(meta) if !meta.file_type().is_socket() => Err(SocketError::NotASocket { path: path.to_path_buf() }),
        Ok(_) => match std::fs::remove_file(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other.map_err(|source| SocketError::RemoveStale { path: path.to_path_buf(), source }),
        },
    }
}

/// Binds a unix socket at `path` with mode 0600, replacing a stale one.
/// The parent directory must exist (see [`ensure_dir`]). Must be called
/// inside a tokio runtime.
///
/// The socket is bound under a hidden staging name (the kubelet's plugin
/// watcher ignores names starting with '.'), given its mode, then renamed
/// into place: the kubelet dials a socket the moment its file appears, and
/// a file made by `bind(2)` is not listening until `listen(2)` (a dial in
/// between is refused, and the registration fails).
pub fn bind(path: &Path) -> Result<UnixListener, SocketError> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(SocketError::NoParent { path: path.to_path_buf() });
    };
    // Refuses to replace anything that is not a socket.
    remove_socket(path)?;
    // One plugin per directory (the state-directory lock), so a fixed
    // staging name is never in use by another process; one left by a
    // crash is replaced here.
    let staging = parent.join(format!(".{}.staging", name.to_string_lossy()));
    remove_socket(&staging)?;
    let listener =
        UnixListener::bind(&staging).map_err(|source| SocketError::Bind { path: path.to_path_buf(), source })?;
    chmod(&staging, SOCKET_MODE)?;
    std::fs::rename(&staging, path).map_err(|source| SocketError::Bind { path: path.to_path_buf(), source })?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().mode() & 0o777
    }

    #[test]
    fn paths_follow_the_go_helpers_conventions() {
        let paths = SocketPaths::new(
            Path::new("/var/lib/kubelet/plugins"),
            Path::new("/var/lib/kubelet/plugins_registry"),
            &DriverName::nvidia_default(),
        );
        assert_eq!(paths.dra, Path::new("/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock"));
        assert_eq!(paths.registration, Path::new("/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock"));
        assert_eq!(paths.plugin_dir, Path::new("/var/lib/kubelet/plugins/gpu.nvidia.com"));
    }

    #[tokio::test]
    async fn stale_sockets_are_replaced_and_modes_are_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("plugins/gpu.nvidia.com");
        ensure_dir(&dir, true).unwrap();
        assert_eq!(mode(&dir), 0o700);
        let path = dir.join("dra.sock");
        // A stale socket left by a killed process.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let listener = bind(&path).unwrap();
        assert_eq!(mode(&path), 0o600);
        // The new socket accepts connections.
        let connect = tokio::net::UnixStream::connect(&path);
        let (accepted, connected) = tokio::join!(listener.accept(), connect);
        accepted.unwrap();
        connected.unwrap();
        remove_socket(&path).unwrap();
        assert!(!path.exists());
        remove_socket(&path).unwrap();
    }

    #[tokio::test]
    async fn the_socket_appears_listening_and_no_staging_file_is_left() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("gpu.nvidia.com-reg.sock");
        // A staging socket left by a process killed between bind and rename.
        drop(std::os::unix::net::UnixListener::bind(tmp.path().join(".gpu.nvidia.com-reg.sock.staging")).unwrap());
        let _listener = bind(&path).unwrap();
        // Listening as soon as it exists: a plain connect succeeds without
        // any accept having run.
        std::os::unix::net::UnixStream::connect(&path).unwrap();
        let names: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, [std::ffi::OsString::from("gpu.nvidia.com-reg.sock")]);
    }

    #[test]
    fn a_regular_file_is_not_deleted() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("dra.sock");
        std::fs::write(&path, b"data").unwrap();
        let err = remove_socket(&path).unwrap_err();
        assert!(err.to_string().contains("is not a socket"), "{err}");
        assert!(path.exists());
    }

    #[test]
    fn a_shared_directory_keeps_its_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("registry");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
        ensure_dir(&dir, false).unwrap();
        assert_eq!(mode(&dir), 0o750);
        let fresh = tmp.path().join("new/registry");
        ensure_dir(&fresh, false).unwrap();
        assert_eq!(mode(&fresh), 0o700);
    }
}
