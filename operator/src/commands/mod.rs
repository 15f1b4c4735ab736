//! The subcommands of `karpenter-hub`; each owns its flags and its output, and nothing else.

pub mod plan;
pub mod register_cluster;
pub mod run;
pub mod sandbox;
