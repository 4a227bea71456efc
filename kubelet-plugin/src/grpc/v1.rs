//! `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`, the version 1.34+ kubelets
//! use when it is advertised first.

use kubelet_proto::dra_v1::dra_plugin_server::DraPlugin;
use kubelet_proto::dra_v1::{
    Device, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
    NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
};
use tonic::{Request, Response, Status};

use super::{DraCore, DraService};
use crate::metrics::ApiVersion;

/// The v1 server over the shared core.
pub struct DraPluginV1<S>(pub DraCore<S>);

#[tonic::async_trait]
impl<S: DraService> DraPlugin for DraPluginV1<S> {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims.into_iter().map(Into::into).collect();
        let results = self.0.prepare(ApiVersion::V1, claims).await;
        let claims = results
            .into_iter()
            .map(|(uid, result)| {
                let response = match result {
                    Ok(devices) => NodePrepareResourceResponse {
                        devices: devices.into_iter().map(Device::from).collect(),
                        error: String::new(),
                    },
                    Err(error) => NodePrepareResourceResponse { devices: Vec::new(), error },
                };
                (uid, response)
            })
            .collect();
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims.into_iter().map(Into::into).collect();
        let results = self.0.unprepare(ApiVersion::V1, claims).await;
        let claims = results
            .into_iter()
            .map(|(uid, result)| (uid, NodeUnprepareResourceResponse { error: result.err().unwrap_or_default() }))
            .collect();
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}
