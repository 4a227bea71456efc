//! The node agent of the GPU DRA driver, as a library so that the binary is
//! only wiring and the integration suite can reach the same code.

pub mod checkpoint;
pub mod claims;
pub mod cli;
pub mod device_nodes;
pub mod driver_files;
pub mod durable;
pub mod grpc;
pub mod health_service;
pub use gpu_dra_driver::service::http;
pub mod inspect;
pub mod instance_lock;
pub mod inventory_watch;
pub use gpu_dra_driver::service::kube_client;
pub mod metrics;
pub mod mps_launch;
pub mod prepare;
pub mod publisher;
pub mod registration;
pub mod run;
pub mod sockets;
