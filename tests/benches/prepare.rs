//! NodePrepareResources latency and the plugin's memory, measured from the
//! kubelet stand-in against the release binary on a fake inventory.
//!
//! `cargo bench -p integration-tests --bench prepare [-- ROUNDS]`
//!
//! Prints, for 1-GPU and 8-GPU claims, p50/p99/mean of prepare (and
//! unprepare), the cost of the fsyncs one prepare must do on the same file
//! system, and the ratio (target: p99 ≤ 2× that cost); then the plugin's
//! steady RSS with 8 GPUs and with an A100 node fully MIG-partitioned
//! (target ≤ 16 MiB). Figures only: nothing here asserts a speed.

use std::time::{Duration, Instant};

use gpu_kubelet_plugin::durable;
use integration_tests::apiserver::ApiServer;
use integration_tests::claim_fixtures::{self, Allocated, allocated_claim};
use integration_tests::kubelet::{Kubelet, KubeletConfig, Plugin, claim};
use integration_tests::plugin_process::{PluginDirs, PluginOptions, PluginProcess};
use integration_tests::workspace_root;
use kubelet_proto::dra_v1::Claim;

const DRIVER: &str = "gpu.nvidia.com";
const NODE: &str = "node-a";
const WAIT: Duration = Duration::from_secs(60);
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

struct Node {
    server: ApiServer,
    dirs: PluginDirs,
    process: PluginProcess,
    kubelet: Kubelet,
    plugin: Plugin,
    runtime: tokio::runtime::Runtime,
}

impl Node {
    fn start(inventory: &str) -> Self {
        let server = ApiServer::start_in_thread().expect("API-server stand-in");
        let dirs = PluginDirs::new(inventory).expect("plugin directories");
        server.write_kubeconfig(&dirs.kubeconfig).expect("kubeconfig");
        let options = PluginOptions { log_level: "warn".into(), ..PluginOptions::default() };
        let process = PluginProcess::spawn(&dirs, &options).expect("plugin process");
        let kubelet = Kubelet::new(KubeletConfig::new(&dirs.registry, DRIVER));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let plugin =
            runtime.block_on(kubelet.wait_and_register(WAIT)).unwrap_or_else(|e| panic!("{e}\n{}", process.log()));
        Self { server, dirs, process, kubelet, plugin, runtime }
    }

    fn claim(&self, name: &str, devices: &[String]) -> Claim {
        let results: Vec<Allocated> = devices.iter().map(|d| Allocated::new("gpu", NODE, d)).collect();
        let uid = claim_fixtures::store(&self.server, &allocated_claim("default", name, &results, vec![]))
            .expect("storing a claim");
        claim("default", name, &uid)
    }

    /// `rounds` prepare + unprepare cycles of `c`; the latencies of each.
    fn cycle(&self, c: &Claim, rounds: usize) -> (Vec<Duration>, Vec<Duration>) {
        let claims = std::slice::from_ref(c);
        let mut prepare = Vec::with_capacity(rounds);
        let mut unprepare = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let started = Instant::now();
            self.runtime.block_on(self.kubelet.prepare(&self.plugin, claims)).expect("prepare");
            prepare.push(started.elapsed());
            let started = Instant::now();
            self.runtime.block_on(self.kubelet.unprepare(&self.plugin, claims)).expect("unprepare");
            unprepare.push(started.elapsed());
        }
        (prepare, unprepare)
    }

    /// VmRSS, VmHWM, RssAnon and RssFile in KiB after a moment of idling.
    fn memory(&self) -> Memory {
        std::thread::sleep(Duration::from_secs(2));
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.process.pid())).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(0)
        };
        Memory { rss: field("VmRSS:"), hwm: field("VmHWM:"), anon: field("RssAnon:"), file: field("RssFile:") }
    }
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
    let record = vec![b'x'; 700];
    let before = durable::fsync_count();
    let samples = (0..rounds)
        .map(|_| {
            let started = Instant::now();
            for w in 0..DURABLE_WRITES_PER_PREPARE {
                durable::write(dir, &format!("f{w}.json"), &record, 0o600).expect("durable write");
            }
            started.elapsed()
        })
        .collect();
    let per_prepare = (durable::fsync_count() - before) as f64 / rounds as f64;
    (stats(samples), per_prepare)
}

fn main() {
    let rounds: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(300);
    let inventory =
        std::fs::read_to_string(workspace_root().join("examples/inventories/dgx-h100.yaml")).expect("inventory");
    println!("prepare benchmark: {rounds} rounds per claim shape, release plugin, fake inventory\n");

    let node = Node::start(&inventory);
    let (fsync, fsyncs) = fsync_cost(node.dirs.root.path(), rounds);
    println!(
        "fsync cost of one prepare ({DURABLE_WRITES_PER_PREPARE} durable writes, {fsyncs:.0} fsyncs): p50 {}  p99 {}  mean {}",
        ms(fsync.p50),
        ms(fsync.p99),
        ms(fsync.mean)
    );
    let one = node.claim("one-gpu", &["gpu-0".to_string()]);
    let eight = node.claim("eight-gpus", &(0..8).map(|i| format!("gpu-{i}")).collect::<Vec<_>>());
    // Warm-up: connections, the claim cache, page cache.
    node.cycle(&one, 5);
    println!(
        "\n| claim | prepare p50 | prepare p99 | prepare mean | unprepare p50 | unprepare p99 | p99 / fsync p50 | p99 / fsync p99 |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (label, c) in [("1 GPU", &one), ("8 GPUs", &eight)] {
        let (prepare, unprepare) = node.cycle(c, rounds);
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
    println!("\nplugin memory, 8 × H100 (8 devices, one 8-GPU claim prepared): {}", node.memory());
    drop(node);

    let mig = Node::start(A100_FULL_MIG);
    let claims: Vec<Claim> =
        (0..8).map(|g| mig.claim(&format!("mig-{g}"), &[format!("gpu-{g}-mig-1g5gb-19-0")])).collect();
    mig.runtime.block_on(mig.kubelet.prepare(&mig.plugin, &claims)).expect("MIG prepare");
    println!(
        "plugin memory, 8 × A100-40GB fully MIG-partitioned (56 devices, 8 MIG claims prepared): {}",
        mig.memory()
    );
    println!("\ntargets: prepare p99 ≤ 2× the fsync cost of a prepare; plugin RSS ≤ 16 MiB (16384 KiB)");
}
