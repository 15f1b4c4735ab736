//! The scheduling core: given pending pods, existing nodes, in-flight claims, NodePools and their
//! instance types, decide which NodeClaims to create so that every pod fits at the lowest price,
//! with kube-scheduler's constraints. Pure: no I/O, no clock (time is passed in), no logging.

pub mod affinity;
pub mod bitset;
pub mod compact;
pub mod convert;
pub mod daemonsets;
pub mod hostports;
pub mod instance_types;
pub mod intern;
pub mod model;
pub mod requirements;
pub mod resources;
pub mod solve;
pub mod taints;
pub mod topology;

pub use compact::CompactPod;
pub use model::{Decision, Input};
pub use solve::solve;
// Re-packing lives with the solver's side of it (`solve/repack/`); its packings keep this path.
pub use solve::repack;
pub mod testkit;

#[cfg(test)]
mod affinity_tests;
#[cfg(test)]
mod checklist;
#[cfg(test)]
mod proptests;
