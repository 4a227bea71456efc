//! The two `DRAPlugin` services the kubelet may pick, over one [`DraCore`]:
//! `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` (1.34+ kubelets use it when it
//! is advertised first) and `...v1beta1.DRAPlugin` (older kubelets, or ones
//! that pick it). Their messages differ only in v1's `Device.share_id`, which
//! the per-version `From` impls in [`super::convert`] handle, so one macro
//! writes both servers.

use tonic::{Request, Response, Status};

use super::service::{DraCore, DraService};
use crate::deadline::Deadline;
use crate::observe::metrics::ApiVersion;

/// The call's deadline from its `grpc-timeout` header.
fn deadline_of<T>(request: &Request<T>) -> Deadline {
    let header = request.metadata().get("grpc-timeout").and_then(|v| v.to_str().ok());
    Deadline::from_header(header, tokio::time::Instant::now())
}

macro_rules! dra_plugin_server {
    ($(#[$doc:meta])* $server:ident, $proto:ident, $api:expr) => {
        $(#[$doc])*
        pub struct $server<S>(pub DraCore<S>);

        #[tonic::async_trait]
        impl<S: DraService> kubelet_proto::$proto::dra_plugin_server::DraPlugin for $server<S> {
            async fn node_prepare_resources(
                &self,
                request: Request<kubelet_proto::$proto::NodePrepareResourcesRequest>,
            ) -> Result<Response<kubelet_proto::$proto::NodePrepareResourcesResponse>, Status> {
                use kubelet_proto::$proto::{Device, NodePrepareResourceResponse, NodePrepareResourcesResponse};
                let deadline = deadline_of(&request);
                let claims = request.into_inner().claims.into_iter().map(Into::into).collect();
                let results = self.0.prepare($api, claims, deadline).await;
                let claims = results
                    .into_iter()
                    .map(|(uid, result)| {
                        let response = match result {
                            Ok(devices) => NodePrepareResourceResponse {
                                devices: devices.into_iter().map(Device::from).collect(),
                                error: String::new(),
                            },
                            Err(error) => NodePrepareResourceResponse { devices: Vec::new(), error: error.to_string() },
                        };
                        (uid, response)
                    })
                    .collect();
                Ok(Response::new(NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<kubelet_proto::$proto::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<kubelet_proto::$proto::NodeUnprepareResourcesResponse>, Status> {
                use kubelet_proto::$proto::{NodeUnprepareResourceResponse, NodeUnprepareResourcesResponse};
                let deadline = deadline_of(&request);
                let claims = request.into_inner().claims.into_iter().map(Into::into).collect();
                let results = self.0.unprepare($api, claims, deadline).await;
                let claims = results
                    .into_iter()
                    .map(|(uid, result)| (uid, NodeUnprepareResourceResponse { error: result.err().map(|e| e.to_string()).unwrap_or_default() }))
                    .collect();
                Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
            }
        }
    };
}

dra_plugin_server!(
    /// The v1 server over the shared core.
    DraPluginV1,
    dra_v1,
    ApiVersion::V1
);

dra_plugin_server!(
    /// The v1beta1 server over the shared core.
    DraPluginV1beta1,
    dra_v1beta1,
    ApiVersion::V1beta1
);
