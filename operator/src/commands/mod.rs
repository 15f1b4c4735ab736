//! The subcommands of `karpenter-hub`; each owns its flags and its output, and nothing else.

pub mod fleet;
pub mod plan;
pub mod register_cluster;
pub mod run;
// The only command (with `sim-cke` in main.rs) that needs the emulators: feature `sandbox`.
#[cfg(feature = "sandbox")]
pub mod sandbox;
