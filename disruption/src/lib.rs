//! The disruption core: which of a scope's nodes to remove or replace, and why (karpenter-semantics
//! §4, §9) — budgets at runtime, candidates, the cost model, emptiness, drift, the scheduling
//! simulation and single- and multi-node consolidation with their validation.
//!
//! Owns the decisions only. Must not do I/O, read a clock (`now` is an argument), log, or know
//! about a Kubernetes client: callers build plain [`Scope`] facts and a [`ScopeModel`] from their
//! cache, call one method per pass in the loop's order ([`emptiness`], [`drift`], [`multi_node`],
//! [`single_node`]) and apply the [`Outcome`] (taints, conditions, replacement claims, deletions,
//! events), validating consolidation commands after the delay ([`validate_emptiness`],
//! [`validate_consolidation`]). The queue, the "consolidated" cache and the method timeouts are the
//! caller's. Simulations reuse the `scheduling` crate unchanged.

pub mod budgets;
pub mod candidates;
pub mod consolidation;
pub mod facts;
pub mod methods;
#[cfg(test)]
mod proptests;
pub mod simulation;
#[cfg(test)]
mod testkit;

pub use budgets::{BudgetError, Budgets, Disrupting, allowed};
pub use candidates::{Candidate, Candidates, Excluded, Method, allowances, candidates};
pub use consolidation::{
    Invalidated, MULTI_NODE_TIME_LIMIT, SINGLE_NODE_TIME_LIMIT, Settings, multi_node, single_node,
    validate_consolidation,
};
pub use facts::{Drift, NodeFacts, Owner, PdbFacts, PodFacts, PoolFacts, Scope};
pub use methods::{Command, Outcome, Simulation, Simulator, drift, emptiness, validate_emptiness};
pub use simulation::ScopeModel;
