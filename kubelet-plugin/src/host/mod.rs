//! The node's driver installation as claims see it: the files every CDI
//! spec injects and the device nodes a fresh node may still lack.

pub mod device_nodes;
pub mod driver_files;
