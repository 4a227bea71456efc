//! What the node agent's and the controller's services share: how they
//! reach the API server ([`kube_client`]), how they call it when it may
//! misbehave ([`api_call`]), their HTTP port for probes and metrics
//! ([`http`]), and serving HTTP with bounded connections ([`connections`],
//! also the controller's webhook), and watching a kind whose objects may
//! not all decode ([`decoded_watch`]).

pub mod api_call;
pub mod connections;
pub mod decoded_watch;
pub mod http;
pub mod kube_client;
