//! The disruption core: which of a scope's nodes to remove or replace, and why — budgets at
//! runtime, candidates, emptiness and drift (karpenter-semantics §4, §9).
//!
//! Owns the decisions only. Must not do I/O, read a clock (`now` is an argument), log, or know
//! about a Kubernetes client: callers build plain facts from their cache, call these functions and
//! apply the result (taints, conditions, claims, events). Simulations reuse the `scheduling` crate
//! unchanged.

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
pub use consolidation::{Settings, multi_node, single_node, validate_consolidation};
pub use facts::{Drift, NodeFacts, Owner, PdbFacts, PodFacts, PoolFacts, Scope};
pub use methods::{Command, Outcome, Simulation, Simulator, drift, emptiness, validate_emptiness};
pub use simulation::ScopeModel;
