//! `<state>/compute-domains/device-nodes.json`: the IMEX channel device
//! nodes this agent created on the host, by channel number
//! (`{"channels": [0]}`), recorded before each is made and removed when no
//! claim holds a channel any more.
//!
//! The file names no path: a channel's node is
//! `<dev-root>/dev/nvidia-caps-imex-channels/channel<N>`, derived from the
//! number, and is removed only when it is what the agent makes (a
//! character device with the channels' major and the channel as minor),
//! reached without following a symlink. A file that is not such a list (a
//! symlink, a FIFO, too large, undecodable, a channel beyond the driver's
//! range) is damaged: the caller sets it aside and removes nothing.
//! Older agents wrote the nodes' paths; a path is read as its channel
//! only when it is exactly such a node's path under `<dev-root>`.

use std::collections::BTreeSet;
use std::io;
use std::path::Path;

use gpu_dra_driver::bounded_file::{self, Dir, Links};
use gpu_dra_driver::compute_domain::imex::{CHANNEL_COUNT, CHANNEL_DIR};
use rustix::fs::FileType;

use super::error::Error;
use crate::state::checkpoint::derived::quoted;
use crate::state::durable;

pub const FILE: &str = "device-nodes.json";
/// 2048 channels of a few bytes each fit many times over.
const FILE_MAX: u64 = 64 * 1024;

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct List {
    channels: BTreeSet<u32>,
}

/// The channels the file lists (none when it is missing); why it is
/// damaged otherwise.
pub fn read(state_dir: &Path, dev_root: Option<&Path>) -> Result<BTreeSet<u32>, Damage> {
    match bounded_file::read(&state_dir.join(FILE), FILE_MAX, Links::Refuse) {
        Ok(bytes) => parse(&bytes, dev_root),
        Err(e) if e.is_not_found() => Ok(BTreeSet::new()),
        Err(e) => Err(Damage::Unreadable(e.problem)),
    }
}

/// Why the list of created nodes cannot be trusted: nothing it lists is
/// removed.
#[derive(Debug, thiserror::Error)]
pub enum Damage {
    #[error(transparent)]
    Unreadable(bounded_file::ReadProblem),
    #[error("not a list of channel numbers ({{\"channels\": [0, 1]}}): {0}")]
    NotAList(#[source] serde_json::Error),
    #[error("names {}, which is not a channel device node under <dev-root>{CHANNEL_DIR}", quoted(.0))]
    NotAChannelNode(String),
    #[error("field `channels` holds {channel}; the driver's channels are 0 to {}", CHANNEL_COUNT - 1)]
    OutOfRange { channel: u32 },
}

/// The channels of a file's content (see the module's rules).
pub fn parse(bytes: &[u8], dev_root: Option<&Path>) -> Result<BTreeSet<u32>, Damage> {
    let channels = match serde_json::from_slice::<List>(bytes) {
        Ok(list) => list.channels,
        Err(error) => {
            let paths: Vec<String> = serde_json::from_slice(bytes).map_err(|_| Damage::NotAList(error))?;
            paths
                .iter()
                .map(|path| legacy_channel(path, dev_root).ok_or_else(|| Damage::NotAChannelNode(path.clone())))
                .collect::<Result<_, _>>()?
        }
    };
    match channels.iter().find(|c| **c >= CHANNEL_COUNT) {
        Some(c) => Err(Damage::OutOfRange { channel: *c }),
        None => Ok(channels),
    }
}

/// The channel of an older agent's entry: exactly
/// `<dev-root>/dev/nvidia-caps-imex-channels/channel<N>`.
fn legacy_channel(path: &str, dev_root: Option<&Path>) -> Option<u32> {
    let dir = dev_root?.join(CHANNEL_DIR.trim_start_matches('/'));
    let name = Path::new(path).strip_prefix(&dir).ok()?.to_str()?;
    let digits = name.strip_prefix("channel")?;
    let id: u32 = digits.parse().ok()?;
    (id.to_string() == digits).then_some(id)
}

/// Records `channels` (durably, before the nodes are made).
pub fn write(state_dir: &Path, channels: &BTreeSet<u32>) -> io::Result<()> {
    let bytes = serde_json::to_vec(&List { channels: channels.clone() }).map_err(io::Error::other)?;
    durable::write(state_dir, FILE, &bytes, 0o600)
}

/// Removes channel `id`'s node under `dev_root` if it is the agent's kind
/// (a character device, major `major` when known, minor `id`); whether it
/// did. Anything else there is left, with one log line.
pub fn remove_node(dev_root: &Path, id: u32, major: Option<u32>) -> Result<bool, Error> {
    let path = dev_root.join(CHANNEL_DIR.trim_start_matches('/'));
    let opened = Dir::open(dev_root).and_then(|d| d.subdir("dev")).and_then(|d| d.subdir("nvidia-caps-imex-channels"));
    let dir = match opened {
        Ok(dir) => dir,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(source) => return Err(Error::ChannelDirLinked { path, source }),
    };
    let name = format!("channel{id}");
    let Some(stat) = dir.entry_stat(&name).map_err(|source| Error::InspectNode { path: path.join(&name), source })?
    else {
        return Ok(false);
    };
    let kind = FileType::from_raw_mode(stat.st_mode);
    let (found_major, found_minor) = (rustix::fs::major(stat.st_rdev), rustix::fs::minor(stat.st_rdev));
    if kind != FileType::CharacterDevice || found_minor != id || major.is_some_and(|m| m != found_major) {
        tracing::warn!(
            path = %path.join(&name).display(),
            ?kind, major = found_major, minor = found_minor,
            "not the channel device node the agent made (a character device, the channels' major, minor {id}); left alone"
        );
        return Ok(false);
    }
    dir.remove_file(&name).map_err(|source| Error::Remove { path: path.join(&name), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_are_read_and_paths_only_as_channel_nodes() {
        let root = Path::new("/host");
        assert_eq!(parse(br#"{"channels":[0,7]}"#, Some(root)).unwrap(), BTreeSet::from([0, 7]));
        let legacy =
            br#"["/host/dev/nvidia-caps-imex-channels/channel0","/host/dev/nvidia-caps-imex-channels/channel12"]"#;
        assert_eq!(parse(legacy, Some(root)).unwrap(), BTreeSet::from([0, 12]));
        for bad in [
            r#"["/etc/passwd"]"#,
            r#"["/host/dev/nvidia-caps-imex-channels/../../etc/passwd"]"#,
            r#"["/host/dev/nvidia-caps-imex-channels/channel01"]"#,
            r#"["/other/dev/nvidia-caps-imex-channels/channel0"]"#,
        ] {
            let error = parse(bad.as_bytes(), Some(root)).unwrap_err().to_string();
            assert!(error.contains("which is not a channel device node"), "{bad}: {error}");
        }
        assert!(parse(br#"["/host/dev/nvidia-caps-imex-channels/channel0"]"#, None).is_err(), "no dev root: no path");
        assert!(parse(br#"{"channels":[2048]}"#, Some(root)).unwrap_err().to_string().contains("0 to 2047"));
        assert!(parse(br#"{"channels":[0],"paths":["/x"]}"#, Some(root)).is_err());
        assert!(parse(b"{", Some(root)).unwrap_err().to_string().starts_with("not a list of channel numbers"));
    }
}
