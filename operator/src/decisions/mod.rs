//! Pure decisions: plain data in, a decision out. No I/O, no clock (time is an argument), no
//! logging, so every transition is a table test. They depend on nothing else in this crate.

pub mod batcher;
pub mod capacity;
pub mod capacity_buffer;
pub mod cluster_report;
pub mod conditions;
pub mod disruption_conditions;
pub mod disruption_queue;
pub mod disruption_scope;
pub mod fingerprint;
pub mod fleet;
pub mod garbage;
pub mod handover;
pub mod hub_id;
pub mod input_corrections;
pub mod kept_verdict;
pub mod launch;
pub mod lifecycle;
pub mod new_claims;
pub mod node_registration;
pub mod nomination;
pub mod organization;
pub mod ownership;
pub mod pause;
pub mod pool_status;
pub mod rollout;
pub mod shard_buckets;
pub mod sharding;
pub mod static_capacity;
pub mod taking_part;
pub mod termination;
