//! The hub's library: everything `karpenter-hub` runs, laid out by role so the tree shows the
//! architecture, and so that integration tests and benchmarks drive the same code as the binary.
//!
//! - [`commands`]: the binary's subcommands (`run`, `sandbox`, `plan`, `register`).
//! - [`controllers`]: loops that gather facts from the clusters, call a decision and carry out its
//!   writes idempotently.
//! - [`decisions`]: pure functions over plain data (no I/O, time passed in).
//! - [`infra`]: what the controllers run on: the shared hub context, the registry of workload
//!   clusters, leader election, metrics, kubeconfig hardening.
//!
//! Dependencies point one way: commands → controllers → infra → decisions. The time every decision
//! is made at comes from `infra::hub::Settings::clock` (the `clock` crate). Only `sandbox` (and the
//! binary's `sim-cke`) use the emulators of `sim`, behind the default feature `sandbox`.

pub mod commands;
pub mod controllers;
pub mod decisions;
pub mod infra;
