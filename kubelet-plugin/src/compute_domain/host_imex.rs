//! An `nvidia-imex` the host runs (NVIDIA's `nvidia-imex` systemd service,
//! which GB200 driver installs enable), not this agent. Two daemons on one
//! node fight for the IMEX ports (50000, 50005) and the channels, so the
//! agent never starts its own beside a host-managed one and never signals
//! or stops it. Instead it serves a domain through it when the host's
//! daemon lists every node of the domain (its `IMEX_NODE_CONFIG_FILE`),
//! asking it `nvidia-imex-ctl -q` for readiness; a domain it does not
//! cover is refused per claim with what to change.
//!
//! Found in the host's process table (`--proc-root`): an `nvidia-imex`
//! whose `-c` is not a configuration this driver writes
//! (`…/domains/<domainUID>/imexd.cfg`, under this agent's state directory
//! or another instance's). Its files are read through `<proc>/<pid>/root`,
//! the host's view of its paths.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

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

/// The configuration an `nvidia-imex` command line runs with, `None` when
/// it is not `nvidia-imex` (argument 0, or 1 under a shell).
pub fn daemon_config_of(args: &[&[u8]]) -> Option<PathBuf> {
    if !args.iter().take(2).any(|a| a.ends_with(b"/nvidia-imex") || *a == b"nvidia-imex") {
        return None;
    }
    let config = args.windows(2).find(|w| w[0] == b"-c").map(|w| w[1]).unwrap_or(DEFAULT_CONFIG.as_bytes());
    Some(PathBuf::from(String::from_utf8_lossy(config).into_owned()))
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

/// The first host-managed `nvidia-imex` in `proc_root`: one whose
/// configuration this driver did not write.
pub fn detect(proc_root: &Path, ours: &Path) -> Option<HostDaemon> {
    let mut pids: Vec<u32> = std::fs::read_dir(proc_root)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
        .collect();
    pids.sort_unstable();
    pids.into_iter().find_map(|pid| {
        let dir = proc_root.join(pid.to_string());
        let cmdline = std::fs::read(dir.join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let config = daemon_config_of(&args)?;
        if written_by_this_driver(&config, ours) || !alive(&dir) {
            return None;
        }
        Some(HostDaemon { pid, config, root: dir.join("root") })
    })
}

fn alive(proc_dir: &Path) -> bool {
    std::fs::read_to_string(proc_dir.join("stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])))
        .unwrap_or(false)
}

impl HostDaemon {
    /// Where the host's `path` is readable from here.
    pub fn readable(&self, path: &Path) -> PathBuf {
        self.root.join(path.strip_prefix("/").unwrap_or(path))
    }

    /// Refuses a domain the daemon cannot serve: its peer list lacks
    /// some of the domain's nodes, or cannot be read.
    pub fn check_serves(&self, peers: &[IpAddr], node: &str, domain: &str) -> Result<(), String> {
        let config = std::fs::read_to_string(self.readable(&self.config)).map_err(|e| {
            format!("{}: cannot read its configuration {}: {e}", self.describe(node), self.config.display())
        })?;
        let nodes_file = nodes_file_of(&config);
        let nodes = std::fs::read_to_string(self.readable(&nodes_file))
            .map_err(|e| format!("{}: cannot read its node list {}: {e}", self.describe(node), nodes_file.display()))?;
        let missing = missing_peers(&nodes, peers);
        if missing.is_empty() {
            return Ok(());
        }
        let missing: Vec<String> = missing.iter().map(ToString::to_string).collect();
        Err(format!(
            "{}, and its node list {} lacks {} of ComputeDomain {domain}: the driver does not start a second IMEX daemon beside it. Either add the domain's nodes to that file and restart the host's daemon, or stop and disable it (systemctl disable --now nvidia-imex) so the driver runs the domain's own daemon",
            self.describe(node),
            nodes_file.display(),
            missing.join(", ")
        ))
    }

    fn describe(&self, node: &str) -> String {
        format!("node {node} runs a host-managed nvidia-imex (pid {}, -c {})", self.pid, self.config.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<&[u8]> {
        line.split(' ').map(str::as_bytes).collect()
    }

    #[test]
    fn an_imex_command_line_names_its_configuration() {
        assert_eq!(daemon_config_of(&args("/usr/bin/nvidia-imex -c /etc/x.cfg")), Some("/etc/x.cfg".into()));
        assert_eq!(daemon_config_of(&args("nvidia-imex")), Some(DEFAULT_CONFIG.into()));
        assert_eq!(daemon_config_of(&args("/bin/sh /r/usr/bin/nvidia-imex -c /c.cfg")), Some("/c.cfg".into()));
        assert_eq!(daemon_config_of(&args("/usr/bin/nvidia-imex-ctl -q")), None);
        assert_eq!(daemon_config_of(&args("/bin/sleep 1")), None);
    }

    #[test]
    fn the_peer_list_is_read_from_the_configuration() {
        assert_eq!(nodes_file_of("LOG_LEVEL=4\nIMEX_NODE_CONFIG_FILE=/etc/n.cfg\n"), PathBuf::from("/etc/n.cfg"));
        assert_eq!(nodes_file_of("LOG_LEVEL=4\n"), PathBuf::from(DEFAULT_NODES));
        let peers: Vec<IpAddr> = ["10.0.0.1", "10.0.0.2", "10.0.0.3"].iter().map(|a| a.parse().unwrap()).collect();
        assert_eq!(missing_peers("# rack 1\n10.0.0.1\n\n10.0.0.2 # tray 2\n", &peers), [peers[2]]);
        assert!(missing_peers("10.0.0.3\n10.0.0.2\n10.0.0.1\n10.0.0.9\n", &peers).is_empty());
    }

    #[test]
    fn our_daemons_and_dead_ones_are_not_the_hosts() {
        let proc = tempfile::tempdir().unwrap();
        let add = |pid: u32, cmdline: &str, state: &str| {
            let dir = proc.path().join(pid.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cmdline"), cmdline.replace(' ', "\0")).unwrap();
            std::fs::write(dir.join("stat"), format!("{pid} (nvidia-imex) {state} 1")).unwrap();
        };
        add(10, "/usr/bin/nvidia-imex -c /state/domains/d1/imexd.cfg", "S");
        add(11, "/usr/bin/nvidia-imex -c /etc/nvidia-imex/config.cfg", "Z");
        add(9, "/bin/sh /r/usr/bin/nvidia-imex -c /other/compute-domains/domains/d2/imexd.cfg", "S");
        assert_eq!(detect(proc.path(), Path::new("/state/domains")), None);
        add(12, "/usr/bin/nvidia-imex -c /etc/nvidia-imex/config.cfg", "S");
        let host = detect(proc.path(), Path::new("/state/domains")).unwrap();
        assert_eq!((host.pid, host.config.as_path()), (12, Path::new("/etc/nvidia-imex/config.cfg")));
        assert_eq!(host.readable(Path::new("/etc/n.cfg")), proc.path().join("12/root/etc/n.cfg"));
    }
}
