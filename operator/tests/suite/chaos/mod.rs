//! The chaos tests (issue 17, docs/reliability.md) that can share the machine: the hub process
//! killed with SIGKILL through every phase of a node's life (`kills`; in sharded mode, two replicas
//! killed in turn, their writes audited against the bucket Leases: `audit`), and the hub under API
//! faults on all its traffic (`faults`). Their bounds are made for a loaded 2-core machine. The partition
//! tests compare latencies and have a binary of their own (`chaos_partitions.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod audit;
mod faults;
mod kills;
