//! An `nvidia-imex` the host runs (NVIDIA's `nvidia-imex` systemd service,
//! which GB200 driver installs enable), not this agent. Two daemons on one
//! node fight for the IMEX ports (50000, 50005) and the channels, so the
//! agent never starts its own beside a host-managed one and never signals
//! or stops it. Instead it serves a domain through it when the host's
//! daemon lists every node of the domain (its `IMEX_NODE_CONFIG_FILE`),
//! asking it `nvidia-imex-ctl -q` for readiness; a domain it does not
//! cover is refused per claim with what to change.
//!
//! Found in the host's process table (`--proc-root`) by what the kernel
//! says, not by a name any process may take: a process running the driver
//! root's very `nvidia-imex` file (see [`crate::process`]), root-owned, as
//! root (uid 0), whose `-c` is not a configuration this driver writes
//! (`…/domains/<domainUID>/imexd.cfg`, under this agent's state directory
//! or another instance's). An unprivileged process, or one running any
//! other file called `nvidia-imex`, is no host daemon: it blocks nothing.
//! Its files are read through `<proc>/<pid>/root`, the host's view of its
//! paths.

use std::net::IpAddr;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use crate::process::{self, Process, Program};

/// Where the daemon reads its configuration without `-c` (NVIDIA's package).
pub const DEFAULT_CONFIG: &str = "/etc/nvidia-imex/config.cfg";
/// Its peer list when the configuration names none.
pub const DEFAULT_NODES: &str = "/etc/nvidia-imex/nodes_config.cfg";

/// A running `nvidia-imex` this agent did not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostDaemon {
    pub pid: u32,
    /// Its configuration, as the host names it.
    pub config: PathBuf,
    /// `<proc>/<pid>/root`: where its paths are readable from here.
    root: PathBuf,
}

/// The configuration an `nvidia-imex` command line names (`-c`), else
/// the package's default.
pub fn config_arg(args: &[Vec<u8>]) -> PathBuf {
    let config = args.windows(2).find(|w| w[0] == b"-c").map_or(DEFAULT_CONFIG.as_bytes(), |w| w[1].as_slice());
    PathBuf::from(std::ffi::OsStr::from_bytes(config))
}

/// The peer list file a configuration names.
pub fn nodes_file_of(config: &str) -> PathBuf {
    config
        .lines()
        .find_map(|l| l.trim().strip_prefix("IMEX_NODE_CONFIG_FILE="))
        .map(|v| PathBuf::from(v.trim()))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_NODES))
}

/// The domain's addresses the peer list does not name (one address per
/// line; blank lines and `#` comments skipped).
pub fn missing_peers(nodes: &str, peers: &[IpAddr]) -> Vec<IpAddr> {
    let listed: Vec<IpAddr> =
        nodes.lines().map(|l| l.split('#').next().unwrap_or_default().trim()).filter_map(|l| l.parse().ok()).collect();
    peers.iter().filter(|p| !listed.contains(p)).copied().collect()
}

/// Whether `config` is one this driver writes: under `ours` (this agent's
/// daemons' directory), or shaped like it (`domains/<uid>/imexd.cfg`: another
/// agent's, e.g. of a second node on a test machine).
fn written_by_this_driver(config: &Path, ours: &Path) -> bool {
    let shaped = config.file_name().is_some_and(|n| n == "imexd.cfg")
        && config.parent().and_then(Path::parent).and_then(Path::file_name).is_some_and(|n| n == "domains");
    config.starts_with(ours) || shaped
}

/// The first host-managed `nvidia-imex` in `proc_root`: root's process
/// running the root-owned `program` (the driver root's `nvidia-imex`),
/// with a configuration this driver did not write.
pub fn detect(proc_root: &Path, ours: &Path, program: &Program) -> Option<HostDaemon> {
    if !program.owned_by_root() {
        return None;
    }
    process::pids(proc_root).into_iter().find_map(|pid| {
        let dir = proc_root.join(pid.to_string());
        let process = Process::read(&dir)?;
        if process.uid != (0, 0) || !program.runs_in(&dir, &process) {
            return None;
        }
        let config = config_arg(&process.args);
        if written_by_this_driver(&config, ours) {
            return None;
        }
        Some(HostDaemon { pid: u32::try_from(pid).ok()?, config, root: dir.join("root") })
    })
}

impl HostDaemon {
    /// Where the host's `path` is readable from here.
    pub fn readable(&self, path: &Path) -> PathBuf {
        self.root.join(path.strip_prefix("/").unwrap_or(path))
    }

    /// Refuses a domain the daemon cannot serve: its peer list lacks
    /// some of the domain's nodes, or cannot be read.
    pub fn check_serves(&self, peers: &[IpAddr], node: &str, domain: &str) -> Result<(), super::error::Error> {
        let config = std::fs::read_to_string(self.readable(&self.config)).map_err(|source| {
            super::error::Error::HostConfigUnreadable {
                describe: self.describe(node),
                path: self.config.clone(),
                source,
            }
        })?;
        let nodes_file = nodes_file_of(&config);
        let nodes = std::fs::read_to_string(self.readable(&nodes_file)).map_err(|source| {
            super::error::Error::HostNodesUnreadable { describe: self.describe(node), path: nodes_file.clone(), source }
        })?;
        let missing = missing_peers(&nodes, peers);
        if missing.is_empty() {
            return Ok(());
        }
        Err(super::error::Error::HostLacksPeers {
            describe: self.describe(node),
            nodes_file,
            missing: missing.iter().map(ToString::to_string).collect(),
            domain: domain.to_owned(),
        })
    }

    fn describe(&self, node: &str) -> String {
        format!("node {node} runs a host-managed nvidia-imex (pid {}, -c {})", self.pid, self.config.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<Vec<u8>> {
        line.split(' ').map(|a| a.as_bytes().to_vec()).collect()
    }

    #[test]
    fn an_imex_command_line_names_its_configuration() {
        assert_eq!(config_arg(&args("/usr/bin/nvidia-imex -c /etc/x.cfg")), PathBuf::from("/etc/x.cfg"));
        assert_eq!(config_arg(&args("nvidia-imex")), PathBuf::from(DEFAULT_CONFIG));
        assert_eq!(config_arg(&args("/bin/sh /r/usr/bin/nvidia-imex -c /c.cfg")), PathBuf::from("/c.cfg"));
    }

    #[test]
    fn the_peer_list_is_read_from_the_configuration() {
        assert_eq!(nodes_file_of("LOG_LEVEL=4\nIMEX_NODE_CONFIG_FILE=/etc/n.cfg\n"), PathBuf::from("/etc/n.cfg"));
        assert_eq!(nodes_file_of("LOG_LEVEL=4\n"), PathBuf::from(DEFAULT_NODES));
        let peers: Vec<IpAddr> = ["10.0.0.1", "10.0.0.2", "10.0.0.3"].iter().map(|a| a.parse().unwrap()).collect();
        assert_eq!(missing_peers("# rack 1\n10.0.0.1\n\n10.0.0.2 # tray 2\n", &peers), [peers[2]]);
        assert!(missing_peers("10.0.0.3\n10.0.0.2\n10.0.0.1\n10.0.0.9\n", &peers).is_empty());
    }
}
