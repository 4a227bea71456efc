//! A node's host for ComputeDomains without a rack: a fake driver root
//! with fake `nvidia-imex` / `nvidia-imex-ctl` (`fake_imex`), a `/dev` the
//! node agent creates channel device nodes in, and a `/proc` naming the
//! IMEX channels' major; the node agent's flags that point at them.

use std::io;
use std::path::{Path, PathBuf};

use gpu_dra_driver::driver_root::{fake_imex, fake_tree};

/// Where a channel's device node is, inside the container and under the host root.
pub const CHANNEL_DEVICE: &str = "/dev/nvidia-caps-imex-channels/channel0";

pub struct ImexHost {
    pub driver_root: PathBuf,
    /// The host root: `dev/`, `proc/`.
    pub host: PathBuf,
}

impl ImexHost {
    /// Builds both trees under `dir`.
    pub fn build(dir: &Path) -> io::Result<Self> {
        let driver_root = dir.join("driver-root");
        fake_tree::build(
            &driver_root,
            "580.82.07",
            &[("libcuda.so", "libcuda.so.1"), ("libnvidia-ml.so", "libnvidia-ml.so.1")],
        )?;
        fake_imex::install(&driver_root)?;
        let host = dir.join("host");
        std::fs::create_dir_all(host.join("dev"))?;
        std::fs::create_dir_all(host.join("proc/sys/kernel/random"))?;
        std::fs::write(host.join("proc/sys/kernel/random/boot_id"), "6f1c1c1e-0d2f-4e5b-8a6c-7d9e0f1a2b3c\n")?;
        std::fs::write(host.join("proc/devices"), "Character devices:\n195 nvidia\n234 nvidia-caps-imex-channels\n")?;
        Ok(Self { driver_root, host })
    }

    /// `run --compute-domains` over these trees: a channel waits at most
    /// `ready_timeout_ms` for its domain and daemon; health every 200 ms.
    pub fn plugin_args(&self, ready_timeout_ms: u32) -> Vec<String> {
        let path = |p: &Path| p.display().to_string();
        vec![
            "--compute-domains".into(),
            "--driver-root".into(),
            path(&self.driver_root),
            "--dev-root".into(),
            path(&self.host),
            "--proc-root".into(),
            path(&self.host.join("proc")),
            "--imex-ready-timeout-ms".into(),
            ready_timeout_ms.to_string(),
            "--imex-health-interval-ms".into(),
            "200".into(),
        ]
    }

    /// The channel's device node on the host.
    pub fn channel_node(&self) -> PathBuf {
        self.host.join(CHANNEL_DEVICE.trim_start_matches('/'))
    }

    /// What each fake daemon of this driver root was told.
    pub fn imex_log(&self) -> Vec<String> {
        fake_imex::daemon_log(&self.driver_root)
    }

    /// Live fake `nvidia-imex` daemons of this driver root: processes with
    /// the program as a whole argument (`nvidia-imex-ctl` is not one) whose
    /// parent is not one too (the script's own subshells are not daemons).
    pub fn daemons(&self) -> usize {
        let needle = format!("{}\0", self.driver_root.join("usr/bin/nvidia-imex").display());
        let needle = needle.as_bytes();
        let mut found = std::collections::BTreeMap::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // After the command's closing parenthesis: state, then parent.
            let mut fields = stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace()).into_iter().flatten();
            let (state, parent) = (fields.next().unwrap_or("Z"), fields.next().and_then(|p| p.parse::<u32>().ok()));
            if state != "Z" && cmdline.windows(needle.len()).any(|w| w == needle) {
                found.insert(pid, parent);
            }
        }
        found.values().filter(|parent| parent.is_none_or(|p| !found.contains_key(&p))).count()
    }
}
