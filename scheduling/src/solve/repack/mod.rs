//! Cost-aware re-packing of the loop's claims (a hub addition, `Settings::repack`): all of it, the
//! solver's side and the packing arithmetic.
//!
//! Karpenter's loop fills each new claim until its largest option is full and then launches the
//! cheapest option that still fits; with Clever's flavors (a 2XS costs less per vCPU than an XL) that
//! leaves up to 60 % on the table for CPU-heavy workloads, which upstream recovers later through
//! consolidation (churn). The solver therefore re-packs the loop's claims, claim group by claim
//! group (same pool, same requirements): nodes are opened one at a time with the instance type that
//! packs the most value per euro, where a pod's value is its requests priced at the shadow prices of
//! the LP relaxation (the cheapest fractional mix of types covering the group's demand). The result
//! is kept only when cheaper. Hostname topology and host ports travel as per-node [`Rules`]; the
//! solver keeps the other topology exact by re-packing only within equal requirements, and
//! catalogues above [`MAX_TYPES`] are cut down to that many [`candidates`].
//!
//! Under a pool's limits ([`pack_within`]), its own or shared ones, the goal changes: the most pods
//! first, the lowest price second, with the nodes' sizes (capacities, and draws on shared limits)
//! summing to no more than what the limits leave. Karpenter's loop charges each claim its largest
//! option and fills it before opening the next, so a limit that two small nodes would respect can be
//! spent on one large node holding fewer pods.
//!
//! The solver's side (each an `impl Solver` block): `cost` (the entry, `Solver::repack`: which
//! groups, and whether their packing replaces them), `limits` (the pools with limits first, pending
//! pods included), `units` (which claims and pods may move, the units that move together and their
//! per-node rules). The arithmetic, which knows items, bins and budgets only: `lp` (shadow prices,
//! [`candidates`]), `pack` ([`pack`](fn@pack), [`pack_balanced`], [`pack_ffd`]), `ruled` ([`Rules`],
//! [`pack_ruled`]), `within` ([`Budget`], [`pack_within`], [`pack_within_ruled`]).
//!
//! Owns re-packing. Must not change a pod's placement except through a packing that keeps every
//! constraint in force exact; the arithmetic files must not know about pools, pods or topology (the
//! solver decides which claims are eligible and turns the limits into a [`Budget`]).

use crds::quantity::Resources;

mod cost;
mod limits;
mod lp;
mod pack;
mod ruled;
mod units;
mod within;

pub use lp::{candidates, shadow_prices};
pub use pack::{pack, pack_balanced, pack_ffd};
pub use ruled::{Packing, Rules, TagSet, pack_ruled};
pub use within::{Budget, pack_within, pack_within_ruled};

/// A node type to pack into.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bin {
    /// Room for pods: allocatable minus DaemonSet overhead.
    pub room: Resources,
    /// EUR/h.
    pub price: f64,
}

/// Most bins a packing considers: the fills are linear in the bins, the merges of [`pack_within`]
/// too, and the LP's vertex enumeration is quartic. Larger catalogues are cut down by [`candidates`].
pub const MAX_TYPES: usize = 64;

/// Items and bins of the arithmetic's unit tests.
#[cfg(test)]
mod testing {
    use super::*;

    pub fn r(cpu: i64, mem_gi: i64) -> Resources {
        Resources { cpu_millis: cpu, memory_bytes: mem_gi << 30, ephemeral_storage_bytes: 0, pods: 1 }
    }

    pub fn bin(cpu: i64, mem_gi: i64, price: f64) -> Bin {
        Bin { room: Resources { pods: 110, ..r(cpu, mem_gi) }, price }
    }
}
