//! `simulate` against the allocator inside it. Not a test: it prints figures.
//!
//! Run: `cargo bench -p gpu-dra-controller --bench simulate`.
//!
//! Part 1, fleets exported to files (issue 20): each fleet is written as
//! `kubectl get resourceslices -o json` would (a `v1` List, `items` before
//! `kind`): 1,000 × 8 partitionable H100 (208,000 devices, the allocation
//! benchmark's fleet), 1,000 × 8 whole H100, and 1,000 × 8 A100 with MIG
//! (7 × 1g.10gb each, published by the plugin's slice builder). `simulate
//! -f deviceclasses -f fleet.json -f claims.json` runs with 100 claims; its
//! wall time (the start: reading the fleet dominates) and peak RSS (the
//! child's own, from wait4) are printed against the allocator holding the
//! same fleet (this binary run with `--case allocator FLEET`: slices parsed
//! one at a time and added, the same claims placed). Targets: on the
//! partitionable fleet peak RSS <= 400 MiB and start <= 2 s; on every
//! fleet, peak RSS within 1.5× of the allocator's.
//!
//! Part 2:
//! Generates a fleet file (1,000 nodes: DGX H100-like, A100 with MIG and
//! PCIe A30 inventories from `examples/inventories/`) and 8,000 claims (a
//! List of single-GPU and MIG claims with CEL selectors), runs the release
//! binary with `--timings -o json`, and compares the whole run's claims/s
//! with the allocation phase alone (the allocator built from the slices and
//! placing every claim). Target (issue 10): simulate within 1.5× of the
//! allocator.
//!
//! `--write FLEET DIR` only writes part 1's files for FLEET (e.g.
//! `h100-partitionable`) into DIR, to profile `simulate` on them.

use std::error::Error;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dra_allocator::{Allocator, SequentialShareIds};
use gpu_dra_driver::names::{DriverName, NodeName};
use gpu_dra_driver::slices::SliceBuilder;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};

#[allow(dead_code)]
#[path = "../../allocator/benches/common/fleets.rs"]
mod fleets;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// The controller's memory allocator, so the allocator's figures are the
/// controller's.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Claims placed in the file runs: enough to exercise the allocator, few
/// enough that reading the fleet is what is measured.
const FILE_CLAIMS: usize = 100;

/// The fleets written to files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileFleet {
    PartitionableH100,
    WholeH100,
    A100Mig,
}

impl FileFleet {
    const ALL: [FileFleet; 3] = [FileFleet::PartitionableH100, FileFleet::WholeH100, FileFleet::A100Mig];

    fn name(self) -> &'static str {
        match self {
            FileFleet::PartitionableH100 => "h100-partitionable",
            FileFleet::WholeH100 => "h100-whole",
            FileFleet::A100Mig => "a100-mig",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            FileFleet::PartitionableH100 => "1,000 x 8 partitionable H100 (208,000 devices)",
            FileFleet::WholeH100 => "1,000 x 8 whole H100 (8,000 devices)",
            FileFleet::A100Mig => "1,000 x 8 A100 with MIG, 7 x 1g.10gb each (56,000 devices)",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Node `n`'s slices.
    fn node_slices(self, n: usize) -> Result<Vec<ResourceSlice>> {
        Ok(match self {
            FileFleet::PartitionableH100 => fleets::node_slices(n, true, 1, fleets::DRIVER_VERSION),
            FileFleet::WholeH100 => fleets::node_slices(n, false, 1, fleets::DRIVER_VERSION),
            FileFleet::A100Mig => {
                const INVENTORY: &str = "gpus: [{model: A100-SXM4-80GB, count: 8, mig: [{instances: \
                    [1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb]}]}]";
                let node = NodeName::new(fleets::node_name(n))?;
                let inventory = gpu_dra_driver::inventory::fake::parse(INVENTORY, &node)
                    .map_err(|(field, problem, _)| format!("{field}: {problem}"))?;
                SliceBuilder::new(DriverName::nvidia_default(), node).build(&inventory, 1)?
            }
        })
    }

    /// Claim `i`: a whole GPU, or a MIG 1g.10gb device on the A100 fleet.
    fn claim(self, i: usize) -> serde_json::Value {
        let (class, expression) = match self {
            FileFleet::A100Mig => ("mig.nvidia.com", r#"device.attributes["gpu.nvidia.com"].profile == "1g.10gb""#),
            _ => (
                "gpu.nvidia.com",
                r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) > 0 && device.attributes["gpu.nvidia.com"].driverVersion.compareTo(semver("575.0.0")) >= 0"#,
            ),
        };
        serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": format!("claim-{i:05}"), "namespace": "bench"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": class, "selectors": [{"cel": {"expression": expression}}]}}]}}
        })
    }
}

/// A finished child: wall time, peak RSS, what it printed.
struct Measured {
    wall: Duration,
    peak_mib: f64,
    stdout: String,
    stderr: String,
}

/// Runs `command` to its end; the peak RSS is the child's own (wait4's
/// rusage), not this process's.
fn measured(command: &mut Command) -> Result<Measured> {
    let out = tempfile::tempfile()?;
    let err = tempfile::tempfile()?;
    let started = Instant::now();
    let child = command.stdin(Stdio::null()).stdout(out.try_clone()?).stderr(err.try_clone()?).spawn()?;
    let pid = libc::pid_t::try_from(child.id())?;
    let mut status: libc::c_int = 0;
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: the pointers are valid for the call; the child is ours and
    // reaped only here (a dropped `Child` is neither waited nor killed).
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, usage.as_mut_ptr()) };
    let wall = started.elapsed();
    if reaped != pid {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: wait4 succeeded, so it filled `usage` (zeroed before anyway).
    let usage = unsafe { usage.assume_init() };
    let read = |mut f: std::fs::File| -> Result<String> {
        use std::io::{Read, Seek};
        let mut text = String::new();
        f.rewind()?;
        f.read_to_string(&mut text)?;
        Ok(text)
    };
    let (stdout, stderr) = (read(out)?, read(err)?);
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        return Err(format!("{command:?} failed (status {status}): {stderr}").into());
    }
    // ru_maxrss is in KiB on Linux.
    Ok(Measured { wall, peak_mib: usage.ru_maxrss as f64 / 1024.0, stdout, stderr })
}

/// Writes the fleet's List and the claims; returns the fleet file's size.
fn write_files(fleet: FileFleet, fleet_file: &Path, claims_file: &Path) -> Result<u64> {
    let file = std::fs::File::create(fleet_file)?;
    let mut failed = None;
    let slices = (0..fleets::NODES).map_while(|n| match fleet.node_slices(n) {
        Ok(s) => Some(s),
        Err(e) => {
            failed = Some(e);
            None
        }
    });
    let bytes = fleets::write_list(file, slices.flatten())?;
    if let Some(e) = failed {
        return Err(e);
    }
    let items: Vec<serde_json::Value> = (0..FILE_CLAIMS).map(|i| fleet.claim(i)).collect();
    std::fs::write(claims_file, serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string())?;
    Ok(bytes)
}

/// The shipped DeviceClasses.
fn shipped_classes(dir: &Path) -> Result<Vec<DeviceClass>> {
    let mut classes = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            classes.push(serde_yaml_ng::from_str(&std::fs::read_to_string(&path)?)?);
        }
    }
    Ok(classes)
}

/// `--case allocator FLEET`: the allocator alone holding the fleet, each
/// slice parsed from JSON and added as a watch would deliver it, then the
/// same claims placed. Prints what it placed.
fn allocator_case(fleet: FileFleet, classes_dir: &Path) -> Result<()> {
    let mut builder = Allocator::builder();
    for n in 0..fleets::NODES {
        for slice in fleet.node_slices(n)? {
            let json = serde_json::to_vec(&slice)?;
            drop(slice);
            let parsed: ResourceSlice = serde_json::from_slice(&json)?;
            builder.add_slice(&parsed);
        }
    }
    let mut allocator =
        builder.build(&shipped_classes(classes_dir)?).with_share_ids(Box::new(SequentialShareIds::new()));
    let mut placed = 0usize;
    for i in 0..FILE_CLAIMS {
        let claim: ResourceClaim = serde_json::from_value(fleet.claim(i))?;
        placed += usize::from(allocator.place(&[&claim]).is_ok());
    }
    println!("placed {placed}");
    Ok(())
}

/// Part 1: each fleet from a file, simulate against the allocator alone.
fn from_files(root: &Path) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let classes = root.join("deviceclasses");
    let exe = std::env::current_exe()?;
    println!("simulate from exported fleet files ({FILE_CLAIMS} claims each; peak RSS of each process from wait4)");
    for fleet in FileFleet::ALL {
        let fleet_file: PathBuf = dir.path().join(format!("{}.json", fleet.name()));
        let claims_file = dir.path().join(format!("{}-claims.json", fleet.name()));
        let bytes = write_files(fleet, &fleet_file, &claims_file)?;
        let run = measured(
            Command::new(env!("CARGO_BIN_EXE_gpu-dra-controller"))
                .args(["simulate", "--timings", "-o", "json", "-f"])
                .arg(&classes)
                .arg("-f")
                .arg(&fleet_file)
                .arg("-f")
                .arg(&claims_file),
        )?;
        let alone = measured(Command::new(&exe).args(["--case", "allocator", fleet.name()]).arg(&classes))?;
        std::fs::remove_file(&fleet_file)?;
        let results: serde_json::Value = serde_json::from_str(&run.stdout)?;
        let allocated =
            results["results"].as_array().map_or(0, |r| r.iter().filter(|r| r["allocated"] == true).count());
        let timings = run.stderr.lines().find(|l| l.starts_with("timings:")).unwrap_or("no timings line");
        println!("fleet: {} ({} MiB of JSON)", fleet.describe(), bytes >> 20);
        println!("  simulate: {allocated} of {FILE_CLAIMS} allocated; {timings}");
        println!("  allocator alone: {}", alone.stdout.trim());
        let start = run.wall.as_secs_f64();
        let ratio = run.peak_mib / alone.peak_mib;
        let verdict = |ok: bool| if ok { "ok" } else { "MISSED" };
        println!("  {:<44} {:>8.2}", "simulate start to exit (s)", start);
        println!("  {:<44} {:>8.0}", "simulate peak RSS (MiB)", run.peak_mib);
        println!("  {:<44} {:>8.0}", "allocator alone peak RSS (MiB)", alone.peak_mib);
        println!("  {:<44} {:>8.2}   target <= 1.5   {}", "simulate / allocator memory", ratio, verdict(ratio <= 1.5));
        if fleet == FileFleet::PartitionableH100 {
            println!(
                "  {:<44} {:>8}   before 3.1 GiB, 7.3 s   target <= 400 MiB, <= 2 s   {}",
                "issue 20 target",
                "",
                verdict(run.peak_mib <= 400.0 && start <= 2.0)
            );
        }
    }
    Ok(())
}

const NODES: usize = 1_000;
const CLAIMS: usize = 8_000;

fn fleet(inventories: &std::path::Path) -> Result<String> {
    let mut out = String::from("nodes:\n");
    for n in 0..NODES {
        let inventory = match n % 4 {
            0 | 1 => "dgx-h100.yaml",
            2 => "a100-mig.yaml",
            _ => "pcie-nvlink-pairs.yaml",
        };
        writeln!(out, "  - name: node-{n:04}\n    inventory: {}", inventories.join(inventory).display())?;
    }
    Ok(out)
}

fn claims() -> String {
    let items: Vec<serde_json::Value> = (0..CLAIMS)
        .map(|i| {
            let (class, expression) = if i % 5 == 0 {
                ("mig.nvidia.com", r#"device.attributes["gpu.nvidia.com"].profile == "1g.10gb""#)
            } else {
                (
                    "gpu.nvidia.com",
                    r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("20Gi")) > 0 && device.attributes["gpu.nvidia.com"].driverVersion.compareTo(semver("550.0.0")) >= 0"#,
                )
            };
            serde_json::json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": format!("claim-{i:05}"), "namespace": "bench"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": class, "selectors": [{"cel": {"expression": expression}}]}}]}}
            })
        })
        .collect();
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

/// `name 12.3 ms` out of the `timings:` line.
fn phase_ms(timings: &str, name: &str) -> Option<f64> {
    let rest = timings.split(&format!("{name} ")).nth(1)?;
    rest.split(" ms").next()?.parse().ok()
}

fn main() -> Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--write") {
        // `--write FLEET DIR`: keep the fleet and claims files, to profile
        // `simulate` on them.
        let fleet = args.get(i + 1).and_then(|n| FileFleet::parse(n)).ok_or("--write FLEET DIR")?;
        let dir = Path::new(args.get(i + 2).ok_or("--write FLEET DIR")?);
        let bytes = write_files(
            fleet,
            &dir.join(format!("{}.json", fleet.name())),
            &dir.join(format!("{}-claims.json", fleet.name())),
        )?;
        println!("wrote {} MiB of JSON to {}", bytes >> 20, dir.display());
        return Ok(());
    }
    if let Some(i) = args.iter().position(|a| a == "--case") {
        let fleet = args.get(i + 2).and_then(|n| FileFleet::parse(n)).ok_or("--case allocator FLEET CLASSES")?;
        let classes = args.get(i + 3).ok_or("--case allocator FLEET CLASSES")?;
        return allocator_case(fleet, Path::new(classes));
    }
    from_files(&root)?;
    println!();
    let dir = tempfile::tempdir()?;
    let fleet_file = dir.path().join("fleet.yaml");
    std::fs::write(&fleet_file, fleet(&root.join("examples/inventories"))?)?;
    let claims_file = dir.path().join("claims.json");
    std::fs::write(&claims_file, claims())?;
    let classes = root.join("deviceclasses");
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra-controller"))
        .args(["simulate", "--timings", "-o", "json", "-f"])
        .arg(&classes)
        .arg("-f")
        .arg(&claims_file)
        .arg("--fleet")
        .arg(&fleet_file)
        .output()?;
    let wall = t.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("simulate failed: {stderr}").into());
    }
    let timings = stderr.lines().find(|l| l.starts_with("timings:")).ok_or("no timings line")?;
    let results: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let allocated = results["results"].as_array().map_or(0, |r| r.iter().filter(|r| r["allocated"] == true).count());
    let allocate = phase_ms(timings, "allocate").ok_or("no allocate phase")? / 1e3;
    let claims = CLAIMS as f64;
    println!("simulate benchmark: {NODES} nodes, {CLAIMS} claims ({allocated} allocated)");
    println!("  {timings}");
    println!("  whole run (process wall time)            {:>8.0} claims/s", claims / wall);
    println!("  allocation phase (allocator alone)       {:>8.0} claims/s", claims / allocate);
    let ratio = wall / allocate;
    let verdict = if ratio <= 1.5 { "ok" } else { "MISSED" };
    println!(
        "  simulate / allocator time                {ratio:>8.2}   before ~3-6 (issue 10)   target <= 1.5   {verdict}"
    );
    Ok(())
}
