//! Builders of scheduling inputs for tests, benchmarks and examples: the built-in flavors (in one
//! zone or the three-zone fixture of karpenter-semantics §10), pools, pods and nodes with the
//! fields that matter, and a compact reading of a decision.
//!
//! Owns no scheduling logic.

use std::collections::BTreeMap;

use crds::catalog::{CAPACITY_TYPE_ON_DEMAND, Catalog, InstanceType, Offering};
use crds::labels;
use crds::quantity::Resources;

use crate::model::{
    Constraints, Decision, Draw, ExistingNode, Headroom, HostPort, Input, LabelSelector, NodeInclusionPolicy,
    NodeSelectorRequirement, Operator, Pod, PodAffinityTerm, Pool, RunningPod, SharedLimit, SpreadConstraint, Taint,
    TaintEffect, Toleration, TolerationOperator, WhenUnsatisfiable, price_micros,
};

/// Bytes in a GiB.
pub const GI: i64 = 1 << 30;

/// xorshift64*: a seeded generator for the benchmarks' workloads (deterministic, no dependency).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// One of `xs`, uniformly.
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[usize::try_from(self.below(xs.len() as u64)).unwrap_or(0)]
    }

    /// Uniform in [lo, hi).
    pub fn float(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}
/// Bytes in a MiB.
pub const MI: i64 = 1 << 20;

/// The six built-in flavors in zone `par`.
pub fn flavors() -> Vec<InstanceType> {
    Catalog::builtin().instance_types(crds::catalog::DEFAULT_ZONE)
}

/// The three-zone fixture: the built-in flavors offered in zones `a`, `b`, `c` at equal prices.
pub fn flavors_3_zones() -> Vec<InstanceType> {
    flavors()
        .into_iter()
        .map(|mut t| {
            let price = t.offerings[0].price_hourly;
            t.labels.remove(labels::ZONE);
            t.offerings = ["a", "b", "c"]
                .iter()
                .map(|z| Offering {
                    zone: (*z).to_string(),
                    capacity_type: CAPACITY_TYPE_ON_DEMAND.to_string(),
                    price_hourly: price,
                    available: true,
                })
                .collect();
            t
        })
        .collect()
}

/// A pool named `name` with the built-in flavors, weight 0, no limits.
pub fn pool(name: &str) -> Pool {
    Pool { name: name.to_string(), instance_types: flavors(), ..Pool::default() }
}

/// `key op values`.
pub fn req(key: &str, op: Operator, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.to_string(),
        operator: op,
        values: values.iter().map(|v| (*v).to_string()).collect(),
        min_values: None,
    }
}

/// A taint.
pub fn taint(key: &str, value: Option<&str>, effect: TaintEffect) -> Taint {
    Taint { key: key.to_string(), value: value.map(str::to_string), effect }
}

/// A toleration (`Equal` with a value, `Exists` without).
pub fn toleration(key: &str, value: Option<&str>) -> Toleration {
    Toleration {
        key: key.to_string(),
        operator: if value.is_some() { TolerationOperator::Equal } else { TolerationOperator::Exists },
        value: value.unwrap_or_default().to_string(),
        effect: None,
    }
}

/// Resources from millicores and bytes (one pod).
pub fn res(cpu_millis: i64, memory_bytes: i64) -> Resources {
    Resources { cpu_millis, memory_bytes, ephemeral_storage_bytes: 0, pods: 1 }
}

/// A pod `default/<name>` requesting `cpu_millis` and `memory_bytes`.
pub fn pod(name: &str, cpu_millis: i64, memory_bytes: i64) -> Pod {
    Pod {
        namespace: "default".to_string(),
        name: name.to_string(),
        uid: name.to_string(),
        requests: res(cpu_millis, memory_bytes),
        ..Pod::default()
    }
}

/// Labels from pairs.
pub fn labels_of(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect()
}

/// A selector `matchLabels`.
pub fn selector(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector { match_labels: labels_of(pairs), match_expressions: Vec::new() }
}

/// A spread constraint with default policies.
pub fn spread(key: &str, max_skew: i32, when: WhenUnsatisfiable, sel: &[(&str, &str)]) -> SpreadConstraint {
    SpreadConstraint {
        max_skew,
        topology_key: key.to_string(),
        when_unsatisfiable: when,
        selector: Some(selector(sel)),
        min_domains: None,
        node_affinity_policy: NodeInclusionPolicy::Honor,
        node_taints_policy: NodeInclusionPolicy::Ignore,
        match_label_keys: Vec::new(),
    }
}

/// A pod (anti-)affinity term in the pod's own namespace.
pub fn term(key: &str, sel: &[(&str, &str)]) -> PodAffinityTerm {
    PodAffinityTerm { selector: Some(selector(sel)), topology_key: key.to_string(), ..PodAffinityTerm::default() }
}

/// A host port.
pub fn host_port(port: i32, protocol: &str) -> HostPort {
    HostPort { ip: String::new(), port, protocol: protocol.to_string() }
}

/// An initialized, unmanaged-looking node of a built-in flavor (labels of the flavor, hostname =
/// name), with pods.
pub fn node_of(name: &str, flavor: &str, pods: Vec<RunningPod>) -> ExistingNode {
    let t = flavors().into_iter().find(|t| t.name == flavor).unwrap_or_else(|| InstanceType::synthesize(flavor));
    let mut lbls = t.labels.clone();
    lbls.insert(labels::HOSTNAME.to_string(), name.to_string());
    ExistingNode {
        name: name.to_string(),
        labels: lbls,
        allocatable: t.allocatable,
        capacity: t.capacity,
        pods,
        initialized: true,
        ..ExistingNode::default()
    }
}

/// A running pod with requests and labels, counted by topology.
pub fn running(name: &str, cpu_millis: i64, memory_bytes: i64, lbls: &[(&str, &str)]) -> RunningPod {
    RunningPod {
        namespace: "default".to_string(),
        name: name.to_string(),
        labels: labels_of(lbls),
        requests: res(cpu_millis, memory_bytes),
        counted: true,
        ..RunningPod::default()
    }
}

/// An input with the given pools and pods, default settings.
pub fn input(pools: Vec<Pool>, pods: Vec<Pod>) -> Input {
    Input { pools, pods, ..Input::default() }
}

/// A shared limit named `name` over the pools named (`None`: every pool), with what is left.
pub fn shared_limit(name: &str, pools: Option<&[&str]>, remaining: Headroom) -> SharedLimit {
    SharedLimit {
        name: name.to_string(),
        pools: pools.map(|ps| ps.iter().map(|p| (*p).to_string()).collect()),
        remaining,
        sizes: BTreeMap::new(),
    }
}

/// What a decision's new claims draw on each shared limit of the input, from the input alone: per
/// claim and dimension the largest draw among its options (a type the limit does not list: its
/// capacity and its cheapest available offering), summed.
pub fn drawn(input: &Input, d: &Decision) -> Vec<Draw> {
    input
        .shared
        .iter()
        .map(|l| {
            let mut sum = Draw::default();
            for c in &d.new_claims {
                if l.pools.as_ref().is_some_and(|ps| !ps.contains(&c.nodepool)) {
                    continue;
                }
                let types = input.pools.iter().find(|p| p.name == c.nodepool).map_or(&[][..], |p| &p.instance_types);
                let mut most = Draw::default();
                for o in &c.instance_types {
                    let draw = l.sizes.get(&o.name).copied().unwrap_or_else(|| {
                        let t = types.iter().find(|t| t.name == o.name);
                        let price = t
                            .into_iter()
                            .flat_map(|t| t.offerings.iter())
                            .filter(|o| o.available)
                            .map(|o| o.price_hourly)
                            .fold(f64::INFINITY, f64::min);
                        Draw {
                            cpu_millis: t.map_or(0, |t| t.capacity.cpu_millis),
                            memory_bytes: t.map_or(0, |t| t.capacity.memory_bytes),
                            price_micros: if price.is_finite() { price_micros(price) } else { 0 },
                        }
                    });
                    most.cpu_millis = most.cpu_millis.max(draw.cpu_millis);
                    most.memory_bytes = most.memory_bytes.max(draw.memory_bytes);
                    most.price_micros = most.price_micros.max(draw.price_micros);
                }
                sum.cpu_millis += most.cpu_millis;
                sum.memory_bytes += most.memory_bytes;
                sum.price_micros += most.price_micros;
            }
            sum
        })
        .collect()
}

/// Constraints helper: a pod with these constraints.
pub fn with(mut p: Pod, f: impl FnOnce(&mut Constraints)) -> Pod {
    f(&mut p.constraints);
    p
}

/// Compact view of a decision: per new claim `pool:cheapest[pods]`, per existing node
/// `node[pods]`, and the unschedulable pod names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// `pool:flavor` of each new claim.
    pub claims: Vec<String>,
    /// Pod names per new claim.
    pub claim_pods: Vec<Vec<String>>,
    /// Existing node name → pod names.
    pub existing: Vec<(String, Vec<String>)>,
    /// Pods left pending.
    pub unschedulable: Vec<String>,
}

/// Summarises a decision.
pub fn summary(input: &Input, d: &Decision) -> Summary {
    let name = |i: &usize| input.pods[*i].name.clone();
    Summary {
        claims: d
            .new_claims
            .iter()
            .map(|c| format!("{}:{}", c.nodepool, c.instance_types.first().map_or("-", |o| o.name.as_str())))
            .collect(),
        claim_pods: d.new_claims.iter().map(|c| c.pods.iter().map(name).collect()).collect(),
        existing: d
            .existing
            .iter()
            .map(|a| (input.nodes[a.node].name.clone(), a.pods.iter().map(name).collect()))
            .collect(),
        unschedulable: d.unschedulable.iter().map(|u| name(&u.pod)).collect(),
    }
}
