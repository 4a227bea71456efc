//! The node agent against a faulty API server: the real plugin binary
//! reaches the API stand-in through the fault proxy (`fault_proxy`), and
//! the kubelet stand-in calls it with a short deadline. Whatever the server
//! does (503 or 429 forever, a body cut short and the connection held or
//! closed, no answer, a reset), every NodePrepare/NodeUnprepare is answered
//! within its deadline (+1 s) with an error in words, no lock is held after
//! it (an unprepare of the same claim, sent while the prepare waits, is
//! answered in time), and the plugin's fds return to their baseline.
//! Then one call of 10,000 claims: connections and fds stay bounded, and
//! the next call succeeds under a 1,024 fd limit.

use std::time::{Duration, Instant};

use integration_tests::apiserver::ApiServer;
use integration_tests::claim_fixtures::{self, Allocated, allocated_claim};
use integration_tests::fault_proxy::{Fault, FaultProxy, Rule};
use integration_tests::kubelet::{Kubelet, KubeletConfig, KubeletError, Plugin, claim};
use integration_tests::plugin_process::{PluginDirs, PluginOptions, PluginProcess};
use kubelet_proto::dra_v1::Claim;

const DRIVER: &str = "gpu.nvidia.com";
const NODE: &str = "node-a";
const INVENTORY: &str = "gpus:\n  - model: H100-80GB\n    count: 8\n";
/// The deadline the kubelet stand-in sends (grpc-timeout).
const CALL_TIMEOUT: Duration = Duration::from_secs(4);
/// "Answered within its deadline (+1 s)".
const ANSWERED_BY: Duration = Duration::from_secs(5);
const WAIT: Duration = Duration::from_secs(60);

struct Node {
    server: ApiServer,
    proxy: FaultProxy,
    dirs: PluginDirs,
    process: PluginProcess,
    kubelet: Kubelet,
    plugin: Plugin,
}

impl Node {
    async fn start(extra_args: &[&str]) -> Node {
        let server = ApiServer::start().await.unwrap();
        let proxy = FaultProxy::start(server.addr()).await.unwrap();
        let dirs = PluginDirs::new(INVENTORY).unwrap();
        proxy.write_kubeconfig(&dirs.kubeconfig).unwrap();
        let options = PluginOptions {
            extra_args: ["--api-timeout-ms", "1500"].iter().chain(extra_args).map(|a| a.to_string()).collect(),
            ..PluginOptions::default()
        };
        let process = PluginProcess::spawn(&dirs, &options).unwrap();
        let mut config = KubeletConfig::new(&dirs.registry, DRIVER);
        config.call_timeout = CALL_TIMEOUT;
        let kubelet = Kubelet::new(config);
        let plugin = kubelet.wait_and_register(WAIT).await.unwrap_or_else(|e| panic!("{e}\n{}", process.log()));
        Node { server, proxy, dirs, process, kubelet, plugin }
    }

    /// Stores claim `name` allocated to `device` and returns its reference.
    fn claim_for(&self, name: &str, device: &str) -> Claim {
        let allocated = allocated_claim("default", name, &[Allocated::new("gpu", NODE, device)], Vec::new());
        let uid = claim_fixtures::store(&self.server, &allocated).unwrap();
        claim("default", name, &uid)
    }

    fn fds(&self) -> usize {
        open_fds(self.process.pid())
    }
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Waits until the plugin holds at most `most` fds; returns the last count.
async fn fds_settle(node: &Node, most: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = node.fds();
        if now <= most || Instant::now() >= deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Words a kubelet user cannot act on, which must never reach it.
const RAW: [&str; 4] = ["Failed to parse error data", "EOF while parsing", "HyperError", "ServiceError"];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_call_is_answered_within_its_deadline_whatever_the_api_server_does() {
    let node = Node::start(&[]).await;
    // Warm up: one claim prepared and unprepared, then the fd baseline.
    let warm = node.claim_for("warm", "gpu-0");
    node.kubelet.prepare(&node.plugin, std::slice::from_ref(&warm)).await.unwrap();
    node.kubelet.unprepare(&node.plugin, std::slice::from_ref(&warm)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let baseline = node.fds();

    let claims_path = "/namespaces/default/resourceclaims/";
    let cases: [(&str, Rule, Fault, &[&str]); 7] = [
        ("503 forever", Rule::path("GET", claims_path), Fault::Status(503), &["unavailable (HTTP 503"]),
        ("429 forever", Rule::path("GET", claims_path), Fault::Status(429), &["throttling requests (HTTP 429"]),
        ("a body cut short, held open", Rule::path("GET", claims_path), Fault::TruncateThenStall, &["did not answer"]),
        (
            "a body cut short, then closed",
            Rule::path("GET", claims_path),
            Fault::TruncateThenClose,
            &["before its answer was complete", "ended early"],
        ),
        ("no answer", Rule::path("GET", claims_path), Fault::Stall, &["did not answer"]),
        ("reset", Rule::path("GET", claims_path), Fault::Reset, &["closed the connection", "reset"]),
        ("503 for everything", Rule::any(), Fault::Status(503), &["unavailable (HTTP 503"]),
    ];
    for (i, (name, rule, fault, words)) in cases.into_iter().enumerate() {
        let device = format!("gpu-{}", 1 + i % 7);
        let victim = node.claim_for(&format!("victim-{i}"), &device);
        node.proxy.inject(rule, fault);

        // The prepare waits on the API server; an unprepare of the same
        // claim arrives while it holds the claim's lock.
        let started = Instant::now();
        let (kubelet, plugin, claims) = (node.kubelet.clone(), node.plugin.clone(), vec![victim.clone()]);
        let prepare = tokio::spawn(async move {
            let answer = kubelet.prepare_raw(&plugin, &claims).await;
            (answer, started.elapsed())
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let unprepare_started = Instant::now();
        let unprepared = node.kubelet.unprepare(&node.plugin, std::slice::from_ref(&victim)).await;
        let unprepare_took = unprepare_started.elapsed();
        let (answer, took) = prepare.await.unwrap();

        let answer =
            answer.unwrap_or_else(|e| panic!("{name}: the prepare got no answer: {e}\n{}", node.process.log()));
        assert!(took <= ANSWERED_BY, "{name}: the prepare was answered after {took:?}");
        let error = &answer[&victim.uid].error;
        println!("{name}: prepare answered in {took:.1?}: {error}");
        assert!(error.contains("ResourceClaim default/victim-"), "{name}: {error}");
        assert!(words.iter().any(|w| error.contains(w)), "{name}: {error} names none of {words:?}");
        assert!(RAW.iter().all(|raw| !error.contains(raw)), "{name}: a raw error reached the kubelet: {error}");
        assert!(error.len() < 1000, "{name}: {} bytes", error.len());
        unprepared.unwrap_or_else(|e| panic!("{name}: the unprepare failed: {e}"));
        assert!(unprepare_took <= ANSWERED_BY, "{name}: the unprepare was answered after {unprepare_took:?}");

        // The fault lifts: the kubelet's retry prepares; nothing was held.
        node.proxy.clear();
        let again =
            tokio::time::timeout(ANSWERED_BY, node.kubelet.prepare(&node.plugin, std::slice::from_ref(&victim))).await;
        let devices = again.expect("answered in time").unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(devices[&victim.uid][0].device_name, device);
        let done = Instant::now();
        node.kubelet.unprepare(&node.plugin, &[victim]).await.unwrap();
        assert!(done.elapsed() < Duration::from_secs(2), "{name}: the unprepare waited");

        let fds = fds_settle(&node, baseline).await;
        println!("{name}: plugin fds {fds} (baseline {baseline})");
        assert!(fds <= baseline, "{name}: {fds} fds open, baseline {baseline}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn damaged_allocations_are_refused_at_once_and_huge_inputs_echoed_cut() {
    let node = Node::start(&[]).await;
    // What a faulty API server could answer: the real one refuses a claim
    // that lists a device twice or holds more than 32 results, so this
    // claim is stored straight into the stand-in.
    let twice = [Allocated::new("gpu", NODE, "gpu-0"), Allocated::new("gpu", NODE, "gpu-0")];
    let uid = claim_fixtures::store(&node.server, &allocated_claim("default", "twice", &twice, Vec::new())).unwrap();
    let many: Vec<Allocated> = (0..10_000).map(|_| Allocated::new("gpu", NODE, "gpu-1")).collect();
    let many_uid = claim_fixtures::store(&node.server, &allocated_claim("default", "many", &many, Vec::new())).unwrap();
    let started = Instant::now();
    let answer = node
        .kubelet
        .prepare_raw(&node.plugin, &[claim("default", "twice", &uid), claim("default", "many", &many_uid)])
        .await
        .unwrap();
    let took = started.elapsed();
    println!("duplicate and 10,000-result claims refused in {took:.2?}");
    assert!(answer[&uid].error.contains("repeats results[0]"), "{}", answer[&uid].error);
    assert!(answer[&many_uid].error.contains("10000 entries, more than the 32"), "{}", answer[&many_uid].error);
    assert!(took < Duration::from_secs(3), "{took:?}");

    // A 1 MiB claim UID from the kubelet is echoed cut, with its length.
    let huge = "u".repeat(1 << 20);
    let err = node.kubelet.prepare(&node.plugin, &[claim("default", "x", &huge)]).await.unwrap_err();
    let KubeletError::ClaimFailed { error, .. } = &err else { panic!("{err}") };
    assert!(error.len() < 600 && error.contains("(1048576 bytes)"), "{} bytes: {}", error.len(), &error[..200]);
    // Neither claim holds a device: gpu-0 and gpu-1 prepare for others.
    let ok = node.claim_for("ok", "gpu-0");
    node.kubelet.prepare(&node.plugin, &[ok]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_claims_in_one_call_use_bounded_connections_and_fds() {
    const CLAIMS: usize = 10_000;
    const FD_LIMIT: u64 = 1024;
    let mut node = Node::start(&[]).await;
    let pid = rustix::process::Pid::from_raw(node.process.pid() as i32).expect("a child pid");
    let limit = rustix::process::Rlimit { current: Some(FD_LIMIT), maximum: Some(FD_LIMIT) };
    rustix::process::prlimit(Some(pid), rustix::process::Resource::Nofile, limit).unwrap();

    // Claims whose results are another driver's devices: each is one
    // lookup and an empty answer, so the call measures the API path.
    let mut refs = Vec::with_capacity(CLAIMS);
    for i in 0..CLAIMS {
        let mut nic = Allocated::new("nic", NODE, &format!("nic-{i}"));
        nic.driver = "net.example.com".into();
        let uid =
            claim_fixtures::store(&node.server, &allocated_claim("default", &format!("c{i}"), &[nic], Vec::new()))
                .unwrap();
        refs.push(claim("default", &format!("c{i}"), &uid));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let baseline = node.fds();
    node.proxy.connections().reset();

    // Sample the plugin's fds while the call runs.
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(baseline));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (peak, stop, pid) = (peak.clone(), stop.clone(), node.process.pid());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                peak.fetch_max(open_fds(pid), std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let mut config = KubeletConfig::new(&node.dirs.registry, DRIVER);
    config.call_timeout = Duration::from_secs(45);
    let kubelet = Kubelet::new(config);
    let started = Instant::now();
    let answer = kubelet.prepare_raw(&node.plugin, &refs).await;
    let took = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    sampler.join().unwrap();
    let answer = answer.unwrap_or_else(|e| panic!("{e}\n{}", node.process.log()));
    let failed: Vec<&String> = answer.values().filter(|r| !r.error.is_empty()).map(|r| &r.error).take(3).collect();
    let connections = node.proxy.connections();
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "{CLAIMS} claims in one NodePrepareResources: answered in {took:.2?}; API connections opened {}, \
         at most {} open at once; plugin fds baseline {baseline}, peak {peak} (limit {FD_LIMIT})",
        connections.accepted(),
        connections.most_open(),
    );
    assert_eq!(answer.len(), CLAIMS);
    assert!(failed.is_empty(), "{failed:?}");
    assert!(connections.most_open() <= 16, "{} connections open at once", connections.most_open());
    assert!(peak < baseline + 64, "peak {peak} fds, baseline {baseline}");

    // The next call succeeds under the 1,024 fd limit.
    let next = node.claim_for("next", "gpu-3");
    node.kubelet.prepare(&node.plugin, &[next]).await.unwrap_or_else(|e| panic!("{e}\n{}", node.process.log()));
    assert!(node.process.wait_timeout(Duration::ZERO).unwrap().is_none(), "the plugin is still running");
}
