//! The node agents' `/metrics`, reached as kubectl reaches a pod: through
//! the API server's pod proxy
//! (`/api/v1/namespaces/NS/pods/NAME:PORT/proxy/metrics`), with the
//! user's credentials. That needs no route from the user's machine to the
//! nodes, only RBAC: `list` on pods and `get` on `pods/proxy` in the
//! driver's namespace. The plugin pod of a node is found by the chart's
//! labels; its port is the container port named `metrics` (the API server
//! takes the port literally: a name would not resolve).
//!
//! The scrapes run at once, each under the `--metrics-timeout` deadline,
//! so the command never hangs; a node that does not answer in time, or
//! whose pod is missing or refused, gets a reason instead of numbers.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use crate::cluster::{METRICS_ROLE, PAGE, each_page, server_reason};
use crate::utilization::{Sample, parse};

/// The chart's labels on the kubelet-plugin DaemonSet's pods.
pub const PLUGIN_SELECTOR: &str = "app.kubernetes.io/name=gpu-dra-driver,app.kubernetes.io/component=kubelet-plugin";

/// Why a node has no samples: printed in place of its claims' numbers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// The node agents' pods could not be listed: the listing's error, with
    /// its context.
    #[error("{0}")]
    Listing(String),
    /// The listing did not end within the deadline.
    #[error("listing the node agents' pods: no answer within {}", seconds(*.0))]
    ListingLate(Duration),
    #[error("no node agent pod (label {PLUGIN_SELECTOR}) on the node")]
    NoPod,
    /// The proxy request could not be built (a name no URL takes).
    #[error("{0}")]
    Request(String),
    /// The API server's reason the pod proxy gave no metrics.
    #[error("its node agent {}/{} did not answer: {reason}", .pod.namespace, .pod.name)]
    NoAnswer { pod: PluginPod, reason: String },
    /// The scrape did not end within the deadline.
    #[error("its node agent {}/{}: no answer within {}", .pod.namespace, .pod.name, seconds(*.within))]
    Late { pod: PluginPod, within: Duration },
}

/// A node's plugin pod and its metrics port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginPod {
    pub namespace: String,
    pub name: String,
    pub port: i32,
}

/// The plugin pod of each node, from the pods the selector lists: a
/// running one with an IP first (a DaemonSet rolling over may have two),
/// each with its `metrics` port (else its first port, as the API server
/// picks). A pod with no port at all is left out.
#[cfg(test)]
fn by_node(pods: &[Pod]) -> BTreeMap<String, PluginPod> {
    pick(pods.iter().filter_map(candidate).collect())
}

/// A pod's node, whether it runs, and how to reach it: what is kept of
/// each page of pods.
type Candidate = (String, bool, PluginPod);

fn candidate(pod: &Pod) -> Option<Candidate> {
    let spec = pod.spec.as_ref()?;
    let node = spec.node_name.clone()?;
    let ports: Vec<_> = spec.containers.iter().flat_map(|c| c.ports.iter().flatten()).collect();
    let port = ports.iter().find(|p| p.name.as_deref() == Some("metrics")).or(ports.first())?.container_port;
    let status = pod.status.as_ref();
    let running = status.is_some_and(|s| {
        s.phase.as_deref() == Some("Running") && s.pod_ips.as_ref().is_some_and(|ips| !ips.is_empty())
    });
    let plugin = PluginPod {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone()?,
        port,
    };
    Some((node, running, plugin))
}

fn pick(mut ranked: Vec<Candidate>) -> BTreeMap<String, PluginPod> {
    // Running ones last, so that they win.
    ranked.sort_by(|(node_a, run_a, a), (node_b, run_b, b)| (node_a, run_a, &a.name).cmp(&(node_b, run_b, &b.name)));
    ranked.into_iter().map(|(node, _, plugin)| (node, plugin)).collect()
}

async fn scrape(client: &kube::Client, pod: &PluginPod) -> Result<Vec<Sample>, Unavailable> {
    let path = format!("/api/v1/namespaces/{}/pods/{}:{}/proxy/metrics", pod.namespace, pod.name, pod.port);
    let request = http::Request::get(&path).body(Vec::new()).map_err(|e| Unavailable::Request(e.to_string()))?;
    let text = client
        .request_text(request)
        .await
        .map_err(|e| Unavailable::NoAnswer { pod: pod.clone(), reason: server_reason(&e, METRICS_ROLE) })?;
    Ok(parse(&text))
}

/// The samples of each node in `nodes`, or why there are none. The pods
/// are listed, then every node scraped at once, each step within
/// `deadline`: a node that hangs costs the others nothing.
pub async fn scrape_nodes(
    client: &kube::Client,
    nodes: &BTreeSet<String>,
    deadline: Duration,
) -> BTreeMap<String, Result<Vec<Sample>, Unavailable>> {
    if nodes.is_empty() {
        return BTreeMap::new();
    }
    let api = Api::<Pod>::all(client.clone());
    let mut candidates = Vec::new();
    let params = ListParams::default().labels(PLUGIN_SELECTOR);
    let what = format!("the node agents' pods (label {PLUGIN_SELECTOR})");
    let listing = each_page(&api, params, PAGE, &what, |page| {
        candidates.extend(page.iter().filter_map(candidate));
        Ok(())
    });
    let listed = match tokio::time::timeout(deadline, listing).await {
        Ok(Ok(())) => Ok(pick(candidates)),
        Ok(Err(e)) => Err(Unavailable::Listing(format!("{e:#}"))),
        Err(_) => Err(Unavailable::ListingLate(deadline)),
    };
    let pods = match listed {
        Ok(pods) => pods,
        Err(why) => return nodes.iter().map(|n| (n.clone(), Err(why.clone()))).collect(),
    };
    let scrapes = nodes.iter().map(|node| {
        let pod = pods.get(node);
        async move {
            let result = match pod {
                Some(pod) => match tokio::time::timeout(deadline, scrape(client, pod)).await {
                    Ok(result) => result,
                    Err(_) => Err(Unavailable::Late { pod: pod.clone(), within: deadline }),
                },
                None => Err(Unavailable::NoPod),
            };
            (node.clone(), result)
        }
    });
    futures::future::join_all(scrapes).await.into_iter().collect()
}

/// `5s`, `500ms`.
fn seconds(d: Duration) -> String {
    if d.subsec_millis() == 0 { format!("{}s", d.as_secs()) } else { format!("{}ms", d.as_millis()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, node: &str, phase: &str, ports: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "gpu-dra-driver"},
            "spec": {"nodeName": node, "containers": [{"name": "plugin", "image": "x", "ports": ports}]},
            "status": {"phase": phase, "podIPs": [{"ip": "10.0.0.1"}]}
        }))
        .unwrap()
    }

    #[test]
    fn each_node_gets_its_running_plugin_pod_and_metrics_port() {
        let ports = json!([{"name": "grpc", "containerPort": 9000}, {"name": "metrics", "containerPort": 8080}]);
        let pods = [
            pod("p-new", "node-a", "Pending", ports.clone()),
            pod("p-old", "node-a", "Running", ports.clone()),
            pod("p-b", "node-b", "Running", json!([{"containerPort": 9100}])),
            pod("p-c", "node-c", "Running", json!([])),
        ];
        let got = by_node(&pods);
        assert_eq!(
            got.get("node-a"),
            Some(&PluginPod { namespace: "gpu-dra-driver".into(), name: "p-old".into(), port: 8080 })
        );
        assert_eq!(got.get("node-b").map(|p| p.port), Some(9100), "no metrics port: the first, as the API server");
        assert!(!got.contains_key("node-c"), "no port, nothing to reach");
    }
}
