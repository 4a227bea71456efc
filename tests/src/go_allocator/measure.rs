//! Running one side as a process to its end: wall time, peak RSS (the
//! child's own, from `wait4`), the phases it reports on its `timings:`
//! line, and its choices.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::compare::{Choice, choices};
use super::{Error, Inputs, Result, io, json};

/// A finished child.
#[derive(Debug, Clone)]
pub struct Measured {
    pub wall: Duration,
    pub peak_mib: f64,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `command` to its end. A non-zero exit is an error with its
/// standard error.
pub fn measured(command: &mut Command) -> Result<Measured> {
    let what = format!("{command:?}");
    let out = tempfile::tempfile().map_err(io("a temporary file for stdout"))?;
    let err = tempfile::tempfile().map_err(io("a temporary file for stderr"))?;
    let started = Instant::now();
    let child = command
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(io("stdout"))?)
        .stderr(err.try_clone().map_err(io("stderr"))?)
        .spawn()
        .map_err(io(format!("starting {what}")))?;
    let pid = libc::pid_t::try_from(child.id()).map_err(|e| Error::Failed(format!("{what}: pid: {e}")))?;
    let mut status: libc::c_int = 0;
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: the pointers are valid for the call; the child is ours and
    // reaped only here (a dropped `Child` is neither waited for nor killed).
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, usage.as_mut_ptr()) };
    let wall = started.elapsed();
    if reaped != pid {
        return Err(Error::Io { what: format!("waiting for {what}"), source: std::io::Error::last_os_error() });
    }
    // SAFETY: wait4 succeeded, so it filled `usage` (zeroed before anyway).
    let usage = unsafe { usage.assume_init() };
    let read = |mut f: std::fs::File| -> Result<String> {
        use std::io::{Read, Seek};
        let mut text = String::new();
        f.rewind().map_err(io("rewinding an output file"))?;
        f.read_to_string(&mut text).map_err(io(format!("reading the output of {what}")))?;
        Ok(text)
    };
    let (stdout, stderr) = (read(out)?, read(err)?);
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        return Err(Error::Failed(format!("{what} failed (wait status {status}): {stderr}")));
    }
    // ru_maxrss is in KiB on Linux.
    Ok(Measured { wall, peak_mib: usage.ru_maxrss as f64 / 1024.0, stdout, stderr })
}

/// One side's run.
#[derive(Debug, Clone)]
pub struct Side {
    pub measured: Measured,
    /// Its `timings:` line.
    pub timings: String,
    /// Time in its allocation phase (placing every claim; for `simulate`
    /// also building the allocator from the slices it read).
    pub allocate: Duration,
    /// Time writing its results.
    pub output: Duration,
    pub choices: Vec<Choice>,
}

impl Side {
    fn new(measured: Measured) -> Result<Self> {
        let timings = measured
            .stderr
            .lines()
            .find(|l| l.starts_with("timings:"))
            .ok_or_else(|| Error::Failed(format!("no timings line in: {}", measured.stderr)))?
            .to_string();
        let phase = |name: &str| {
            phase_ms(&timings, name)
                .map(|ms| Duration::from_secs_f64(ms / 1e3))
                .ok_or_else(|| Error::Failed(format!("no {name} phase in {timings:?}")))
        };
        let (allocate, output) = (phase("allocate")?, phase("output")?);
        let choices = choices(&measured.stdout).map_err(json("the results document"))?;
        Ok(Side { timings, allocate, output, choices, measured })
    }

    /// From process start until the claims are allocated: reading the
    /// inputs (what a controller or scheduler does once, at start).
    pub fn start_up(&self) -> Duration {
        self.measured.wall.saturating_sub(self.allocate + self.output)
    }

    pub fn allocated(&self) -> usize {
        self.choices.iter().filter(|c| c.placed.is_some()).count()
    }
}

/// `name 12.3 ms` out of a `timings:` line.
fn phase_ms(timings: &str, name: &str) -> Option<f64> {
    let rest = timings.split(&format!(" {name} ")).nth(1)?;
    rest.split(" ms").next()?.parse().ok()
}

/// `simulate -o json --timings` on the inputs.
pub fn run_simulate(controller: &Path, inputs: &Inputs) -> Result<Side> {
    Side::new(measured(
        Command::new(controller)
            .args(["simulate", "-o", "json", "--timings", "-f"])
            .arg(&inputs.classes)
            .arg("-f")
            .arg(&inputs.slices)
            .arg("-f")
            .arg(&inputs.claims),
    )?)
}

/// The Go program on the inputs.
pub fn run_go(go: &Path, inputs: &Inputs) -> Result<Side> {
    Side::new(measured(
        Command::new(go)
            .arg("-classes")
            .arg(&inputs.classes)
            .arg("-slices")
            .arg(&inputs.slices)
            .arg("-claims")
            .arg(&inputs.claims),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_read_from_either_timings_line() {
        let ours =
            "timings: read 812.4 ms, fleet 0.0 ms, workload 0.2 ms, allocate 35.1 ms, output 1.5 ms (700 claims)";
        let go = "timings: read 2310.7 ms, allocate 4120.0 ms, output 20.3 ms (700 claims)";
        assert_eq!(phase_ms(ours, "allocate"), Some(35.1));
        assert_eq!(phase_ms(ours, "output"), Some(1.5));
        assert_eq!(phase_ms(go, "read"), Some(2310.7));
        assert_eq!(phase_ms(go, "fleet"), None);
    }

    #[test]
    fn a_failing_child_is_an_error_with_its_stderr() {
        let e = measured(Command::new("sh").args(["-c", "echo broken >&2; exit 3"])).unwrap_err();
        assert!(e.to_string().contains("broken"), "{e}");
        let ok = measured(Command::new("sh").args(["-c", "echo fine"])).unwrap();
        assert_eq!(ok.stdout, "fine\n");
        assert!(ok.peak_mib > 0.0);
    }
}
