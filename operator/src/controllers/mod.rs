//! The hub's controllers. Each gathers facts (watch caches, live reads where absence matters),
//! calls a pure decision from [`crate::decisions`] and carries out its writes idempotently. None of
//! them acts on a workload cluster that is not connected and synced.

pub mod capacity_buffer;
pub mod cluster_report;
pub mod cluster_status;
pub mod disruption;
pub mod flavorcatalog;
pub mod gc;
pub mod node_overlay;
pub mod nodeclaim;
pub mod nodeclass;
pub mod nodepool;
pub mod organization;
pub mod provisioning;
pub mod static_capacity;
