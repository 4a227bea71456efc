//! Dynamic MIG on the node: which MIG-mode GPUs the plugin manages
//! ([`selection`], used by publishing and prepare alike). Instances are
//! made and removed by prepare; their bookkeeping lives beside this.

pub mod selection;
