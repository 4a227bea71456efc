//! `simulate` against the allocator inside it. Not a test: it prints figures.
//!
//! Run: `cargo bench -p gpu-dra-controller --bench simulate`.
//!
//! Generates a fleet file (1,000 nodes: DGX H100-like, A100 with MIG and
//! PCIe A30 inventories from `examples/inventories/`) and 8,000 claims (a
//! List of single-GPU and MIG claims with CEL selectors), runs the release
//! binary with `--timings -o json`, and compares the whole run's claims/s
//! with the allocation phase alone (the allocator built from the slices and
//! placing every claim). Target (issue 10): simulate within 1.5× of the
//! allocator.

use std::error::Error;
use std::fmt::Write as _;
use std::process::Command;
use std::time::Instant;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

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
