//! (in progress) The fleet's devices indexed per node.
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;

#[derive(Debug, Default)]
pub(crate) struct Fleet {
    nodes: Vec<String>,
    devices: usize,
}

impl Fleet {
    pub(crate) fn build(_slices: &[ResourceSlice], _nodes: &[Node]) -> Self {
        Self::default()
    }
    pub(crate) fn node_names(&self) -> &[String] {
        &self.nodes
    }
    pub(crate) fn device_count(&self) -> usize {
        self.devices
    }
}
