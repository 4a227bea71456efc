//! NodePrepareResources latency and the plugin's memory, measured from the
//! kubelet stand-in against the shipped binary (profile `node`) on a fake
//! inventory.
//!
//! `cargo bench -p integration-tests --bench prepare [-- ROUNDS]`
//!
//! Prints, for 1-GPU and 8-GPU claims, p50/p99/mean of prepare (and
//! unprepare), the cost of the fsyncs one prepare must do on the same file
//! system, and the ratio (target: p99 ≤ 2× that cost); then the plugin's
//! steady RSS with 8 GPUs and with an A100 node fully MIG-partitioned
//! (target ≤ 16 MiB); then dynamic MIG on the mock NVML: prepare and
//! unprepare of a 1g and of a 4g+2g+1g claim, the time NVML took inside
//! each call (the plugin's own metric), and the rest, our overhead,
//! against the same fsync target. Figures only: nothing here asserts a
//! speed.

use std::time::{Duration, Instant};

use gpu_dra_driver::driver_root::{LIBRARIES, fake_tree};
use gpu_kubelet_plugin::state::durable;
use integration_tests::kubelet::KubeletConfig;
use integration_tests::node::{DRIVER, RunningNode};
use integration_tests::plugin_process::PluginOptions;
use integration_tests::workspace_root;
use kubelet_proto::dra_v1::Claim;

/// A prepare writes three records durably (PrepareStarted, the CDI spec,
/// PrepareCompleted): each is a file fsync plus a directory fsync.
const DURABLE_WRITES_PER_PREPARE: usize = 3;

const A100_FULL_MIG: &str = "\
gpus:
  - model: A100-SXM4-40GB
    count: 8
    nvlinkGroups: [[0, 1, 2, 3, 4, 5, 6, 7]]
    mig:
      - instances: [1g.5gb, 1g.5gb, 1g.5gb, 1g.5gb, 1g.5gb, 1g.5gb, 1g.5gb]
";

/// `rounds` prepare + unprepare cycles of `c`; the latencies of each.
fn cycle(node: &RunningNode, c: &Claim, rounds: usize) -> (Vec<Duration>, Vec<Duration>) {
    let claims = std::slice::from_ref(c);
    let mut prepare = Vec::with_capacity(rounds);
    let mut unprepare = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        node.runtime.block_on(node.kubelet.prepare(&node.plugin, claims)).expect("prepare");
        prepare.push(started.elapsed());
        let started = Instant::now();
        node.runtime.block_on(node.kubelet.unprepare(&node.plugin, claims)).expect("unprepare");
        unprepare.push(started.elapsed());
    }
    (prepare, unprepare)
}

/// VmRSS, VmHWM, RssAnon and RssFile of the plugin after a moment of idling.
fn memory(node: &RunningNode) -> Memory {
    std::thread::sleep(Duration::from_secs(2));
    let status = std::fs::read_to_string(format!("/proc/{}/status", node.process.pid())).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Memory { rss: field("VmRSS:"), hwm: field("VmHWM:"), anon: field("RssAnon:"), file: field("RssFile:") }
}

/// The plugin on `inventory`, with a driver root laid out like a real
/// install (every library of the compute and utility set, firmware,
/// binaries, the persistenced socket), so specs carry their mounts and hooks.
fn start(inventory: &str) -> (RunningNode, tempfile::TempDir) {
    let version = inventory
        .lines()
        .find_map(|l| l.trim().strip_prefix("driverVersion:"))
        .map(|v| v.trim().trim_matches('"').to_string())
        .unwrap_or_else(|| "580.82.07".into());
    let root = tempfile::tempdir().expect("driver root");
    let libs: Vec<(&str, String)> = LIBRARIES.iter().map(|l| (*l, format!("{l}.1"))).collect();
    let libs: Vec<(&str, &str)> = libs.iter().map(|(l, s)| (*l, s.as_str())).collect();
    fake_tree::build(root.path(), &version, &libs).expect("fake driver root");
    let extra_args = vec![
        "--driver-root".to_string(),
        root.path().display().to_string(),
        "--nvidia-cdi-hook-path".into(),
        "/usr/bin/nvidia-cdi-hook".into(),
    ];
    let options = PluginOptions { log_level: "warn".into(), extra_args, ..PluginOptions::default() };
    (RunningNode::start(inventory, KubeletConfig::new("", DRIVER), options), root)
}

struct Memory {
    rss: u64,
    hwm: u64,
    anon: u64,
    file: u64,
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "VmRSS {} KiB ({:.1} MiB; anonymous {} KiB, file-backed {} KiB), VmHWM {} KiB",
            self.rss,
            self.rss as f64 / 1024.0,
            self.anon,
            self.file,
            self.hwm
        )
    }
}

struct Stats {
    p50: Duration,
    p99: Duration,
    mean: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    let mean = samples.iter().sum::<Duration>() / samples.len().max(1) as u32;
    Stats { p50: at(0.50), p99: at(0.99), mean }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// The durable writes of one prepare, timed on the file system the plugin
/// uses: 3 × (write temp, fsync, rename, fsync dir).
fn fsync_cost(dir: &std::path::Path, rounds: usize) -> (Stats, f64) {
    let before = durable::fsync_count();
    let samples = (0..rounds).map(|_| fsync_sample(dir)).collect();
    let per_prepare = (durable::fsync_count() - before) as f64 / rounds as f64;
    (stats(samples), per_prepare)
}

/// One prepare's durable writes, timed once.
fn fsync_sample(dir: &std::path::Path) -> Duration {
    let record = [b'x'; 700];
    let started = Instant::now();
    for w in 0..DURABLE_WRITES_PER_PREPARE {
        durable::write(dir, &format!("f{w}.json"), &record, 0o600).expect("durable write");
    }
    started.elapsed()
}

fn main() {
    let rounds: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(300);
    let inventory =
        std::fs::read_to_string(workspace_root().join("examples/inventories/dgx-h100.yaml")).expect("inventory");
    println!(
        "prepare benchmark: {rounds} rounds per claim shape, plugin built with profile `node`, fake inventory and a fake driver root ({} libraries, firmware, binaries)\n",
        LIBRARIES.len()
    );

    let (node, _root) = start(&inventory);
    let (fsync, fsyncs) = fsync_cost(node.dirs.root.path(), rounds);
    println!(
        "fsync cost of one prepare ({DURABLE_WRITES_PER_PREPARE} durable writes, {fsyncs:.0} fsyncs): p50 {}  p99 {}  mean {}",
        ms(fsync.p50),
        ms(fsync.p99),
        ms(fsync.mean)
    );
    let one = node.gpu_claim("one-gpu", &["gpu-0"]);
    let all: Vec<String> = (0..8).map(|i| format!("gpu-{i}")).collect();
    let eight = node.gpu_claim("eight-gpus", &all.iter().map(String::as_str).collect::<Vec<_>>());
    // Warm-up: connections, the claim cache, page cache.
    cycle(&node, &one, 5);
    println!(
        "\n| claim | prepare p50 | prepare p99 | prepare mean | unprepare p50 | unprepare p99 | p99 / fsync p50 | p99 / fsync p99 |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (label, c) in [("1 GPU", &one), ("8 GPUs", &eight)] {
        let (prepare, unprepare) = cycle(&node, c, rounds);
        let (p, u) = (stats(prepare), stats(unprepare));
        println!(
            "| {label} | {} | {} | {} | {} | {} | {:.2}× | {:.2}× |",
            ms(p.p50),
            ms(p.p99),
            ms(p.mean),
            ms(u.p50),
            ms(u.p99),
            p.p99.as_secs_f64() / fsync.p50.as_secs_f64(),
            p.p99.as_secs_f64() / fsync.p99.as_secs_f64()
        );
    }
    // Leave one 8-GPU claim prepared for the memory reading.
    node.runtime.block_on(node.kubelet.prepare(&node.plugin, std::slice::from_ref(&eight))).expect("prepare");
    println!("\nplugin memory, 8 × H100 (8 devices, one 8-GPU claim prepared): {}", memory(&node));
    drop(node);

    let (mig, _mig_root) = start(A100_FULL_MIG);
    let claims: Vec<Claim> =
        (0..8).map(|g| mig.gpu_claim(&format!("mig-{g}"), &[&format!("gpu-{g}-mig-1g5gb-19-0")])).collect();
    mig.runtime.block_on(mig.kubelet.prepare(&mig.plugin, &claims)).expect("MIG prepare");
    println!(
        "plugin memory, 8 × A100-40GB fully MIG-partitioned (56 devices, 8 MIG claims prepared): {}",
        memory(&mig)
    );
    drop(mig);

    dynamic_mig(rounds, &fsync);
    println!(
        "\ntargets: prepare p99 ≤ 2× the fsync cost of a prepare (dynamic MIG: our overhead around the mock's creation time); plugin RSS ≤ 16 MiB (16384 KiB)"
    );
}

const DYNAMIC_H100: &str = "gpus:\n  - model: H100-80GB\n    count: 8\n    mig:\n      - dynamic: true\n";

/// Dynamic MIG claims on 8 dynamic H100s behind the mock NVML: the
/// plugin's prepare and unprepare latency as the kubelet sees it, and, for
/// each call, the time NVML took inside it (the plugin's own
/// `gpu_dra_mig_nvml_duration_seconds`, read before and after the call):
/// the rest is ours, per call rather than as a difference of percentiles.
/// Each round also times one prepare's durable writes just before its
/// prepare, so that the fsync cost the target compares with is measured
/// under the same conditions as the calls (this machine's disk is shared
/// and its latency drifts over minutes); the run's first fsync cost is
/// shown beside it.
fn dynamic_mig(rounds: usize, fsync: &Stats) {
    use integration_tests::mock_gpu::MockGpuNode;
    use integration_tests::plugin_process::scrape_metrics;

    let gpu = MockGpuNode::new(DYNAMIC_H100);
    let mut options = gpu.plugin_options("DynamicMIG=true");
    // A free port chosen here: the plugin logs only warnings, as in the
    // other cases, so its log does not say which port it bound.
    let [port] = integration_tests::ports::reserve();
    let addr = format!("127.0.0.1:{port}");
    options.log_level = "warn".into();
    options.metrics_addr = addr.clone();
    let node = RunningNode::start("gpus: []\n", KubeletConfig::new("", DRIVER), options);
    let nvml_seconds = |operation: &str| -> f64 {
        let text = scrape_metrics(&addr).expect("GET /metrics");
        let prefix = format!("gpu_dra_mig_nvml_duration_seconds_sum{{operation=\"{operation}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.trim().parse().ok()).unwrap_or(0.0)
    };
    let one = node.gpu_claim("dyn-1g", &["gpu-0-mig-1g10gb-19-0"]);
    let three =
        node.gpu_claim("dyn-4g2g1g", &["gpu-1-mig-4g40gb-5-0", "gpu-1-mig-2g20gb-14-4", "gpu-1-mig-1g10gb-19-6"]);
    cycle(&node, &one, 3);

    println!("\ndynamic MIG on the mock NVML ({rounds} rounds; NVML's time is the plugin's own measure of each call):");
    println!(
        "\n| claim | prepare p50 | prepare p99 | NVML p50 | NVML p99 | ours p50 | ours p99 | fsync p50 / p99 in the same rounds | ours p99 / that p50 | ours p99 / that p99 | ours p99 / the first fsync p50 | unprepare p50 | its NVML p50 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let claims = [("1g", &one), ("4g+2g+1g", &three)];
    for (label, claim) in claims {
        let claims = std::slice::from_ref(claim);
        let (mut prepare, mut nvml, mut ours, mut unprepare, mut unmake, mut writes) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            writes.push(fsync_sample(node.dirs.root.path()));
            let before = nvml_seconds("prepare");
            let started = Instant::now();
            node.runtime.block_on(node.kubelet.prepare(&node.plugin, claims)).expect("prepare");
            let took = started.elapsed();
            let made = Duration::from_secs_f64((nvml_seconds("prepare") - before).max(0.0));
            prepare.push(took);
            nvml.push(made);
            ours.push(took.saturating_sub(made));
            let before = nvml_seconds("unprepare");
            let started = Instant::now();
            node.runtime.block_on(node.kubelet.unprepare(&node.plugin, claims)).expect("unprepare");
            unprepare.push(started.elapsed());
            unmake.push(Duration::from_secs_f64((nvml_seconds("unprepare") - before).max(0.0)));
        }
        let (p, n, o, u, d) = (stats(prepare), stats(nvml), stats(ours), stats(unprepare), stats(unmake));
        let w = stats(writes);
        println!(
            "| {label} | {} | {} | {} | {} | {} | {} | {} / {} | {:.2}× | {:.2}× | {:.2}× | {} | {} |",
            ms(p.p50),
            ms(p.p99),
            ms(n.p50),
            ms(n.p99),
            ms(o.p50),
            ms(o.p99),
            ms(w.p50),
            ms(w.p99),
            o.p99.as_secs_f64() / w.p50.as_secs_f64(),
            o.p99.as_secs_f64() / w.p99.as_secs_f64(),
            o.p99.as_secs_f64() / fsync.p50.as_secs_f64(),
            ms(u.p50),
            ms(d.p50)
        );
    }
    println!("plugin memory, 8 dynamic H100s (one 4g+2g+1g claim prepared): {}", {
        node.runtime.block_on(node.kubelet.prepare(&node.plugin, std::slice::from_ref(&three))).expect("prepare");
        memory(&node)
    });
}
