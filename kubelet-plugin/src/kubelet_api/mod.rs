//! The kubelet's side of the node agent: the DRA gRPC services, plugin
//! registration, the sockets both live on, and the health stream.

pub mod grpc;
pub mod health_service;
pub mod registration;
pub mod sockets;
