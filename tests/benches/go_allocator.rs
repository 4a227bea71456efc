//! Our allocator against the kube-scheduler's, side by side. Not a test: it
//! prints figures (and fails if the two ever choose differently).
//!
//! Run: `cargo bench -p integration-tests --bench go_allocator`
//! (`-- --fleet NAME` for one fleet: h100-100, h100-1000, a100-mig,
//! h100-partitionable). Needs Go and the Go module proxy the first time,
//! to build `tests/go-allocator/` into the per-machine cache.
//!
//! Each fleet, its DeviceClasses (the shipped ones) and its claims are
//! written once as `v1` Lists in JSON. Then `gpu-dra-controller simulate -o
//! json --timings` (release build) and the Go program
//! (`k8s.io/dynamic-resource-allocation` of Kubernetes 1.36, the allocator
//! our allocator follows, with 1.36's default features) each read the
//! files and allocate every claim in order, each on the first node in name
//! order that fits, seeing the claims before it: the Go program as the
//! kube-scheduler does, a new allocator per claim over the allocations so
//! far (PreFilter), `Allocate` on one node after another (Filter). Per
//! fleet and side: claims/s end to end (claims ÷ process wall time) and in
//! the allocation phase alone, start-up (wall time less the allocation and
//! output phases: reading the inputs), peak RSS (the child's, from
//! `wait4`); ratios are ours over Go's for claims/s and Go's over ours for
//! time and memory, so above 1 means ours is ahead. Every claim's node and
//! devices must be the same on both sides; a difference is printed and the
//! benchmark exits with an error.
//!
//! The Go allocator gathers every slice of the fleet on each `Allocate`
//! call and first fit tries the full nodes before the free one, so its time
//! per claim grows with the fleet and with the claims placed before; the
//! claim counts below keep a run within minutes on 2 cores.

use std::process::ExitCode;

use integration_tests::go_allocator::{Fleet, Layout, SideBySide, go_allocator, side_by_side};
use integration_tests::{controller, workspace_root};

/// The fleets: name, fleet, and a note printed with it.
const FLEETS: [(&str, Fleet, &str); 4] = [
    ("h100-100", Fleet { layout: Layout::WholeH100, nodes: 100, claims: 700 }, ""),
    ("h100-1000", Fleet { layout: Layout::WholeH100, nodes: 1_000, claims: 2_000 }, ""),
    ("a100-mig", Fleet { layout: Layout::A100HalfMig, nodes: 1_000, claims: 2_000 }, ""),
    (
        "h100-partitionable",
        Fleet { layout: Layout::PartitionableH100, nodes: 1_000, claims: 40 },
        "claims bounded to 40: each Go Allocate call takes ~0.4 s on this fleet",
    ),
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let only = args.iter().position(|a| a == "--fleet").and_then(|i| args.get(i + 1)).map(String::as_str);
    if let Some(name) = only
        && !FLEETS.iter().any(|(n, ..)| *n == name)
    {
        let names: Vec<&str> = FLEETS.iter().map(|(n, ..)| *n).collect();
        eprintln!("error: --fleet {name}: no such fleet; fleets: {}", names.join(", "));
        return ExitCode::FAILURE;
    }
    match run(only) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: the two allocators chose differently (see above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the fleets; false if any choice differed.
fn run(only: Option<&str>) -> Result<bool, Box<dyn std::error::Error>> {
    let go = go_allocator()?;
    let ours = controller();
    let classes = workspace_root().join("deviceclasses");
    println!("Go allocator vs ours (cargo bench -p integration-tests --bench go_allocator)");
    println!("  ours: {}", ours.display());
    println!("  Go:   {}", go.display());
    let mut rows = Vec::new();
    let mut identical = true;
    for (name, fleet, note) in FLEETS {
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let dir = tempfile::tempdir()?;
        let run = side_by_side(&fleet, dir.path(), &classes, ours, &go)?;
        report(&fleet, note, &run);
        identical &= run.comparison.identical();
        rows.push((fleet, run));
    }
    println!();
    table(&rows);
    Ok(identical)
}

fn report(fleet: &Fleet, note: &str, run: &SideBySide) {
    let i = &run.inputs;
    println!();
    println!(
        "fleet: {} ({} devices in {} slices, {} MiB of JSON); {} claims{}",
        fleet.describe(),
        thousands(i.devices),
        thousands(i.slice_count),
        i.slice_bytes >> 20,
        thousands(fleet.claims),
        if note.is_empty() { String::new() } else { format!(" ({note})") }
    );
    println!("  ours: {} allocated; {}", run.ours.allocated(), run.ours.timings);
    println!("  Go:   {} allocated; {}", run.go.allocated(), run.go.timings);
    if let Some(calls) = run.go.measured.stderr.lines().find(|l| l.starts_with("allocate calls:")) {
        println!("        {calls}");
    }
    let c = &run.comparison;
    if c.identical() {
        println!(
            "  choices: identical on all {} claims ({} allocated alike, {} refused by both)",
            thousands(fleet.claims),
            c.same_allocated,
            c.same_refused
        );
    } else {
        println!("  choices: {} of {} claims DIFFER; the first:", c.mismatches.len(), fleet.claims);
        for m in c.mismatches.iter().take(10) {
            println!("    {m}");
        }
    }
}

/// The summary as a Markdown table (docs/benchmarks.md quotes it).
fn table(rows: &[(Fleet, SideBySide)]) {
    println!(
        "| fleet | claims | claims/s end to end: ours / Go (×) | claims/s allocating: ours / Go (×) | start-up s: ours / Go (×) | peak RSS MiB: ours / Go (×) | same choices |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (fleet, run) in rows {
        let claims = fleet.claims as f64;
        let rate = |secs: f64| claims / secs.max(1e-9);
        let (ours, go) = (&run.ours, &run.go);
        let end = (rate(ours.measured.wall.as_secs_f64()), rate(go.measured.wall.as_secs_f64()));
        let alloc = (rate(ours.allocate.as_secs_f64()), rate(go.allocate.as_secs_f64()));
        let start = (ours.start_up().as_secs_f64(), go.start_up().as_secs_f64());
        let rss = (ours.measured.peak_mib, go.measured.peak_mib);
        println!(
            "| {} | {} | {} / {} ({}) | {} / {} ({}) | {:.2} / {:.2} ({}) | {:.0} / {:.0} ({}) | {} |",
            fleet.describe(),
            thousands(fleet.claims),
            per_second(end.0),
            per_second(end.1),
            times(end.0 / end.1),
            per_second(alloc.0),
            per_second(alloc.1),
            times(alloc.0 / alloc.1),
            start.0,
            start.1,
            times(start.1 / start.0),
            rss.0,
            rss.1,
            times(rss.1 / rss.0),
            if run.comparison.identical() { "yes" } else { "NO" }
        );
    }
}

fn thousands(n: usize) -> String {
    integration_tests::go_allocator::thousands(n)
}

/// A rate with two or three significant digits.
fn per_second(r: f64) -> String {
    if r >= 1000.0 {
        thousands(r.round() as usize)
    } else if r >= 10.0 {
        format!("{r:.0}")
    } else {
        format!("{r:.1}")
    }
}

fn times(ratio: f64) -> String {
    if ratio >= 10.0 { format!("{ratio:.0}×") } else { format!("{ratio:.1}×") }
}
