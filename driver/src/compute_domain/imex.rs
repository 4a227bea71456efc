//! The IMEX daemon's files and answers: its configuration (NVIDIA's
//! `compute-domain-daemon-config.tmpl.cfg` keys), the peer list (one
//! address a line, `IMEX_NODE_CONFIG_FILE`), what `nvidia-imex-ctl -q`
//! prints, and the channel character devices
//! (`/dev/nvidia-caps-imex-channels/channel<N>`, major from the
//! `nvidia-caps-imex-channels` line of `/proc/devices`).

use std::net::IpAddr;
use std::path::Path;

/// The `/proc/devices` name of the IMEX channel devices.
pub const CHANNEL_DEVICE_NAME: &str = "nvidia-caps-imex-channels";
/// Directory of the channel device nodes, in the host's and the container's `/dev`.
pub const CHANNEL_DIR: &str = "/dev/nvidia-caps-imex-channels";
/// Channels the driver offers (NVIDIA's plugin hard-codes the same figure).
pub const CHANNEL_COUNT: u32 = 2048;
/// The IMEX daemon's peer port (`SERVER_PORT`, NVIDIA's default).
pub const SERVER_PORT: u16 = 50000;
/// The IMEX daemon's command port (`IMEX_CMD_PORT`), which
/// `nvidia-imex-ctl` queries.
pub const CMD_PORT: u16 = 50005;

/// `/dev/nvidia-caps-imex-channels/channel<id>`.
pub fn channel_path(id: u32) -> String {
    format!("{CHANNEL_DIR}/channel{id}")
}

/// The major of the IMEX channel devices, from the "Character devices:"
/// section of `/proc/devices`; `None` when the driver did not register it
/// (no IMEX support loaded).
pub fn channel_major(proc_devices: &str) -> Option<u32> {
    let mut in_character_devices = false;
    for line in proc_devices.lines().map(str::trim) {
        if line.ends_with(':') {
            in_character_devices = line == "Character devices:";
            continue;
        }
        let mut fields = line.split_whitespace();
        if let (true, Some(major), Some(CHANNEL_DEVICE_NAME), None) =
            (in_character_devices, fields.next(), fields.next(), fields.next())
        {
            return major.parse().ok();
        }
    }
    None
}

/// The daemon's configuration file: NVIDIA's keys and values, with the
/// peer list at `nodes_config` and the log at `log_file`. The daemon does
/// not daemonize: the node agent tracks its process.
pub fn daemon_config(nodes_config: &Path, log_file: &Path) -> String {
    let lines = [
        "LOG_LEVEL=4".to_owned(),
        format!("LOG_FILE_NAME={}", log_file.display()),
        "LOG_APPEND_TO_LOG=1".to_owned(),
        "LOG_FILE_MAX_SIZE=1024".to_owned(),
        "LOG_USE_SYSLOG=0".to_owned(),
        "DAEMONIZE=0".to_owned(),
        "BIND_INTERFACE_IP=".to_owned(),
        format!("SERVER_PORT={SERVER_PORT}"),
        format!("IMEX_NODE_CONFIG_FILE={}", nodes_config.display()),
        "IMEX_WAIT_FOR_QUORUM=RECOVERY".to_owned(),
        "IMEX_ENABLE_AUTH_ENCRYPTION=0".to_owned(),
        "IMEX_CMD_ENABLED=1".to_owned(),
        format!("IMEX_CMD_PORT={CMD_PORT}"),
        "IMEX_NODE_DISCONNECTED_GRACE_TIME=-1".to_owned(),
    ];
    let mut text = lines.join("\n");
    text.push('\n');
    text
}

/// The peer list: each node's address on a line of its own, in the order
/// given (the domain's node order, so every node writes the same file).
pub fn nodes_config<'a>(addresses: impl IntoIterator<Item = &'a IpAddr>) -> String {
    addresses.into_iter().map(|a| format!("{a}\n")).collect()
}

/// What `nvidia-imex-ctl -q` said about the local daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DaemonState {
    Ready,
    /// Anything else, with what it printed (trimmed), for the error a user sees.
    NotReady(String),
}

/// `nvidia-imex-ctl -q` prints `READY` and nothing else for a ready daemon
/// (NVIDIA's daemon check compares the output with `"READY\n"`).
pub fn parse_ctl_query(exit_ok: bool, output: &str) -> DaemonState {
    let trimmed = output.trim();
    if exit_ok && trimmed == "READY" {
        DaemonState::Ready
    } else if trimmed.is_empty() {
        DaemonState::NotReady(if exit_ok { "no answer".into() } else { "nvidia-imex-ctl failed".into() })
    } else {
        DaemonState::NotReady(trimmed.chars().take(200).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_major_only_from_character_devices() {
        let text = "Character devices:\n  1 mem\n195 nvidia\n236 nvidia-caps-imex-channels\n\nBlock devices:\n237 nvidia-caps-imex-channels\n";
        assert_eq!(channel_major(text), Some(236));
        assert_eq!(channel_major("Block devices:\n236 nvidia-caps-imex-channels\n"), None);
        assert_eq!(channel_major("Character devices:\n195 nvidia\n"), None);
    }

    #[test]
    fn config_points_at_the_peer_list() {
        let text = daemon_config(Path::new("/s/nodes.cfg"), Path::new("/s/imex.log"));
        assert!(text.contains("\nIMEX_NODE_CONFIG_FILE=/s/nodes.cfg\n"), "{text}");
        assert!(text.contains("\nDAEMONIZE=0\n"));
        assert!(text.contains("\nIMEX_CMD_PORT=50005\n"));
        let a: IpAddr = "10.0.0.2".parse().unwrap();
        let b: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(nodes_config([&a, &b]), "10.0.0.2\nfd00::1\n");
        assert_eq!(channel_path(3), "/dev/nvidia-caps-imex-channels/channel3");
    }

    #[test]
    fn only_ready_is_ready() {
        assert_eq!(parse_ctl_query(true, "READY\n"), DaemonState::Ready);
        assert_eq!(parse_ctl_query(true, "NOT_READY\n"), DaemonState::NotReady("NOT_READY".into()));
        assert_eq!(parse_ctl_query(false, "READY\n"), DaemonState::NotReady("READY".into()));
        assert_eq!(parse_ctl_query(false, ""), DaemonState::NotReady("nvidia-imex-ctl failed".into()));
    }
}
