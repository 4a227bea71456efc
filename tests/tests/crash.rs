//! SIGKILL at many instants during a storm of concurrent prepares and
//! unprepares; after every restart the plugin must have lost nothing and
//! doubled nothing:
//! (a) every claim the kubelet stand-in saw prepared (and did not ask to
//!     unprepare since) is still prepared, with the same CDI ids;
//! (b) no CDI spec file exists without a completed checkpoint record;
//! (c) no exclusive device is in two completed records.
//!
//! The stand-in behaves like the kubelet: a call whose answer was lost in
//! the kill is in an unknown state and is retried after the restart
//! (prepare) or until it succeeds (unprepare); calls for one claim never
//! overlap. Claims compete for devices, so refusals happen too.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_kubelet_plugin::state::checkpoint::{CheckpointDir, PrepareState};
use integration_tests::apiserver::ApiServer;
use integration_tests::claim_fixtures::{self, Allocated, allocated_claim};
use integration_tests::kubelet::{Kubelet, KubeletConfig, Plugin, claim};
use integration_tests::plugin_process::{PluginDirs, PluginOptions, PluginProcess};
use kubelet_proto::dra_v1::Claim;

const DRIVER: &str = "gpu.nvidia.com";
const NODE: &str = "node-a";
const KILLS: usize = 200;
const CLAIMS: usize = 16;
const WORKERS: usize = 4;
const SEED: u64 = 0x5eed_c0ff_ee15_600d;
const WAIT: Duration = Duration::from_secs(30);
const INVENTORY: &str = "gpus:\n  - model: H100-80GB\n    count: 8\n";

/// xorshift64*: deterministic, good enough to spread kill instants.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// What the kubelet stand-in knows about each claim.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Known {
    /// Never prepared, or unprepared successfully.
    Unprepared,
    /// A prepare answered with these CDI ids (sorted).
    Prepared(Vec<String>),
    /// A prepare's answer was lost: prepared or not, retry it.
    PrepareUnknown,
    /// An unprepare's answer was lost: retry until it succeeds.
    UnprepareUnknown,
}

struct Model {
    claims: Vec<Claim>,
    known: Mutex<Vec<Known>>,
    prepared_ok: Mutex<usize>,
    refused: Mutex<usize>,
    unprepared_ok: Mutex<usize>,
}

impl Model {
    fn known(&self, i: usize) -> Known {
        self.known.lock().unwrap()[i].clone()
    }

    fn set(&self, i: usize, known: Known) {
        self.known.lock().unwrap()[i] = known;
    }
}

fn cdi_ids(devices: &[kubelet_proto::dra_v1::Device]) -> Vec<String> {
    let mut ids: Vec<String> = devices.iter().flat_map(|d| d.cdi_device_ids.clone()).collect();
    ids.sort();
    ids
}

/// One worker's storm over its own claims (`i % WORKERS == worker`), until
/// the plugin dies under it.
async fn storm(model: Arc<Model>, kubelet: Arc<Kubelet>, plugin: Plugin, worker: usize, seed: u64) {
    let mut rng = Rng(seed | 1);
    let mine: Vec<usize> = (0..model.claims.len()).filter(|i| i % WORKERS == worker).collect();
    loop {
        let i = mine[rng.below(mine.len() as u64) as usize];
        let claim = std::slice::from_ref(&model.claims[i]);
        let uid = &model.claims[i].uid;
        match model.known(i) {
            Known::Unprepared | Known::PrepareUnknown => {
                model.set(i, Known::PrepareUnknown);
                match kubelet.prepare_raw(&plugin, claim).await {
                    Ok(mut answers) => {
                        let Some(answer) = answers.remove(uid) else { panic!("no answer for {uid}") };
                        if answer.error.is_empty() {
                            model.set(i, Known::Prepared(cdi_ids(&answer.devices)));
                            *model.prepared_ok.lock().unwrap() += 1;
                        } else {
                            assert!(
                                answer.error.contains("already prepared for"),
                                "unexpected error: {}",
                                answer.error
                            );
                            // Refused before any side effect. Had a lost
                            // earlier attempt completed, this retry would
                            // have been answered from its record instead.
                            model.set(i, Known::Unprepared);
                            *model.refused.lock().unwrap() += 1;
                        }
                    }
                    Err(_) => return, // killed: stays PrepareUnknown
                }
            }
            Known::Prepared(ids) => {
                if rng.below(3) == 0 {
                    // A repeat must answer the same.
                    match kubelet.prepare_raw(&plugin, claim).await {
                        Ok(mut answers) => {
                            let answer = answers.remove(uid).unwrap_or_default();
                            assert_eq!(answer.error, "", "repeat of prepared claim {uid}");
                            assert_eq!(cdi_ids(&answer.devices), ids, "repeat of {uid} changed its CDI ids");
                        }
                        Err(_) => return,
                    }
                    continue;
                }
                model.set(i, Known::UnprepareUnknown);
                match kubelet.unprepare_raw(&plugin, claim).await {
                    Ok(answers) => {
                        assert_eq!(answers.get(uid).map(String::as_str), Some(""), "unprepare of {uid}");
                        model.set(i, Known::Unprepared);
                        *model.unprepared_ok.lock().unwrap() += 1;
                    }
                    Err(_) => return,
                }
            }
            Known::UnprepareUnknown => match kubelet.unprepare_raw(&plugin, claim).await {
                Ok(answers) => {
                    assert_eq!(answers.get(uid).map(String::as_str), Some(""), "unprepare retry of {uid}");
                    model.set(i, Known::Unprepared);
                }
                Err(_) => return,
            },
        }
    }
}

/// Checks (a)–(c) on the files of an idle, freshly started plugin, and
/// that every prepared claim answers a repeat with the same CDI ids.
async fn check_invariants(model: &Model, dirs: &PluginDirs, kubelet: &Kubelet, plugin: &Plugin, round: usize) {
    let loaded = CheckpointDir::open(dirs.plugin_dir(DRIVER).join("checkpoint")).unwrap().load().unwrap();
    assert!(loaded.damaged.is_empty(), "round {round}: damaged records {:?}", loaded.damaged);
    let completed: HashMap<&str, _> = loaded
        .records
        .iter()
        .filter(|r| r.state == PrepareState::PrepareCompleted)
        .map(|r| (r.uid.as_str(), r))
        .collect();
    assert_eq!(completed.len(), loaded.records.len(), "round {round}: a started record survived start-up");

    // (a) seen prepared => still prepared, same ids.
    let mut repeat = Vec::new();
    for (i, claim) in model.claims.iter().enumerate() {
        if let Known::Prepared(ids) = model.known(i) {
            let record = completed.get(claim.uid.as_str()).unwrap_or_else(|| {
                panic!("round {round} (seed {SEED:#x}): claim {} was seen prepared but has no record", claim.name)
            });
            let mut stored: Vec<String> = record.devices.iter().flat_map(|d| d.cdi_device_ids.clone()).collect();
            stored.sort();
            assert_eq!(stored, ids, "round {round}: claim {} has other CDI ids than the kubelet saw", claim.name);
            let spec = dirs.cdi.join(format!("k8s.{DRIVER}-claim_{}.json", claim.uid));
            assert!(spec.exists(), "round {round}: claim {} lost its CDI spec", claim.name);
            repeat.push(claim.clone());
        }
    }
    if !repeat.is_empty() {
        let answers = kubelet.prepare_raw(plugin, &repeat).await.expect("repeat prepare after restart");
        for claim in &repeat {
            let answer = &answers[&claim.uid];
            assert_eq!(answer.error, "", "round {round}: repeat of {}", claim.name);
            let i = model.claims.iter().position(|c| c.uid == claim.uid).unwrap();
            assert_eq!(
                Known::Prepared(cdi_ids(&answer.devices)),
                model.known(i),
                "round {round}: ids of {}",
                claim.name
            );
        }
    }

    // (b) every spec file has a completed record; no temporary files.
    let prefix = format!("k8s.{DRIVER}-claim_");
    for entry in std::fs::read_dir(&dirs.cdi).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(!name.ends_with(".tmp"), "round {round}: temporary file {name} left after start-up");
        let Some(uid) = name.strip_prefix(&prefix).and_then(|r| r.strip_suffix(".json")) else { continue };
        assert!(completed.contains_key(uid), "round {round} (seed {SEED:#x}): CDI spec {name} has no record");
    }

    // (c) no device in two completed records.
    let mut holders: BTreeMap<&str, &str> = BTreeMap::new();
    for record in completed.values() {
        for device in record.devices.iter().filter(|d| d.is_exclusive()) {
            if let Some(other) = holders.insert(&device.device_name, &record.uid) {
                panic!("round {round}: device {} is prepared for {other} and {}", device.device_name, record.uid);
            }
        }
    }
}

#[test]
fn sigkill_during_a_prepare_storm_loses_and_doubles_nothing() {
    let started = Instant::now();
    let server = ApiServer::start_in_thread().unwrap();
    let dirs = PluginDirs::new(INVENTORY).unwrap();
    server.write_kubeconfig(&dirs.kubeconfig).unwrap();

    // Claim i wants gpu-(i % 8), and from 12 on also gpu-(i+1 % 8): every
    // GPU is wanted by two or three claims.
    let mut claims = Vec::new();
    for i in 0..CLAIMS {
        let mut wanted = vec![format!("gpu-{}", i % 8)];
        if i >= 12 {
            wanted.push(format!("gpu-{}", (i + 1) % 8));
        }
        let results: Vec<Allocated> = wanted.iter().map(|d| Allocated::new("gpu", NODE, d)).collect();
        let name = format!("claim-{i}");
        let uid = claim_fixtures::store(&server, &allocated_claim("default", &name, &results, vec![])).unwrap();
        claims.push(claim("default", &name, &uid));
    }
    let model = Arc::new(Model {
        known: Mutex::new(vec![Known::Unprepared; claims.len()]),
        claims,
        prepared_ok: Mutex::new(0),
        refused: Mutex::new(0),
        unprepared_ok: Mutex::new(0),
    });
    let kubelet = Arc::new(Kubelet::new(KubeletConfig::new(&dirs.registry, DRIVER)));
    let options = PluginOptions { log_level: "warn".into(), ..PluginOptions::default() };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut rng = Rng(SEED);
    let mut kills_in_start_up = 0;
    let mut kills_mid_call = 0;

    for round in 0..KILLS {
        let mut process = PluginProcess::spawn(&dirs, &options).unwrap();
        // One kill in eight lands during start-up (reconcile, binding).
        if rng.below(8) == 0 {
            std::thread::sleep(Duration::from_millis(rng.below(40)));
            process.kill().unwrap();
            kills_in_start_up += 1;
            continue;
        }
        let plugin = runtime
            .block_on(kubelet.wait_and_register(WAIT))
            .unwrap_or_else(|e| panic!("round {round}: {e}\n{}", process.log()));
        runtime.block_on(check_invariants(&model, &dirs, &kubelet, &plugin, round));
        let tasks: Vec<_> = (0..WORKERS)
            .map(|w| runtime.spawn(storm(model.clone(), kubelet.clone(), plugin.clone(), w, rng.next())))
            .collect();
        std::thread::sleep(Duration::from_micros(rng.below(100_000)));
        process.kill().unwrap();
        for task in tasks {
            if let Err(e) = runtime.block_on(task) {
                panic!("round {round} (seed {SEED:#x}): {e}\n{}", process.log());
            }
        }
        let lost = model
            .known
            .lock()
            .unwrap()
            .iter()
            .filter(|k| matches!(k, Known::PrepareUnknown | Known::UnprepareUnknown))
            .count();
        if lost > 0 {
            kills_mid_call += 1;
        }
    }

    // A last start: everything still holds, and unpreparing all empties
    // both directories.
    let mut process = PluginProcess::spawn(&dirs, &options).unwrap();
    let plugin = runtime.block_on(kubelet.wait_and_register(WAIT)).unwrap();
    runtime.block_on(check_invariants(&model, &dirs, &kubelet, &plugin, KILLS));
    let everything: Vec<Claim> = model.claims.clone();
    runtime.block_on(kubelet.unprepare(&plugin, &everything)).unwrap();
    let loaded = CheckpointDir::open(dirs.plugin_dir(DRIVER).join("checkpoint")).unwrap().load().unwrap();
    assert!(loaded.records.is_empty(), "records left after unpreparing everything");
    let left: BTreeSet<String> =
        std::fs::read_dir(&dirs.cdi).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(left.is_empty(), "CDI files left after unpreparing everything: {left:?}");
    process.terminate(WAIT).unwrap();

    eprintln!(
        "crash test: {KILLS} kills ({kills_in_start_up} during start-up, {kills_mid_call} with calls in flight), {} prepares answered ok, {} refused \
         (device held), {} unprepares, {:?}",
        model.prepared_ok.lock().unwrap(),
        model.refused.lock().unwrap(),
        model.unprepared_ok.lock().unwrap(),
        started.elapsed()
    );
    assert!(*model.prepared_ok.lock().unwrap() > KILLS, "the storm must actually prepare claims");
}
