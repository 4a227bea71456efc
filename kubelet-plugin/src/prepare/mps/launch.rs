//! The MPS subcommands: `mps-launch` runs `nvidia-cuda-mps-control -d` in
//! a mount namespace of its own whose `/dev/shm` is the claim's tmpfs;
//! `mps-supervisor` launches daemons for the plugin from another container
//! (see [`crate::prepare::mps::supervisor`]).
//!
//! The MPS server and its clients share memory through `/dev/shm`: the
//! containers get the claim's tmpfs there (a CDI mount), so the daemon
//! must see the same one. NVIDIA's daemon pod bind-mounts it and chroots;
//! here the launcher unshares its mount namespace (a follower of the
//! plugin's, so unmounts there reach it), binds the tmpfs on `/dev/shm`,
//! drops its copies of the other claims' tmpfs mounts (so that a daemon
//! does not keep another claim's memory alive after that claim's
//! unmount), then execs the daemon, which keeps the namespace.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

/// Arguments of `mps-launch` (run by the plugin, not by people).
#[derive(Debug, clap::Args)]
pub struct MpsLaunchArgs {
    /// The claim's tmpfs, to become `/dev/shm`.
    #[arg(long, value_name = "DIR")]
    pub shm: PathBuf,
    /// `<state-dir>/mps`: mounts under it are dropped from the namespace.
    #[arg(long, value_name = "DIR")]
    pub mps_dir: PathBuf,
    /// The daemon's command line.
    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
}

/// Sets up the namespace and execs the command; returns only on failure.
pub fn exec(args: &MpsLaunchArgs) -> anyhow::Result<()> {
    use rustix::mount::{MountPropagationFlags, UnmountFlags, mount_bind, mount_change, unmount};
    // SAFETY: unshare(CLONE_NEWNS) changes this process's mount namespace
    // only; this subcommand runs single-threaded (no async runtime) and
    // shares no file descriptor tables.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(std::io::Error::last_os_error()).context("unsharing the mount namespace (needs CAP_SYS_ADMIN)");
    }
    mount_change("/", MountPropagationFlags::DOWNSTREAM | MountPropagationFlags::REC)
        .context("making the new mount namespace a follower of the plugin's")?;
    std::fs::create_dir_all("/dev/shm").context("creating /dev/shm")?;
    mount_bind(&args.shm, "/dev/shm").with_context(|| format!("binding {} on /dev/shm", args.shm.display()))?;
    let mps_dir = std::fs::canonicalize(&args.mps_dir).unwrap_or_else(|_| args.mps_dir.clone());
    let table = std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    let mut ours: Vec<PathBuf> = crate::prepare::mps::host::mount_points(&table)
        .map(PathBuf::from)
        .filter(|p| p.starts_with(&mps_dir) && p.as_path() != Path::new("/dev/shm"))
        .collect();
    // Deepest first.
    ours.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for mount in ours {
        unmount(&mount, UnmountFlags::DETACH)
            .with_context(|| format!("dropping {} from the namespace", mount.display()))?;
    }
    let Some((program, rest)) = args.command.split_first() else { bail!("no command to run") };
    let error = std::process::Command::new(program).args(rest).exec();
    Err(error).with_context(|| format!("running {}", Path::new(program).display()))
}

/// Flags of `mps-supervisor`.
#[derive(Debug, clap::Args)]
pub struct MpsSupervisorArgs {
    /// The plugin's --state-dir (shared with the plugin's container, at the
    /// same path).
    #[arg(long, env = "STATE_DIR", value_name = "DIR")]
    pub state_dir: PathBuf,
    /// The NVIDIA driver's installation, whose nvidia-cuda-mps-control runs
    /// [default: /].
    #[arg(long, env = "NVIDIA_DRIVER_ROOT", value_name = "DIR", default_value = "/")]
    pub driver_root: PathBuf,
}

/// `mps-supervisor`: serves the plugin's launch requests until stopped.
pub fn supervise(args: &MpsSupervisorArgs) -> anyhow::Result<()> {
    let host = crate::host::driver_files::local_mps_control(args.driver_root.clone(), true)
        .and_then(super::host::LocalMps::from_driver)
        .context("no nvidia-cuda-mps-control in --driver-root: nothing to supervise")?;
    // Its text already holds every cause: one line, not a chain repeating them.
    crate::prepare::mps::supervisor::run(&host, &args.state_dir).map_err(|e| anyhow::Error::msg(e.to_string()))
}
