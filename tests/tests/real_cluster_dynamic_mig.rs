//! Dynamic MIG under the real kube-scheduler, on the oldest and the newest
//! supported release: our plugin, run with `--feature-gates DynamicMIG=true`
//! on a node of one A100-40GB and two H100-80GB in MIG mode without
//! instances, publishes every MIG profile at every placement with shared
//! counters (on 1.34 sets and devices together, from 1.35 in slices of their
//! own); the real scheduler allocates the claims of `examples/dynamic-mig/`
//! and the docs' 1g template (`examples/claims/04-mig-1g.yaml`), as they
//! are written, one pod after the other:
//!
//! 1. `a100-7g` takes the A100 whole; `a100-1g-after-7g` then stays
//!    unschedulable (the 7g used up the A100's counters).
//! 2. `four-two-one` (4g + 2g + 1g, one `matchAttribute: parentUUID`) lands
//!    on one H100 at placements that do not overlap, using all its compute
//!    slices.
//! 3. A profile by name (3g.40gb), a claim by memory (16 GiB or more) and
//!    "any 2g or bigger" go to the other H100, the only one left.
//! 4. The 1g template's pod then stays unschedulable: no H100 has a memory
//!    slice and a compute slice left together.
//!
//! Over every allocation the scheduler wrote, no counter of any GPU is
//! consumed beyond what the GPU's counter set holds, and no memory slice
//! twice: the placements the scheduler chose could all be made on the GPUs.

use std::collections::BTreeMap;
use std::path::Path;

use integration_tests::real_cluster::driver::{
    NodePlugin, allocation, bound_node, chart, eventually, install, pod_claim, start_plugin_with, unschedulable,
    yaml_documents,
};
use integration_tests::real_cluster::objects::create_all;
use integration_tests::real_cluster::{Cluster, Release, V1_34, V1_37};
use integration_tests::workspace_root;
use k8s_openapi::api::resource::v1::{Device, ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

const NODE: &str = "mig-dynamic";
const INVENTORY: &str = "gpus:\n  - {model: A100-SXM4-40GB, mig: [{dynamic: true}]}\n  \
                         - {model: H100-80GB, count: 2, mig: [{dynamic: true}]}\n";

fn tmp_dir() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

fn example(path: &str) -> Vec<Value> {
    yaml_documents(&workspace_root().join("examples").join(path))
}

/// The claim named `name` of `examples/dynamic-mig/claims.yaml`, as written.
fn dynamic_claim(name: &str) -> Value {
    let claims = example("dynamic-mig/claims.yaml");
    claims.into_iter().find(|c| c["metadata"]["name"] == name).unwrap_or_else(|| panic!("no claim {name}"))
}

/// A pod that uses the existing claim `claim`.
fn pod_using(claim: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("uses-{claim}"), "namespace": "default"},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/app", "resources": {"claims": [{"name": "mig"}]}}],
                 "resourceClaims": [{"name": "mig", "resourceClaimName": claim}]}})
}

/// The node's published pool: counter sets by name, devices by name.
struct Pool {
    sets: BTreeMap<String, BTreeMap<String, u64>>,
    devices: BTreeMap<String, Device>,
}

fn count(quantity: &str) -> u64 {
    quantity.parse().unwrap_or_else(|e| panic!("counter {quantity}: {e}"))
}

impl Pool {
    async fn read(cluster: &Cluster) -> Self {
        let slices = Api::<ResourceSlice>::all(cluster.admin())
            .list(&ListParams::default())
            .await
            .unwrap_or_else(|e| panic!("listing slices: {e}"));
        let (mut sets, mut devices) = (BTreeMap::new(), BTreeMap::new());
        for slice in slices.items.into_iter().filter(|s| s.spec.pool.name == NODE) {
            for set in slice.spec.shared_counters.into_iter().flatten() {
                let counters = set.counters.iter().map(|(k, v)| (k.clone(), count(&v.value.0))).collect();
                sets.insert(set.name, counters);
            }
            for device in slice.spec.devices.into_iter().flatten() {
                devices.insert(device.name.clone(), device);
            }
        }
        Self { sets, devices }
    }

    fn device(&self, name: &str) -> &Device {
        self.devices.get(name).unwrap_or_else(|| panic!("{name} is not published"))
    }

    fn string_attribute(&self, device: &str, attribute: &str) -> String {
        let value =
            self.device(device).attributes.as_ref().and_then(|a| a.get(attribute)).and_then(|a| a.string.clone());
        value.unwrap_or_else(|| panic!("{device}: no string attribute {attribute}"))
    }

    /// What `device` consumes: (counter set, counter) -> amount.
    fn consumption(&self, device: &str) -> BTreeMap<(String, String), u64> {
        let consumes = self.device(device).consumes_counters.clone().unwrap_or_default();
        assert!(!consumes.is_empty(), "{device} consumes no counters");
        consumes
            .into_iter()
            .flat_map(|c| {
                let set = c.counter_set;
                c.counters.into_iter().map(move |(name, n)| ((set.clone(), name), count(&n.value.0)))
            })
            .collect()
    }

    /// Panics unless the devices together fit their GPUs' counter sets:
    /// no counter over its set's value, so no memory slice twice.
    fn assert_fit_together(&self, devices: &[String]) {
        let mut used: BTreeMap<(String, String), u64> = BTreeMap::new();
        for device in devices {
            for (key, n) in self.consumption(device) {
                *used.entry(key).or_default() += n;
            }
        }
        for ((set, counter), n) in &used {
            let available = self.sets.get(set).and_then(|s| s.get(counter)).copied();
            let available = available.unwrap_or_else(|| panic!("{set}/{counter} is not published"));
            assert!(*n <= available, "{set}/{counter}: {n} consumed of {available} by {devices:?}");
        }
    }

    /// The counter set of the GPU a device belongs to.
    fn counter_set(&self, device: &str) -> String {
        let sets: Vec<String> = self.consumption(device).into_keys().map(|(set, _)| set).collect();
        assert!(sets.iter().all(|s| *s == sets[0]), "{device} consumes from several sets: {sets:?}");
        sets[0].clone()
    }

    /// Counters of `set` no device of `devices` left.
    fn left(&self, set: &str, devices: &[String]) -> BTreeMap<String, u64> {
        let mut left = self.sets[set].clone();
        for device in devices {
            for ((s, counter), n) in self.consumption(device) {
                if s == set {
                    *left.get_mut(&counter).unwrap() -= n;
                }
            }
        }
        left
    }
}

struct Scene<'a> {
    cluster: &'a Cluster,
    plugin: NodePlugin,
}

impl Scene<'_> {
    fn logs(&self) -> String {
        format!("{}\n---- plugin {}\n{}", self.cluster.logs(), self.plugin.node, self.plugin.process.log())
    }

    async fn create(&self, objects: &[Value]) {
        create_all(&self.cluster.admin(), objects)
            .await
            .unwrap_or_else(|e| panic!("the real API server refused it: {e}"));
    }

    /// Waits until `pod` is bound with its claim allocated; the devices
    /// (request, device) the scheduler chose.
    async fn scheduled(&self, namespace: &str, pod: &str) -> Vec<(String, String)> {
        let (node, claim) = eventually(
            &format!("pod {namespace}/{pod} bound with its claim allocated"),
            || async {
                let node = bound_node(self.cluster, namespace, pod).await?;
                let claim = pod_claim(self.cluster, namespace, pod).await?;
                (!allocation(&claim).is_empty()).then_some((node, claim))
            },
            || self.logs(),
        )
        .await;
        assert_eq!(node, NODE, "{pod}");
        requests_and_devices(&claim)
    }

    /// Waits until the scheduler marked `pod` unschedulable; its claim has
    /// no allocation.
    async fn stays_unschedulable(&self, namespace: &str, pod: &str) {
        eventually(
            &format!("pod {namespace}/{pod} to be unschedulable"),
            || async { unschedulable(self.cluster, namespace, pod).await.then_some(()) },
            || self.logs(),
        )
        .await;
        self.assert_still_unschedulable(namespace, pod).await;
    }

    async fn assert_still_unschedulable(&self, namespace: &str, pod: &str) {
        assert!(unschedulable(self.cluster, namespace, pod).await, "{pod} is no longer unschedulable\n{}", self.logs());
        assert_eq!(bound_node(self.cluster, namespace, pod).await, None, "{pod} was bound");
        if let Some(claim) = pod_claim(self.cluster, namespace, pod).await {
            assert!(allocation(&claim).is_empty(), "{pod}: {claim:?}");
        }
    }
}

fn requests_and_devices(claim: &ResourceClaim) -> Vec<(String, String)> {
    let results = claim.status.as_ref().and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref());
    let results = results.and_then(|d| d.results.as_ref()).cloned().unwrap_or_default();
    for r in &results {
        assert_eq!((r.pool.as_str(), r.driver.as_str()), (NODE, "gpu.nvidia.com"), "{r:?}");
    }
    results.into_iter().map(|r| (r.request, r.device)).collect()
}

fn profile_of(pool: &Pool, device: &str) -> String {
    pool.string_attribute(device, "profile")
}

async fn dynamic_mig_claims_are_scheduled_at_placements_that_fit(release: Release) {
    let cluster = Cluster::start(release).await;
    install(&cluster, &chart(tmp_dir(), json!({"webhook": {"enabled": false}}))).await;
    let inventory = cluster.dir().join("inventory-dynamic-mig.yaml");
    std::fs::write(&inventory, INVENTORY).unwrap();
    let plugin = start_plugin_with(&cluster, NODE, &inventory, &["--feature-gates", "DynamicMIG=true"]).await;
    let scene = Scene { cluster: &cluster, plugin };
    let pool = Pool::read(&cluster).await;
    // One counter set per GPU.
    assert_eq!(pool.sets.len(), 3, "{:?}", pool.sets.keys());
    let mut chosen: Vec<String> = Vec::new();

    // 1. The A100 whole as a 7g; a 1g on it afterwards does not fit.
    scene.create(&[dynamic_claim("a100-7g"), pod_using("a100-7g")]).await;
    let seven = scene.scheduled("default", "uses-a100-7g").await;
    assert_eq!(seven.len(), 1);
    assert_eq!(profile_of(&pool, &seven[0].1), "7g.40gb");
    let a100 = pool.counter_set(&seven[0].1);
    chosen.push(seven[0].1.clone());
    scene.create(&[dynamic_claim("a100-1g-after-7g"), pod_using("a100-1g-after-7g")]).await;
    scene.stays_unschedulable("default", "uses-a100-1g-after-7g").await;

    // 2. 4g + 2g + 1g on one H100, at placements that fit together.
    scene.create(&[dynamic_claim("four-two-one"), pod_using("four-two-one")]).await;
    let three = scene.scheduled("default", "uses-four-two-one").await;
    let profiles: BTreeMap<&str, String> = three.iter().map(|(r, d)| (r.as_str(), profile_of(&pool, d))).collect();
    assert_eq!(
        profiles,
        BTreeMap::from([("large", "4g.40gb".into()), ("medium", "2g.20gb".into()), ("small", "1g.10gb".into())])
    );
    let parents: Vec<String> = three.iter().map(|(_, d)| pool.string_attribute(d, "parentUUID")).collect();
    assert!(parents.iter().all(|p| *p == parents[0]), "one GPU: {three:?} on {parents:?}");
    let devices: Vec<String> = three.iter().map(|(_, d)| d.clone()).collect();
    pool.assert_fit_together(&devices);
    let first_h100 = pool.counter_set(&devices[0]);
    assert_ne!(first_h100, a100);
    assert_eq!(pool.left(&first_h100, &devices)["compute-slices"], 0, "4 + 2 + 1 of 7: {three:?}");
    chosen.extend(devices);

    // 3. By profile, by memory, any 2g or bigger: on the other H100.
    let mut second = Vec::new();
    for claim in ["by-profile", "by-memory", "two-g-or-bigger"] {
        scene.create(&[dynamic_claim(claim), pod_using(claim)]).await;
        let devices = scene.scheduled("default", &format!("uses-{claim}")).await;
        assert_eq!(devices.len(), 1, "{claim}: {devices:?}");
        let device = devices[0].1.clone();
        let profile = profile_of(&pool, &device);
        match claim {
            "by-profile" => assert_eq!(profile, "3g.40gb"),
            "by-memory" => {
                let memory = &pool.device(&device).capacity.as_ref().unwrap()["memory"].value.0;
                assert!(gib(memory) >= 16.0, "{device}: {memory}");
            }
            _ => assert!(matches!(profile.as_bytes(), [b'2'..=b'7', b'g', b'.', ..]), "{device}: {profile}"),
        }
        let set = pool.counter_set(&device);
        assert!(set != a100 && set != first_h100, "{claim}: {device} on a GPU already used up");
        second.push(device);
    }
    pool.assert_fit_together(&second);
    chosen.extend(second);

    // 4. The docs' 1g template: no room left anywhere.
    let mut template = vec![json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "inference"}})];
    template.extend(example("claims/04-mig-1g.yaml"));
    scene.create(&template).await;
    scene.stays_unschedulable("inference", "tiny-llm").await;

    // All allocations together fit; the refused claims are still refused.
    pool.assert_fit_together(&chosen);
    scene.assert_still_unschedulable("default", "uses-a100-1g-after-7g").await;
    scene.assert_still_unschedulable("inference", "tiny-llm").await;
}

/// GiB of a quantity as the API writes it ("19968Mi", "20Gi", bytes).
fn gib(quantity: &str) -> f64 {
    let split = quantity.find(|c: char| !c.is_ascii_digit()).unwrap_or(quantity.len());
    let (digits, unit) = quantity.split_at(split);
    let n: f64 = digits.parse().unwrap_or_else(|e| panic!("quantity {quantity}: {e}"));
    let bytes = match unit {
        "" => n,
        "Ki" => n * 1024.0,
        "Mi" => n * 1024.0 * 1024.0,
        "Gi" => n * 1024.0 * 1024.0 * 1024.0,
        other => panic!("quantity {quantity}: unit {other} not expected here"),
    };
    bytes / (1u64 << 30) as f64
}

#[tokio::test(flavor = "multi_thread")]
async fn k8s_1_34_dynamic_mig_claims_are_scheduled_at_placements_that_fit() {
    // Partitionable devices (shared counters) are alpha in 1.34.
    dynamic_mig_claims_are_scheduled_at_placements_that_fit(V1_34.with_optional_gates()).await
}

#[tokio::test(flavor = "multi_thread")]
async fn k8s_1_37_dynamic_mig_claims_are_scheduled_at_placements_that_fit() {
    dynamic_mig_claims_are_scheduled_at_placements_that_fit(V1_37).await
}
