//! The kubelet's gRPC APIs for DRA plugins, generated at build time from the
//! protos in `proto/` (written from the upstream field tables):
//!
//! | module | proto package | service | advertised as |
//! |---|---|---|---|
//! | [`dra_v1`] | `k8s.io.kubelet.pkg.apis.dra.v1` | `DRAPlugin` | `v1.DRAPlugin` |
//! | [`dra_v1beta1`] | `k8s.io.kubelet.pkg.apis.dra.v1beta1` | `DRAPlugin` | `v1beta1.DRAPlugin` |
//! | [`registration`] | `pluginregistration` | `Registration` | (the registration socket) |
//! | [`health_v1alpha1`] | `v1alpha1` | `DRAResourceHealth` | `v1alpha1.DRAResourceHealth` |
//! | [`health_v1`] | `v1` | `DRAResourceHealth` | `v1.DRAResourceHealth` |
//!
//! Each module holds the messages plus a tonic server and client.

#![allow(clippy::all, clippy::pedantic, missing_docs)]

/// DRA v1 (kubelet 1.34+; `share_id` from 1.35).
pub mod dra_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// DRA v1beta1 (kubelet 1.32+): v1 without `Device.share_id`.
pub mod dra_v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// Kubelet plugin registration.
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// DRA device health (kubelet 1.34+, feature gate ResourceHealthStatus).
pub mod health_v1alpha1 {
    tonic::include_proto!("v1alpha1");
}

/// DRA device health v1 (kubelet 1.37+): v1alpha1's service under the
/// package `v1`, with v1alpha1's messages.
pub mod health_v1 {
    tonic::include_proto!("v1");
}

/// `type` a DRA plugin reports in `PluginInfo` (pluginregistration
/// `constants.go`: `DRAPlugin = "DRAPlugin"`).
pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";

/// The strings a plugin advertises in `PluginInfo.supported_versions`:
/// `"<last package component>.<service>"` for DRAPlugin, the full service
/// name for health (its package is literally `v1alpha1`).
pub mod versions {
    pub const DRA_V1: &str = "v1.DRAPlugin";
    pub const DRA_V1BETA1: &str = "v1beta1.DRAPlugin";
    pub const HEALTH_V1ALPHA1: &str = "v1alpha1.DRAResourceHealth";
    pub const HEALTH_V1: &str = "v1.DRAResourceHealth";
}

#[cfg(test)]
mod tests {
    use tonic::server::NamedService;

    use super::*;

    /// The paths the kubelet dials (dra-facts §1.1, §2.1, §2.3). tonic routes
    /// `/<NAME>/<Method>`, and the clients hard-code the same paths.
    #[test]
    fn service_names_give_the_kubelets_rpc_paths() {
        type V1 = dra_v1::dra_plugin_server::DraPluginServer<()>;
        type V1beta1 = dra_v1beta1::dra_plugin_server::DraPluginServer<()>;
        type Reg = registration::registration_server::RegistrationServer<()>;
        type Health = health_v1alpha1::dra_resource_health_server::DraResourceHealthServer<()>;
        type HealthV1 = health_v1::dra_resource_health_server::DraResourceHealthServer<()>;
        assert_eq!(<V1 as NamedService>::NAME, "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin");
        assert_eq!(<V1beta1 as NamedService>::NAME, "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin");
        assert_eq!(<Reg as NamedService>::NAME, "pluginregistration.Registration");
        assert_eq!(<Health as NamedService>::NAME, "v1alpha1.DRAResourceHealth");
        // The advertised strings are the last package component plus service.
        assert!(<V1 as NamedService>::NAME.ends_with(&format!(".{}", versions::DRA_V1)));
        assert!(<V1beta1 as NamedService>::NAME.ends_with(&format!(".{}", versions::DRA_V1BETA1)));
        assert_eq!(<Health as NamedService>::NAME, versions::HEALTH_V1ALPHA1);
        assert_eq!(<HealthV1 as NamedService>::NAME, versions::HEALTH_V1);
    }

    /// The method paths, read from the generated client code.
    #[test]
    fn generated_clients_call_the_kubelets_method_paths() {
        let generated = [
            include_str!(concat!(env!("OUT_DIR"), "/k8s.io.kubelet.pkg.apis.dra.v1.rs")),
            include_str!(concat!(env!("OUT_DIR"), "/k8s.io.kubelet.pkg.apis.dra.v1beta1.rs")),
            include_str!(concat!(env!("OUT_DIR"), "/pluginregistration.rs")),
            include_str!(concat!(env!("OUT_DIR"), "/v1alpha1.rs")),
            include_str!(concat!(env!("OUT_DIR"), "/v1.rs")),
        ]
        .concat();
        for path in [
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
            "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
            "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
            "/pluginregistration.Registration/GetInfo",
            "/pluginregistration.Registration/NotifyRegistrationStatus",
            "/v1alpha1.DRAResourceHealth/NodeWatchResources",
            "/v1.DRAResourceHealth/NodeWatchResources",
        ] {
            assert!(generated.contains(&format!("\"{path}\"")), "no generated method for {path}");
        }
    }

    /// Field numbers are the wire contract: encode with v1 and decode with
    /// v1beta1, which must ignore `share_id` (field 5).
    #[test]
    fn v1beta1_reads_v1_devices_without_share_id() {
        use prost::Message;
        let v1 = dra_v1::Device {
            request_names: vec!["gpu".into()],
            pool_name: "node-a".into(),
            device_name: "gpu-0".into(),
            cdi_device_ids: vec!["k8s.gpu.nvidia.com/claim=x-gpu-0".into()],
            share_id: Some("s".into()),
        };
        let beta = dra_v1beta1::Device::decode(v1.encode_to_vec().as_slice()).unwrap();
        assert_eq!(beta.request_names, v1.request_names);
        assert_eq!(beta.pool_name, v1.pool_name);
        assert_eq!(beta.device_name, v1.device_name);
        assert_eq!(beta.cdi_device_ids, v1.cdi_device_ids);
    }
}
