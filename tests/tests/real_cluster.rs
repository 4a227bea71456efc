//! The driver against the real Kubernetes control plane -- etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler -- of the oldest
//! and the newest supported release, built from their Go modules
//! (`tests/kube-bins/`, cached outside the clone). Each test starts its own
//! cluster and leaves no process or file behind.

use std::collections::BTreeMap;
use std::path::Path;

use integration_tests::controller_process::ControllerProcess;
use integration_tests::helm::{self, render_all, rendered};
use integration_tests::kubelet::{Kubelet, KubeletConfig, claim};
use integration_tests::real_cluster::driver::{
    NAMESPACE, PLUGIN_ACCOUNT, WAIT, allocation, event_about, eventually, install, pod_claim, start_controller,
    start_controller_through, start_plugin, yaml_documents,
};
use integration_tests::real_cluster::host_address::HostAddress;
use integration_tests::real_cluster::intercept::Trap;
use integration_tests::real_cluster::objects::create_all;
use integration_tests::real_cluster::{Cluster, Release, V1_34, V1_37};
use integration_tests::{example_inventories, kubelet_plugin, run, stdout_ok, workspace_root};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn tmp_dir() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// The chart as `helm install` renders it with `values`.
fn chart(values: Value) -> Vec<Value> {
    rendered(&render_all(tmp_dir(), &[("real", values)]), "real").0
}

/// The chart's objects as the tests install them: the webhook off (no
/// controller serves it in these tests; with `failurePolicy: Fail` every
/// claim would be refused).
fn chart_without_webhook() -> Vec<Value> {
    chart(json!({"webhook": {"enabled": false}}))
}

// ------------------------------------------------------------------ slices

fn taints(spec: &mut Value) -> impl Iterator<Item = &mut Value> {
    let devices = spec.get_mut("devices").and_then(Value::as_array_mut).into_iter().flatten();
    devices.flat_map(|d| d.get_mut("taints").and_then(Value::as_array_mut).into_iter().flatten())
}

/// Every slice every example inventory publishes passes the real API
/// server's validation, and reads back as written: with the optional
/// gates on, as a server with a gate off drops that gate's fields on
/// write (what the publisher does then is `real_cluster_default_gates`'s).
async fn example_slices_are_accepted(release: Release) {
    let cluster = Cluster::start(release.with_optional_gates()).await;
    let slices: Api<ResourceSlice> = Api::all(cluster.admin());
    let mut created = 0;
    for inventory in example_inventories() {
        let node = inventory.file_stem().unwrap().to_string_lossy().to_string();
        let out = run(
            kubelet_plugin(),
            &["print-slices", "--node-name", &node, "--fake-inventory", inventory.to_str().unwrap(), "-o", "json"],
            None,
        );
        let list: Value = serde_json::from_str(&stdout_ok(&out)).unwrap();
        let printed: Vec<ResourceSlice> = serde_json::from_value(list["items"].clone()).unwrap();
        assert!(!printed.is_empty(), "{}", inventory.display());
        for slice in printed {
            let name = slice.metadata.name.clone().unwrap_or_default();
            let stored = slices.create(&PostParams::default(), &slice).await.unwrap_or_else(|e| {
                panic!("{}: slice {name} refused by kube-apiserver {}: {e}", inventory.display(), release.minor)
            });
            // The server defaults a taint's `timeAdded` (SetDefaults_DeviceTaint);
            // everything else reads back as written.
            let mut stored_spec = serde_json::to_value(&stored.spec).unwrap();
            for taint in taints(&mut stored_spec) {
                let added = taint.as_object_mut().unwrap().remove("timeAdded");
                assert!(added.is_some_and(|t| t.is_string()), "{name}: a taint without timeAdded: {taint}");
            }
            assert_eq!(
                stored_spec,
                serde_json::to_value(&slice.spec).unwrap(),
                "{name}: the server stored a different spec"
            );
            created += 1;
        }
    }
    eprintln!("kube-apiserver {} accepted {created} slices", release.minor);
}

// ------------------------------------------------------ chart, RBAC, policy

/// The chart's manifests install as they are; each node's plugin publishes
/// on its own token; the ValidatingAdmissionPolicy refuses node A's plugin
/// writing node B's slice, and RBAC refuses it what the chart does not grant.
async fn chart_installs_and_plugins_publish_on_their_own_tokens(release: Release) {
    let cluster = Cluster::start(release).await;
    let objects = chart_without_webhook();
    install(&cluster, &objects).await;
    let a = start_plugin(&cluster, "node-a", &workspace_root().join("examples/inventories/dgx-h100.yaml")).await;

    let token = cluster.pod_bound_token(NAMESPACE, PLUGIN_ACCOUNT, "node-b").await;
    cluster.create_node("node-b").await;
    let node_b = cluster.client_with_token(&token).await;
    let node_a = {
        let token = cluster.pod_bound_token(NAMESPACE, PLUGIN_ACCOUNT, &a.node).await;
        cluster.client_with_token(&token).await
    };

    // Node B's plugin may write its own slice ...
    let slice = |node: &str| -> ResourceSlice {
        serde_json::from_value(json!({
            "metadata": {"name": format!("{node}-by-hand")},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0"}]},
        }))
        .unwrap()
    };
    Api::<ResourceSlice>::all(node_b.clone()).create(&PostParams::default(), &slice("node-b")).await.unwrap();
    // ... node A's may not write it, nor delete it, once the API server has
    // loaded the policy (it refreshes its policies about every second: a
    // new policy is not enforced at once, unlike in the stand-in).
    let message = eventually(
        "the ValidatingAdmissionPolicy to refuse node A's plugin",
        || async {
            let mut attempt = slice("node-b");
            attempt.metadata.name = Some("node-b-from-a".into());
            match Api::<ResourceSlice>::all(node_a.clone()).create(&PostParams::default(), &attempt).await {
                Ok(_) => {
                    let admin: Api<ResourceSlice> = Api::all(cluster.admin());
                    admin.delete("node-b-from-a", &Default::default()).await.unwrap();
                    None
                }
                Err(refused) => Some(refused.to_string()),
            }
        },
        || cluster.logs(),
    )
    .await;
    assert!(message.contains("may not modify ResourceSlices of node 'node-b'"), "{message}");
    let refused = Api::<ResourceSlice>::all(node_a.clone())
        .delete("node-b-by-hand", &Default::default())
        .await
        .expect_err("node A's plugin deleted a slice of node B");
    assert!(refused.to_string().contains("node 'node-b'"), "{refused}");
    // RBAC: the plugin's account reads no pods, writes no claims.
    let pods = Api::<Pod>::all(node_a.clone()).list(&ListParams::default()).await;
    assert!(matches!(pods, Err(kube::Error::Api(ref s)) if s.code == 403), "{pods:?}");

    // The plugin published its node's pool through its own token.
    let published = Api::<ResourceSlice>::all(cluster.admin())
        .list(&ListParams::default().fields("spec.nodeName=node-a"))
        .await
        .unwrap();
    let devices: usize = published.items.iter().map(|s| s.spec.devices.as_ref().map_or(0, Vec::len)).sum();
    assert!(devices >= 8, "node-a published {devices} devices\n{}", a.process.log());
    assert!(!a.process.log().contains("Forbidden"), "{}", a.process.log());
    drop(a.dirs);
}

// ------------------------------------------------- the real kube-scheduler

/// The demo's workload (`examples/demo/workload.yaml`, applied as it is):
/// the real kube-controller-manager makes the pods' claims from their
/// templates, the real kube-scheduler allocates them from the slices our
/// plugins publish and binds the pods (there is no kubelet: they stay
/// bound, not running), and the impossible one stays unschedulable. The
/// kubelet stand-in then has the node's plugin prepare a claim the
/// scheduler allocated.
async fn real_scheduler_allocates_from_our_slices(release: Release) {
    let cluster = Cluster::start(release).await;
    install(&cluster, &chart_without_webhook()).await;
    let inventories = workspace_root().join("examples/inventories");
    let dgx = start_plugin(&cluster, "dgx-h100-a", &inventories.join("dgx-h100.yaml")).await;
    let mig = start_plugin(&cluster, "hgx-a100-mig", &inventories.join("a100-mig.yaml")).await;
    let workload = yaml_documents(&workspace_root().join("examples/demo/workload.yaml"));
    create_all(&cluster.admin(), &workload).await.unwrap_or_else(|e| panic!("the real API server refused it: {e}"));

    let logs = || format!("{}\n{}\n{}", cluster.logs(), dgx.process.log(), mig.process.log());
    let mut placed = BTreeMap::new();
    // The scheduler scores the nodes that fit: an NVLink pair fits the DGX
    // and the HGX's two whole GPUs alike, so either is right for trainer.
    for (pod, nodes, devices) in [
        ("notebook", &["dgx-h100-a"][..], 1),
        ("trainer", &["dgx-h100-a", "hgx-a100-mig"][..], 2),
        ("tiny-llm", &["hgx-a100-mig"][..], 1),
    ] {
        let (bound_to, claim) = eventually(
            &format!("pod {pod} bound with its claim allocated"),
            || async {
                let bound = Api::<Pod>::namespaced(cluster.admin(), "default").get(pod).await.ok()?.spec?.node_name?;
                let claim = pod_claim(&cluster, "default", pod).await?;
                (!allocation(&claim).is_empty()).then_some((bound, claim))
            },
            logs,
        )
        .await;
        assert!(nodes.contains(&bound_to.as_str()), "{pod} bound to {bound_to}, expected one of {nodes:?}");
        let allocated = allocation(&claim);
        assert_eq!(allocated.len(), devices, "{pod}: {allocated:?}");
        assert!(allocated.iter().all(|(pool, _)| *pool == bound_to), "{pod}: {allocated:?}");
        let reserved = claim.status.as_ref().and_then(|s| s.reserved_for.as_ref()).map_or(0, Vec::len);
        assert_eq!(reserved, 1, "{pod}: the scheduler reserves the claim for the pod");
        placed.insert(pod, claim);
    }
    // The MIG request got a 1g MIG device; the pair shares an NVLink group.
    let slices = Api::<ResourceSlice>::all(cluster.admin()).list(&ListParams::default()).await.unwrap();
    let attribute = |pool: &str, device: &str, name: &str| -> Option<Value> {
        let device = slices
            .items
            .iter()
            .filter(|s| s.spec.pool.name == pool)
            .flat_map(|s| s.spec.devices.iter().flatten())
            .find(|d| d.name == device)?;
        serde_json::to_value(device.attributes.as_ref()?.get(name)?).ok()
    };
    let (pool, device) = &allocation(&placed["tiny-llm"])[0];
    let profile = attribute(pool, device, "profile").unwrap_or_else(|| panic!("{device} has no profile"));
    assert!(profile["string"].as_str().is_some_and(|p| p.starts_with("1g.")), "{profile}");
    let pair = allocation(&placed["trainer"]);
    let groups: Vec<_> = pair.iter().map(|(pool, device)| attribute(pool, device, "nvlinkGroup")).collect();
    assert!(groups[0].is_some() && groups[0] == groups[1], "{groups:?}");

    // Eight B200s exist nowhere: the scheduler leaves that pod pending.
    eventually(
        "big-model to be marked unschedulable",
        || async {
            let pod = Api::<Pod>::namespaced(cluster.admin(), "default").get("big-model").await.ok()?;
            let conditions = pod.status?.conditions?;
            conditions
                .iter()
                .any(|c| {
                    c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable")
                })
                .then_some(())
        },
        logs,
    )
    .await;

    // The node's plugin prepares what the real scheduler chose.
    let kubelet = Kubelet::new(KubeletConfig::new(&dgx.dirs.registry, "gpu.nvidia.com"));
    let plugin = kubelet.wait_and_register(WAIT).await.unwrap_or_else(|e| panic!("{e}\n{}", dgx.process.log()));
    let notebook = &placed["notebook"];
    let uid = notebook.metadata.uid.clone().unwrap();
    let request = claim("default", notebook.metadata.name.as_deref().unwrap(), &uid);
    let prepared = kubelet.prepare(&plugin, &[request]).await.unwrap_or_else(|e| panic!("{e}\n{}", dgx.process.log()));
    let devices = &prepared[&uid];
    assert_eq!(devices.len(), 1);
    assert_eq!((devices[0].pool_name.clone(), devices[0].device_name.clone()), allocation(notebook)[0]);
    assert!(!devices[0].cdi_device_ids.is_empty(), "{devices:?}");
}

// ------------------------------------------------------------ the controller

async fn lease_holder(cluster: &Cluster) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(cluster.admin(), NAMESPACE);
    leases.get("gpu-dra-controller").await.ok()?.spec?.holder_identity
}

/// Two controllers on their own tokens elect a leader on a real Lease; the
/// leader explains an unsatisfiable claim with an Event the real API
/// server stores, allocates a delegated claim through the real status
/// subresource, meeting a real 409 on its first write and retrying; when
/// it is killed the other takes the Lease over.
async fn controller_explains_allocates_and_fails_over(release: Release) {
    let cluster = Cluster::start(release).await;
    install(&cluster, &chart_without_webhook()).await;
    let inventories = workspace_root().join("examples/inventories");
    let dgx = start_plugin(&cluster, "dgx-h100-a", &inventories.join("dgx-h100.yaml")).await;
    // Both replicas call through a front that, before the first status
    // write of the claim "delegated", labels the claim as another client
    // would: that write carries a stale resourceVersion and the real API
    // server answers 409.
    let claims_api: Api<ResourceClaim> = Api::namespaced(cluster.admin(), "default");
    let trap = Trap::new("PUT", "/namespaces/default/resourceclaims/delegated/status", move || {
        let claims = claims_api.clone();
        async move {
            let label = json!({"metadata": {"labels": {"example.com/touched": "meanwhile"}}});
            claims.patch("delegated", &PatchParams::default(), &Patch::Merge(&label)).await.expect("labelling");
        }
    });
    let mut controllers: BTreeMap<String, ControllerProcess> = BTreeMap::new();
    let mut fronts = Vec::new();
    for identity in ["replica-a", "replica-b"] {
        let (controller, front) = start_controller_through(&cluster, identity, "dgx-h100-a", trap.clone()).await;
        controllers.insert(identity.to_string(), controller);
        fronts.push(front);
    }
    let logs = |controllers: &BTreeMap<String, ControllerProcess>| {
        let mut text = format!("{}\n{}", cluster.logs(), dgx.process.log());
        for (id, c) in controllers {
            text += &format!("\n---- controller {id}\n{}", c.log());
        }
        text
    };
    let leader = eventually("a leader", || lease_holder(&cluster), || logs(&controllers)).await;
    assert!(controllers.contains_key(&leader), "{leader}");

    // An impossible claim with a pod waiting for it: explained.
    let claims = yaml_documents(&workspace_root().join("examples/claims/08-unsatisfiable.yaml"));
    create_all(&cluster.admin(), &claims[..1]).await.unwrap();
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "big", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/x"}],
                 "resourceClaims": [{"name": "gpus", "resourceClaimName": "eight-b200"}]}});
    create_all(&cluster.admin(), &[pod]).await.unwrap();
    let event = event_about(&cluster, "default", "eight-b200", "Unsatisfiable", || logs(&controllers)).await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.reporting_controller.as_deref(), Some("gpu.nvidia.com/controller"));
    let note = event.note.clone().unwrap_or_default();
    assert!(note.contains("default/eight-b200"), "{note}");

    // A delegated claim: the controller allocates it through /status.
    let delegated = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "delegated", "namespace": "default", "annotations": {"gpu.nvidia.com/allocate": "true"}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}});
    create_all(&cluster.admin(), &[delegated]).await.unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.admin(), "default");
    let allocated = eventually(
        "the delegated claim's allocation",
        || async {
            let claim = claims.get("delegated").await.ok()?;
            let devices = allocation(&claim);
            (!devices.is_empty()).then_some(devices)
        },
        || logs(&controllers),
    )
    .await;
    assert_eq!(allocated.len(), 1);
    assert_eq!(allocated[0].0, "dgx-h100-a");
    // The first status write met the real conflict; the controller read
    // the claim again and wrote the allocation over the label, keeping it.
    let answers = trap.answers();
    assert_eq!(answers.first(), Some(&409), "{answers:?}\n{}", logs(&controllers));
    assert_eq!(answers.last(), Some(&200), "{answers:?}");
    let claim = claims.get("delegated").await.unwrap();
    let labels = claim.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("example.com/touched").map(String::as_str), Some("meanwhile"));
    let finalizers = claim.metadata.finalizers.clone().unwrap_or_default();
    assert!(finalizers.iter().any(|f| f == "gpu.nvidia.com/delegated-allocation"), "{finalizers:?}");

    // The leader dies: the other takes the Lease over.
    controllers.get_mut(&leader).unwrap().kill();
    let next = eventually(
        "the other replica to take the Lease",
        || async { lease_holder(&cluster).await.filter(|holder| *holder != leader) },
        || logs(&controllers),
    )
    .await;
    assert!(controllers.contains_key(&next) && next != leader, "{next}");
    for (id, controller) in &controllers {
        assert!(!controller.log().contains("Forbidden"), "controller {id} was refused a call:\n{}", controller.log());
    }
}

// ------------------------------------------------------------- the webhook

/// `kubectl create -f -` of `object` as the admin (`--dry-run=server` when
/// `dry_run`): its exit status and standard error, where kubectl prints
/// the server's warnings and refusals.
fn kubectl_create(cluster: &Cluster, object: &Value, dry_run: bool) -> (bool, String) {
    let mut args = vec!["--kubeconfig", cluster.admin_kubeconfig().to_str().unwrap(), "create", "-f", "-"];
    if dry_run {
        args.push("--dry-run=server");
    }
    let out = run(&helm::kubectl(tmp_dir()), &args, Some(object.to_string().as_bytes()));
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn claim_with(name: &str, selector: &str, parameters: Value) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                     "selectors": [{"cel": {"expression": selector}}]}}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": parameters}}]}}})
}

/// The chart with its webhook, applied as rendered (the Service, the
/// Secret Helm generated, the ValidatingWebhookConfiguration with its CA
/// bundle); the controller serves the webhook with that Secret's
/// certificate, on a non-loopback address of this machine published as the
/// Service's EndpointSlice (no kube-proxy: the API server runs with
/// `--enable-aggregator-routing`). The real API server calls it: a
/// selector that matches no device today is admitted with the webhook's
/// warning, which kubectl prints; a config that does not decode is denied
/// with the webhook's message, naming the field.
async fn webhook_warnings_and_denials_reach_the_client(release: Release) {
    let cluster = Cluster::start(release).await;
    let objects = chart(json!({}));
    install(&cluster, &objects).await;
    let dgx = start_plugin(&cluster, "dgx-h100-a", &workspace_root().join("examples/inventories/dgx-h100.yaml")).await;

    let secret: Secret = serde_json::from_value(helm::one(&objects, "Secret", "-webhook-tls").clone()).unwrap();
    let data = secret.data.unwrap();
    let dir = cluster.dir().join("webhook-tls");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tls.crt"), &data["tls.crt"].0).unwrap();
    std::fs::write(dir.join("tls.key"), &data["tls.key"].0).unwrap();
    let port = std::net::TcpListener::bind("0.0.0.0:0").unwrap().local_addr().unwrap().port().to_string();
    let (crt, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let args =
        ["--webhook-port", &port, "--tls-cert-file", crt.to_str().unwrap(), "--tls-key-file", key.to_str().unwrap()];
    let controller = start_controller(&cluster, "webhook", "dgx-h100-a", &args).await;

    let service = helm::one(&objects, "Service", "-webhook");
    let service_name = service["metadata"]["name"].as_str().unwrap();
    assert_eq!(service["spec"]["ports"][0]["name"], "https", "{service}");
    let address = HostAddress::acquire();
    let endpoints = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service_name}-test"), "namespace": NAMESPACE,
                     "labels": {"kubernetes.io/service-name": service_name}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address.ip().to_string()], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": port.parse::<u16>().unwrap(), "protocol": "TCP"}]});
    create_all(&cluster.admin(), &[endpoints]).await.unwrap_or_else(|e| panic!("{e}"));

    // A selector no device matches today: admitted, with the warning. The
    // controller first needs the fleet and the API server the endpoints.
    let h200 = r#"device.attributes["gpu.nvidia.com"].productName == "NVIDIA H200""#;
    let gpu_config = || json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"});
    let logs = || format!("{}\n{}\n---- controller\n{}", cluster.logs(), dgx.process.log(), controller.log());
    eventually(
        "the webhook's warning on a dry run",
        || async {
            let (ok, stderr) = kubectl_create(&cluster, &claim_with("h200", h200, gpu_config()), true);
            (ok && stderr.contains("no device in the cluster matches request gpu today")).then_some(())
        },
        logs,
    )
    .await;
    let (created, stderr) = kubectl_create(&cluster, &claim_with("h200", h200, gpu_config()), false);
    assert!(created, "{stderr}");
    assert!(stderr.starts_with("Warning: no device in the cluster matches request gpu today"), "{stderr}\n{}", logs());
    let stored = Api::<ResourceClaim>::namespaced(cluster.admin(), "default").get_opt("h200").await.unwrap();
    assert!(stored.is_some(), "a warned claim is stored");

    // An opaque config with a field GpuConfig does not have: denied.
    let mut bad = gpu_config();
    bad["sharing"] = json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}, "typo": true});
    let (created, stderr) = kubectl_create(&cluster, &claim_with("bad-config", "true", bad), false);
    assert!(!created, "{stderr}");
    assert!(
        stderr.contains(r#"admission webhook "resourceclaims.gpu.nvidia.com" denied the request: spec.devices.config[0].opaque.parameters.sharing"#),
        "{stderr}"
    );
    let stored = Api::<ResourceClaim>::namespaced(cluster.admin(), "default").get_opt("bad-config").await.unwrap();
    assert!(stored.is_none(), "a denied claim was stored");

    // A claim that fits: admitted without a warning.
    let (created, stderr) = kubectl_create(&cluster, &claim_with("fits", "true", gpu_config()), false);
    assert!(created && !stderr.contains("Warning"), "{stderr}");
    assert!(!controller.log().contains("Forbidden"), "{}", controller.log());
}

macro_rules! on_release {
    ($module:ident, $release:expr) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread")]
            async fn example_slices_are_accepted() {
                super::example_slices_are_accepted($release).await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn chart_installs_and_plugins_publish_on_their_own_tokens() {
                super::chart_installs_and_plugins_publish_on_their_own_tokens($release).await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn real_scheduler_allocates_from_our_slices() {
                super::real_scheduler_allocates_from_our_slices($release).await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn controller_explains_allocates_and_fails_over() {
                super::controller_explains_allocates_and_fails_over($release).await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn webhook_warnings_and_denials_reach_the_client() {
                super::webhook_warnings_and_denials_reach_the_client($release).await
            }
        }
    };
}

on_release!(k8s_1_34, V1_34);
on_release!(k8s_1_37, V1_37);
