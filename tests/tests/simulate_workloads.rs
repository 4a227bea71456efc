//! `simulate` on the workloads users write: Deployments, StatefulSets and
//! Jobs expanded to their pods (NVIDIA's four-replica demo as written),
//! opaque configs checked as the webhook checks them, and pods asking for
//! an extended resource a DeviceClass serves.

use std::path::Path;
use std::process::Output;

use integration_tests::{controller, run, stdout_ok, workspace_root};
use serde_json::Value;

fn simulate(args: &[&str]) -> Output {
    let mut all = vec!["simulate"];
    all.extend_from_slice(args);
    run(controller(), &all, None)
}

/// `simulate -o json` of `yaml` (with the shipped classes) on a fleet of
/// one node with `gpus` whole H100s.
fn results_for(dir: &Path, yaml: &str, gpus: usize) -> Vec<Value> {
    let file = dir.join("input.yaml");
    std::fs::write(&file, yaml).unwrap();
    let fleet = dir.join("fleet.yaml");
    std::fs::write(&fleet, format!("- name: n\n  inventory: {{gpus: [{{model: H100-80GB, count: {gpus}}}]}}\n"))
        .unwrap();
    let classes = workspace_root().join("deviceclasses");
    let out = simulate(&[
        "-f",
        classes.to_str().unwrap(),
        "-f",
        file.to_str().unwrap(),
        "--fleet",
        fleet.to_str().unwrap(),
        "-o",
        "json",
    ]);
    let doc: Value = serde_json::from_str(&stdout_ok(&out)).unwrap();
    doc["results"].as_array().unwrap().clone()
}

fn field<'a>(results: &'a [Value], name: &str) -> Vec<&'a str> {
    results.iter().map(|r| r[name].as_str().unwrap_or("-")).collect()
}

const TEMPLATE: &str = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\n\
metadata: {name: one-gpu}\n\
spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}}\n";

const POD_SPEC: &str = "{resourceClaims: [{name: gpu, resourceClaimTemplateName: one-gpu}], \
containers: [{name: c, image: x, resources: {claims: [{name: gpu}]}}]}";

#[test]
fn nvidias_four_replica_deployment_shares_one_gpu() {
    let root = workspace_root();
    let classes = root.join("deviceclasses");
    let workload = root.join("examples/sharing/nvidia-integer-sharing.yaml");
    let fleet = root.join("examples/fleets/consumable-shares.yaml");
    let args = ["-f", classes.to_str().unwrap(), "-f", workload.to_str().unwrap(), "--fleet", fleet.to_str().unwrap()];
    let mut json_args = args.to_vec();
    json_args.extend(["-o", "json"]);
    let doc: Value = serde_json::from_str(&stdout_ok(&simulate(&json_args))).unwrap();
    let results = doc["results"].as_array().unwrap();
    assert_eq!(results.len(), 4, "one claim per replica: {results:?}");
    let mut devices = Vec::new();
    for r in results {
        assert_eq!(r["allocated"], true, "{r}");
        assert_eq!(r["namespace"], "gpu-share-integer");
        assert_eq!(r["workload"], "Deployment gpu-share-integer/integer-sharing");
        let pod = r["pod"].as_str().unwrap();
        assert!(pod.starts_with("gpu-share-integer/integer-sharing-"), "{pod}");
        assert_eq!(r["name"].as_str().unwrap(), format!("{}-gpu", pod.split_once('/').unwrap().1));
        let result = &r["allocation"]["devices"]["results"][0];
        devices.push((r["node"].as_str().unwrap().to_string(), result["device"].as_str().unwrap().to_string()));
    }
    devices.dedup();
    assert_eq!(devices.len(), 1, "all four on one GPU: {devices:?}");
    let pods: std::collections::BTreeSet<&str> = results.iter().map(|r| r["pod"].as_str().unwrap()).collect();
    assert_eq!(pods.len(), 4, "four distinct pods");

    // The table names each claim's pod and its Deployment.
    let table = stdout_ok(&simulate(&args));
    assert!(table.lines().next().unwrap().contains("POD"), "{table}");
    assert!(table.contains("(Deployment integer-sharing)"), "{table}");
    assert!(table.contains("4 of 4 claims allocated"), "{table}");
}

#[test]
fn a_job_runs_parallelism_pods_capped_by_completions() {
    let dir = tempfile::tempdir().unwrap();
    let job = format!(
        "{TEMPLATE}---\napiVersion: batch/v1\nkind: Job\nmetadata: {{name: train}}\n\
         spec: {{parallelism: 3, completions: 5, template: {{spec: {POD_SPEC}}}}}\n"
    );
    let results = results_for(dir.path(), &job, 2);
    assert_eq!(field(&results, "name"), ["train-0-gpu", "train-1-gpu", "train-2-gpu"]);
    assert_eq!(field(&results, "pod"), ["default/train-0", "default/train-1", "default/train-2"]);
    assert_eq!(field(&results, "workload"), ["Job default/train"; 3]);
    // Two GPUs: the third pod waits, with the reason.
    assert_eq!(results.iter().map(|r| r["allocated"] == true).collect::<Vec<_>>(), [true, true, false]);
    assert!(results[2]["reason"].as_str().unwrap().contains("cannot be allocated"), "{:?}", results[2]);

    let capped = job.replace("completions: 5", "completions: 1");
    assert_eq!(field(&results_for(dir.path(), &capped, 2), "name"), ["train-0-gpu"]);
}

#[test]
fn a_statefulset_names_its_pods_by_ordinal() {
    let dir = tempfile::tempdir().unwrap();
    let set = format!(
        "{TEMPLATE}---\napiVersion: apps/v1\nkind: StatefulSet\nmetadata: {{name: db, namespace: ml}}\n\
         spec: {{replicas: 2, serviceName: db, selector: {{matchLabels: {{app: db}}}}, \
         template: {{metadata: {{labels: {{app: db}}}}, spec: {POD_SPEC}}}}}\n"
    )
    .replace("metadata: {name: one-gpu}", "metadata: {name: one-gpu, namespace: ml}");
    let results = results_for(dir.path(), &set, 8);
    assert_eq!(field(&results, "pod"), ["ml/db-0", "ml/db-1"]);
    assert_eq!(field(&results, "name"), ["db-0-gpu", "db-1-gpu"]);
    assert_eq!(field(&results, "workload"), ["StatefulSet ml/db"; 2]);
    assert!(results.iter().all(|r| r["allocated"] == true), "{results:?}");
}

#[test]
fn a_bad_mps_percentage_is_refused_with_the_webhooks_message() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("claim.yaml");
    std::fs::write(
        &file,
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: mps}\nspec:\n  devices:\n    \
         requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]\n    config:\n    - opaque:\n        \
         driver: gpu.nvidia.com\n        parameters:\n          apiVersion: resource.nvidia.com/v1beta1\n          \
         kind: GpuConfig\n          sharing: {strategy: MPS, mpsConfig: {defaultActiveThreadPercentage: 150}}\n",
    )
    .unwrap();
    let root = workspace_root();
    let classes = root.join("deviceclasses");
    let fleet = root.join("examples/fleets/mixed.yaml");
    let base = ["-f", classes.to_str().unwrap(), "-f", file.to_str().unwrap(), "--fleet", fleet.to_str().unwrap()];
    let refused = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let out = simulate(&args);
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(out.stdout.is_empty());
        stderr.trim().to_string()
    };
    // With MPS allowed, the range check the webhook makes (the message is
    // the webhook's: `spec...: active thread percentage ...`).
    let line = refused(&["--feature-gates", "MPSSupport=true"]);
    assert_eq!(
        line,
        format!(
            "error: {}: ResourceClaim default/mps: the webhook denies it: \
             spec.devices.config[0].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage: active \
             thread percentage must be between 0 and 100, not 150",
            file.display()
        )
    );
    // Without the gate (this fleet's plugins have none), MPS itself is refused.
    let line = refused(&[]);
    assert!(
        line.contains("the webhook denies it: spec.devices.config[0].opaque.parameters.sharing.strategy"),
        "{line}"
    );
    assert!(line.contains("MPSSupport"), "{line}");
}

#[test]
fn a_pod_asking_for_an_extended_resource_gets_the_schedulers_claim() {
    let dir = tempfile::tempdir().unwrap();
    let classes = dir.path().join("classes.yaml");
    // The shipped class as the chart writes it with
    // deviceClasses.extendedResourceName=true.
    let shipped = std::fs::read_to_string(workspace_root().join("deviceclasses/gpu.nvidia.com.yaml")).unwrap();
    std::fs::write(&classes, shipped.replace("spec:\n", "spec:\n  extendedResourceName: nvidia.com/gpu\n")).unwrap();
    let pods = dir.path().join("pods.yaml");
    std::fs::write(
        &pods,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: legacy}\n\
         spec: {containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 2, cpu: 1}}}]}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {name: implicit}\n\
         spec: {containers: [{name: c, image: x, resources: {limits: \
         {deviceclass.resource.kubernetes.io/gpu.nvidia.com: 1}}}]}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {name: unserved}\n\
         spec: {containers: [{name: c, image: x, resources: {limits: {example.com/fpga: 1}}}]}\n",
    )
    .unwrap();
    let fleet = dir.path().join("fleet.yaml");
    std::fs::write(&fleet, "- name: n\n  inventory: {gpus: [{model: H100-80GB, count: 8}]}\n").unwrap();
    let mut args =
        vec!["-f", classes.to_str().unwrap(), "-f", pods.to_str().unwrap(), "--fleet", fleet.to_str().unwrap()];
    args.extend(["-o", "json"]);
    let out = simulate(&args);
    let doc: Value = serde_json::from_str(&stdout_ok(&out)).unwrap();
    let results = doc["results"].as_array().unwrap();
    assert_eq!(field(results, "name"), ["legacy-extended-resources", "implicit-extended-resources"]);
    assert_eq!(field(results, "pod"), ["default/legacy", "default/implicit"]);
    let legacy = &results[0]["allocation"]["devices"]["results"];
    let requests: Vec<&str> = legacy.as_array().unwrap().iter().map(|r| r["request"].as_str().unwrap()).collect();
    // One request for container 0; nvidia.com/gpu sorts after cpu: index 1.
    assert_eq!(requests, ["container-0-request-1", "container-0-request-1"]);
    assert_eq!(results[1]["allocated"], true);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("Pod default/unserved asks for example.com/fpga, which no DeviceClass serves"), "{stderr}");

    // Before 1.36 the scheduler does not serve extended resources by DRA.
    let mut old = args.clone();
    old.extend(["--kubernetes-version", "1.35"]);
    let doc: Value = serde_json::from_str(&stdout_ok(&simulate(&old))).unwrap();
    assert!(doc["results"].as_array().unwrap().is_empty(), "{doc}");
}
