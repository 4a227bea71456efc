//! The controller's library face: what other tools of the driver reuse
//! (`kubectl gpu` runs `simulate` on objects read from a live cluster, so
//! its explanations are simulate's, word for word).

pub mod manifests;
pub mod simulate;
