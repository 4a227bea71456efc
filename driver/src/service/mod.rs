//! What the node agent's and the controller's services share: how they
//! reach the API server ([`kube_client`]), their HTTP port for probes and
//! metrics ([`http`]), and serving HTTP with bounded connections
//! ([`connections`], also the controller's webhook).

pub mod connections;
pub mod http;
pub mod kube_client;
