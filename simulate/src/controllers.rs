//! What Kubernetes' workload controllers make of the objects users write:
//! the pods of a Deployment, ReplicaSet, StatefulSet, Job or CronJob, so
//! `simulate` can check a workload as written (NVIDIA's demos are
//! Deployments with `replicas`).
//!
//! How many pods, as the controllers decide it:
//! - Deployment, ReplicaSet, StatefulSet: `spec.replicas`, default 1;
//! - Job: `spec.parallelism` (default 1), capped by `spec.completions`; none
//!   while `spec.suspend` is true;
//! - CronJob: one Job from `spec.jobTemplate` (none while suspended).
//!
//! Names are deterministic, so output is reproducible (Kubernetes adds
//! random suffixes where noted):
//! - StatefulSet: `<name>-<ordinal>` from `spec.ordinals.start`, exactly
//!   as Kubernetes names them;
//! - Deployment: `<name>-<hash>-<i>`, `<name>-<hash>` being its ReplicaSet
//!   and `<hash>` the `pod-template-hash` label (an FNV hash of the pod
//!   template in Kubernetes' alphabet; Kubernetes hashes differently and
//!   ends with a random suffix instead of `<i>`);
//! - ReplicaSet and Job: `<name>-<i>` (Kubernetes: a random suffix; an
//!   Indexed Job's pods carry their completion index as here);
//! - CronJob: its Job is `<name>-0` (Kubernetes: the scheduled time).
//!
//! Each pod gets the template's labels, annotations and spec, the
//! workload's namespace and an owner reference to its controller; its
//! claims are then made from its `resourceClaims` like any pod's.

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job, JobSpec};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// A workload whose counts simulate will not expand: the field, its value
/// and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpandError {
    #[error("spec.ordinals.start: {0} is negative; fix: start at 0 or more")]
    NegativeOrdinalsStart(i32),
    /// A Job's `completions`; `at` is the Job spec's path.
    #[error("{at}.completions: {count} is negative; fix: set 0 or more, or leave it out")]
    NegativeCompletions { at: String, count: i32 },
    /// A replica or parallelism count.
    #[error("{field}: {count} is negative; fix: set 0 or more")]
    Negative { field: String, count: i32 },
    #[error("{field}: {count} pods are more than simulate expands from one workload ({MAX_PODS}); fix: lower it")]
    TooMany { field: String, count: i32 },
}

/// The kinds expanded, with the API version each is read as.
pub const KINDS: [(&str, &str); 5] = [
    ("Deployment", "apps/v1"),
    ("ReplicaSet", "apps/v1"),
    ("StatefulSet", "apps/v1"),
    ("Job", "batch/v1"),
    ("CronJob", "batch/v1"),
];

/// More pods than this from one workload is refused: a typo such as
/// `replicas: 1000000` must not exhaust memory.
pub const MAX_PODS: i32 = 10_000;

/// `pod-template-hash`, set by the Deployment controller.
const POD_TEMPLATE_HASH: &str = "pod-template-hash";
/// Labels the StatefulSet controller sets.
const STATEFULSET_POD_NAME: &str = "statefulset.kubernetes.io/pod-name";
const POD_INDEX: &str = "apps.kubernetes.io/pod-index";
/// Label and annotation the Job controller sets on an Indexed Job's pods.
const JOB_COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// A workload read from the input.
#[derive(Debug, Clone)]
pub enum Workload {
    // Boxed: each is kilobytes of optional fields.
    Deployment(Box<Deployment>),
    ReplicaSet(Box<ReplicaSet>),
    StatefulSet(Box<StatefulSet>),
    Job(Box<Job>),
    CronJob(Box<CronJob>),
}

/// A pod a controller would create, and what made it (`Deployment ns/name`).
#[derive(Debug, Clone)]
pub struct ControlledPod {
    pub pod: Pod,
    pub workload: String,
}

impl Workload {
    pub fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Workload::Deployment(d) => &mut d.metadata,
            Workload::ReplicaSet(r) => &mut r.metadata,
            Workload::StatefulSet(s) => &mut s.metadata,
            Workload::Job(j) => &mut j.metadata,
            Workload::CronJob(c) => &mut c.metadata,
        }
    }

    fn meta(&self) -> &ObjectMeta {
        match self {
            Workload::Deployment(d) => &d.metadata,
            Workload::ReplicaSet(r) => &r.metadata,
            Workload::StatefulSet(s) => &s.metadata,
            Workload::Job(j) => &j.metadata,
            Workload::CronJob(c) => &c.metadata,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Workload::Deployment(_) => "Deployment",
            Workload::ReplicaSet(_) => "ReplicaSet",
            Workload::StatefulSet(_) => "StatefulSet",
            Workload::Job(_) => "Job",
            Workload::CronJob(_) => "CronJob",
        }
    }

    /// `Kind namespace/name`, as the output names a pod's workload.
    pub fn describe(&self) -> String {
        let meta = self.meta();
        format!(
            "{} {}",
            self.kind(),
            super::keys::key(meta.namespace.as_deref(), meta.name.as_deref().unwrap_or_default())
        )
    }

    /// The pods its controller would create, in name order.
    pub fn pods(&self) -> Result<Vec<ControlledPod>, ExpandError> {
        let meta = self.meta();
        let name = meta.name.clone().unwrap_or_default();
        let namespace = meta.namespace.clone();
        let workload = self.describe();
        let owner = |kind: &str, owner_name: &str| OwnerReference {
            api_version: if kind == "Job" { "batch/v1" } else { "apps/v1" }.to_string(),
            kind: kind.to_string(),
            name: owner_name.to_string(),
            uid: String::new(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        let mut pods = Vec::new();
        let mut add = |pod_name: String, template: &PodTemplateSpec, owner: OwnerReference, labels: &[(&str, &str)]| {
            let mut pod = pod_from(template, pod_name, namespace.clone(), owner);
            let pod_labels = pod.metadata.labels.get_or_insert_with(Default::default);
            for (k, v) in labels {
                pod_labels.insert((*k).to_string(), (*v).to_string());
            }
            pods.push(ControlledPod { pod, workload: workload.clone() });
        };
        match self {
            Workload::Deployment(d) => {
                let replicas = count(d.spec.replicas, "spec.replicas")?;
                let template = d.spec.template.clone();
                let hash = template_hash(&template);
                let replica_set = format!("{name}-{hash}");
                for i in 0..replicas {
                    add(
                        format!("{replica_set}-{i}"),
                        &template,
                        owner("ReplicaSet", &replica_set),
                        &[(POD_TEMPLATE_HASH, &hash)],
                    );
                }
            }
            Workload::ReplicaSet(r) => {
                let replicas = count(r.spec.replicas, "spec.replicas")?;
                let template = r.spec.template.clone().unwrap_or_default();
                for i in 0..replicas {
                    add(format!("{name}-{i}"), &template, owner("ReplicaSet", &name), &[]);
                }
            }
            Workload::StatefulSet(s) => {
                let replicas = count(s.spec.replicas, "spec.replicas")?;
                let start = s.spec.ordinals.as_ref().and_then(|o| o.start).unwrap_or(0);
                if start < 0 {
                    return Err(ExpandError::NegativeOrdinalsStart(start));
                }
                let template = s.spec.template.clone();
                for i in 0..replicas {
                    let ordinal = (i64::from(start) + i64::from(i)).to_string();
                    let pod_name = format!("{name}-{ordinal}");
                    add(
                        pod_name.clone(),
                        &template,
                        owner("StatefulSet", &name),
                        &[(STATEFULSET_POD_NAME, &pod_name), (POD_INDEX, &ordinal)],
                    );
                }
            }
            Workload::Job(j) => {
                for (pod_name, template, index) in job_pods(&name, j.spec.as_ref(), "spec")? {
                    let index = index.map(|i| i.to_string());
                    let labels: Vec<(&str, &str)> = index.iter().map(|i| (JOB_COMPLETION_INDEX, i.as_str())).collect();
                    add(pod_name, &template, owner("Job", &name), &labels);
                }
            }
            Workload::CronJob(c) => {
                if c.spec.suspend == Some(true) {
                    return Ok(Vec::new());
                }
                let job_name = format!("{name}-0");
                let job_spec = c.spec.job_template.spec.as_ref();
                for (pod_name, template, index) in job_pods(&job_name, job_spec, "spec.jobTemplate.spec")? {
                    let index = index.map(|i| i.to_string());
                    let labels: Vec<(&str, &str)> = index.iter().map(|i| (JOB_COMPLETION_INDEX, i.as_str())).collect();
                    add(pod_name, &template, owner("Job", &job_name), &labels);
                }
            }
        }
        Ok(pods)
    }
}

/// A Job's pods: `min(parallelism, completions)` (parallelism defaults to
/// 1), with the completion index of an Indexed Job.
fn job_pods(
    name: &str,
    spec: Option<&JobSpec>,
    at: &str,
) -> Result<Vec<(String, PodTemplateSpec, Option<i32>)>, ExpandError> {
    let Some(spec) = spec else { return Ok(Vec::new()) };
    if spec.suspend == Some(true) {
        return Ok(Vec::new());
    }
    let parallelism = count(spec.parallelism, &format!("{at}.parallelism"))?;
    let completions = match spec.completions {
        Some(c) if c < 0 => return Err(ExpandError::NegativeCompletions { at: at.to_owned(), count: c }),
        Some(c) => c,
        None => i32::MAX,
    };
    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    Ok((0..parallelism.min(completions))
        .map(|i| (format!("{name}-{i}"), spec.template.clone(), indexed.then_some(i)))
        .collect())
}

/// A replica or parallelism count: default 1, never negative, bounded.
fn count(value: Option<i32>, field: &str) -> Result<i32, ExpandError> {
    match value.unwrap_or(1) {
        n if n < 0 => Err(ExpandError::Negative { field: field.to_owned(), count: n }),
        n if n > MAX_PODS => Err(ExpandError::TooMany { field: field.to_owned(), count: n }),
        n => Ok(n),
    }
}

fn pod_from(template: &PodTemplateSpec, name: String, namespace: Option<String>, owner: OwnerReference) -> Pod {
    let template_meta = template.metadata.clone().unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace,
            labels: template_meta.labels,
            annotations: template_meta.annotations,
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: template.spec.clone(),
        status: None,
    }
}

/// The pod template's hash written as Kubernetes writes it
/// (`SafeEncodeString`: each decimal digit's byte picks from consonants and
/// digits, so no word is spelt): FNV-1a over the template's JSON.
fn template_hash(template: &PodTemplateSpec) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let bytes = serde_json::to_vec(template).unwrap_or_default();
    let mut hash: u32 = 0x811c_9dc5;
    for b in bytes {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    let digits = hash.to_string();
    digits.bytes().map(|d| char::from(ALPHABET[usize::from(d) % ALPHABET.len()])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(kind: &str, yaml: &str) -> Workload {
        let text = format!("metadata: {{name: w, namespace: ml}}\n{yaml}");
        match kind {
            "Deployment" => Workload::Deployment(Box::new(serde_yaml_ng::from_str(&text).unwrap())),
            "ReplicaSet" => Workload::ReplicaSet(Box::new(serde_yaml_ng::from_str(&text).unwrap())),
            "StatefulSet" => Workload::StatefulSet(Box::new(serde_yaml_ng::from_str(&text).unwrap())),
            "Job" => Workload::Job(Box::new(serde_yaml_ng::from_str(&text).unwrap())),
            _ => Workload::CronJob(Box::new(serde_yaml_ng::from_str(&text).unwrap())),
        }
    }

    fn names(w: &Workload) -> Vec<String> {
        w.pods().unwrap().into_iter().map(|p| p.pod.metadata.name.unwrap()).collect()
    }

    const TEMPLATE: &str = "template: {metadata: {labels: {app: x}}, spec: {containers: [{name: c}]}}";

    #[test]
    fn replicas_default_to_one_and_statefulsets_count_from_their_start() {
        assert_eq!(names(&workload("ReplicaSet", &format!("spec: {{{TEMPLATE}}}"))), ["w-0"]);
        assert_eq!(names(&workload("ReplicaSet", &format!("spec: {{replicas: 0, {TEMPLATE}}}"))).len(), 0);
        let set = workload("StatefulSet", &format!("spec: {{replicas: 2, ordinals: {{start: 5}}, {TEMPLATE}}}"));
        assert_eq!(names(&set), ["w-5", "w-6"]);
        let pod = &set.pods().unwrap()[1].pod;
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!((labels["app"].as_str(), labels[STATEFULSET_POD_NAME].as_str()), ("x", "w-6"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("ml"));
        assert_eq!(pod.metadata.owner_references.as_ref().unwrap()[0].kind, "StatefulSet");
    }

    #[test]
    fn deployments_name_their_pods_after_a_stable_template_hash() {
        let d = workload("Deployment", &format!("spec: {{replicas: 3, {TEMPLATE}}}"));
        let pods = d.pods().unwrap();
        let hash = pods[0].pod.metadata.labels.as_ref().unwrap()[POD_TEMPLATE_HASH].clone();
        assert!(hash.bytes().all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)), "{hash}");
        let expected: Vec<String> = (0..3).map(|i| format!("w-{hash}-{i}")).collect();
        assert_eq!(names(&d), expected);
        assert_eq!(pods[0].workload, "Deployment ml/w");
        assert_eq!(pods[0].pod.metadata.owner_references.as_ref().unwrap()[0].name, format!("w-{hash}"));
        let other = workload("Deployment", "spec: {template: {spec: {containers: [{name: d}]}}}");
        assert_ne!(names(&other)[0], expected[0], "another template, another hash");
    }

    #[test]
    fn jobs_run_parallelism_pods_capped_by_completions() {
        let job = |spec: &str| names(&workload("Job", &format!("spec: {{{spec}, {TEMPLATE}}}")));
        assert_eq!(job("parallelism: 3"), ["w-0", "w-1", "w-2"]);
        assert_eq!(job("parallelism: 3, completions: 2"), ["w-0", "w-1"]);
        assert_eq!(job("completions: 5").len(), 1);
        assert!(job("parallelism: 3, suspend: true").is_empty());
        let indexed = workload("Job", &format!("spec: {{parallelism: 2, completionMode: Indexed, {TEMPLATE}}}"));
        let pods = indexed.pods().unwrap();
        assert_eq!(pods[1].pod.metadata.labels.as_ref().unwrap()[JOB_COMPLETION_INDEX], "1");
        let cron = workload(
            "CronJob",
            &format!("spec: {{schedule: '* * * * *', jobTemplate: {{spec: {{parallelism: 2, {TEMPLATE}}}}}}}"),
        );
        assert_eq!(names(&cron), ["w-0-0", "w-0-1"]);
        assert_eq!(cron.pods().unwrap()[0].workload, "CronJob ml/w");
    }

    #[test]
    fn absurd_counts_are_refused_naming_the_field() {
        let err = workload("Deployment", &format!("spec: {{replicas: 1000000, {TEMPLATE}}}")).pods().unwrap_err();
        assert_eq!(
            err.to_string(),
            "spec.replicas: 1000000 pods are more than simulate expands from one workload (10000); fix: lower it"
        );
        let err = workload("Job", &format!("spec: {{parallelism: -1, {TEMPLATE}}}")).pods().unwrap_err();
        assert_eq!(err.to_string(), "spec.parallelism: -1 is negative; fix: set 0 or more");
    }
}
