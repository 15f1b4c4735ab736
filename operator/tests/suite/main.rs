//! The operator's integration tests that share a process: one binary, so that `cargo test` runs
//! them side by side (four at a time, `.cargo/config.toml`) instead of one binary after another,
//! and links the operator once instead of once per file. They mostly wait on emulated clusters and
//! real API servers, so a wait in one overlaps another's work (docs/testing.md, "CI").
//!
//! What stays out, in a binary of its own: a test that installs a process-wide tracing subscriber
//! or panic hook to read what the hub logs (`config`, `kubeconfig_bombs`, `reflection`,
//! `secrets_not_logged`), which other tests' lines would pollute, and the partition tests
//! (`chaos_partitions`), which compare latencies and need the machine to themselves.
//!
//! Run one file's tests by its module: `cargo test -p operator --test suite provisioning::`.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/invariants.rs"]
mod invariants;

mod buffers;
mod chaos;
mod charts;
mod disruption;
mod e2e;
mod examples;
mod faults;
mod fleet;
mod hub;
mod kubectl;
mod leader;
mod lifecycle;
mod metrics_docs;
mod metrics_series;
mod organization;
mod overlays;
mod plan;
mod provisioning;
mod register;
mod registry;
mod requests;
mod run_binary;
mod sandbox;
mod scenarios;
mod sharding;
mod static_pools;
mod termination;
mod volumes;
