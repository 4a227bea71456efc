//! What the node agent's and the controller's services share: how they
//! reach the API server ([`kube_client`]) and their HTTP port for probes and
//! metrics ([`http`]).

pub mod http;
pub mod kube_client;
