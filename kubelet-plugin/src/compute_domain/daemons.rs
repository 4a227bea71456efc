//! The IMEX daemons this node agent runs: one `nvidia-imex` per
//! ComputeDomain with a claim prepared on this node, from the driver root,
//! configured in `<state>/compute-domains/domains/<domainUID>/`
//! (`imexd.cfg`, `nodes.cfg`, `imex.log`).
//!
//! A daemon is found by its command line (`nvidia-imex -c <that imexd.cfg>`)
//! in `/proc`, never by a pid file: a plugin killed between starting the
//! daemon and recording anything finds it again, so a daemon is never
//! started twice. Its directory exists before it starts and is removed
//! after it stopped, so a daemon never outlives its directory.
//!
//! A daemon outlives the agent that started it (its own process group; a
//! plugin stopped or killed leaves it running): the next agent adopts it
//! by that command line. When it died with the agent's container, the
//! next agent starts it again from the directory's files ([`Daemons::revive`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpu_dra_driver::compute_domain::imex::{self, DaemonState};

use super::host_imex::HostDaemon;
use crate::state::durable;
use crate::state::kill_point::{self, Step};

const CONFIG: &str = "imexd.cfg";
const NODES: &str = "nodes.cfg";
const LOG: &str = "imex.log";
/// How long a stopping daemon gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long a started daemon may take to show its command line.
const VISIBLE_WAIT: Duration = Duration::from_secs(1);
/// The longest one `nvidia-imex-ctl -q` may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the IMEX programs are: `usr/bin` (else `bin`) of the driver root.
#[derive(Debug, Clone)]
pub struct ImexPrograms {
    pub daemon: PathBuf,
    pub ctl: PathBuf,
}

impl ImexPrograms {
    /// `None` when the driver root has no `nvidia-imex` (the optional
    /// nvidia-imex package is not installed).
    pub fn find(driver_root: &Path) -> Option<Self> {
        ["usr/bin", "bin"].iter().map(|d| driver_root.join(d)).find_map(|dir| {
            let daemon = dir.join("nvidia-imex");
            let ctl = dir.join("nvidia-imex-ctl");
            (daemon.is_file() && ctl.is_file()).then_some(Self { daemon, ctl })
        })
    }
}

/// What [`Daemons::ensure`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// Started now: give it time to become ready.
    Started,
    /// Was running; its peer list was rewritten and it was told (SIGUSR1).
    Reloaded,
    Unchanged,
}

/// A daemon this process started, and whether it asked it to stop.
struct Started {
    child: Child,
    stop_requested: bool,
}

/// How a daemon this process started ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DaemonExit {
    /// The agent stopped it (its domain has no claim left here): expected.
    StoppedByAgent,
    /// It exited or was killed without the agent asking: the health loop
    /// starts it again, and the user should know.
    Unexpected,
}

impl DaemonExit {
    /// An exit after the agent's SIGTERM (or SIGKILL past the grace) is the
    /// agent's doing whatever its status (`nvidia-imex` exits 0 on
    /// SIGTERM); any other exit, even status 0, is not: a daemon serves
    /// until it is told to stop.
    pub fn classify(stop_requested: bool) -> Self {
        if stop_requested { Self::StoppedByAgent } else { Self::Unexpected }
    }
}

pub struct Daemons {
    root: PathBuf,
    programs: Option<ImexPrograms>,
    /// Daemons this process started, reaped when they exit.
    children: Mutex<HashMap<String, Started>>,
}

impl Daemons {
    pub fn new(root: PathBuf, programs: Option<ImexPrograms>) -> Self {
        Self { root, programs, children: Mutex::new(HashMap::new()) }
    }

    /// Where the daemons' directories are (a configuration under it is ours).
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn dir(&self, domain: &str) -> PathBuf {
        self.root.join(domain)
    }

    fn programs(&self) -> Result<&ImexPrograms, String> {
        self.programs.as_ref().ok_or_else(|| {
            "nvidia-imex and nvidia-imex-ctl are not in the driver root (usr/bin or bin): install NVIDIA's nvidia-imex package matching the driver".to_owned()
        })
    }

    /// Domains with a directory (a daemon running, or being set up or torn down).
    pub fn domains(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.root) else { return Vec::new() };
        entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| !n.starts_with('.')).collect()
    }

    /// The peer list the daemon was last given.
    pub fn peers(&self, domain: &str) -> Option<String> {
        std::fs::read_to_string(self.dir(domain).join(NODES)).ok()
    }

    /// Writes the configuration and peer list, and starts the daemon unless
    /// it runs (then a changed peer list is reloaded with SIGUSR1, as
    /// NVIDIA's daemon wrapper does).
    pub fn ensure(&self, domain: &str, peers: &[IpAddr]) -> Result<Ensured, String> {
        let programs = self.programs()?;
        let dir = self.dir(domain);
        durable::create_dir(&self.root, 0o700).map_err(|e| format!("creating {}: {e}", self.root.display()))?;
        durable::create_dir(&dir, 0o700).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let config = imex::daemon_config(&dir.join(NODES), &dir.join(LOG));
        if std::fs::read_to_string(dir.join(CONFIG)).ok().as_deref() != Some(config.as_str()) {
            durable::write(&dir, CONFIG, config.as_bytes(), 0o644).map_err(|e| format!("writing {CONFIG}: {e}"))?;
        }
        let nodes = imex::nodes_config(peers);
        let changed = self.peers(domain).as_deref() != Some(nodes.as_str());
        if changed {
            durable::write(&dir, NODES, nodes.as_bytes(), 0o644).map_err(|e| format!("writing {NODES}: {e}"))?;
        }
        self.reap();
        if let Some(pid) = self.find(domain) {
            if changed {
                signal(pid, rustix::process::Signal::USR1)?;
                return Ok(Ensured::Reloaded);
            }
            return Ok(Ensured::Unchanged);
        }
        kill_point::reached(Step::DomainDaemonConfigured);
        self.spawn(domain, programs)?;
        kill_point::reached(Step::DomainDaemonStarted);
        Ok(Ensured::Started)
    }

    /// Starts the domain's daemon again from the files in its directory
    /// when it is not running (it died, or with the agent's container);
    /// `false` when it runs or the directory has no configuration.
    pub fn revive(&self, domain: &str) -> Result<bool, String> {
        let dir = self.dir(domain);
        if !dir.join(CONFIG).is_file() || !dir.join(NODES).is_file() {
            return Ok(false);
        }
        self.reap();
        if self.find(domain).is_some() {
            return Ok(false);
        }
        self.spawn(domain, self.programs()?)?;
        Ok(true)
    }

    fn spawn(&self, domain: &str, programs: &ImexPrograms) -> Result<(), String> {
        let dir = self.dir(domain);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("output.log"))
            .map_err(|e| format!("opening the daemon's output log: {e}"))?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let mut command = Command::new(&programs.daemon);
        command.arg("-c").arg(dir.join(CONFIG)).stdin(Stdio::null()).stdout(log).stderr(err);
        // Its own process group: a signal to the plugin's group (a
        // terminal's ^C) does not stop the domain's daemon.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command.spawn().map_err(|e| format!("starting {}: {e}", programs.daemon.display()))?;
        // The kernel shows the new command line a moment after `spawn`
        // returns: wait for it, so that no caller misses the daemon and
        // starts a second.
        let deadline = Instant::now() + VISIBLE_WAIT;
        while self.find(domain).is_none() && Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "{} exited at once ({status}); see {}",
                    programs.daemon.display(),
                    dir.join("output.log").display()
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        tracing::info!(domain, pid = child.id(), "started nvidia-imex");
        self.children().insert(domain.to_owned(), Started { child, stop_requested: false });
        Ok(())
    }

    /// `nvidia-imex-ctl -c <config> -q`: whether the local daemon is ready.
    pub async fn query(&self, domain: &str) -> DaemonState {
        let Ok(programs) = self.programs() else { return DaemonState::NotReady("nvidia-imex-ctl missing".into()) };
        if self.find(domain).is_none() {
            return DaemonState::NotReady("the daemon is not running".into());
        }
        ctl_query(&programs.ctl, &self.dir(domain).join(CONFIG)).await
    }

    /// `nvidia-imex-ctl -c <its config> -q` for a host-managed daemon.
    pub async fn query_host(&self, host: &HostDaemon) -> DaemonState {
        let Ok(programs) = self.programs() else { return DaemonState::NotReady("nvidia-imex-ctl missing".into()) };
        ctl_query(&programs.ctl, &host.readable(&host.config)).await
    }

    /// The daemon's log, for an error a user reads.
    pub fn log_file(&self, domain: &str) -> PathBuf {
        self.dir(domain).join(LOG)
    }

    /// Stops the domain's daemon (SIGTERM, then SIGKILL) and removes its
    /// directory; how it ended when this process had started it.
    pub fn stop(&self, domain: &str) -> Result<Option<DaemonExit>, String> {
        let mut exit = None;
        let mut reap = || {
            for (reaped, how) in self.reap() {
                if reaped == domain {
                    exit = Some(how);
                }
            }
        };
        if let Some(pid) = self.find(domain) {
            if let Some(started) = self.children().get_mut(domain) {
                started.stop_requested = true;
            }
            signal(pid, rustix::process::Signal::TERM)?;
            let deadline = Instant::now() + STOP_GRACE;
            while self.find(domain).is_some() && Instant::now() < deadline {
                reap();
                std::thread::sleep(Duration::from_millis(20));
            }
            if let Some(pid) = self.find(domain) {
                signal(pid, rustix::process::Signal::KILL)?;
                while self.find(domain).is_some() {
                    reap();
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            tracing::info!(domain, "stopped nvidia-imex");
            kill_point::reached(Step::DomainDaemonStopped);
        }
        reap();
        let dir = self.dir(domain);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(exit),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(exit),
            Err(e) => Err(format!("removing {}: {e}", dir.display())),
        }
    }

    fn children(&self) -> std::sync::MutexGuard<'_, HashMap<String, Started>> {
        self.children.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Collects the exit status of daemons this process started: an exit
    /// the agent asked for is logged at info, any other warns.
    pub fn reap(&self) -> Vec<(String, DaemonExit)> {
        let mut exits = Vec::new();
        self.children().retain(|domain, started| match started.child.try_wait() {
            Ok(Some(status)) => {
                let exit = DaemonExit::classify(started.stop_requested);
                match exit {
                    DaemonExit::StoppedByAgent => {
                        tracing::info!(domain, %status, "nvidia-imex exited, stopped by the agent")
                    }
                    DaemonExit::Unexpected => {
                        tracing::warn!(domain, %status, "nvidia-imex exited unexpectedly; the health loop starts it again")
                    }
                }
                exits.push((domain.clone(), exit));
                false
            }
            _ => true,
        });
        exits
    }

    /// The pid of the domain's daemon: a live process whose command line
    /// runs `nvidia-imex` with `-c <its imexd.cfg>`.
    pub fn find(&self, domain: &str) -> Option<i32> {
        let config = self.dir(domain).join(CONFIG);
        let config = config.to_str()?;
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let runs_imex = args.iter().take(2).any(|a| a.ends_with(b"nvidia-imex"));
            let ours = args.windows(2).any(|w| w[0] == b"-c" && w[1] == config.as_bytes());
            if runs_imex && ours && is_alive(pid) {
                return Some(pid);
            }
        }
        None
    }
}

async fn ctl_query(ctl: &Path, config: &Path) -> DaemonState {
    let mut command = tokio::process::Command::new(ctl);
    command.arg("-c").arg(config).arg("-q").stdin(Stdio::null()).kill_on_drop(true);
    match tokio::time::timeout(QUERY_TIMEOUT, command.output()).await {
        Ok(Ok(output)) => {
            let text = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
            imex::parse_ctl_query(output.status.success(), &text)
        }
        Ok(Err(error)) => DaemonState::NotReady(format!("cannot run nvidia-imex-ctl: {error}")),
        Err(_) => DaemonState::NotReady(format!("nvidia-imex-ctl gave no answer in {QUERY_TIMEOUT:?}")),
    }
}

fn is_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])))
        .unwrap_or(false)
}

fn signal(pid: i32, signal: rustix::process::Signal) -> Result<(), String> {
    let Some(pid) = rustix::process::Pid::from_raw(pid) else { return Ok(()) };
    match rustix::process::kill_process(pid, signal) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(e) => Err(format!("signalling nvidia-imex (pid {}): {e}", pid.as_raw_nonzero())),
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use gpu_dra_driver::driver_root::fake_imex;

    use super::*;

    #[test]
    fn only_an_exit_the_agent_did_not_ask_for_is_unexpected() {
        assert_eq!(DaemonExit::classify(true), DaemonExit::StoppedByAgent);
        assert_eq!(DaemonExit::classify(false), DaemonExit::Unexpected);
    }

    /// The fake `nvidia-imex` exits 0 on SIGTERM, as the real one does:
    /// the agent's own stop is told apart from a kill it did not make.
    #[test]
    fn a_stopped_daemon_is_the_agents_doing_and_a_killed_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        fake_imex::install(&dir.path().join("driver")).unwrap();
        let daemons = Daemons::new(dir.path().join("domains"), ImexPrograms::find(&dir.path().join("driver")));
        let peers = [IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))];

        assert_eq!(daemons.ensure("stopped", &peers).unwrap(), Ensured::Started);
        assert_eq!(daemons.stop("stopped").unwrap(), Some(DaemonExit::StoppedByAgent));
        assert!(!daemons.dir("stopped").exists());

        assert_eq!(daemons.ensure("killed", &peers).unwrap(), Ensured::Started);
        let pid = daemons.find("killed").unwrap();
        signal(pid, rustix::process::Signal::KILL).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut exits = Vec::new();
        while exits.is_empty() && Instant::now() < deadline {
            exits = daemons.reap();
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(exits, [("killed".to_owned(), DaemonExit::Unexpected)]);
        assert_eq!(daemons.stop("killed").unwrap(), None, "nothing left to stop");
    }
}
