//! NodePrepareResources / NodeUnprepareResources through the real plugin,
//! with the API-server stand-in holding the claims and the kubelet
//! stand-in calling over the socket; CDI specs are checked with the CNCF
//! CDI library, the way a container runtime would read them.

use std::collections::BTreeSet;

use container_device_interface::cache::new_cache;
use container_device_interface::spec_dirs::with_spec_dirs;
use gpu_kubelet_plugin::state::checkpoint::PrepareState;
use integration_tests::claim_fixtures::Allocated;
use integration_tests::kubelet::{KubeletConfig, claim};
use integration_tests::node::{DRIVER, NODE, RunningNode};
use integration_tests::plugin_process::PluginOptions;
use integration_tests::wait;
use integration_tests::workspace_root;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kubelet_proto::dra_v1::Claim;

const WHOLE_GPU: &str = "gpu-2";
const MIG: &str = "gpu-0-mig-1g10gb-19-3";

/// Plugin + both stand-ins on the A100 MIG example node (`gpu-0`, `gpu-1`
/// MIG-partitioned, `gpu-2`, `gpu-3` whole).
fn a100_node(kubelet: KubeletConfig) -> RunningNode {
    let inventory = std::fs::read_to_string(workspace_root().join("examples/inventories/a100-mig.yaml")).unwrap();
    RunningNode::start(&inventory, kubelet, PluginOptions::default())
}

/// The same with a kubelet that speaks v1.
fn v1_node() -> RunningNode {
    a100_node(KubeletConfig::new("", DRIVER))
}

/// The device nodes a container gets for `id`, as the CNCF library
/// injects them from the CDI directory.
fn injected_nodes(cdi_dir: &std::path::Path, id: &str) -> BTreeSet<String> {
    let cache = new_cache(vec![with_spec_dirs(&[cdi_dir.to_str().unwrap()])]);
    let mut cache = cache.lock().unwrap();
    let mut oci = oci_spec::runtime::Spec::default();
    cache.inject_devices(Some(&mut oci), vec![id.to_string()]).unwrap_or_else(|e| panic!("injecting {id}: {e}"));
    let linux = oci.linux().as_ref().expect("linux section");
    linux.devices().as_ref().expect("devices").iter().map(|d| d.path().display().to_string()).collect()
}

#[test]
fn gpu_and_mig_claims_become_cdi_specs_a_runtime_can_inject() {
    let node = v1_node();
    let whole = node.gpu_claim("whole", &[WHOLE_GPU]);
    let mig = node.claim("mig", &[Allocated::new("small/1g", NODE, MIG)], vec![]);
    let answers = node.prepare(&[whole.clone(), mig.clone()]);

    let whole_devices = answers[&whole.uid].clone().unwrap();
    assert_eq!(whole_devices.len(), 1);
    let d = &whole_devices[0];
    assert_eq!((d.pool_name.as_str(), d.device_name.as_str()), (NODE, WHOLE_GPU));
    assert_eq!(d.request_names, ["gpu"]);
    assert_eq!(d.cdi_device_ids, [format!("k8s.gpu.nvidia.com/claim={}-{WHOLE_GPU}", whole.uid)]);
    let nodes = injected_nodes(&node.dirs.cdi, &d.cdi_device_ids[0]);
    assert!(nodes.contains("/dev/nvidia2") && nodes.contains("/dev/nvidiactl"), "{nodes:?}");
    assert!(!nodes.iter().any(|n| n.starts_with("/dev/nvidia-caps")), "{nodes:?}");

    let m = &answers[&mig.uid].clone().unwrap()[0];
    assert_eq!(m.request_names, ["small"], "subrequest names are stripped to the base request");
    let nodes = injected_nodes(&node.dirs.cdi, &m.cdi_device_ids[0]);
    assert!(nodes.contains("/dev/nvidia0"), "a MIG device brings its parent GPU: {nodes:?}");
    assert_eq!(nodes.iter().filter(|n| n.starts_with("/dev/nvidia-caps/nvidia-cap")).count(), 2, "{nodes:?}");

    let records = node.records();
    assert_eq!(records.len(), 2);
    assert!(records.iter().all(|r| r.state == PrepareState::PrepareCompleted));

    node.unprepare(&[whole.clone(), mig.clone()]);
    assert!(!node.spec_path(&whole.uid).exists() && !node.spec_path(&mig.uid).exists());
    assert!(node.records().is_empty());
}

#[test]
fn a_v1beta1_kubelet_prepares_too() {
    let node = a100_node(KubeletConfig::new("", DRIVER).v1beta1_only());
    let c = node.gpu_claim("beta", &[WHOLE_GPU]);
    let devices = node.prepare(std::slice::from_ref(&c))[&c.uid].clone().unwrap();
    assert_eq!(devices[0].device_name, WHOLE_GPU);
    assert_eq!(devices[0].share_id, None, "v1beta1 has no share_id");
    assert!(!injected_nodes(&node.dirs.cdi, &devices[0].cdi_device_ids[0]).is_empty());
    node.unprepare(std::slice::from_ref(&c));
    assert!(!node.spec_path(&c.uid).exists());
}

#[test]
fn repeats_and_restarts_answer_the_same() {
    let mut node = v1_node();
    let c = node.gpu_claim("train", &[WHOLE_GPU, "gpu-3"]);
    let first = node.prepare(std::slice::from_ref(&c))[&c.uid].clone().unwrap();
    let spec = std::fs::read(node.spec_path(&c.uid)).unwrap();
    assert_eq!(node.prepare(std::slice::from_ref(&c))[&c.uid], Ok(first.clone()), "an idempotent repeat");
    node.restart();
    assert_eq!(node.prepare(std::slice::from_ref(&c))[&c.uid], Ok(first), "a restart keeps the prepared claim");
    assert_eq!(std::fs::read(node.spec_path(&c.uid)).unwrap(), spec, "the spec is untouched");
}

#[test]
fn unprepare_works_after_the_claim_is_deleted() {
    let node = v1_node();
    let c = node.gpu_claim("gone", &[WHOLE_GPU]);
    node.prepare(std::slice::from_ref(&c))[&c.uid].clone().unwrap();
    node.server.delete::<ResourceClaim>(Some("default"), "gone").unwrap();
    node.unprepare(std::slice::from_ref(&c));
    assert!(!node.spec_path(&c.uid).exists());
    assert!(node.records().is_empty());
}

#[test]
fn each_bad_claim_gets_its_own_error_and_good_ones_still_prepare() {
    let node = v1_node();
    let good = node.gpu_claim("good", &["gpu-3"]);
    let holder = node.gpu_claim("holder", &[WHOLE_GPU]);
    node.prepare(std::slice::from_ref(&holder))[&holder.uid].clone().unwrap();

    let bad_uid = claim("default", "good", "../../etc/passwd");
    let missing = claim("default", "missing", "8c0f5b7e-1d2c-4e3f-9a8b-7c6d5e4f3a2b");
    let mismatch = claim("default", "good", "9d1e6c8f-2e3d-4f5a-8b9c-0d1e2f3a4b5c");
    let mut unallocated = ResourceClaim::default();
    unallocated.metadata.name = Some("pending".into());
    unallocated.metadata.namespace = Some("default".into());
    let pending_uid = node.server.create(&unallocated).unwrap().metadata.uid.unwrap();
    let pending = claim("default", "pending", &pending_uid);
    let elsewhere = node.claim("elsewhere", &[Allocated::new("gpu", "node-b", "gpu-0")], vec![]);
    let phantom = node.gpu_claim("phantom", &["gpu-9"]);
    let contender = node.gpu_claim("contender", &[WHOLE_GPU]);

    let batch = [&bad_uid, &missing, &mismatch, &pending, &elsewhere, &phantom, &contender, &good];
    let answers = node.prepare(&batch.iter().map(|c| (*c).clone()).collect::<Vec<_>>());
    assert_eq!(answers.len(), batch.len(), "every claim gets an entry");
    let error = |c: &Claim| answers[&c.uid].clone().expect_err(&c.name);
    for (claim, needle) in [
        (&bad_uid, "invalid claim UID"),
        (&missing, "default/missing not found"),
        (&mismatch, "the claim was deleted and re-created"),
        (&pending, "is not allocated"),
        (&elsewhere, "pool \"node-b\""),
        (&phantom, "\"gpu-9\", which is not in this node's GPU inventory"),
        (&contender, "gpu-2 is already prepared for ResourceClaim default/holder"),
    ] {
        let text = error(claim);
        assert!(text.contains(needle), "{}: {text:?} lacks {needle:?}", claim.name);
    }
    assert!(answers[&good.uid].is_ok(), "{:?}", answers[&good.uid]);
    let specs: Vec<_> = std::fs::read_dir(&node.dirs.cdi).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(specs.len(), 2, "only the holder and the good claim have specs: {specs:?}");
}

#[test]
fn of_two_concurrent_claims_on_one_device_exactly_one_wins() {
    let node = v1_node();
    let a = node.gpu_claim("a", &["gpu-3"]);
    let b = node.gpu_claim("b", &["gpu-3"]);
    let (ra, rb) = node.runtime.block_on(async {
        tokio::join!(
            node.kubelet.prepare_raw(&node.plugin, std::slice::from_ref(&a)),
            node.kubelet.prepare_raw(&node.plugin, std::slice::from_ref(&b))
        )
    });
    let ok_a = ra.unwrap()[&a.uid].error.is_empty();
    let ok_b = rb.unwrap()[&b.uid].error.is_empty();
    assert!(ok_a != ok_b, "exactly one of the two may hold gpu-3 (a: {ok_a}, b: {ok_b})");
    assert_eq!(node.records().len(), 1);
}

#[test]
fn opaque_configs_are_decoded_strictly_and_errors_name_the_field() {
    use integration_tests::claim_fixtures::opaque_config;
    use serde_json::json;
    let node = v1_node();
    let gpu = |kind: &str, extra: serde_json::Value| {
        let mut parameters = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind});
        if let (Some(p), Some(e)) = (parameters.as_object_mut(), extra.as_object()) {
            p.extend(e.clone());
        }
        parameters
    };
    let results = [Allocated::new("gpu", NODE, "gpu-3")];
    let plain =
        node.claim("plain", &results, vec![opaque_config("FromClass", &[], DRIVER, gpu("GpuConfig", json!({})))]);
    let typo = node.claim(
        "typo",
        &results,
        vec![
            opaque_config("FromClass", &[], DRIVER, gpu("GpuConfig", json!({}))),
            opaque_config("FromClaim", &["gpu"], DRIVER, gpu("GpuConfig", json!({"sharin": {}}))),
        ],
    );
    let shared = node.claim(
        "shared",
        &results,
        vec![opaque_config(
            "FromClaim",
            &[],
            DRIVER,
            gpu("GpuConfig", json!({"sharing": {"strategy": "TimeSlicing"}})),
        )],
    );
    let mig_on_gpu = node.claim(
        "mig-on-gpu",
        &results,
        vec![opaque_config("FromClaim", &[], DRIVER, gpu("MigDeviceConfig", json!({})))],
    );
    let answers = node.prepare(&[typo.clone(), shared.clone(), mig_on_gpu.clone()]);
    let error = |c: &Claim| answers[&c.uid].clone().expect_err(&c.name);
    assert!(
        error(&typo)
            .starts_with("status.allocation.devices.config[1].opaque.parameters.sharin: unknown field `sharin`"),
        "{}",
        error(&typo)
    );
    assert!(error(&shared).contains("sharing.strategy: \"TimeSlicing\" is selected as the GPU sharing strategy"));
    assert!(error(&mig_on_gpu).contains("cannot apply MigDeviceConfig to device gpu-3 of type gpu"));
    assert!(node.records().is_empty(), "refused configs leave nothing behind");
    assert!(node.prepare(std::slice::from_ref(&plain))[&plain.uid].is_ok(), "a plain GpuConfig is accepted");
}

#[test]
fn a_second_plugin_process_waits_for_the_first_to_stop() {
    use integration_tests::plugin_process::PluginProcess;
    let mut node = v1_node();
    let c = node.gpu_claim("kept", &["gpu-3"]);
    let first = node.prepare(std::slice::from_ref(&c))[&c.uid].clone().unwrap();

    let mut second = PluginProcess::spawn(&node.dirs, &PluginOptions::default()).unwrap();
    let waiting = second.wait_for_log("another plugin process uses this state directory", WAIT_FOR_LOG);
    assert!(waiting.is_some(), "{}", second.log());
    assert_eq!(node.prepare(std::slice::from_ref(&c))[&c.uid], Ok(first.clone()), "the first still serves");

    let status = node.process.terminate(WAIT_FOR_LOG).unwrap();
    assert!(status.is_some_and(|s| s.success()));
    node.process = second;
    node.plugin = node.runtime.block_on(node.kubelet.wait_and_register(WAIT_FOR_LOG)).unwrap();
    assert_eq!(node.prepare(std::slice::from_ref(&c))[&c.uid], Ok(first), "the second took over the checkpoint");
}

const WAIT_FOR_LOG: std::time::Duration = std::time::Duration::from_secs(30);

/// A fresh node lacks `/dev/nvidia*` (NVIDIA's #1380): the plugin creates
/// the nodes a claim's spec names, with the majors and minors it knows,
/// before the spec is written.
#[test]
fn missing_device_nodes_are_created_before_the_first_claim() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: creating device nodes needs CAP_MKNOD");
        return;
    }
    let dev_root = tempfile::tempdir().unwrap();
    let inventory = std::fs::read_to_string(workspace_root().join("examples/inventories/a100-mig.yaml")).unwrap();
    let options = PluginOptions {
        extra_args: vec!["--dev-root".into(), dev_root.path().display().to_string()],
        ..PluginOptions::default()
    };
    let node = RunningNode::start(&inventory, KubeletConfig::new("", DRIVER), options);
    let mig = node.claim("mig", &[Allocated::new("small/1g", NODE, MIG)], vec![]);
    node.prepare(std::slice::from_ref(&mig))[&mig.uid].clone().unwrap();
    let dev = |p: &str| std::fs::metadata(dev_root.path().join(p)).unwrap();
    for (path, major, minor) in [("dev/nvidia0", 195, 0), ("dev/nvidiactl", 195, 255)] {
        let meta = dev(path);
        assert!(meta.file_type().is_char_device(), "{path}");
        assert_eq!(meta.rdev(), rustix::fs::makedev(major, minor), "{path}");
    }
    let caps: Vec<_> = std::fs::read_dir(dev_root.path().join("dev/nvidia-caps")).unwrap().flatten().collect();
    assert_eq!(caps.len(), 2, "the MIG instance's two capability nodes");
    assert!(!dev_root.path().join("dev/nvidia2").exists(), "only what the claim needs");
}

/// A driver upgraded under a running plugin: once the inventory reports the
/// new version, specs mount the new version's files (found again off the
/// prepare path); until then they keep the old ones.
#[test]
fn specs_follow_a_driver_upgrade() {
    use gpu_dra_driver::driver_root::fake_tree::{self, LIBDIR};
    let libs = [("libcuda.so", "libcuda.so.1"), ("libnvidia-ml.so", "libnvidia-ml.so.1")];
    let root = tempfile::tempdir().unwrap();
    fake_tree::build(root.path(), "570.172.08", &libs).unwrap();
    let inventory = std::fs::read_to_string(workspace_root().join("examples/inventories/a100-mig.yaml")).unwrap();
    let options = PluginOptions {
        extra_args: vec!["--driver-root".into(), root.path().display().to_string()],
        ..PluginOptions::default()
    };
    let node = RunningNode::start(&inventory, KubeletConfig::new("", DRIVER), options);
    let mounts_libcuda = |name: &str| {
        let c = node.gpu_claim(name, &[WHOLE_GPU]);
        node.prepare(std::slice::from_ref(&c))[&c.uid].clone().unwrap();
        let spec = std::fs::read_to_string(node.spec_path(&c.uid)).unwrap();
        node.unprepare(std::slice::from_ref(&c));
        spec
    };
    assert!(mounts_libcuda("before").contains(&format!("/{LIBDIR}/libcuda.so.570.172.08")));

    // The upgrade: new files, and the driver reports the new version.
    std::fs::remove_dir_all(root.path().join(LIBDIR)).unwrap();
    fake_tree::build(root.path(), "580.95.05", &libs).unwrap();
    std::fs::write(&node.dirs.inventory, inventory.replace("570.172.08", "580.95.05")).unwrap();
    let mut round = 0;
    let upgraded = || {
        round += 1;
        let spec = mounts_libcuda(&format!("after-{round}"));
        spec.contains(&format!("/{LIBDIR}/libcuda.so.580.95.05")).then_some(spec)
    };
    let within = std::time::Duration::from_secs(30);
    let spec = wait::until_some("the specs to follow the upgrade", within, upgraded, || node.process.log());
    assert!(!spec.contains("570.172.08"), "{spec}");
}
