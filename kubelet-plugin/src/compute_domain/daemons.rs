//! The IMEX daemons this node agent runs: one `nvidia-imex` per
//! ComputeDomain with a claim prepared on this node, from the driver root,
//! configured in `<state>/compute-domains/domains/<domainUID>/`
//! (`imexd.cfg`, `nodes.cfg`, `imex.log`, `output.log`). The directory's
//! name is the domain's validated UID ([`DomainUid`]), never a path read
//! from a file, and no step goes through a symlink: a symlinked directory
//! or log is refused with what to remove.
//!
//! A daemon is the agent's when the agent started it, proven by the
//! kernel, never by its name or command line: `daemon.json` in its
//! directory records its pid, start time and executable, written as soon
//! as it started; a process is that daemon only while its pid, start time
//! and executable match, it is the driver root's `nvidia-imex`
//! ([`Program`]), runs as the agent's user, with that directory's
//! configuration. Nothing else is ever signalled. A plugin killed between
//! starting a daemon and recording it finds it again by the environment it
//! gave it (`GPU_DRA_IMEX_DAEMON_DIR`, with the same program and owner
//! checks), so a daemon is never started twice. Its directory exists before
//! it starts and is removed after it stopped.
//!
//! A daemon outlives the agent that started it (its own process group; a
//! plugin stopped or killed leaves it running): the next agent adopts it
//! by that record. When it died with the agent's container, the next agent
//! starts it again from the directory's files ([`Daemons::revive`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpu_dra_driver::bounded_file::Dir;
use gpu_dra_driver::compute_domain::imex::{self, DaemonState};
use gpu_dra_driver::names::DomainUid;

use super::error::Error;
use super::host_imex::{self, HostDaemon};
use crate::process::{self, Process, Program};
use crate::state::durable;
use crate::state::kill_point::{self, Step};

const CONFIG: &str = "imexd.cfg";
const NODES: &str = "nodes.cfg";
const LOG: &str = "imex.log";
const OUTPUT: &str = "output.log";
/// The daemon's identity, recorded when it started.
const RECORD: &str = "daemon.json";
/// The environment a daemon is started with: its directory.
const DIR_ENV: &str = "GPU_DRA_IMEX_DAEMON_DIR";
/// The most of a configuration, peer list or record read back.
const FILE_MAX: u64 = 64 * 1024;
/// How long a stopping daemon gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// The longest one `nvidia-imex-ctl -q` may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the IMEX programs are: `usr/bin` (else `bin`) of the driver root.
#[derive(Debug, Clone)]
pub struct ImexPrograms {
    pub daemon: PathBuf,
    pub ctl: PathBuf,
    /// The daemon's file, which a process must run to be an IMEX daemon.
    pub program: Program,
}

impl ImexPrograms {
    /// `None` when the driver root has no `nvidia-imex` (the optional
    /// nvidia-imex package is not installed).
    pub fn find(driver_root: &Path) -> Option<Self> {
        ["usr/bin", "bin"].iter().map(|d| driver_root.join(d)).find_map(|dir| {
            let daemon = dir.join("nvidia-imex");
            let ctl = dir.join("nvidia-imex-ctl");
            if !(daemon.is_file() && ctl.is_file()) {
                return None;
            }
            let program = Program::at(&daemon)?;
            Some(Self { daemon, ctl, program })
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

/// `daemon.json`: the process the agent started for a domain.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonRecord {
    pub pid: i32,
    /// Field 22 of `/proc/<pid>/stat`: a recycled pid has another.
    pub start_time: u64,
    /// Where `/proc/<pid>/exe` pointed when it started.
    pub exe: PathBuf,
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

    /// The domain's directory: its UID under the daemons' directory.
    pub fn dir(&self, domain: &DomainUid) -> PathBuf {
        self.root.join(domain.as_str())
    }

    fn programs(&self) -> Result<&ImexPrograms, Error> {
        self.programs.as_ref().ok_or(Error::NoImexPrograms)
    }

    /// The domain's directory, opened without following a symlink (created
    /// first when `create`); `None` when missing and not created.
    fn open_dir(&self, domain: &DomainUid, create: bool) -> Result<Option<Dir>, Error> {
        let path = self.dir(domain);
        if create {
            durable::create_dir(&self.root, 0o700)
                .map_err(|source| Error::CreateDir { path: self.root.clone(), source })?;
            if std::fs::symlink_metadata(&path).is_err() {
                durable::create_dir(&path, 0o700).map_err(|source| Error::CreateDir { path: path.clone(), source })?;
            }
        }
        let root = match Dir::open(&self.root) {
            Ok(root) => root,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => return Ok(None),
            Err(source) => return Err(Error::OpenDir { path: self.root.clone(), source }),
        };
        match root.subdir(domain.as_str()) {
            Ok(dir) => Ok(Some(dir)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => Ok(None),
            Err(source) => Err(Error::NotOurDir { path, source }),
        }
    }

    /// Domains with a directory (a daemon running, or being set up or torn
    /// down): real directories named by a ComputeDomain UID.
    pub fn domains(&self) -> Vec<DomainUid> {
        self.entries().0
    }

    /// Entries of the daemons' directory the agent did not make (not a
    /// directory named by a UID): left alone.
    pub fn strays(&self) -> Vec<PathBuf> {
        self.entries().1
    }

    fn entries(&self) -> (Vec<DomainUid>, Vec<PathBuf>) {
        let (mut domains, mut strays) = (Vec::new(), Vec::new());
        let Ok(entries) = std::fs::read_dir(&self.root) else { return (domains, strays) };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            match DomainUid::new(name) {
                Ok(uid) if is_dir => domains.push(uid),
                _ => strays.push(entry.path()),
            }
        }
        domains.sort();
        (domains, strays)
    }

    /// The peer list the daemon was last given.
    pub fn peers(&self, domain: &DomainUid) -> Option<String> {
        let dir = self.open_dir(domain, false).ok()??;
        String::from_utf8(dir.read(NODES, FILE_MAX).ok()?).ok()
    }

    /// Writes the configuration and peer list, and starts the daemon unless
    /// it runs (then a changed peer list is reloaded with SIGUSR1, as
    /// NVIDIA's daemon wrapper does).
    pub fn ensure(&self, domain: &DomainUid, peers: &[IpAddr]) -> Result<Ensured, Error> {
        let programs = self.programs()?;
        let path = self.dir(domain);
        let dir = self.open_dir(domain, true)?.ok_or_else(|| Error::DirMissing(path.clone()))?;
        let config = imex::daemon_config(&path.join(NODES), &path.join(LOG));
        if dir.read(CONFIG, FILE_MAX).ok().as_deref() != Some(config.as_bytes()) {
            durable::write(&path, CONFIG, config.as_bytes(), 0o644)
                .map_err(|source| Error::WriteDaemonFile { name: CONFIG, source })?;
        }
        let nodes = imex::nodes_config(peers);
        let changed = self.peers(domain).as_deref() != Some(nodes.as_str());
        if changed {
            durable::write(&path, NODES, nodes.as_bytes(), 0o644)
                .map_err(|source| Error::WriteDaemonFile { name: NODES, source })?;
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
        self.spawn(domain, programs, &dir)?;
        kill_point::reached(Step::DomainDaemonStarted);
        Ok(Ensured::Started)
    }

    /// Starts the domain's daemon again from the files in its directory
    /// when it is not running (it died, or with the agent's container);
    /// `false` when it runs or the directory has no configuration.
    pub fn revive(&self, domain: &DomainUid) -> Result<bool, Error> {
        let Some(dir) = self.open_dir(domain, false)? else { return Ok(false) };
        let regular = |name| matches!(dir.entry_kind(name), Ok(Some(rustix::fs::FileType::RegularFile)));
        if !regular(CONFIG) || !regular(NODES) {
            return Ok(false);
        }
        self.reap();
        if self.find(domain).is_some() {
            return Ok(false);
        }
        self.spawn(domain, self.programs()?, &dir)?;
        Ok(true)
    }

    fn spawn(&self, domain: &DomainUid, programs: &ImexPrograms, dir: &Dir) -> Result<(), Error> {
        let path = self.dir(domain);
        // The daemon runs as root and writes its own log by path: never
        // through a link someone left there.
        if let Ok(Some(kind)) = dir.entry_kind(LOG)
            && kind != rustix::fs::FileType::RegularFile
        {
            return Err(Error::LogNotRegular { path: path.join(LOG), kind });
        }
        let log =
            dir.open_append(OUTPUT, 0o600).map_err(|source| Error::OpenOutput { path: path.join(OUTPUT), source })?;
        let err = log.try_clone().map_err(Error::DaemonIo)?;
        let mut command = Command::new(&programs.daemon);
        command.arg("-c").arg(path.join(CONFIG)).env(DIR_ENV, &path).stdin(Stdio::null()).stdout(log).stderr(err);
        // Its own process group: a signal to the plugin's group (a
        // terminal's ^C) does not stop the domain's daemon.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child =
            command.spawn().map_err(|source| Error::StartDaemon { program: programs.daemon.clone(), source })?;
        // `spawn` returns once the child has let go of our memory, in the
        // middle of its exec: its start time and executable are already what
        // the kernel shows from now on (fs/exec.c sets the executable before
        // `exec_mmap`), its arguments and environment not yet, so only the
        // first two are recorded.
        let started = Process::read(&proc_dir(child.id() as i32));
        let Some(process) = started else {
            let status = child.wait().map_err(Error::DaemonIo)?;
            return Err(Error::ExitedAtOnce { program: programs.daemon.clone(), status, output: path.join(OUTPUT) });
        };
        let record = DaemonRecord { pid: process.pid, start_time: process.start_time, exe: process.exe };
        tracing::info!(domain = %domain, pid = record.pid, "started nvidia-imex");
        self.children().insert(domain.to_string(), Started { child, stop_requested: false });
        self.record(domain, &record)
    }

    fn record(&self, domain: &DomainUid, record: &DaemonRecord) -> Result<(), Error> {
        let bytes = serde_json::to_vec(record).map_err(Error::EncodeDaemonRecord)?;
        durable::write(&self.dir(domain), RECORD, &bytes, 0o600).map_err(Error::WriteDaemonRecord)
    }

    /// `nvidia-imex-ctl -c <config> -q`: whether the local daemon is ready.
    pub async fn query(&self, domain: &DomainUid) -> DaemonState {
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

    /// A host-managed `nvidia-imex` in `proc_root` (see [`host_imex`]);
    /// none without the driver's program to recognise one by.
    pub fn host_daemon(&self, proc_root: &Path) -> Option<HostDaemon> {
        host_imex::detect(proc_root, &self.root, &self.programs.as_ref()?.program)
    }

    /// The daemon's log, for an error a user reads.
    pub fn log_file(&self, domain: &DomainUid) -> PathBuf {
        self.dir(domain).join(LOG)
    }

    /// Stops the domain's daemon (SIGTERM, then SIGKILL) and removes its
    /// directory; how it ended when this process had started it.
    pub fn stop(&self, domain: &DomainUid) -> Result<Option<DaemonExit>, Error> {
        let mut exit = None;
        let mut reap = || {
            for (reaped, how) in self.reap() {
                if reaped == domain.as_str() {
                    exit = Some(how);
                }
            }
        };
        if let Some(pid) = self.find(domain) {
            if let Some(started) = self.children().get_mut(domain.as_str()) {
                started.stop_requested = true;
            }
            signal(pid, rustix::process::Signal::TERM)?;
            let deadline = Instant::now() + STOP_GRACE;
            while self.find(domain) == Some(pid) && Instant::now() < deadline {
                reap();
                std::thread::sleep(Duration::from_millis(20));
            }
            if self.find(domain) == Some(pid) {
                signal(pid, rustix::process::Signal::KILL)?;
                while self.find(domain) == Some(pid) {
                    reap();
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            tracing::info!(domain = %domain, "stopped nvidia-imex");
            kill_point::reached(Step::DomainDaemonStopped);
        }
        reap();
        // A symlink in its place goes itself, never what it names.
        let dir = self.dir(domain);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(exit),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(exit),
            Err(source) => Err(Error::Remove { path: dir, source }),
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

    /// The pid of the domain's daemon: the process its record names, while
    /// it is that process ([`Self::is_daemon_of`]); else (killed before
    /// recording) the one started with the directory in its environment,
    /// which is recorded now.
    pub fn find(&self, domain: &DomainUid) -> Option<i32> {
        let program = &self.programs.as_ref()?.program;
        let dir = self.open_dir(domain, false).ok()??;
        let recorded: Option<DaemonRecord> =
            dir.read(RECORD, FILE_MAX).ok().and_then(|b| serde_json::from_slice(&b).ok());
        if let Some(record) = recorded {
            let proc = proc_dir(record.pid);
            if let Some(process) = Process::read(&proc)
                && process.start_time == record.start_time
                && process.exe == record.exe
                && self.is_daemon_of(domain, program, &proc, &process)
            {
                return Some(record.pid);
            }
        }
        let env = format!("{DIR_ENV}={}", self.dir(domain).display());
        let found = process::pids(Path::new("/proc"))
            .into_iter()
            .filter_map(|pid| {
                let proc = proc_dir(pid);
                let process = Process::read(&proc)?;
                (self.is_daemon_of(domain, program, &proc, &process) && Process::has_env(&proc, &env))
                    .then_some(process)
            })
            .min_by_key(|p| (p.start_time, p.pid))?;
        tracing::info!(domain = %domain, pid = found.pid, "found the domain's unrecorded nvidia-imex (the agent stopped before recording it)");
        let record = DaemonRecord { pid: found.pid, start_time: found.start_time, exe: found.exe };
        if let Err(error) = self.record(domain, &record) {
            tracing::warn!(domain = %domain, %error, "cannot record the daemon");
        }
        Some(record.pid)
    }

    /// Whether `process` is a daemon of `domain` the agent may have
    /// started: the driver's program, run as the agent's user, with the
    /// domain's configuration.
    fn is_daemon_of(&self, domain: &DomainUid, program: &Program, proc: &Path, process: &Process) -> bool {
        let config = self.dir(domain).join(CONFIG);
        process.uid.1 == rustix::process::geteuid().as_raw()
            && host_imex::config_arg(&process.args) == config
            && program.runs_in(proc, process)
    }
}

fn proc_dir(pid: i32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}"))
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

fn signal(raw: i32, signal: rustix::process::Signal) -> Result<(), Error> {
    let Some(pid) = rustix::process::Pid::from_raw(raw) else { return Ok(()) };
    match rustix::process::kill_process(pid, signal) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(source) => Err(Error::Signal { pid: raw, source }),
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
        let stopped = DomainUid::new("0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b61").unwrap();
        let killed = DomainUid::new("0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b62").unwrap();

        assert_eq!(daemons.ensure(&stopped, &peers).unwrap(), Ensured::Started);
        assert_eq!(daemons.stop(&stopped).unwrap(), Some(DaemonExit::StoppedByAgent));
        assert!(!daemons.dir(&stopped).exists());

        assert_eq!(daemons.ensure(&killed, &peers).unwrap(), Ensured::Started);
        let pid = daemons.find(&killed).unwrap();
        signal(pid, rustix::process::Signal::KILL).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut exits = Vec::new();
        while exits.is_empty() && Instant::now() < deadline {
            exits = daemons.reap();
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(exits, [(killed.to_string(), DaemonExit::Unexpected)]);
        assert_eq!(daemons.stop(&killed).unwrap(), None, "nothing left to stop");
    }

    /// Killed between starting the daemon and recording it: the next
    /// agent finds it by the environment it gave it, and starts no second.
    #[test]
    fn an_unrecorded_daemon_is_found_by_what_the_agent_gave_it() {
        let dir = tempfile::tempdir().unwrap();
        fake_imex::install(&dir.path().join("driver")).unwrap();
        let programs = ImexPrograms::find(&dir.path().join("driver"));
        let daemons = Daemons::new(dir.path().join("domains"), programs.clone());
        let domain = DomainUid::new("0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b61").unwrap();
        let peers = [IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))];
        assert_eq!(daemons.ensure(&domain, &peers).unwrap(), Ensured::Started);
        let pid = daemons.find(&domain).unwrap();
        std::fs::remove_file(daemons.dir(&domain).join(RECORD)).unwrap();
        let next = Daemons::new(dir.path().join("domains"), programs);
        assert_eq!(next.find(&domain), Some(pid));
        assert!(daemons.dir(&domain).join(RECORD).exists(), "recorded again");
        assert_eq!(next.ensure(&domain, &peers).unwrap(), Ensured::Unchanged);
        assert_eq!(next.stop(&domain).unwrap(), None);
        assert!(!daemons.dir(&domain).exists());
    }
}
