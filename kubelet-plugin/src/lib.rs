//! The node agent of the GPU DRA driver, as a library so that the binary is
//! only wiring and the integration suite can reach the same code.

pub mod claims;
pub mod cli;
pub mod inspect;
pub mod inventory_watch;
pub mod kube_client;
pub mod publisher;
