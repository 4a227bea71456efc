//! The largest MIG profile of every model, made at prepare through the real
//! plugin and the mock NVML (`examples/inventories/dynamic-mig.yaml`: an
//! A100-40GB, A100-80GB, A30, H100, H200 and B200, each dynamic): a
//! `7g.40gb` on the A100 (NVIDIA's #1480) and a `7g.80gb` on the H100 among
//! them. Each takes its whole GPU (one instance at slice 0 spanning it,
//! its UUID in the spec); a 1g on that GPU meanwhile is refused naming the
//! claim that holds it; unprepare leaves the GPU empty and the 1g then fits.

use gpu_dra_driver::inventory::catalog::Catalog;
use integration_tests::kubelet::KubeletConfig;
use integration_tests::mock_gpu::MockGpuNode;
use integration_tests::node::{DRIVER, RunningNode};
use integration_tests::workspace_root;

fn device_name(minor: u32, profile: &str, id: u32, start: u32) -> String {
    format!("gpu-{minor}-mig-{}-{id}-{start}", profile.replace('.', "").replace('+', "-"))
}

#[test]
fn the_largest_profile_of_every_model_is_made_whole_and_unmade() {
    let yaml = std::fs::read_to_string(workspace_root().join("examples/inventories/dynamic-mig.yaml")).unwrap();
    let gpu = MockGpuNode::new(&yaml);
    let node = RunningNode::start("gpus: []\n", KubeletConfig::new("", DRIVER), gpu.plugin_options("DynamicMIG=true"));
    let catalog = Catalog::embedded().unwrap();
    let mut made = Vec::new();
    for g in gpu.inventory.gpus.iter().filter(|g| g.minor <= 5) {
        let model = catalog.models.values().find(|m| m.product_name == g.product_name).unwrap();
        let largest = model.mig_profiles.iter().max_by_key(|p| (p.memory_slices, p.compute_slices)).unwrap();
        let smallest = model.mig_profiles.iter().min_by_key(|p| (p.memory_slices, p.compute_slices)).unwrap();
        let [start, size] = largest.placements[0];
        assert_eq!(start, 0, "{}: {largest:?}", g.product_name);
        let name = device_name(g.minor, &largest.name, largest.gi_profile_id, start);
        let claim = node.gpu_claim(&format!("largest-{}", g.minor), &[&name]);
        let answers = node.prepare(std::slice::from_ref(&claim));
        answers[&claim.uid].as_ref().unwrap_or_else(|e| panic!("{name}: {e}\n{}", node.process.log()));
        let instances = gpu.instances()[&g.minor].clone();
        assert_eq!(instances.len(), 1, "{name}: {instances:?}");
        let instance = &instances[0];
        assert_eq!((instance.profile_id, instance.start, instance.size), (largest.gi_profile_id, 0, size), "{name}");
        assert!(instance.has_compute_instance, "{name}");
        let spec = std::fs::read_to_string(node.spec_path(&claim.uid)).unwrap();
        assert!(spec.contains(&instance.uuid), "{name}: the MIG UUID in the spec");

        // The scheduler never allocates a 1g beside it (the counters); a
        // kubelet preparing one anyway is told which claim holds the GPU.
        let [last, _] = *smallest.placements.last().unwrap();
        let one = device_name(g.minor, &smallest.name, smallest.gi_profile_id, last);
        let beside = node.gpu_claim(&format!("beside-{}", g.minor), &[&one]);
        let refused = node.prepare(std::slice::from_ref(&beside))[&beside.uid].clone().unwrap_err();
        assert!(refused.contains(&format!("ResourceClaim default/largest-{}", g.minor)), "{one}: {refused}");
        assert_eq!(gpu.instances()[&g.minor].len(), 1, "{one}: nothing made");
        made.push((name, claim, beside));
    }
    for (name, claim, beside) in &made {
        node.unprepare(std::slice::from_ref(claim));
        assert!(node.prepare(std::slice::from_ref(beside))[&beside.uid].is_ok(), "{name}: the 1g fits now");
        node.unprepare(std::slice::from_ref(beside));
    }
    for minor in 0..=5 {
        assert!(gpu.instances()[&minor].is_empty(), "GPU {minor} empty: {:?}", gpu.instances());
    }
    assert_eq!(gpu.instances()[&6].len(), 2, "the administrator's H100 keeps its instances");
    assert!(node.records().is_empty());
}
