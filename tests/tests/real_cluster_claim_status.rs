//! A GPU claim's `status.devices` on the real control plane of 1.37 (and
//! 1.34, the oldest supported, without the last part): the
//! real scheduler allocates a pod's claim from the slices our plugin
//! publishes on its own pod-bound ServiceAccount token under the chart's
//! RBAC (nothing wider: the write passes the real authorizer, including
//! 1.36+'s `associated-node:update` on `resourceclaims/driver`), the
//! kubelet stand-in has the plugin prepare it, and the claim read back
//! from the real API server shows our driver, pool and device, the GPU's
//! UUID in `data` and `Ready=True`; a claim whose prepare fails (a MIG
//! config on a whole GPU) shows `Ready=False` with the reason; unprepare
//! removes our entries. Then the chart's `resourceclaims/driver` rule is
//! taken away: the real server refuses the write (422), the prepare still
//! succeeds, and a Warning Event on the claim says what to grant.

use std::path::Path;

use integration_tests::kubelet::{Kubelet, KubeletConfig, claim};
use integration_tests::real_cluster::driver::PLUGIN_ACCOUNT;
use integration_tests::real_cluster::driver::{
    WAIT, allocation, eventually, install_without_workloads, pod_claim, start_plugin,
};
use integration_tests::real_cluster::objects::create_all;
use integration_tests::real_cluster::{Cluster, Release, V1_34, V1_37};
use integration_tests::workspace_root;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};

const DRIVER: &str = "gpu.nvidia.com";
const NODE: &str = "dgx-h100-a";

fn tmp_dir() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// Claim `name` for one GPU (with `config`, if any) and a pod using it.
fn claim_and_pod(name: &str, config: Option<Value>) -> Vec<Value> {
    let mut claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}});
    if let Some(parameters) = config {
        claim["spec"]["devices"]["config"] =
            json!([{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": parameters}}]);
    }
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/app", "resources": {"claims": [{"name": "gpu"}]}}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]}});
    vec![claim, pod]
}

fn ours(claim: &ResourceClaim) -> Vec<AllocatedDeviceStatus> {
    let devices = claim.status.as_ref().and_then(|s| s.devices.clone()).unwrap_or_default();
    devices.into_iter().filter(|d| d.driver == DRIVER).collect()
}

fn ready(entry: &AllocatedDeviceStatus) -> Option<(String, String, String)> {
    let c = entry.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread")]
async fn k8s_1_37_a_prepared_claim_shows_its_devices_status() {
    a_prepared_claim_shows_its_devices_status(V1_37).await;
}

/// 1.34 serves status.devices by default too (DRAResourceClaimDeviceStatus
/// beta and on since 1.33), without the granular authorization (1.36).
#[tokio::test(flavor = "multi_thread")]
async fn k8s_1_34_a_prepared_claim_shows_its_devices_status() {
    a_prepared_claim_shows_its_devices_status(V1_34).await;
}

async fn a_prepared_claim_shows_its_devices_status(release: Release) {
    let cluster = Cluster::start(release).await;
    install_without_workloads(&cluster, tmp_dir()).await;
    let inventory = workspace_root().join("examples/inventories/dgx-h100.yaml");
    let dgx = start_plugin(&cluster, NODE, &inventory).await;
    let mut objects = claim_and_pod("train", None);
    let mig_config = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig"});
    objects.extend(claim_and_pod("misconfigured", Some(mig_config)));
    create_all(&cluster.admin(), &objects).await.unwrap_or_else(|e| panic!("the real API server refused it: {e}"));
    let logs = || format!("{}\n{}", cluster.logs(), dgx.process.log());

    let kubelet = Kubelet::new(KubeletConfig::new(&dgx.dirs.registry, DRIVER));
    let plugin = kubelet.wait_and_register(WAIT).await.unwrap_or_else(|e| panic!("{e}\n{}", dgx.process.log()));
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.admin(), "default");
    let mut allocated = Vec::new();
    for name in ["train", "misconfigured"] {
        let claim = eventually(
            &format!("{name}'s claim allocated"),
            || async { pod_claim(&cluster, "default", name).await.filter(|c| !allocation(c).is_empty()) },
            logs,
        )
        .await;
        allocated.push(claim);
    }

    // Prepared: our entry, Ready, with the GPU's UUID.
    let train = &allocated[0];
    let uid = train.metadata.uid.clone().unwrap_or_default();
    let request = claim("default", "train", &uid);
    let answers = kubelet.prepare_raw(&plugin, std::slice::from_ref(&request)).await.expect("prepare call");
    assert!(answers[&uid].error.is_empty(), "{:?}\n{}", answers[&uid], dgx.process.log());
    let (pool, device) = allocation(train)[0].clone();
    let entry = eventually(
        "train's status.devices entry Ready",
        || async {
            let claim = claims.get("train").await.ok()?;
            ours(&claim).into_iter().find(|d| ready(d).is_some_and(|r| r.0 == "True"))
        },
        logs,
    )
    .await;
    assert_eq!((entry.pool.as_str(), entry.device.as_str()), (pool.as_str(), device.as_str()));
    assert_eq!(entry.pool, NODE);
    let uuid = entry.data.as_ref().map(|d| d.0["uuid"].clone()).unwrap_or_default();
    let published = integration_tests::real_cluster::driver::device_attribute(&cluster, &pool, &device, "uuid").await;
    assert!(uuid.as_str().is_some_and(|u| u.starts_with("GPU-")), "{entry:?}");
    assert_eq!(published.and_then(|a| a["string"].as_str().map(str::to_owned)).as_deref(), uuid.as_str());
    assert_eq!(ready(&entry).map(|r| r.1), Some("Prepared".to_owned()));

    // Failed: Ready=False with the reason the kubelet got.
    let misconfigured = &allocated[1];
    let bad_uid = misconfigured.metadata.uid.clone().unwrap_or_default();
    let bad = claim("default", "misconfigured", &bad_uid);
    let answers = kubelet.prepare_raw(&plugin, std::slice::from_ref(&bad)).await.expect("prepare call");
    let error = answers[&bad_uid].error.clone();
    assert!(error.contains("MigDeviceConfig"), "{error}");
    let failed = eventually(
        "misconfigured's entry NotReady",
        || async {
            let claim = claims.get("misconfigured").await.ok()?;
            ours(&claim).into_iter().find_map(|d| ready(&d).filter(|r| r.0 == "False"))
        },
        logs,
    )
    .await;
    assert_eq!(failed.1, "PrepareFailed");
    assert!(error.contains(&failed.2) && failed.2.contains("MigDeviceConfig"), "{failed:?}\n{error}");

    // Unprepared: our entries go.
    kubelet.unprepare(&plugin, std::slice::from_ref(&request)).await.unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    eventually(
        "train's entries removed",
        || async { claims.get("train").await.ok().filter(|c| ours(c).is_empty()).map(|_| ()) },
        logs,
    )
    .await;
    let log = dgx.process.log();
    assert!(!log.contains("cannot write the claim's device status"), "{log}");

    if release.minor == V1_34.minor {
        return;
    }
    // Without the granular grant the real server refuses the write.
    let roles: Api<ClusterRole> = Api::all(cluster.admin());
    let mut role = roles.get(PLUGIN_ACCOUNT).await.expect("the plugin's ClusterRole");
    let rules = role.rules.get_or_insert_default();
    let before = rules.len();
    rules.retain(|r| !r.resources.iter().flatten().any(|res| res == "resourceclaims/driver"));
    assert_eq!(rules.len(), before - 1, "the chart grants resourceclaims/driver in one rule");
    roles.replace(PLUGIN_ACCOUNT, &PostParams::default(), &role).await.expect("replacing the ClusterRole");
    let event = eventually(
        "the refused write's Event on train",
        || async {
            // The authorizer sees the new role after a moment: each round
            // prepares again (one write each) until one is refused.
            let answers = kubelet.prepare_raw(&plugin, std::slice::from_ref(&request)).await.ok()?;
            assert!(answers[&uid].error.is_empty(), "{:?}", answers[&uid]);
            let events: Api<Event> = Api::namespaced(cluster.admin(), "default");
            let list = events.list(&ListParams::default()).await.ok()?;
            let found = list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("ReadyConditionRefused")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("train")
            });
            if found.is_none() {
                kubelet.unprepare(&plugin, std::slice::from_ref(&request)).await.ok()?;
            }
            found
        },
        logs,
    )
    .await;
    let note = event.note.unwrap_or_default();
    // The granular check is part of the status strategy's validation: the
    // refusal comes as 422 Invalid with a Forbidden cause, not as a 403.
    assert!(note.contains("HTTP 422 Invalid") && note.contains("cannot associated-node:update"), "{note}");
    assert!(
        note.contains("associated-node:update on resourceclaims/driver for gpu.nvidia.com"),
        "the fix is named: {note}"
    );
}
