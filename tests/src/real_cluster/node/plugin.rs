//! Our plugin as a host process on a [`RealNode`], as its DaemonSet pod
//! would run it: on the kubelet's plugin and registry directories, writing
//! CDI specs where containerd reads them, with a token bound to a pod on
//! the node.

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use serde_json::json;

use super::{RealNode, TEST_IMAGE};
use crate::helm;
use crate::plugin_process::PluginDirs;
use crate::real_cluster::Cluster;
use crate::real_cluster::driver::PLUGIN_ACCOUNT;

impl RealNode {
    /// The plugin's pod as its DaemonSet would put it on this node (here a
    /// busybox that sleeps, run by the real kubelet), and the token the
    /// kubelet would project into it: bound to that pod, so it carries the
    /// node's name.
    pub async fn plugin_token(&self, cluster: &Cluster) -> String {
        let pods: Api<Pod> = Api::namespaced(cluster.admin(), helm::NAMESPACE);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("kubelet-plugin-stand-in-{}", self.name())},
            "spec": {
                "nodeName": self.name(), "hostNetwork": true, "serviceAccountName": PLUGIN_ACCOUNT,
                "automountServiceAccountToken": false, "terminationGracePeriodSeconds": 0,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "sleep", "image": TEST_IMAGE, "imagePullPolicy": "Never",
                                "command": ["sleep", "3600"]}],
            },
        }))
        .expect("the stand-in pod");
        let pod = pods.create(&PostParams::default(), &pod).await.unwrap_or_else(|e| panic!("the stand-in pod: {e}"));
        let request: TokenRequest = serde_json::from_value(json!({"spec": {
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid},
            "expirationSeconds": 3600,
        }}))
        .expect("TokenRequest");
        let accounts: Api<ServiceAccount> = Api::namespaced(cluster.admin(), helm::NAMESPACE);
        let answer = accounts
            .create_token_request(PLUGIN_ACCOUNT, &PostParams::default(), &request)
            .await
            .unwrap_or_else(|e| panic!("TokenRequest for the plugin: {e}"));
        answer.status.and_then(|s| s.token).expect("TokenRequest answered without a token")
    }

    /// The plugin's directories on this node: the kubelet's sockets, the
    /// CDI directory containerd reads; the inventory (`inventory_yaml`) and
    /// a kubeconfig with `token` in a fresh directory of their own.
    pub fn plugin_dirs(&self, cluster: &Cluster, inventory_yaml: &str, token: &str) -> PluginDirs {
        let root = tempfile::tempdir().expect("the plugin's directory");
        let dirs = PluginDirs {
            plugins: self.plugins_dir(),
            registry: self.registry_dir(),
            cdi: self.cdi_dir(),
            inventory: root.path().join("inventory.yaml"),
            kubeconfig: root.path().join("kubeconfig"),
            root,
        };
        std::fs::write(&dirs.inventory, inventory_yaml).expect("the inventory file");
        cluster.write_kubeconfig(&dirs.kubeconfig, token);
        dirs
    }
}
