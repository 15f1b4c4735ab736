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
mod finish;
mod place;
pub mod repack;

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
#[derive(Debug, Clone, Copy)]
struct Remaining {
    res: [Option<i64>; 4],
    nodes: Option<i64>,
}

impl Remaining {
    fn admits(&self, cap: &Resources) -> bool {
        let c = [cap.cpu_millis, cap.memory_bytes, cap.ephemeral_storage_bytes, cap.pods];
        self.res.iter().zip(c).all(|(r, c)| r.is_none_or(|r| c <= r))
    }

    fn take(&mut self, cap: &Resources) {
        let c = [cap.cpu_millis, cap.memory_bytes, cap.ephemeral_storage_bytes, cap.pods];
        for (r, c) in self.res.iter_mut().zip(c) {
            if let Some(r) = r {
                *r = r.saturating_sub(c);
            }
        }
        if let Some(n) = &mut self.nodes {
            *n -= 1;
        }
    }

    fn is_limited(&self) -> bool {
        self.res.iter().any(Option::is_some)
    }
}

struct PoolCtx {
    input: usize,
    name: String,
    template: Requirements,
    taints: Vec<crate::model::Taint>,
    table: TypeTable,
    groups: Vec<DsGroup>,
    remaining: Remaining,
    /// Types within the remaining limits (recomputed when a claim opens).
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
    extended: Vec<String>,
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
    ports: Vec<HostPort>,
    hostname: Val,
    pods: Vec<usize>,
    /// Per-resource max over types of allocatable − overhead − used: quick rejection.
    headroom: Resources,
    min_values_relaxed: bool,
    /// What the claim took from its pool's limits: its largest option's capacity when opened.
    charged: Resources,
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

fn refresh_limits(pool: &mut PoolCtx) {
    if !pool.remaining.is_limited() {
        return;
    }
    let mut bits = pool.table.all();
    for (i, t) in pool.table.types.iter().enumerate() {
        if !pool.remaining.admits(&t.capacity) {
            bits.clear(i);
        }
    }
    pool.within_limits = bits;
}

fn describe_remaining(r: &Remaining) -> String {
    let names = ["cpu", "memory", "ephemeral-storage", "pods"];
    let mut parts: Vec<String> = Vec::new();
    for (n, v) in names.iter().zip(r.res) {
        if let Some(v) = v {
            let text = match *n {
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

fn label_of(labels: &[(Key, Val)], key: Key) -> Option<Val> {
    labels.binary_search_by_key(&key, |(k, _)| *k).ok().map(|i| labels[i].1)
}
