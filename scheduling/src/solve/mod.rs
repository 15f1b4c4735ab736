//! The solve loop (karpenter-semantics §3.3–§3.7, §3.13–§3.15): pods in queue order, each placed on
//! an existing node, else on a claim opened earlier this round, else on a new claim of the
//! highest-priority pool that accepts it, relaxing its preferences one step per failed attempt; then
//! the claims are re-packed for cost (a hub addition) and finished (cheapest options first,
//! truncation, DaemonSet overhead).
//!
//! One job per file, each an `impl Solver` block over the state declared here: `build` (the state
//! from the input), `place` (the loop), `repack` (the claims re-packed for cost and within the pools'
//! limits, with the packing arithmetic), `finish` (the claims as the decision).
//!
//! Limits, a pool's own and those it shares with others ([`crate::model::SharedLimit`]: an
//! organisation's quota, a price ceiling), are one vector per pool (its own dimensions, then three per
//! shared limit): a new claim may only use the types within all of it, and takes from it, per
//! dimension, the largest of those types; a claim of one pool so shrinks what the others may use.
//!
//! Owns placement decisions and the solver's state. Pure: the same input always gives the same
//! decision. Must not read Kubernetes objects (that is [`crate::convert`]) nor hold set, topology or
//! DaemonSet semantics of its own (those are [`crate::requirements`], [`crate::topology`],
//! [`crate::daemonsets`]).

use std::collections::{BTreeMap, HashMap};

use crds::labels;
use crds::quantity::Resources;

use crate::bitset::Bits;
use crate::daemonsets::DsGroup;
use crate::instance_types::TypeTable;
use crate::intern::{Interner, Key, Val};
use crate::model::{Decision, HostPort, Input, Toleration};
use crate::requirements::Requirements;
use crate::topology::{Domains, PodConstraint, Topology};

mod build;
#[cfg(test)]
mod extended_tests;
mod finish;
mod place;
pub mod repack;
#[cfg(test)]
mod shared_tests;

/// Decides a round. See the module documentation.
pub fn solve(input: &Input) -> Decision {
    let mut s = Solver::new(input);
    s.run();
    if input.settings.repack {
        s.repack();
    }
    s.finish()
}

/// Remaining limits of a pool; `None` is unlimited.
#[derive(Debug, Clone)]
struct Remaining {
    /// cpu, memory, ephemeral storage, pods (compared with capacity), then one per extended
    /// resource the pool limits (named in `extended`, in that order): first in the pool's limit
    /// vector; each shared limit the pool draws on adds [`SHARED_DIMS`] after them.
    res: Vec<Option<i64>>,
    extended: Vec<String>,
    nodes: Option<i64>,
}

impl Remaining {
    fn is_limited(&self) -> bool {
        self.res.iter().any(Option::is_some)
    }
}

impl PoolCtx {
    /// Dimensions of the pool's own limits in its limit vector (the four node resources and its
    /// extended resources); the shared limits' come after.
    fn own_dims(&self) -> usize {
        self.remaining.res.len()
    }
}

/// Dimensions of a shared limit: cpu, memory, price.
const SHARED_DIMS: usize = 3;

/// A shared limit as the round spends it.
struct SharedCtx {
    name: String,
    /// What is left: cpu, memory, price (micro-EUR/h); `None` is unlimited.
    left: [Option<i64>; SHARED_DIMS],
}

/// A shared limit one pool draws on.
struct PoolShare {
    /// Index in [`Solver::shared`] (and [`Input::shared`]).
    limit: usize,
    /// What one node of each type of the pool's table draws (table order).
    draws: Vec<[i64; SHARED_DIMS]>,
}

struct PoolCtx {
    input: usize,
    name: String,
    template: Requirements,
    taints: Vec<crate::model::Taint>,
    table: TypeTable,
    groups: Vec<DsGroup>,
    remaining: Remaining,
    /// Shared limits the pool draws on.
    shared: Vec<PoolShare>,
    /// Types within the remaining limits, its own and the shared ones (recomputed when a claim opens).
    within_limits: Bits,
    /// Why the pool can take no pod at all.
    unusable: Option<String>,
    has_prefer_no_schedule: bool,
}

/// Data shared by pods with equal namespace, labels and constraints.
struct Class {
    namespace: String,
    labels: BTreeMap<String, String>,
    /// nodeSelector ∧ each required term (OR'ed alternatives).
    strict: Vec<Requirements>,
    /// Preferred node-affinity terms, highest weight first.
    preferred: Vec<Requirements>,
    tolerations: Vec<Toleration>,
    host_ports: Vec<HostPort>,
    /// Volume requirement alternatives (node side only); empty: none.
    volume_alts: Vec<Requirements>,
    /// Own constraints by kind, soft ones ranked by weight.
    spreads: Vec<PodConstraint>,
    affinities: Vec<PodConstraint>,
    antis: Vec<PodConstraint>,
    /// Inverse groups this class owns (its required anti-affinity).
    owned_inverse: Vec<usize>,
    /// Groups counting pods of this class (forward groups) and inverse groups constraining it.
    selected: Vec<usize>,
    inverse_selected: Vec<usize>,
    has_topology: bool,
    n_soft_affinity: usize,
    n_soft_anti: usize,
    n_soft_spread: usize,
}

/// A relaxation state (§3.5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
struct Relax {
    term: usize,
    preferred: usize,
    affinity_dropped: usize,
    anti_dropped: usize,
    spread_dropped: usize,
    tolerate_pns: bool,
}

struct NodeState {
    input: usize,
    labels: Vec<(Key, Val)>,
    hostname: Val,
    taints: Vec<crate::model::Taint>,
    remaining: Resources,
    /// Extended resources left (allocatable − its pods').
    extended: BTreeMap<String, i64>,
    ports: Vec<HostPort>,
    pods: Vec<usize>,
    /// CSI claims attached per driver (existing + planned), a claim counting once.
    volumes: BTreeMap<String, std::collections::BTreeSet<String>>,
}

struct Claim {
    pool: usize,
    reqs: Requirements,
    types: Bits,
    used: Resources,
    /// Σ its pods' extended resources (its types all offer them).
    extended: BTreeMap<String, i64>,
    ports: Vec<HostPort>,
    hostname: Val,
    pods: Vec<usize>,
    /// Per-resource max over types of allocatable − overhead − used: quick rejection.
    headroom: Resources,
    min_values_relaxed: bool,
    /// What the claim took from its pool's limit vector ([`Solver::left`]): per dimension, the
    /// largest of its options when opened (capacity for the pool's own limits, draw for shared ones).
    charged: Vec<i64>,
}

/// What a target accepts a pod with.
struct Accepted {
    reqs: Requirements,
    types: Bits,
    relaxed_min_values: bool,
}

struct Solver<'a> {
    input: &'a Input,
    ints: Interner,
    n_well_known: Key,
    hostname_key: Key,
    zone_key: Key,
    capacity_type_key: Key,
    pools: Vec<PoolCtx>,
    /// Shared limits, in input order.
    shared: Vec<SharedCtx>,
    nodes: Vec<NodeState>,
    claims: Vec<Claim>,
    /// Claim indices, fewest pods first (ties: opening order).
    claim_order: Vec<usize>,
    classes: Vec<Class>,
    pod_class: Vec<usize>,
    topo: Topology,
    domains: HashMap<Key, Domains>,
    mask_cache: HashMap<(usize, Relax, usize), Bits>,
    errors: Vec<Option<String>>,
    placed: Vec<bool>,
    /// The relaxation each placed pod was placed under: its constraints still in force.
    relax_of: Vec<Relax>,
    any_prefer_no_schedule: bool,
}

fn well_known_keys() -> impl Iterator<Item = &'static str> {
    labels::WELL_KNOWN.iter().copied()
}

/// A pool's limit vector: its own remaining limits, then what is left of each shared limit it draws
/// on; `None` is unlimited.
fn left_of(pool: &PoolCtx, shared: &[SharedCtx]) -> Vec<Option<i64>> {
    let mut v = pool.remaining.res.to_vec();
    for s in &pool.shared {
        v.extend(shared[s.limit].left);
    }
    v
}

/// What one node of type `i` counts in the pool's limit vector: its capacity, then its draws.
fn sizes_of(pool: &PoolCtx, i: usize) -> Vec<i64> {
    let t = &pool.table.types[i];
    let c = &t.capacity;
    let mut v = vec![c.cpu_millis, c.memory_bytes, c.ephemeral_storage_bytes, c.pods];
    v.extend(pool.remaining.extended.iter().map(|k| t.extended.get(k).copied().unwrap_or(0)));
    for s in &pool.shared {
        v.extend(s.draws[i]);
    }
    v
}

/// What a claim of these types takes from the limit vector: per dimension the largest, since the
/// launch may pick any of them (0 for no type).
fn charge_of(pool: &PoolCtx, types: &Bits) -> Vec<i64> {
    let mut v = vec![0; pool.own_dims() + SHARED_DIMS * pool.shared.len()];
    for i in types.iter() {
        for (a, s) in v.iter_mut().zip(sizes_of(pool, i)) {
            *a = (*a).max(s);
        }
    }
    v
}

/// Whether every limited dimension of `left` holds `size`.
fn within(left: &[Option<i64>], size: &[i64]) -> bool {
    left.iter().zip(size).all(|(l, s)| l.is_none_or(|l| *s <= l))
}

/// The types of the pool within every limit it draws on.
fn refresh_limits(pool: &mut PoolCtx, shared: &[SharedCtx]) {
    let left = left_of(pool, shared);
    let mut bits = pool.table.all();
    if left.iter().any(Option::is_some) {
        for i in 0..pool.table.len() {
            if !within(&left, &sizes_of(pool, i)) {
                bits.clear(i);
            }
        }
    }
    pool.within_limits = bits;
}

impl Solver<'_> {
    /// Pool `pi`'s limit vector (see [`left_of`]).
    fn left(&self, pi: usize) -> Vec<Option<i64>> {
        left_of(&self.pools[pi], &self.shared)
    }

    /// Gives `back` to pool `pi`'s limit vector and takes `taken` from it (claims replaced by
    /// others), then recomputes the types within limits of every pool this may change.
    fn recharge(&mut self, pi: usize, back: &[i64], taken: &[i64]) {
        let pool = &mut self.pools[pi];
        let own = pool.own_dims();
        let change = |r: &mut Option<i64>, k: usize| {
            if let Some(r) = r {
                let at = |v: &[i64]| v.get(k).copied().unwrap_or(0);
                *r = r.saturating_add(at(back)).saturating_sub(at(taken));
            }
        };
        for (k, r) in pool.remaining.res.iter_mut().enumerate() {
            change(r, k);
        }
        for (j, s) in pool.shared.iter().enumerate() {
            for (d, r) in self.shared[s.limit].left.iter_mut().enumerate() {
                change(r, own + SHARED_DIMS * j + d);
            }
        }
        if pool.shared.is_empty() {
            refresh_limits(pool, &self.shared);
        } else {
            // What one pool draws, the others sharing the limit can no longer use.
            for pool in &mut self.pools {
                refresh_limits(pool, &self.shared);
            }
        }
    }
}

fn describe_remaining(r: &Remaining) -> String {
    let names = ["cpu", "memory", "ephemeral-storage", "pods"];
    let mut parts: Vec<String> = Vec::new();
    for (n, v) in names.iter().copied().chain(r.extended.iter().map(String::as_str)).zip(r.res.iter().copied()) {
        if let Some(v) = v {
            let text = match n {
                "cpu" => crds::quantity::format_millis_cpu(v),
                "memory" | "ephemeral-storage" => crate::instance_types::gib(v),
                _ => v.to_string(),
            };
            parts.push(format!("{n}={text}"));
        }
    }
    if let Some(n) = r.nodes {
        parts.push(format!("nodes={n}"));
    }
    parts.join(", ")
}

/// What is left of a shared limit, as `cpu=2, memory=4G, price-per-hour=0.0100 EUR`.
fn describe_left(left: &[Option<i64>; SHARED_DIMS]) -> String {
    let [cpu, memory, price] = *left;
    let mut parts: Vec<String> = Vec::new();
    if let Some(c) = cpu {
        parts.push(format!("cpu={}", crds::quantity::format_millis_cpu(c)));
    }
    if let Some(m) = memory {
        // Quotas count nominal GB: shown as such when whole.
        let text =
            if m % 1_000_000_000 == 0 { format!("{}G", m / 1_000_000_000) } else { crate::instance_types::gib(m) };
        parts.push(format!("memory={text}"));
    }
    if let Some(p) = price {
        parts.push(format!("price-per-hour={} EUR", format_eur(p)));
    }
    parts.join(", ")
}

/// Micro-EUR as EUR with 4 decimals, 6 when the last two are not zero.
fn format_eur(micros: i64) -> String {
    let sign = if micros < 0 { "-" } else { "" };
    let m = micros.unsigned_abs();
    let (whole, frac) = (m / 1_000_000, m % 1_000_000);
    if frac % 100 == 0 { format!("{sign}{whole}.{:04}", frac / 100) } else { format!("{sign}{whole}.{frac:06}") }
}

fn label_of(labels: &[(Key, Val)], key: Key) -> Option<Val> {
    labels.binary_search_by_key(&key, |(k, _)| *k).ok().map(|i| labels[i].1)
}
