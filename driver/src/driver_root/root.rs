//! The driver installation as the plugin and the host see it, and paths
//! resolved inside it.

use std::path::{Component, Path, PathBuf};

/// The driver installation as the plugin sees it and as the host does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverRoot {
    /// Where this process reads it.
    pub root: PathBuf,
    /// The same directory on the host (what specs name).
    pub host_root: PathBuf,
}

impl DriverRoot {
    pub fn new(root: impl Into<PathBuf>, host_root: Option<PathBuf>) -> Self {
        let root = root.into();
        let host_root = host_root.unwrap_or_else(|| root.clone());
        DriverRoot { root, host_root }
    }

    /// A path inside the root (absolute, as the root sees it) as this
    /// process reaches it.
    pub(super) fn local(&self, inside: &str) -> PathBuf {
        self.root.join(inside.trim_start_matches('/'))
    }

    /// The same path as the host reaches it.
    pub(super) fn host(&self, inside: &str) -> String {
        self.host_root.join(inside.trim_start_matches('/')).to_string_lossy().into_owned()
    }
}

/// A file given to containers read-only: host path, path in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverMount {
    pub host_path: String,
    pub container_path: String,
}

/// Follows `path`'s symlinks inside the root (absolute targets are the
/// root's, not this process's) to a regular file; at most 16 hops.
pub(super) fn resolve(root: &DriverRoot, path: &str) -> Option<String> {
    let mut current = normalize(Path::new(path))?;
    for _ in 0..16 {
        let local = root.local(&current);
        let meta = std::fs::symlink_metadata(&local).ok()?;
        if meta.is_file() {
            return Some(current);
        }
        if !meta.is_symlink() {
            return None;
        }
        let target = std::fs::read_link(&local).ok()?;
        let next = if target.is_absolute() {
            target
        } else {
            Path::new(&current).parent().unwrap_or(Path::new("/")).join(target)
        };
        current = normalize(&next)?;
    }
    None
}

/// `path` made absolute without `.`/`..`, never above `/`.
pub(super) fn normalize(path: &Path) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => parts.push(p.to_str()?.to_string()),
            Component::ParentDir => {
                parts.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Some(format!("/{}", parts.join("/")))
}
