//! The Go side's binary, built by `tests/go-allocator/build.sh` into the
//! per-machine cache when its sources changed (about 2 minutes of CPU
//! cold), otherwise found there at once.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::{Error, Result, io};
use crate::workspace_root;

/// Path of the Go allocator's binary, building it first if the cache lacks
/// this version of its sources. Needs Go and the Go module proxy.
pub fn go_allocator() -> Result<PathBuf> {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    if let Some(path) = BUILT.get() {
        return Ok(path.clone());
    }
    let script = workspace_root().join("tests/go-allocator/build.sh");
    let output = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(io(format!("running {}", script.display())))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(Error::Failed(format!(
            "{} failed ({}): the Go allocator comparison needs Go (>= 1.26) and the Go module proxy; see docs/contributing.md",
            script.display(),
            output.status
        )));
    }
    let path =
        stdout.lines().find_map(|l| l.strip_prefix("go-allocator-bin=")).map(PathBuf::from).ok_or_else(|| {
            Error::Failed(format!("{} printed no go-allocator-bin= line: {stdout}", script.display()))
        })?;
    if !path.is_file() {
        return Err(Error::Failed(format!("{} is missing after the build", path.display())));
    }
    Ok(BUILT.get_or_init(|| path).clone())
}
