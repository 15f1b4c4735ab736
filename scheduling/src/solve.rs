//! The solve loop (karpenter-semantics §3.3–§3.7, §3.13–§3.15): pods in queue order, each placed on
//! an existing node, else on a claim opened earlier this round, else on a new claim of the
//! highest-priority pool that accepts it, relaxing its preferences one step per failed attempt; then
//! the claims are finished (cheapest options first, truncation, DaemonSet overhead).
//!
//! Owns placement decisions. Pure: the same input always gives the same decision.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crds::labels;
use crds::quantity::Resources;

use crate::bitset::Bits;
use crate::daemonsets::{self, DsGroup, DsPod};
use crate::hostports;
use crate::instance_types::{TypeInfo, TypeTable, describe_resources, type_meets};
use crate::intern::{Interner, Key, Val};
use crate::model::{
    ClaimOption, Constraints, Decision, HostPort, Input, MinValuesPolicy, NewClaim, NodeAssignment,
    NodeSelectorRequirement, Operator, Pod, PreferencePolicy, TaintEffect, Toleration, Unschedulable,
};
use crate::requirements::{Requirements, ValueSet};
use crate::taints;
use crate::topology::{self, Domains, Kind, PodConstraint, Refused, Topology};

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

impl<'a> Solver<'a> {
    fn new(input: &'a Input) -> Self {
        let mut ints = Interner::default();
        for k in well_known_keys() {
            ints.key(k);
        }
        let n_well_known = u32::try_from(labels::WELL_KNOWN.len()).unwrap_or(u32::MAX);
        let hostname_key = ints.key(labels::HOSTNAME);
        let zone_key = ints.key(labels::ZONE);
        let capacity_type_key = ints.key(labels::CAPACITY_TYPE);
        let mut s = Solver {
            input,
            ints,
            n_well_known,
            hostname_key,
            zone_key,
            capacity_type_key,
            pools: Vec::new(),
            nodes: Vec::new(),
            claims: Vec::new(),
            claim_order: Vec::new(),
            classes: Vec::new(),
            pod_class: Vec::new(),
            topo: Topology::default(),
            domains: HashMap::new(),
            mask_cache: HashMap::new(),
            errors: vec![None; input.pods.len()],
            placed: vec![false; input.pods.len()],
            relax_of: vec![Relax::default(); input.pods.len()],
            any_prefer_no_schedule: false,
        };
        let ds = daemonsets::prepare(&input.daemonsets, &mut s.ints);
        s.build_pools(&ds);
        s.build_nodes(&ds);
        s.build_classes();
        s.compute_domains();
        s.any_prefer_no_schedule = s.pools.iter().any(|p| p.has_prefer_no_schedule)
            || s.nodes.iter().any(|n| n.taints.iter().any(|t| t.effect == TaintEffect::PreferNoSchedule));
        s
    }

    fn well_known(&self) -> impl Fn(Key) -> bool + use<> {
        let n = self.n_well_known;
        move |k| k < n
    }

    // ----- preparation -------------------------------------------------------------------------

    fn build_pools(&mut self, ds: &[DsPod]) {
        let mut order: Vec<usize> = (0..self.input.pools.len()).collect();
        // Weight descending, then name descending (§3.3).
        order.sort_by(|&a, &b| {
            let (pa, pb) = (&self.input.pools[a], &self.input.pools[b]);
            pb.weight.cmp(&pa.weight).then_with(|| pb.name.cmp(&pa.name))
        });
        let registered = self.ints.key(labels::REGISTERED);
        let initialized = self.ints.key(labels::INITIALIZED);
        let true_val = self.ints.val("true");
        let nodepool_key = self.ints.key(labels::NODEPOOL);
        for i in order {
            let pool = &self.input.pools[i];
            let mut template = Requirements::from_api(&pool.requirements, &mut self.ints);
            let from_labels = Requirements::from_labels(&pool.labels, &mut self.ints);
            template = template.intersect(&from_labels, &self.ints);
            let pool_val = self.ints.val(&pool.name);
            template.add(nodepool_key, ValueSet::single(pool_val), &self.ints);
            let mut ds_template = template.clone();
            ds_template.add(registered, ValueSet::single(true_val), &self.ints);
            ds_template.add(initialized, ValueSet::single(true_val), &self.ints);
            let well_known = self.well_known();
            let mut groups: Vec<DsGroup> = Vec::new();
            let zone = self.zone_key;
            let ct = self.capacity_type_key;
            let mut infos = crate::instance_types::intern_all(&pool.instance_types, &mut self.ints);
            let mut eliminated = Vec::new();
            infos.retain_mut(|t| {
                match keep_type(
                    t,
                    &template,
                    &pool.taints,
                    ds,
                    &mut groups,
                    &self.ints,
                    &well_known,
                    &ds_template,
                    zone,
                    ct,
                ) {
                    Ok((price, group)) => {
                        t.price = price;
                        t.ds_group = group;
                        true
                    }
                    Err(reason) => {
                        eliminated.push(format!("{}: {reason}", t.name));
                        false
                    }
                }
            });
            if groups.is_empty() {
                groups.push(DsGroup::default());
            }
            let table = TypeTable::from_types(infos, &self.ints);
            let unusable = if table.is_empty() {
                Some(if pool.instance_types.is_empty() {
                    format!("nodepool {} has no instance types", pool.name)
                } else {
                    format!(
                        "nodepool {} has no compatible instance type ({})",
                        pool.name,
                        eliminated.iter().take(6).cloned().collect::<Vec<_>>().join("; ")
                    )
                })
            } else {
                None
            };
            let limit = |l: Option<i64>, used: i64| l.map(|l| l.saturating_sub(used));
            let remaining = Remaining {
                res: [
                    limit(pool.limits.cpu_millis, pool.usage.resources.cpu_millis),
                    limit(pool.limits.memory_bytes, pool.usage.resources.memory_bytes),
                    limit(pool.limits.ephemeral_storage_bytes, pool.usage.resources.ephemeral_storage_bytes),
                    limit(pool.limits.pods, pool.usage.resources.pods),
                ],
                nodes: limit(pool.limits.nodes, pool.usage.nodes),
            };
            let mut ctx = PoolCtx {
                input: i,
                name: pool.name.clone(),
                template,
                taints: pool.taints.clone(),
                within_limits: table.all(),
                table,
                groups,
                remaining,
                unusable,
                has_prefer_no_schedule: pool.taints.iter().any(|t| t.effect == TaintEffect::PreferNoSchedule),
            };
            refresh_limits(&mut ctx);
            self.pools.push(ctx);
        }
    }

    fn build_nodes(&mut self, ds: &[DsPod]) {
        let mut order: Vec<usize> = (0..self.input.nodes.len()).collect();
        order.sort_by(|&a, &b| {
            let (na, nb) = (&self.input.nodes[a], &self.input.nodes[b]);
            nb.initialized.cmp(&na.initialized).then_with(|| na.name.cmp(&nb.name))
        });
        for i in order {
            let n = &self.input.nodes[i];
            let mut lbls: Vec<(Key, Val)> = n
                .labels
                .iter()
                .map(|(k, v)| (self.ints.key(crate::requirements::normalize_key(k)), self.ints.val(v)))
                .collect();
            let hostname = match n.labels.get(labels::HOSTNAME) {
                Some(h) => self.ints.val(h),
                None => {
                    let h = self.ints.val(&n.name);
                    lbls.push((self.hostname_key, h));
                    h
                }
            };
            lbls.sort_unstable();
            lbls.dedup_by_key(|(k, _)| *k);
            let taints: Vec<crate::model::Taint> = if n.managed && !n.initialized {
                n.taints
                    .iter()
                    .filter(|t| {
                        !taints::is_ephemeral(t)
                            && !n.startup_taints.iter().any(|s| s.key == t.key && s.effect == t.effect)
                    })
                    .cloned()
                    .collect()
            } else {
                n.taints.clone()
            };
            let mut used = Resources::ZERO;
            let mut ports = Vec::new();
            let mut volumes: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
            for p in &n.pods {
                used += p.requests;
                ports.extend(p.host_ports.iter().cloned());
                for (driver, claim) in &p.csi_volumes {
                    volumes.entry(driver.clone()).or_default().insert(claim.clone());
                }
            }
            let mut missing_ds = Resources::ZERO;
            for d in ds {
                let running = n.pods.iter().any(|p| p.daemonset.as_deref() == Some(d.key.as_str()));
                if !running && daemonsets::compatible_with_node(d, &n.taints, &lbls, &self.ints) {
                    missing_ds += d.requests;
                    ports.extend(d.host_ports.iter().cloned());
                }
            }
            let remaining = n.allocatable.saturating_sub(used).saturating_sub(missing_ds.floored_at_zero());
            self.nodes.push(NodeState {
                input: i,
                labels: lbls,
                hostname,
                taints,
                remaining,
                ports,
                pods: Vec::new(),
                volumes,
            });
        }
    }

    fn build_classes(&mut self) {
        let input = self.input;
        let mut index: HashMap<(&str, &BTreeMap<String, String>, &Constraints), usize> = HashMap::new();
        self.pod_class.reserve(input.pods.len());
        for pod in &input.pods {
            let has_topo = pod.constraints.has_topology();
            // Labels only matter when some group may select them; keying on them always is simpler
            // and cheap for the usual few labels.
            let key = (pod.namespace.as_str(), &pod.labels, &pod.constraints);
            let c = match index.get(&key) {
                Some(&c) => c,
                None => {
                    let c = self.classes.len();
                    let class = self.build_class(pod, has_topo);
                    self.classes.push(class);
                    index.insert(key, c);
                    c
                }
            };
            self.pod_class.push(c);
        }
        // Inverse anti-affinity of running pods.
        let namespace_labels = &input.namespace_labels;
        let mut running_inverse: Vec<(usize, usize)> = Vec::new();
        for (ni, n) in self.nodes.iter().enumerate() {
            for p in &input.nodes[n.input].pods {
                if !p.counted {
                    continue;
                }
                for term in &p.anti_affinity {
                    let id = topology::term_key(
                        Kind::Inverse,
                        term,
                        &p.namespace,
                        &p.labels,
                        namespace_labels,
                        &mut self.ints,
                    );
                    let g = self.topo.group(id);
                    running_inverse.push((g, ni));
                }
            }
        }
        if self.topo.is_empty() {
            return;
        }
        // Which groups select which classes.
        for c in &mut self.classes {
            for (gi, g) in self.topo.groups.iter().enumerate() {
                if g.selects(&c.namespace, &c.labels) {
                    if g.id.kind == Kind::Inverse {
                        c.inverse_selected.push(gi);
                    } else {
                        c.selected.push(gi);
                    }
                }
            }
            c.has_topology = c.has_topology || !c.inverse_selected.is_empty() || !c.selected.is_empty();
        }
        // Counts of running pods.
        for ni in 0..self.nodes.len() {
            let n = &self.nodes[ni];
            let node = &input.nodes[n.input];
            for p in node.pods.iter().filter(|p| p.counted) {
                for g in self.topo.groups.iter_mut() {
                    if g.id.kind == Kind::Inverse || !g.selects(&p.namespace, &p.labels) {
                        continue;
                    }
                    if g.id.kind == Kind::Spread && !g.node_passes(&n.labels, &node.taints, &self.ints) {
                        continue;
                    }
                    if let Some(v) = label_of(&n.labels, g.id.key) {
                        g.record(v);
                    }
                }
            }
        }
        for (g, ni) in running_inverse {
            if let Some(v) = label_of(&self.nodes[ni].labels, self.topo.groups[g].id.key) {
                self.topo.groups[g].record(v);
            }
        }
    }

    fn build_class(&mut self, pod: &Pod, has_topo: bool) -> Class {
        let c = &pod.constraints;
        let ints = &mut self.ints;
        let selector = Requirements::from_labels(&c.node_selector, ints);
        let strict: Vec<Requirements> = if c.required_terms.is_empty() {
            vec![selector.clone()]
        } else {
            c.required_terms.iter().map(|t| selector.intersect(&Requirements::from_api(t, ints), ints)).collect()
        };
        let respect = self.input.settings.preference_policy == PreferencePolicy::Respect;
        let mut preferred_terms: Vec<&crate::model::WeightedNodeTerm> = c.preferred_terms.iter().collect();
        preferred_terms.sort_by_key(|t| std::cmp::Reverse(t.weight));
        let preferred = if respect {
            preferred_terms.iter().map(|t| Requirements::from_api(&t.requirements, ints)).collect()
        } else {
            Vec::new()
        };
        let mut class = Class {
            namespace: pod.namespace.clone(),
            labels: pod.labels.clone(),
            strict,
            preferred,
            tolerations: c.tolerations.clone(),
            host_ports: c.host_ports.clone(),
            volume_alts: c.volume_requirements.iter().map(|alt| Requirements::from_api(alt, ints)).collect(),
            spreads: Vec::new(),
            affinities: Vec::new(),
            antis: Vec::new(),
            owned_inverse: Vec::new(),
            selected: Vec::new(),
            inverse_selected: Vec::new(),
            has_topology: has_topo,
            n_soft_affinity: 0,
            n_soft_anti: 0,
            n_soft_spread: 0,
            extended: pod.extended.iter().filter(|(_, v)| **v > 0).map(|(k, _)| k.clone()).collect(),
        };
        if !has_topo {
            return class;
        }
        let nsl = &self.input.namespace_labels;
        for sc in &c.topology_spread {
            let soft = topology::spread_is_soft(sc);
            if soft && !respect {
                continue;
            }
            let id = topology::spread_key(
                sc,
                &pod.namespace,
                &pod.labels,
                &class.strict,
                &class.tolerations,
                &mut self.ints,
            );
            let group = self.topo.group(id);
            let rank = if soft { class.n_soft_spread } else { 0 };
            class.n_soft_spread += usize::from(soft);
            class.spreads.push(PodConstraint { group, soft, rank });
        }
        for term in &c.pod_affinity {
            let id = topology::term_key(Kind::Affinity, term, &pod.namespace, &pod.labels, nsl, &mut self.ints);
            class.affinities.push(PodConstraint { group: self.topo.group(id), soft: false, rank: 0 });
        }
        for term in &c.pod_anti_affinity {
            let id = topology::term_key(Kind::AntiAffinity, term, &pod.namespace, &pod.labels, nsl, &mut self.ints);
            class.antis.push(PodConstraint { group: self.topo.group(id), soft: false, rank: 0 });
            let inv = topology::term_key(Kind::Inverse, term, &pod.namespace, &pod.labels, nsl, &mut self.ints);
            class.owned_inverse.push(self.topo.group(inv));
        }
        if respect {
            let mut soft: Vec<_> = c.preferred_pod_affinity.iter().collect();
            soft.sort_by_key(|t| std::cmp::Reverse(t.weight));
            for (rank, t) in soft.into_iter().enumerate() {
                let id = topology::term_key(Kind::Affinity, &t.term, &pod.namespace, &pod.labels, nsl, &mut self.ints);
                class.affinities.push(PodConstraint { group: self.topo.group(id), soft: true, rank });
                class.n_soft_affinity += 1;
            }
            let mut soft: Vec<_> = c.preferred_pod_anti_affinity.iter().collect();
            soft.sort_by_key(|t| std::cmp::Reverse(t.weight));
            for (rank, t) in soft.into_iter().enumerate() {
                let id =
                    topology::term_key(Kind::AntiAffinity, &t.term, &pod.namespace, &pod.labels, nsl, &mut self.ints);
                class.antis.push(PodConstraint { group: self.topo.group(id), soft: true, rank });
                class.n_soft_anti += 1;
            }
        }
        class
    }

    // ----- the loop ----------------------------------------------------------------------------

    fn run(&mut self) {
        let pods = &self.input.pods;
        let mut order: Vec<usize> = (0..pods.len()).collect();
        order.sort_by(|&a, &b| {
            let (pa, pb) = (&pods[a], &pods[b]);
            pb.requests
                .cpu_millis
                .cmp(&pa.requests.cpu_millis)
                .then_with(|| pb.requests.memory_bytes.cmp(&pa.requests.memory_bytes))
                .then_with(|| pa.created.cmp(&pb.created))
                .then_with(|| pa.uid.cmp(&pb.uid))
                .then_with(|| a.cmp(&b))
        });
        let mut queue: VecDeque<usize> = order.into();
        let mut pushed_at: Vec<usize> = vec![usize::MAX; pods.len()];
        while let Some(&p) = queue.front() {
            if pushed_at[p] == queue.len() {
                break; // a full pass without progress
            }
            queue.pop_front();
            match self.place(p) {
                Ok(()) => {
                    self.errors[p] = None;
                    self.placed[p] = true;
                }
                Err(e) => {
                    self.errors[p] = Some(e);
                    queue.push_back(p);
                    pushed_at[p] = queue.len();
                }
            }
        }
    }

    /// Places one pod, relaxing one step per failed attempt (§3.5).
    fn place(&mut self, p: usize) -> Result<(), String> {
        let class = self.pod_class[p];
        if let Some(r) = self.classes[class].extended.first() {
            return Err(format!("requests {r}, which no instance type offers"));
        }
        let mut relax = Relax::default();
        loop {
            match self.try_place(p, class, relax) {
                Ok(()) => {
                    self.relax_of[p] = relax;
                    return Ok(());
                }
                Err(e) => match self.relax(class, relax) {
                    Some(next) => relax = next,
                    None => return Err(e),
                },
            }
        }
    }

    fn relax(&self, class: usize, r: Relax) -> Option<Relax> {
        let c = &self.classes[class];
        let mut n = r;
        if c.strict.len() - r.term >= 2 {
            n.term += 1;
        } else if r.affinity_dropped < c.n_soft_affinity {
            n.affinity_dropped += 1;
        } else if r.anti_dropped < c.n_soft_anti {
            n.anti_dropped += 1;
        } else if r.preferred < c.preferred.len() {
            n.preferred += 1;
        } else if r.spread_dropped < c.n_soft_spread {
            n.spread_dropped += 1;
        } else if !r.tolerate_pns && self.any_prefer_no_schedule {
            n.tolerate_pns = true;
        } else {
            return None;
        }
        Some(n)
    }

    fn working(&self, class: usize, r: Relax) -> Requirements {
        let c = &self.classes[class];
        let strict = &c.strict[r.term.min(c.strict.len() - 1)];
        match c.preferred.get(r.preferred) {
            Some(pref) => strict.intersect(pref, &self.ints),
            None => strict.clone(),
        }
    }

    /// The pod's active topology constraints under a relaxation state.
    fn active(&self, class: usize, r: Relax) -> Vec<PodConstraint> {
        let c = &self.classes[class];
        let keep = |pc: &&PodConstraint, dropped: usize| !pc.soft || pc.rank >= dropped;
        c.spreads
            .iter()
            .filter(|pc| keep(pc, r.spread_dropped))
            .chain(c.affinities.iter().filter(|pc| keep(pc, r.affinity_dropped)))
            .chain(c.antis.iter().filter(|pc| keep(pc, r.anti_dropped)))
            .copied()
            .chain(c.inverse_selected.iter().map(|&g| PodConstraint { group: g, soft: false, rank: 0 }))
            .collect()
    }

    fn try_place(&mut self, p: usize, class: usize, r: Relax) -> Result<(), String> {
        let working = self.working(class, r);
        let active = if self.classes[class].has_topology { self.active(class, r) } else { Vec::new() };
        if !working.is_empty() {
            for pi in 0..self.pools.len() {
                if !self.mask_cache.contains_key(&(class, r, pi)) {
                    let m = self.pools[pi].table.requirement_mask(&working, &self.ints);
                    self.mask_cache.insert((class, r, pi), m);
                }
            }
        }
        let pod = &self.input.pods[p];
        // 1. Existing nodes, in order.
        for ni in 0..self.nodes.len() {
            if self.node_accepts(ni, pod, class, r, &active).is_ok() {
                self.commit_node(ni, p, class);
                return Ok(());
            }
        }
        // 2. Claims opened earlier this round, fewest pods first.
        for oi in 0..self.claim_order.len() {
            let ci = self.claim_order[oi];
            let claim = &self.claims[ci];
            if !pod.requests.fits(&claim.headroom) {
                continue;
            }
            let pool = claim.pool;
            if let Ok(acc) = self.claim_accepts(
                pool,
                &claim.reqs,
                &claim.types,
                claim.used,
                &claim.ports,
                claim.hostname,
                pod,
                class,
                r,
                &working,
                &active,
            ) {
                self.commit_claim(ci, p, class, acc);
                return Ok(());
            }
        }
        // 3. A new claim, pools in priority order.
        let mut reasons: Vec<String> = Vec::new();
        for pi in 0..self.pools.len() {
            let pool = &self.pools[pi];
            if let Some(why) = &pool.unusable {
                reasons.push(why.clone());
                continue;
            }
            if pool.remaining.nodes.is_some_and(|n| n <= 0) {
                reasons.push(format!("nodepool {}: node limits exhausted (limits.nodes)", pool.name));
                continue;
            }
            if pool.within_limits.is_empty() {
                reasons.push(format!(
                    "nodepool {}: every instance type would exceed the remaining limits ({})",
                    pool.name,
                    describe_remaining(&pool.remaining)
                ));
                continue;
            }
            let hostname = self.ints.val(&format!("hostname-placeholder-{:04}", self.claims.len()));
            let pool = &self.pools[pi];
            match self.claim_accepts(
                pi,
                &pool.template,
                &pool.within_limits,
                Resources::ZERO,
                &[],
                hostname,
                pod,
                class,
                r,
                &working,
                &active,
            ) {
                Ok(acc) => {
                    let types = acc.types.clone();
                    let pool = &mut self.pools[pi];
                    let cap = pool.table.max_capacity(&types);
                    pool.remaining.take(&cap);
                    refresh_limits(pool);
                    self.claims.push(Claim {
                        pool: pi,
                        reqs: Requirements::new(),
                        types: Bits::empty(0),
                        used: Resources::ZERO,
                        ports: Vec::new(),
                        hostname,
                        pods: Vec::new(),
                        headroom: Resources::ZERO,
                        min_values_relaxed: false,
                        charged: cap,
                    });
                    let ci = self.claims.len() - 1;
                    self.claim_order.insert(0, ci);
                    self.commit_claim(ci, p, class, acc);
                    return Ok(());
                }
                Err(e) => reasons.push(format!("nodepool {}: {e}", self.pools[pi].name)),
            }
        }
        if self.pools.is_empty() {
            return Err("no NodePool available (none is Ready for this cluster)".to_string());
        }
        Err(reasons.join("; "))
    }

    fn node_accepts(
        &self,
        ni: usize,
        pod: &Pod,
        class: usize,
        r: Relax,
        active: &[PodConstraint],
    ) -> Result<(), String> {
        let n = &self.nodes[ni];
        let c = &self.classes[class];
        if !pod.requests.fits(&n.remaining) {
            return Err("not enough room".into());
        }
        if let Some(t) = taints::first_untolerated(&n.taints, &c.tolerations, r.tolerate_pns) {
            return Err(format!("untolerated taint {}", taints::describe(t)));
        }
        if let Some(port) = hostports::first_clash(&c.host_ports, &n.ports) {
            return Err(format!("host port {} in use", hostports::describe(port)));
        }
        let limits = &self.input.nodes[n.input].csi_limits;
        for (driver, limit) in limits {
            let wanted: Vec<&String> = pod.csi_volumes.iter().filter(|(d, _)| d == driver).map(|(_, c)| c).collect();
            if wanted.is_empty() {
                continue;
            }
            let attached = n.volumes.get(driver);
            let new = wanted.iter().filter(|c| attached.is_none_or(|a| !a.contains(**c))).count();
            let total = attached.map_or(0, std::collections::BTreeSet::len) + new;
            if i64::try_from(total).unwrap_or(i64::MAX) > *limit {
                return Err(format!("CSI driver {driver} attach limit {limit} reached"));
            }
        }
        let strict = &c.strict[r.term.min(c.strict.len() - 1)];
        strict.matches_labels(&n.labels, &self.ints).map_err(|e| e.describe(&self.ints, &[]))?;
        if !c.volume_alts.is_empty() && !c.volume_alts.iter().any(|a| a.matches_labels(&n.labels, &self.ints).is_ok()) {
            return Err("the node is outside the topology of the pod's volumes".into());
        }
        for pc in active {
            let g = &self.topo.groups[pc.group];
            let v = if g.id.key == self.hostname_key { Some(n.hostname) } else { label_of(&n.labels, g.id.key) };
            let possible = v.map(|v| vec![v]);
            let min = self.eligible_min(pc.group, class, r);
            topology::admissible(
                g,
                possible.as_deref(),
                self.self_match(class, pc.group),
                g.id.key == self.hostname_key,
                min,
                self.may_bootstrap(pc.group, class, r),
                &self.ints,
            )
            .map_err(|Refused(e)| e)?;
        }
        Ok(())
    }

    /// Claim acceptance (§3.7), once per volume alternative: the first that fits wins.
    #[allow(clippy::too_many_arguments)]
    fn claim_accepts(
        &self,
        pi: usize,
        reqs: &Requirements,
        types: &Bits,
        used: Resources,
        ports: &[HostPort],
        hostname: Val,
        pod: &Pod,
        class: usize,
        r: Relax,
        working: &Requirements,
        active: &[PodConstraint],
    ) -> Result<Accepted, String> {
        let alts = &self.classes[class].volume_alts;
        if alts.is_empty() {
            return self
                .claim_accepts_one(pi, reqs, types, used, ports, hostname, pod, class, r, working, true, active);
        }
        let mut last = String::new();
        for alt in alts {
            let with_volume = working.intersect(alt, &self.ints);
            match self.claim_accepts_one(
                pi,
                reqs,
                types,
                used,
                ports,
                hostname,
                pod,
                class,
                r,
                &with_volume,
                false,
                active,
            ) {
                Ok(acc) => return Ok(acc),
                Err(e) => last = format!("with the topology of its volumes: {e}"),
            }
        }
        Err(last)
    }

    #[allow(clippy::too_many_arguments)]
    fn claim_accepts_one(
        &self,
        pi: usize,
        reqs: &Requirements,
        types: &Bits,
        used: Resources,
        ports: &[HostPort],
        hostname: Val,
        pod: &Pod,
        class: usize,
        r: Relax,
        working: &Requirements,
        cached: bool,
        active: &[PodConstraint],
    ) -> Result<Accepted, String> {
        let pool = &self.pools[pi];
        let c = &self.classes[class];
        // (1) Template taints (startup taints need no toleration).
        if let Some(t) = taints::first_untolerated(&pool.taints, &c.tolerations, r.tolerate_pns) {
            return Err(format!("did not tolerate taint {}", taints::describe(t)));
        }
        // (2) Requirements.
        let well_known = self.well_known();
        if let Err(e) = reqs.compatible(working, &self.ints, &well_known) {
            let defined: Vec<Key> = reqs.keys().chain(pool.table.keys()).collect();
            return Err(e.describe(&self.ints, &defined));
        }
        let mut new_reqs = if working.is_empty() || reqs.subsumes(working, &self.ints) {
            reqs.clone()
        } else {
            reqs.intersect(working, &self.ints)
        };
        let mut new_types = types.clone();
        if !working.is_empty() {
            match self.mask_cache.get(&(class, r, pi)).filter(|_| cached) {
                Some(m) => new_types.and_with(m),
                None => new_types.and_with(&pool.table.requirement_mask(working, &self.ints)),
            }
        }
        let mut zone_or_ct = working.has_key(self.zone_key) || working.has_key(self.capacity_type_key);
        // (3) Topology.
        for pc in active {
            let g = &self.topo.groups[pc.group];
            let key = g.id.key;
            let hostname_key = key == self.hostname_key;
            let possible =
                if hostname_key { Some(vec![hostname]) } else { self.claim_values(pi, &new_reqs, &new_types, key) };
            let min = self.eligible_min(pc.group, class, r);
            let ok = topology::admissible(
                g,
                possible.as_deref(),
                self.self_match(class, pc.group),
                hostname_key,
                min,
                self.may_bootstrap(pc.group, class, r),
                &self.ints,
            )
            .map_err(|Refused(e)| e)?;
            if !hostname_key && !ok.is_empty() && possible.as_ref().is_some_and(|p| p.len() != ok.len()) {
                let mut pin = Requirements::new();
                pin.add(key, ValueSet::is_in(ok), &self.ints);
                new_types.and_with(&pool.table.requirement_mask(&pin, &self.ints));
                new_reqs = new_reqs.intersect(&pin, &self.ints);
                zone_or_ct |= key == self.zone_key || key == self.capacity_type_key;
            }
        }
        if new_types.is_empty() {
            return Err(format!(
                "no instance type satisfies the requirements {}",
                working_description(working, &self.ints)
            ));
        }
        if zone_or_ct {
            pool.table.retain_offerings(&mut new_types, &new_reqs, &self.ints);
            if new_types.is_empty() {
                return Err(format!(
                    "no instance type has an available offering for {}",
                    working_description(&new_reqs, &self.ints)
                ));
            }
        }
        // (4) Resources and host ports, per type with its DaemonSet group.
        let total = used + pod.requests;
        let mut fitting = new_types.clone();
        let mut port_clash: Option<String> = None;
        if let Some(port) = hostports::first_clash(&c.host_ports, ports) {
            return Err(format!("host port {} already used by a pod on this claim", hostports::describe(port)));
        }
        for i in new_types.iter() {
            let t = &pool.table.types[i];
            let group = &pool.groups[t.ds_group];
            if !(total + group.overhead).fits(&t.allocatable) {
                fitting.clear(i);
            } else if !c.host_ports.is_empty()
                && let Some(port) = hostports::first_clash(&c.host_ports, &group.ports)
            {
                port_clash = Some(hostports::describe(port));
                fitting.clear(i);
            }
        }
        if fitting.is_empty() {
            if let Some(port) = port_clash {
                return Err(format!("host port {port} is used by a DaemonSet"));
            }
            let (lo, hi) = overhead_range(pool, &new_types);
            let best = pool.table.max_headroom(&new_types, |_| Resources::ZERO);
            let limits = if pool.remaining.is_limited() && pool.within_limits.count() < pool.table.len() {
                format!(" (the pool's remaining limits {} exclude larger types)", describe_remaining(&pool.remaining))
            } else {
                String::new()
            };
            // Short: only the parts that are not zero (issue 13 item 9).
            let on_claim = if used == Resources::ZERO {
                String::new()
            } else {
                format!(" (with {} already on the claim)", describe_resources(&used))
            };
            let overhead = match (lo == Resources::ZERO && hi == Resources::ZERO, lo == hi) {
                (true, _) => String::new(),
                (false, true) => format!(", daemonset overhead {}", describe_resources(&lo)),
                (false, false) => {
                    format!(", daemonset overhead {}..{}", describe_resources(&lo), describe_resources(&hi))
                }
            };
            return Err(format!(
                "no instance type has enough resources: requests {}{on_claim}{overhead}, largest allocatable {}{limits}",
                describe_resources(&pod.requests),
                describe_resources(&best),
            ));
        }
        // (5) minValues.
        let mut relaxed_min_values = false;
        if new_reqs.iter().any(|(_, s)| s.min_values().is_some())
            && let Some((key, wanted, reached)) = pool.table.min_values_unmet(&fitting, &new_reqs, &self.ints)
        {
            match self.input.settings.min_values_policy {
                MinValuesPolicy::Strict => {
                    return Err(format!(
                        "minValues {wanted} of {} not met: only {reached} values remain among the instance types \
                         that fit",
                        self.ints.key_name(key)
                    ));
                }
                MinValuesPolicy::BestEffort => {
                    relaxed_min_values = true;
                    for k in new_reqs.keys().collect::<Vec<_>>() {
                        if let Some(wanted) = new_reqs.get(k).and_then(ValueSet::min_values) {
                            let reached = pool.table.distinct_values(k, &fitting, &new_reqs, &self.ints);
                            let reached = u32::try_from(reached).unwrap_or(u32::MAX);
                            if reached < wanted
                                && let Some(s) = new_reqs.get_mut(k)
                            {
                                s.set_min_values(Some(reached.max(1)));
                            }
                        }
                    }
                }
            }
        }
        Ok(Accepted { reqs: new_reqs, types: fitting, relaxed_min_values })
    }

    /// Possible values of a key on a claim: the types' values allowed by the requirements, else the
    /// requirement's own finite values; `None` when neither defines the key.
    fn claim_values(&self, pi: usize, reqs: &Requirements, types: &Bits, key: Key) -> Option<Vec<Val>> {
        let table = &self.pools[pi].table;
        let allowed = reqs.get(key);
        let from_types = table.values_of(key, types);
        if !from_types.is_empty() {
            let v: Vec<Val> =
                from_types.into_iter().filter(|v| allowed.is_none_or(|s| s.has(*v, &self.ints))).collect();
            return Some(v);
        }
        match allowed {
            Some(s) if !s.is_complement() && !s.values().is_empty() => Some(s.values().to_vec()),
            _ => None,
        }
    }

    fn self_match(&self, class: usize, group: usize) -> bool {
        self.classes[class].selected.binary_search(&group).is_ok()
    }

    /// Pod affinity: whether the pod may open a domain of its own. It must select itself, and no domain
    /// its strict requirements allow may hold a matching pod yet (otherwise it must join one of those;
    /// matching pods only in domains it cannot use do not stop it, §3.11).
    fn may_bootstrap(&self, group: usize, class: usize, r: Relax) -> bool {
        let g = &self.topo.groups[group];
        if g.id.kind != Kind::Affinity || !self.self_match(class, group) {
            return false;
        }
        let c = &self.classes[class];
        let allowed = c.strict[r.term.min(c.strict.len() - 1)].get(g.id.key);
        !g.counts.iter().any(|(v, n)| *n > 0 && allowed.is_none_or(|s| s.has(*v, &self.ints)))
    }

    /// For a spread on a non-hostname key: the lowest count among the domains eligible for the pod,
    /// 0 when fewer than `minDomains` are eligible.
    fn eligible_min(&self, group: usize, class: usize, r: Relax) -> i32 {
        let g = &self.topo.groups[group];
        if g.id.kind != Kind::Spread || g.id.key == self.hostname_key {
            return 0;
        }
        let c = &self.classes[class];
        let strict = &c.strict[r.term.min(c.strict.len() - 1)];
        let allowed = strict.get(g.id.key);
        let Some(domains) = self.domains.get(&g.id.key) else { return 0 };
        let mut eligible: Vec<Val> = Vec::new();
        for topology::DomainSource { value: v, taints: source_taints, node_labels } in &domains.sources {
            if allowed.is_some_and(|s| !s.has(*v, &self.ints)) {
                continue;
            }
            if let Some(tol) = &g.id.taints_filter
                && taints::first_untolerated(source_taints, tol, true).is_some()
            {
                continue;
            }
            if let (Some(alts), Some(l)) = (&g.id.affinity_filter, node_labels)
                && !alts.iter().any(|a| a.matches_labels(l, &self.ints).is_ok())
            {
                continue;
            }
            if !eligible.contains(v) {
                eligible.push(*v);
            }
        }
        if g.id.min_domains.is_some_and(|m| usize::try_from(m).unwrap_or(0) > eligible.len()) {
            return 0;
        }
        eligible.iter().map(|&v| g.count(v)).min().unwrap_or(0)
    }

    fn compute_domains(&mut self) {
        let keys: Vec<Key> = self
            .topo
            .groups
            .iter()
            .filter(|g| g.id.kind == Kind::Spread && g.id.key != self.hostname_key)
            .map(|g| g.id.key)
            .collect();
        for key in keys {
            if self.domains.contains_key(&key) {
                continue;
            }
            let mut d = Domains::default();
            for pool in &self.pools {
                let all = pool.table.all();
                let mut vals = pool.table.values_of(key, &all);
                if let Some(s) = pool.template.get(key) {
                    vals.retain(|v| s.has(*v, &self.ints));
                    if !s.is_complement() {
                        vals.extend(s.values().iter().copied());
                    }
                }
                vals.sort_unstable();
                vals.dedup();
                for v in vals {
                    d.sources.push(topology::DomainSource { value: v, taints: pool.taints.clone(), node_labels: None });
                }
            }
            for n in &self.nodes {
                if let Some(v) = label_of(&n.labels, key) {
                    d.sources.push(topology::DomainSource {
                        value: v,
                        taints: n.taints.clone(),
                        node_labels: Some(n.labels.clone()),
                    });
                }
            }
            self.domains.insert(key, d);
        }
    }

    // ----- commits ----------------------------------------------------------------------------

    fn commit_node(&mut self, ni: usize, p: usize, class: usize) {
        let pod = &self.input.pods[p];
        let n = &mut self.nodes[ni];
        n.remaining = n.remaining.saturating_sub(pod.requests);
        n.ports.extend(self.classes[class].host_ports.iter().cloned());
        n.pods.push(p);
        for (driver, claim) in &pod.csi_volumes {
            n.volumes.entry(driver.clone()).or_default().insert(claim.clone());
        }
        if self.classes[class].has_topology {
            let n = &self.nodes[ni];
            let c = &self.classes[class];
            let mut per_group: Vec<(usize, Vec<Val>)> = Vec::new();
            for &g in c.selected.iter().chain(c.owned_inverse.iter()) {
                let key = self.topo.groups[g].id.key;
                let v = if key == self.hostname_key { Some(n.hostname) } else { label_of(&n.labels, key) };
                per_group.push((g, v.into_iter().collect()));
            }
            self.record_values(per_group);
        }
    }

    fn commit_claim(&mut self, ci: usize, p: usize, class: usize, acc: Accepted) {
        let pod = &self.input.pods[p];
        let pool = &self.pools[self.claims[ci].pool];
        let claim = &mut self.claims[ci];
        claim.used += pod.requests;
        claim.ports.extend(self.classes[class].host_ports.iter().cloned());
        claim.pods.push(p);
        claim.reqs = acc.reqs;
        claim.types = acc.types;
        claim.min_values_relaxed |= acc.relaxed_min_values;
        let used = claim.used;
        claim.headroom = pool.table.max_headroom(&claim.types, |g| pool.groups[g].overhead).saturating_sub(used);
        // Keep the order: fewest pods first, ties by opening order.
        let count = claim.pods.len();
        if let Some(pos) = self.claim_order.iter().position(|&c| c == ci) {
            self.claim_order.remove(pos);
        }
        let claims = &self.claims;
        let at = self.claim_order.partition_point(|&c| (claims[c].pods.len(), c) < (count, ci));
        self.claim_order.insert(at, ci);
        if self.classes[class].has_topology {
            let pi = self.claims[ci].pool;
            let reqs = self.claims[ci].reqs.clone();
            let types = self.claims[ci].types.clone();
            let hostname = self.claims[ci].hostname;
            let values = |s: &Solver<'_>, key: Key| s.claim_values(pi, &reqs, &types, key).unwrap_or_default();
            let mut per_group: Vec<(usize, Vec<Val>)> = Vec::new();
            let c = &self.classes[class];
            for &g in c.selected.iter().chain(c.owned_inverse.iter()) {
                let key = self.topo.groups[g].id.key;
                let vals = if key == self.hostname_key { vec![hostname] } else { values(self, key) };
                per_group.push((g, vals));
            }
            self.record_values(per_group);
        }
    }

    /// Counts a placed pod: spread and affinity record a domain only once collapsed to one value;
    /// anti-affinity (forward and inverse) blocks every domain the pod could still land in.
    fn record_values(&mut self, per_group: Vec<(usize, Vec<Val>)>) {
        for (g, vals) in per_group {
            let group = &mut self.topo.groups[g];
            match group.id.kind {
                Kind::Spread | Kind::Affinity => {
                    if let [v] = vals.as_slice() {
                        group.record(*v);
                    }
                }
                Kind::AntiAffinity | Kind::Inverse => {
                    for v in vals {
                        group.record(v);
                    }
                }
            }
        }
    }

    // ----- finishing ---------------------------------------------------------------------------

    /// Re-packs the new claims for cost (see [`crate::repack`]), group by group (same pool, same
    /// requirements), keeping the result only when cheaper. Every constraint stays exact:
    /// - topology on keys other than the hostname: a group's claims share their requirements, and a
    ///   claim joins only when each such key its pods are constrained or counted on is pinned there
    ///   to one value (or not defined by the pool's types), so every pod keeps its domain;
    /// - hostname topology and host ports become per-node rules ([`crate::repack::Rules`]); pods held
    ///   together by hostname pod affinity move as one bundle;
    /// - minValues: each type is packed as the room it shares with enough other types to meet the
    ///   minimum, and a node whose options would still miss it voids the packing.
    ///
    /// Constraints a pod was relaxed out of are not kept; those in force when it was placed are.
    /// Under a pool's limits the free pods first get their own packing ([`Self::repack_limited`],
    /// which may place more pods); then this one may only lower the price of the same pods, its
    /// claims charged within what the limits leave.
    fn repack(&mut self) {
        self.repack_limited();
        let mut groups: Vec<(usize, Requirements, Vec<usize>)> = Vec::new();
        for (ci, claim) in self.claims.iter().enumerate() {
            let pool = &self.pools[claim.pool];
            if pool.unusable.is_some() || !self.claim_movable(ci) {
                continue;
            }
            match groups.iter_mut().find(|(pi, reqs, _)| *pi == claim.pool && *reqs == claim.reqs) {
                Some((_, _, list)) => list.push(ci),
                None => groups.push((claim.pool, claim.reqs.clone(), vec![ci])),
            }
        }
        let mut replaced: Vec<usize> = Vec::new();
        let mut added: Vec<Claim> = Vec::new();
        for (pi, reqs, claims) in groups {
            if let Some(new_claims) = self.repack_group(pi, &reqs, &claims, added.len()) {
                // What the pool's limits have left: the old claims' charges back, the new ones taken.
                let old = claims.iter().fold(Resources::ZERO, |a, &c| a + self.claims[c].charged);
                let new = new_claims.iter().fold(Resources::ZERO, |a, c| a + c.charged);
                let pool = &mut self.pools[pi];
                for ((r, o), n) in pool.remaining.res.iter_mut().zip(res4(&old)).zip(res4(&new)) {
                    if let Some(r) = r {
                        *r = r.saturating_add(o).saturating_sub(n);
                    }
                }
                if let Some(n) = &mut pool.remaining.nodes {
                    *n += i64::try_from(claims.len()).unwrap_or(0) - i64::try_from(new_claims.len()).unwrap_or(0);
                }
                refresh_limits(pool);
                replaced.extend(claims.iter().copied());
                added.extend(new_claims);
            }
        }
        self.replace_claims(replaced, added);
    }

    /// Whether a pod the loop left pending may join a limited pool's packing: no resource the types
    /// lack, every constraint on it on the hostname (kept by the packing's rules), no hostname
    /// affinity of its own (it would need a node of matching pods), no host port a DaemonSet of the
    /// pool may hold.
    fn pending_movable(&self, p: usize, pi: usize) -> bool {
        if self.is_free(p) {
            return true;
        }
        let class = self.pod_class[p];
        let c = &self.classes[class];
        let ds_ports = self.pools[pi].groups.iter().any(|g| !g.ports.is_empty());
        if !c.extended.is_empty() || (ds_ports && !c.host_ports.is_empty()) {
            return false;
        }
        let own = self.active(class, Relax::default());
        own.iter().all(|pc| self.topo.groups[pc.group].id.kind != Kind::Affinity)
            && own
                .iter()
                .map(|pc| pc.group)
                .chain(c.selected.iter().copied())
                .all(|g| self.topo.groups[g].id.key == self.hostname_key)
    }

    /// Whether every pod of a claim may move to another claim of the same requirements with the
    /// constraints kept exact (see [`Self::repack`]).
    fn claim_movable(&self, ci: usize) -> bool {
        let claim = &self.claims[ci];
        let pool = &self.pools[claim.pool];
        let ds_ports = pool.groups.iter().any(|g| !g.ports.is_empty());
        let all = pool.table.all();
        let stable = |key: Key| {
            key == self.hostname_key
                || claim.reqs.get(key).is_some_and(|s| !s.is_complement() && s.values().len() == 1)
                || pool.table.values_of(key, &all).is_empty()
        };
        claim.pods.iter().all(|&p| {
            let class = self.pod_class[p];
            let c = &self.classes[class];
            if !c.extended.is_empty() || (ds_ports && !c.host_ports.is_empty()) {
                return false;
            }
            if !c.has_topology {
                return true;
            }
            let own = self.active(class, self.relax_of[p]);
            own.iter().map(|pc| pc.group).chain(c.selected.iter().copied()).all(|g| stable(self.topo.groups[g].id.key))
        })
    }

    /// Re-packs one group of claims; the new claims when cheaper (hostnames numbered from `first`).
    fn repack_group(&mut self, pi: usize, reqs: &Requirements, claims: &[usize], first: usize) -> Option<Vec<Claim>> {
        let pool = &self.pools[pi];
        let table = &pool.table;
        let mut mask = table.requirement_mask(reqs, &self.ints);
        table.retain_offerings(&mut mask, reqs, &self.ints);
        let types: Vec<usize> = mask.iter().collect();
        if types.is_empty() {
            return None;
        }
        let overhead = |i: usize| pool.groups[table.types[i].ds_group].overhead;
        let prices: Vec<f64> = types.iter().map(|&i| table.price_under(i, reqs, &self.ints)).collect();
        let min_values = reqs.iter().any(|(_, s)| s.min_values().is_some());
        let rooms: Vec<Resources> = if min_values {
            self.shared_rooms(pi, reqs, &types)
        } else {
            types.iter().map(|&i| table.types[i].allocatable.saturating_sub(overhead(i))).collect()
        };
        let all_bins: Vec<crate::repack::Bin> =
            rooms.iter().zip(&prices).map(|(&room, &price)| crate::repack::Bin { room, price }).collect();
        let (units, rules) = self.units(claims);
        let items: Vec<Resources> =
            units.iter().map(|u| u.iter().fold(Resources::ZERO, |a, &p| a + self.input.pods[p].requests)).collect();
        // Large catalogues: the packings see a bounded set of types; each node is then priced on
        // the cheapest of all the types that hold it.
        let bins: Vec<crate::repack::Bin> =
            crate::repack::candidates(&all_bins, &items).into_iter().map(|k| all_bins[k]).collect();
        let mut by_price: Vec<usize> = (0..types.len()).collect();
        by_price.sort_by(|&a, &b| prices[a].total_cmp(&prices[b]).then(a.cmp(&b)));
        let holds = |k: usize, used: &Resources| (*used + overhead(types[k])).fits(&table.types[types[k]].allocatable);
        // Under limits: what the limits leave for this group's nodes (the old claims' charges back).
        let rem = pool.remaining;
        let budget = (rem.is_limited() || rem.nodes.is_some()).then(|| {
            let mut res = rem.res;
            for &ci in claims {
                for (r, c) in res.iter_mut().zip(res4(&self.claims[ci].charged)) {
                    if let Some(r) = r {
                        *r = r.saturating_add(c);
                    }
                }
            }
            let nodes = rem.nodes.map(|n| usize::try_from(n.max(0)).unwrap_or(0) + claims.len());
            crate::repack::Budget { res, nodes }
        });
        let cap = |k: usize| table.types[types[k]].capacity;
        // What finishing would launch for a node: its cheapest option, at that price; its options: the
        // types holding it, under limits only those no larger than that one on the limited
        // resources (so that the claim's charge, its largest option, is that type's capacity).
        // The options are only needed while comparing packings under limits or minValues; else
        // they are listed for the winner alone.
        let listed = budget.is_some() || min_values;
        let options = |used: &Resources, list: bool| -> Option<(f64, Bits)> {
            let &c = by_price.iter().find(|&&k| holds(k, used))?;
            let mut fit = Bits::empty(if list { table.len() } else { 0 });
            for (k, &i) in types.iter().enumerate().filter(|_| list) {
                if holds(k, used) && budget.as_ref().is_none_or(|b| b.no_larger(&cap(k), &cap(c))) {
                    fit.set(i);
                }
            }
            Some((prices[c], fit))
        };
        let price_of =
            |fit: &Bits| fit.iter().map(|i| table.price_under(i, reqs, &self.ints)).fold(f64::INFINITY, f64::min);
        let old: f64 = claims.iter().map(|&c| price_of(&self.claims[c].types)).sum();
        let mut best: Option<(f64, Vec<PackedNode>)> = None;
        for how in [crate::repack::Packing::Value, crate::repack::Packing::Balanced, crate::repack::Packing::Ffd] {
            let Some(packed) = crate::repack::pack_ruled(&items, &rules, &bins, how) else { continue };
            let mut nodes = Vec::new();
            let mut cost = 0.0;
            let mut charged = Resources::ZERO;
            for (_, idx) in packed {
                let members: Vec<usize> = idx.iter().flat_map(|&k| units[k].iter().copied()).collect();
                let used = idx.iter().fold(Resources::ZERO, |a, &k| a + items[k]);
                match options(&used, listed) {
                    Some((price, fit)) if !min_values || table.min_values_unmet(&fit, reqs, &self.ints).is_none() => {
                        cost += price;
                        if budget.is_some() {
                            charged += table.max_capacity(&fit);
                        }
                        nodes.push((members, used, fit));
                    }
                    _ => {
                        cost = f64::INFINITY;
                        break;
                    }
                }
            }
            if budget.as_ref().is_some_and(|b| !b.holds(&res4(&charged), nodes.len())) {
                continue;
            }
            if cost.is_finite() && best.as_ref().is_none_or(|(c, _)| cost < *c) {
                best = Some((cost, nodes));
            }
        }
        let (new_cost, nodes) = best?;
        if new_cost + 1e-9 >= old {
            return None;
        }
        let relaxed = claims.iter().any(|&c| self.claims[c].min_values_relaxed);
        let mut out = Vec::new();
        for (members, used, fit) in nodes {
            let fit = if listed { fit } else { options(&used, true).map(|(_, f)| f).unwrap_or(fit) };
            let headroom = table.max_headroom(&fit, |g| pool.groups[g].overhead).saturating_sub(used);
            let hostname = self.ints.val(&format!("hostname-placeholder-r{:04}", first + out.len()));
            let ports: Vec<HostPort> =
                members.iter().flat_map(|&p| self.classes[self.pod_class[p]].host_ports.iter().cloned()).collect();
            out.push(Claim {
                pool: pi,
                reqs: reqs.clone(),
                charged: table.max_capacity(&fit),
                types: fit,
                used,
                ports,
                hostname,
                pods: members,
                headroom,
                min_values_relaxed: relaxed,
            });
        }
        Some(out)
    }

    /// The claims' pods as units that move together (a pod alone, or the pods its hostname pod
    /// affinity keeps on its node), and the per-node rules between units: hostname anti-affinity
    /// (the owner blocks its group, the pods it selects mark it), hostname spread (marks capped at
    /// `maxSkew`), host ports (mark and block).
    fn units(&self, claims: &[usize]) -> (Vec<Vec<usize>>, crate::repack::Rules) {
        let lists: Vec<Vec<usize>> = claims.iter().map(|&c| self.claims[c].pods.clone()).collect();
        self.units_of(&lists)
    }

    /// [`Self::units`] of lists of pods, each list the pods of one node.
    fn units_of(&self, lists: &[Vec<usize>]) -> (Vec<Vec<usize>>, crate::repack::Rules) {
        let hostname = |g: usize| self.topo.groups[g].id.key == self.hostname_key;
        let mut units: Vec<Vec<usize>> = Vec::new();
        let mut caps: std::collections::HashMap<u32, i64> = std::collections::HashMap::new();
        let mut spread_owned = std::collections::HashSet::new();
        for pods in lists {
            let affinities: Vec<usize> = pods
                .iter()
                .flat_map(|&p| {
                    let class = self.pod_class[p];
                    self.active(class, self.relax_of[p])
                        .into_iter()
                        .filter(|pc| self.topo.groups[pc.group].id.kind == Kind::Affinity && hostname(pc.group))
                        .map(|pc| pc.group)
                })
                .collect();
            let mut bundle: Vec<usize> = Vec::new();
            for &p in pods {
                let class = self.pod_class[p];
                let c = &self.classes[class];
                let own = self.active(class, self.relax_of[p]);
                for pc in &own {
                    let g = &self.topo.groups[pc.group];
                    if g.id.kind == Kind::Spread && hostname(pc.group) {
                        spread_owned.insert(pc.group);
                    }
                }
                let affine = own.iter().any(|pc| affinities.contains(&pc.group))
                    || c.selected.iter().any(|g| affinities.contains(g));
                if affine {
                    bundle.push(p);
                } else {
                    units.push(vec![p]);
                }
            }
            if !bundle.is_empty() {
                units.push(bundle);
            }
        }
        for &g in &spread_owned {
            caps.insert(u32::try_from(g).unwrap_or(u32::MAX), i64::from(self.topo.groups[g].id.max_skew));
        }
        // Host ports after the topology groups' tags.
        let mut ports: Vec<(i32, String)> = Vec::new();
        let n_groups = self.topo.groups.len();
        let mut sets: Vec<crate::repack::TagSet> = Vec::new();
        let mut index: HashMap<crate::repack::TagSet, usize> = HashMap::new();
        let mut item_set = Vec::with_capacity(units.len());
        for u in &units {
            let mut marks: BTreeMap<u32, i64> = BTreeMap::new();
            let mut blocks: Vec<u32> = Vec::new();
            for &p in u {
                let class = self.pod_class[p];
                let c = &self.classes[class];
                for &g in &c.selected {
                    let kind = self.topo.groups[g].id.kind;
                    if hostname(g)
                        && (kind == Kind::AntiAffinity || (kind == Kind::Spread && spread_owned.contains(&g)))
                    {
                        *marks.entry(u32::try_from(g).unwrap_or(u32::MAX)).or_default() += 1;
                    }
                }
                for pc in self.active(class, self.relax_of[p]) {
                    if self.topo.groups[pc.group].id.kind == Kind::AntiAffinity && hostname(pc.group) {
                        blocks.push(u32::try_from(pc.group).unwrap_or(u32::MAX));
                    }
                }
                for hp in &c.host_ports {
                    let key = (hp.port, hp.protocol.clone());
                    let at = match ports.iter().position(|k| *k == key) {
                        Some(at) => at,
                        None => {
                            ports.push(key);
                            ports.len() - 1
                        }
                    };
                    let tag = u32::try_from(n_groups + at).unwrap_or(u32::MAX);
                    *marks.entry(tag).or_default() += 1;
                    blocks.push(tag);
                }
            }
            blocks.sort_unstable();
            blocks.dedup();
            let set = crate::repack::TagSet { marks: marks.into_iter().collect(), blocks };
            let at = match index.get(&set) {
                Some(&at) => at,
                None => {
                    index.insert(set.clone(), sets.len());
                    sets.push(set);
                    sets.len() - 1
                }
            };
            item_set.push(at);
        }
        (units, crate::repack::Rules { sets, item_set, caps })
    }

    /// minValues as room: per type, the room it shares with the types that, together with it, reach
    /// every minValues of `reqs` (chosen greedily, those covering most of its room first). A node
    /// that fits this room fits enough types to meet the minimums; a type that cannot reach them
    /// has no room.
    fn shared_rooms(&self, pi: usize, reqs: &Requirements, types: &[usize]) -> Vec<Resources> {
        let pool = &self.pools[pi];
        let table = &pool.table;
        let room = |i: usize| table.types[i].allocatable.saturating_sub(pool.groups[table.types[i].ds_group].overhead);
        let wanted: Vec<(Key, usize)> = reqs
            .iter()
            .filter_map(|(k, s)| s.min_values().map(|m| (k, usize::try_from(m).unwrap_or(usize::MAX))))
            .collect();
        let values = |i: usize, k: Key| -> Vec<Val> {
            let mut one = Bits::empty(table.len());
            one.set(i);
            let allowed = reqs.get(k);
            table.values_of(k, &one).into_iter().filter(|v| allowed.is_none_or(|s| s.has(*v, &self.ints))).collect()
        };
        let cover = |a: &Resources, b: &Resources| {
            let r = |x: i64, y: i64| if y <= 0 { 1.0 } else { (x as f64 / y as f64).min(1.0) };
            r(a.cpu_millis, b.cpu_millis).min(r(a.memory_bytes, b.memory_bytes)).min(r(a.pods, b.pods))
        };
        types
            .iter()
            .map(|&i| {
                let mut shared = room(i);
                for &(k, m) in &wanted {
                    let mut seen: Vec<Val> = values(i, k);
                    let mut others: Vec<usize> = types.iter().copied().filter(|&j| j != i).collect();
                    others.sort_by(|&a, &b| {
                        cover(&room(b), &room(i)).total_cmp(&cover(&room(a), &room(i))).then(a.cmp(&b))
                    });
                    for j in others {
                        if seen.len() >= m {
                            break;
                        }
                        let new: Vec<Val> = values(j, k).into_iter().filter(|v| !seen.contains(v)).collect();
                        if new.is_empty() {
                            continue;
                        }
                        seen.extend(new);
                        let r = room(j);
                        shared = Resources {
                            cpu_millis: shared.cpu_millis.min(r.cpu_millis),
                            memory_bytes: shared.memory_bytes.min(r.memory_bytes),
                            ephemeral_storage_bytes: shared.ephemeral_storage_bytes.min(r.ephemeral_storage_bytes),
                            pods: shared.pods.min(r.pods),
                        };
                    }
                    if seen.len() < m {
                        shared = Resources::ZERO;
                    }
                }
                shared
            })
            .collect()
    }

    /// Drops the claims at the indexes `replaced` and appends `added` (a repack's result).
    fn replace_claims(&mut self, mut replaced: Vec<usize>, added: Vec<Claim>) {
        if replaced.is_empty() {
            return;
        }
        replaced.sort_unstable();
        let mut kept: Vec<Claim> = Vec::new();
        for (ci, c) in std::mem::take(&mut self.claims).into_iter().enumerate() {
            if replaced.binary_search(&ci).is_err() {
                kept.push(c);
            }
        }
        kept.extend(added);
        self.claims = kept;
        self.claim_order = (0..self.claims.len()).collect();
    }

    /// A pod with no topology constraint and no host port, none of whose constraints come from
    /// other pods, and with no resource the types lack: free to move between claims.
    fn is_free(&self, p: usize) -> bool {
        let c = &self.classes[self.pod_class[p]];
        !c.has_topology && c.host_ports.is_empty() && c.inverse_selected.is_empty() && c.extended.is_empty()
    }

    /// Limits as part of the packing: per limited pool (cpu, memory, ephemeral storage, pods or node
    /// count), the claims holding only free pods, group by group (same requirements), are re-packed
    /// together with the free pods left pending that such a claim would take, into the mix of types
    /// placing the most pods first and costing least second within what the limits leave
    /// ([`crate::repack::pack_within`]). Each new claim keeps only the options no larger than its
    /// chosen type on the limited resources, so what it charges (its largest option) stays within the
    /// limits and `nodes` is counted exactly. Kept only when it places more pods, or as many for less.
    /// Pods still left out for want of room within the limits are told so.
    fn repack_limited(&mut self) {
        let placeholder = self.ints.val("hostname-placeholder-limits");
        let mut replaced: Vec<usize> = Vec::new();
        let mut added: Vec<Claim> = Vec::new();
        let mut taken = vec![false; self.input.pods.len()];
        for pi in 0..self.pools.len() {
            let pool = &self.pools[pi];
            if !(pool.remaining.is_limited() || pool.remaining.nodes.is_some()) || pool.unusable.is_some() {
                continue;
            }
            let mut groups: Vec<(Requirements, Vec<usize>)> = Vec::new();
            for (ci, claim) in self.claims.iter().enumerate() {
                if claim.pool != pi
                    || claim.reqs.iter().any(|(_, s)| s.min_values().is_some())
                    || !self.claim_movable(ci)
                {
                    continue;
                }
                match groups.iter_mut().find(|(reqs, _)| *reqs == claim.reqs) {
                    Some((_, list)) => list.push(ci),
                    None => groups.push((claim.reqs.clone(), vec![ci])),
                }
            }
            for (reqs, claims) in groups {
                self.repack_limited_group(pi, &reqs, &claims, placeholder, &mut taken, &mut replaced, &mut added);
            }
        }
        self.replace_claims(replaced, added);
    }

    #[allow(clippy::too_many_arguments)]
    fn repack_limited_group(
        &mut self,
        pi: usize,
        reqs: &Requirements,
        claims: &[usize],
        placeholder: Val,
        taken: &mut [bool],
        replaced: &mut Vec<usize>,
        added: &mut Vec<Claim>,
    ) {
        let pool = &self.pools[pi];
        let table = &pool.table;
        let mut mask = table.requirement_mask(reqs, &self.ints);
        table.retain_offerings(&mut mask, reqs, &self.ints);
        let types: Vec<usize> = mask.iter().collect();
        if types.is_empty() {
            return;
        }
        let overhead = |i: usize| pool.groups[table.types[i].ds_group].overhead;
        let prices: Vec<f64> = types.iter().map(|&i| table.price_under(i, reqs, &self.ints)).collect();
        let bins: Vec<crate::repack::Bin> = types
            .iter()
            .zip(&prices)
            .map(|(&i, &price)| crate::repack::Bin {
                room: table.types[i].allocatable.saturating_sub(overhead(i)),
                price,
            })
            .collect();
        let caps: Vec<Resources> = types.iter().map(|&i| table.types[i].capacity).collect();
        // Free pods left pending that a claim of this group would take (requirements, taints, size).
        let all = table.all();
        let extra: Vec<usize> = (0..self.input.pods.len())
            .filter(|&p| !self.placed[p] && !taken[p] && self.pending_movable(p, pi))
            .filter(|&p| {
                let class = self.pod_class[p];
                let working = self.working(class, Relax::default());
                self.claim_accepts(
                    pi,
                    &pool.template,
                    &all,
                    Resources::ZERO,
                    &[],
                    placeholder,
                    &self.input.pods[p],
                    class,
                    Relax::default(),
                    &working,
                    &[],
                )
                .is_ok_and(|acc| acc.reqs == *reqs)
            })
            .collect();
        let rem = pool.remaining;
        let mut res = rem.res;
        for &ci in claims {
            let c = self.claims[ci].charged;
            for (r, c) in res.iter_mut().zip([c.cpu_millis, c.memory_bytes, c.ephemeral_storage_bytes, c.pods]) {
                if let Some(r) = r {
                    *r = r.saturating_add(c);
                }
            }
        }
        let budget = crate::repack::Budget {
            res,
            nodes: rem.nodes.map(|n| usize::try_from(n.max(0)).unwrap_or(0) + claims.len()),
        };
        let pods: Vec<usize> =
            claims.iter().flat_map(|&c| self.claims[c].pods.iter().copied()).chain(extra.iter().copied()).collect();
        // Units (a pod, or the pods its hostname affinity holds together) and the per-node rules;
        // the claims' pods listed first, so that they are the ones kept among equal units.
        let lists: Vec<Vec<usize>> =
            claims.iter().map(|&c| self.claims[c].pods.clone()).chain(extra.iter().map(|&p| vec![p])).collect();
        let (units, rules) = self.units_of(&lists);
        let items: Vec<Resources> =
            units.iter().map(|u| u.iter().fold(Resources::ZERO, |a, &p| a + self.input.pods[p].requests)).collect();
        // Large catalogues: the packing sees a bounded set of types (indices into `types`).
        let cand = crate::repack::candidates(&bins, &items);
        let (sub_bins, sub_caps): (Vec<crate::repack::Bin>, Vec<Resources>) =
            cand.iter().map(|&k| (bins[k], caps[k])).unzip();
        let plan: Vec<(usize, Vec<usize>)> =
            crate::repack::pack_within_ruled(&items, &rules, &sub_bins, &sub_caps, &budget)
                .into_iter()
                .map(|(b, idx)| (cand[b], idx))
                .collect();
        // Per node: members, requests, the options (fit and no larger than the chosen type on the
        // limited resources), the price finishing would launch at.
        let mut nodes: Vec<(Vec<usize>, Resources, Bits, f64)> = Vec::new();
        for (b, idx) in &plan {
            let members: Vec<usize> = idx.iter().flat_map(|&k| units[k].iter().copied()).collect();
            let used = members.iter().fold(Resources::ZERO, |a, &p| a + self.input.pods[p].requests);
            let mut fit = Bits::empty(table.len());
            let mut price = f64::INFINITY;
            for (k, &i) in types.iter().enumerate() {
                if (used + overhead(i)).fits(&table.types[i].allocatable) && budget.no_larger(&caps[k], &caps[*b]) {
                    fit.set(i);
                    price = price.min(prices[k]);
                }
            }
            if !price.is_finite() {
                return; // cannot happen: the chosen type holds its items
            }
            nodes.push((members, used, fit, price));
        }
        let cheapest = |used: &Resources| -> f64 {
            types
                .iter()
                .zip(&prices)
                .filter(|&(&i, _)| (*used + overhead(i)).fits(&table.types[i].allocatable))
                .map(|(_, &p)| p)
                .fold(f64::INFINITY, f64::min)
        };
        let old_placed: usize = claims.iter().map(|&c| self.claims[c].pods.len()).sum();
        let old_price: f64 = claims.iter().map(|&c| cheapest(&self.claims[c].used)).sum();
        let new_placed: usize = nodes.iter().map(|n| n.0.len()).sum();
        let new_price: f64 = nodes.iter().map(|n| n.3).sum();
        let better = new_placed > old_placed || (new_placed == old_placed && new_price + 1e-9 < old_price);
        let fits_a_type = |p: usize| bins.iter().any(|b| self.input.pods[p].requests.fits(&b.room));
        // A type holding the pod whose capacity alone is within what the limits leave.
        let fits_alone = |p: usize| {
            bins.iter().zip(&caps).any(|(b, c)| {
                self.input.pods[p].requests.fits(&b.room)
                    && budget.holds(&[c.cpu_millis, c.memory_bytes, c.ephemeral_storage_bytes, c.pods], 1)
            })
        };
        let limits = describe_limits(&self.input.pools[pool.input].limits);
        let left = describe_remaining(&Remaining {
            res: budget.res,
            nodes: budget.nodes.map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
        });
        let name = pool.name.clone();
        let placed_now = if better { new_placed } else { old_placed };
        let left_out: Vec<usize> = if better {
            let mut inside = vec![false; self.input.pods.len()];
            for n in &nodes {
                for &p in &n.0 {
                    inside[p] = true;
                }
            }
            pods.iter().copied().filter(|&p| !inside[p]).collect()
        } else {
            extra.clone()
        };
        if better {
            replaced.extend(claims.iter().copied());
            let mut charged_total = Resources::ZERO;
            let mut new_claims = Vec::new();
            for (members, used, fit, _) in nodes {
                let headroom = table.max_headroom(&fit, |g| pool.groups[g].overhead).saturating_sub(used);
                let charged = table.max_capacity(&fit);
                charged_total += charged;
                new_claims.push((members, used, fit, headroom, charged));
            }
            let old_charged = claims.iter().fold(Resources::ZERO, |a, &c| a + self.claims[c].charged);
            let n_new = new_claims.len();
            for (members, used, fit, headroom, charged) in new_claims {
                for &p in &members {
                    self.placed[p] = true;
                    self.errors[p] = None;
                    taken[p] = true;
                }
                let hostname = self.ints.val(&format!("hostname-placeholder-l{:04}", added.len()));
                added.push(Claim {
                    pool: pi,
                    reqs: reqs.clone(),
                    types: fit,
                    used,
                    ports: Vec::new(),
                    hostname,
                    pods: members,
                    headroom,
                    min_values_relaxed: false,
                    charged,
                });
            }
            let pool = &mut self.pools[pi];
            let back = [
                old_charged.cpu_millis,
                old_charged.memory_bytes,
                old_charged.ephemeral_storage_bytes,
                old_charged.pods,
            ];
            let now = [
                charged_total.cpu_millis,
                charged_total.memory_bytes,
                charged_total.ephemeral_storage_bytes,
                charged_total.pods,
            ];
            for ((r, b), n) in pool.remaining.res.iter_mut().zip(back).zip(now) {
                if let Some(r) = r {
                    *r = r.saturating_add(b).saturating_sub(n);
                }
            }
            if let Some(n) = &mut pool.remaining.nodes {
                *n += i64::try_from(claims.len()).unwrap_or(0) - i64::try_from(n_new).unwrap_or(0);
            }
            refresh_limits(pool);
        }
        // Pods left out stay candidates for the next limited pools.
        for p in left_out {
            if !fits_a_type(p) {
                continue;
            }
            self.placed[p] = false;
            let reason = if fits_alone(p) {
                format!(
                    "nodepool {name}: limits {limits} reached: the best packing within them places {placed_now} of \
                     the {} pods that could share these nodes",
                    pods.len()
                )
            } else {
                format!(
                    "nodepool {name}: every instance type that holds it exceeds what the limits {limits} leave for \
                     new nodes ({left})"
                )
            };
            let prefix = format!("nodepool {name}: ");
            let others: Vec<String> = self.errors[p]
                .take()
                .unwrap_or_default()
                .split("; ")
                .filter(|s| !s.is_empty() && !s.starts_with(&prefix))
                .map(str::to_string)
                .collect();
            self.errors[p] = Some(std::iter::once(reason).chain(others).collect::<Vec<_>>().join("; "));
        }
    }

    fn finish(mut self) -> Decision {
        let mut decision = Decision::default();
        let max_types = self.input.settings.max_instance_types.max(1);
        let instance_type_key = self.ints.key(labels::INSTANCE_TYPE);
        let nodepool_key = self.ints.key(labels::NODEPOOL);
        let mut dropped: Vec<(usize, String)> = Vec::new();
        for claim in &self.claims {
            let pool = &self.pools[claim.pool];
            let table = &pool.table;
            let mut options: Vec<(f64, usize)> =
                claim.types.iter().map(|i| (table.price_under(i, &claim.reqs, &self.ints), i)).collect();
            options.retain(|(p, _)| p.is_finite());
            options.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| table.types[a.1].name.cmp(&table.types[b.1].name)));
            options.truncate(max_types);
            let mut kept = Bits::empty(table.len());
            for &(_, i) in &options {
                kept.set(i);
            }
            if options.is_empty() {
                for &p in &claim.pods {
                    dropped.push((p, format!("nodepool {}: no instance type has an available offering", pool.name)));
                }
                continue;
            }
            if self.input.settings.min_values_policy == MinValuesPolicy::Strict
                && let Some((key, wanted, reached)) = table.min_values_unmet(&kept, &claim.reqs, &self.ints)
            {
                for &p in &claim.pods {
                    dropped.push((
                        p,
                        format!(
                            "nodepool {}: minValues {wanted} of {} not met after keeping the {max_types} cheapest \
                             instance types ({reached} values)",
                            pool.name,
                            self.ints.key_name(key)
                        ),
                    ));
                }
                continue;
            }
            let overhead = (0..pool.groups.len())
                .filter(|&g| options.iter().any(|&(_, i)| table.types[i].ds_group == g))
                .map(|g| pool.groups[g].overhead)
                .min_by_key(|o| (o.cpu_millis, o.memory_bytes, o.ephemeral_storage_bytes, o.pods))
                .unwrap_or(Resources::ZERO);
            let capacity_types = table.capacity_types(&kept, &claim.reqs, &self.ints);
            let mut requirements: Vec<NodeSelectorRequirement> = Vec::new();
            let mut claim_labels: BTreeMap<String, String> = self.input.pools[pool.input].labels.clone();
            for (k, set) in claim.reqs.iter() {
                if k == self.hostname_key || k == instance_type_key || k == self.capacity_type_key {
                    continue;
                }
                let name = self.ints.key_name(k).to_string();
                let mut single = set.clone();
                // One value per custom label (well-known keys keep their sets).
                if k >= self.n_well_known && !set.is_complement() && set.values().len() > 1 {
                    let mut vals: Vec<&str> = set.values().iter().map(|&v| self.ints.val_name(v)).collect();
                    vals.sort_unstable();
                    if let Some(first) = vals.first()
                        && let Some(v) = self.ints.lookup_val(first)
                    {
                        single = ValueSet::single(v).with_min_values(set.min_values());
                    }
                }
                if (k >= self.n_well_known || k == nodepool_key)
                    && !single.is_complement()
                    && let [v] = single.values()
                {
                    claim_labels.insert(name.clone(), self.ints.val_name(*v).to_string());
                }
                let mut one = Requirements::new();
                one.add(k, single, &self.ints);
                requirements.extend(one.to_api(&self.ints));
            }
            let it_min = claim.reqs.get(instance_type_key).and_then(ValueSet::min_values);
            requirements.push(NodeSelectorRequirement {
                key: labels::INSTANCE_TYPE.to_string(),
                operator: Operator::In,
                values: options.iter().map(|&(_, i)| table.types[i].name.clone()).collect(),
                min_values: it_min.and_then(|m| i32::try_from(m).ok()),
            });
            requirements.push(NodeSelectorRequirement {
                key: labels::CAPACITY_TYPE.to_string(),
                operator: Operator::In,
                values: capacity_types.iter().map(|&v| self.ints.val_name(v).to_string()).collect(),
                min_values: claim
                    .reqs
                    .get(self.capacity_type_key)
                    .and_then(ValueSet::min_values)
                    .and_then(|m| i32::try_from(m).ok()),
            });
            requirements.sort_by(|a, b| a.key.cmp(&b.key));
            let input_pool = &self.input.pools[pool.input];
            let mut pods = claim.pods.clone();
            pods.sort_unstable();
            decision.new_claims.push(NewClaim {
                nodepool: pool.name.clone(),
                price: options[0].0,
                instance_types: options
                    .iter()
                    .map(|&(price, i)| ClaimOption { name: table.types[i].name.clone(), price })
                    .collect(),
                pods,
                requests: claim.used + overhead,
                requirements,
                labels: claim_labels,
                taints: input_pool.taints.clone(),
                startup_taints: input_pool.startup_taints.clone(),
                min_values_relaxed: claim.min_values_relaxed,
            });
        }
        for n in &self.nodes {
            if !n.pods.is_empty() {
                let mut pods = n.pods.clone();
                pods.sort_unstable();
                decision.existing.push(NodeAssignment { node: n.input, pods });
            }
        }
        decision.existing.sort_by_key(|a| a.node);
        for (p, why) in dropped {
            self.placed[p] = false;
            self.errors[p] = Some(why);
        }
        for p in 0..self.input.pods.len() {
            if !self.placed[p] {
                let reason = self.errors[p].take().unwrap_or_else(|| "not attempted".to_string());
                decision.unschedulable.push(Unschedulable { pod: p, reason });
            }
        }
        decision
    }
}

#[allow(clippy::too_many_arguments)]
fn keep_type(
    t: &TypeInfo,
    template: &Requirements,
    template_taints: &[crate::model::Taint],
    ds: &[DsPod],
    groups: &mut Vec<DsGroup>,
    ints: &Interner,
    well_known: &impl Fn(Key) -> bool,
    ds_template: &Requirements,
    zone: Key,
    ct: Key,
) -> Result<(f64, usize), String> {
    if let Err(k) = type_meets(t, template, ints) {
        return Err(format!("excluded by the requirement on {}", ints.key_name(k)));
    }
    let price = t
        .offerings
        .iter()
        .filter(|o| {
            o.available
                && template.get(zone).is_none_or(|s| s.has(o.zone, ints))
                && template.get(ct).is_none_or(|s| s.has(o.capacity_type, ints))
        })
        .map(|o| o.price)
        .min_by(f64::total_cmp);
    let Some(price) = price else {
        return Err("no available offering".to_string());
    };
    let members: Vec<usize> = ds
        .iter()
        .enumerate()
        .filter(|(_, d)| daemonsets::compatible_with_type(d, ds_template, template_taints, t, ints, well_known))
        .map(|(i, _)| i)
        .collect();
    let group = daemonsets::group_of(groups, members, ds);
    let overhead = groups[group].overhead + Resources { pods: 1, ..Resources::ZERO };
    if !overhead.fits(&t.allocatable) {
        return Err(format!("daemonset overhead {} does not fit", describe_resources(&groups[group].overhead)));
    }
    Ok((price, group))
}

/// A re-packed node: its pods, their requests, its options.
type PackedNode = (Vec<usize>, Resources, Bits);

/// cpu, memory, ephemeral storage, pods: the order of limits.
fn res4(r: &Resources) -> [i64; 4] {
    [r.cpu_millis, r.memory_bytes, r.ephemeral_storage_bytes, r.pods]
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

/// A pool's `limits` as `cpu=24, memory=16Gi`.
fn describe_limits(l: &crate::model::Limits) -> String {
    describe_remaining(&Remaining {
        res: [l.cpu_millis, l.memory_bytes, l.ephemeral_storage_bytes, l.pods],
        nodes: l.nodes,
    })
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

fn overhead_range(pool: &PoolCtx, types: &Bits) -> (Resources, Resources) {
    let mut lo: Option<Resources> = None;
    let mut hi = Resources::ZERO;
    for i in types.iter() {
        let o = pool.groups[pool.table.types[i].ds_group].overhead;
        lo = Some(match lo {
            None => o,
            Some(l) => Resources {
                cpu_millis: l.cpu_millis.min(o.cpu_millis),
                memory_bytes: l.memory_bytes.min(o.memory_bytes),
                ephemeral_storage_bytes: l.ephemeral_storage_bytes.min(o.ephemeral_storage_bytes),
                pods: l.pods.min(o.pods),
            },
        });
        hi = Resources {
            cpu_millis: hi.cpu_millis.max(o.cpu_millis),
            memory_bytes: hi.memory_bytes.max(o.memory_bytes),
            ephemeral_storage_bytes: hi.ephemeral_storage_bytes.max(o.ephemeral_storage_bytes),
            pods: hi.pods.max(o.pods),
        };
    }
    (lo.unwrap_or(Resources::ZERO), hi)
}

fn label_of(labels: &[(Key, Val)], key: Key) -> Option<Val> {
    labels.binary_search_by_key(&key, |(k, _)| *k).ok().map(|i| labels[i].1)
}

fn working_description(r: &Requirements, ints: &Interner) -> String {
    if r.is_empty() { "of the pool".to_string() } else { r.describe(ints) }
}

/// Limits as part of the packing (issue 14, item 1), on the built-in flavors.
#[cfg(test)]
mod limit_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use crate::model::{Input, Limits, Operator, Settings};
    use crate::solve;
    use crate::testkit::*;
    use crds::labels::CLEVER_FLAVOR;

    /// The pool of examples/general-purpose.yaml: 2XS–M, at most 24 CPU and 16Gi.
    fn example_pool() -> crate::model::Pool {
        let mut p = pool("default");
        p.requirements = vec![req(CLEVER_FLAVOR, Operator::In, &["2XS", "XS", "S", "M"])];
        p.limits = Limits { cpu_millis: Some(24_000), memory_bytes: Some(16 * GI), ..Limits::default() };
        p
    }

    fn pods(n: usize, cpu: i64, mem: i64) -> Vec<crate::model::Pod> {
        (0..n).map(|i| pod(&format!("p{i:02}"), cpu, mem)).collect()
    }

    fn plain(i: &Input) -> Input {
        Input { settings: Settings { repack: false, ..Settings::default() }, ..i.clone() }
    }

    struct Case {
        name: &'static str,
        input: Input,
        /// Cheapest option of each new claim.
        claims: Vec<&'static str>,
        /// Pods left pending, each with the limits named in its reason.
        pending: Vec<&'static str>,
    }

    fn cases() -> Vec<Case> {
        let mut big_and_small = pods(12, 1000, GI);
        big_and_small.push(pod("big", 8000, 8 * GI));
        let mut nodes_1 = pool("default");
        nodes_1.limits = Limits { nodes: Some(2), ..Limits::default() };
        nodes_1.usage.nodes = 1;
        vec![
            Case {
                // The plain loop opens one M for 10 pods (charged 15.25Gi of the 16Gi) and leaves 2.
                name: "12 pods of 1 CPU / 1Gi under 16Gi: two XS hold them all",
                input: input(vec![example_pool()], pods(12, 1000, GI)),
                claims: vec!["default:XS", "default:XS"],
                pending: vec![],
            },
            Case {
                // 2×XS (12 pods) is the most any mix within 16Gi holds, and the cheapest such mix.
                name: "20 pods under 16Gi: 12 placed on two XS, 8 pending for the limits",
                input: input(vec![example_pool()], pods(20, 1000, GI)),
                claims: vec!["default:XS", "default:XS"],
                pending: vec!["p12", "p13", "p14", "p15", "p16", "p17", "p18", "p19"],
            },
            Case {
                // The big pod alone takes an S (11.4Gi of capacity) and leaves room for 3 small pods:
                // leaving it out places 12.
                name: "a pod whose node would crowd out 8 others is the one left pending",
                input: input(vec![example_pool()], big_and_small),
                claims: vec!["default:XS", "default:XS"],
                pending: vec!["big"],
            },
            Case {
                // Two XS would be cheaper, but one node is all the pool may add.
                name: "node-count limit strict: one node left, one claim holding all 12",
                input: input(vec![nodes_1], pods(12, 1000, GI)),
                claims: vec!["default:L"],
                pending: vec![],
            },
        ]
    }

    #[test]
    fn limits_are_part_of_the_packing() {
        for case in cases() {
            let d = solve(&case.input);
            let s = summary(&case.input, &d);
            let mut claims = s.claims.clone();
            claims.sort();
            assert_eq!(claims, case.claims, "{}", case.name);
            assert_eq!(s.unschedulable, case.pending, "{}", case.name);
            for u in &d.unschedulable {
                assert!(
                    u.reason.contains("limits") && u.reason.contains("best packing"),
                    "{}: {}",
                    case.name,
                    u.reason
                );
            }
            // Never fewer pods than the plain loop, and no dearer for as many.
            let p = solve(&plain(&case.input));
            assert!(d.unschedulable.len() <= p.unschedulable.len(), "{}", case.name);
            if d.unschedulable.len() == p.unschedulable.len() {
                let price = |d: &crate::Decision| d.new_claims.iter().map(|c| c.price).sum::<f64>();
                assert!(price(&d) <= price(&p) + 1e-9, "{}", case.name);
            }
        }
    }

    #[test]
    fn the_plain_loop_strands_pods_that_the_packing_places() {
        // What the issue reported, kept as the reference the packing improves on.
        let i = plain(&input(vec![example_pool()], pods(12, 1000, GI)));
        let s = summary(&i, &solve(&i));
        assert_eq!(s.claims, vec!["default:M"]);
        assert_eq!(s.unschedulable.len(), 2);
    }

    #[test]
    fn each_claim_charges_no_more_than_the_limits_leave() {
        // Every option of every claim counts at its capacity: the largest options sum within 16Gi.
        let i = input(vec![example_pool()], pods(20, 1000, GI));
        let d = solve(&i);
        let types = flavors();
        let largest: i64 = d
            .new_claims
            .iter()
            .map(|c| {
                c.instance_types
                    .iter()
                    .map(|o| types.iter().find(|t| t.name == o.name).unwrap().capacity.memory_bytes)
                    .max()
                    .unwrap()
            })
            .sum();
        assert!(largest <= 16 * GI, "{largest}");
    }

    #[test]
    fn a_pod_no_flavor_holds_keeps_its_own_reason() {
        let mut all = pods(12, 1000, GI);
        all.push(pod("huge", 64_000, GI));
        let i = input(vec![example_pool()], all);
        let d = solve(&i);
        let s = summary(&i, &d);
        assert_eq!(s.unschedulable, vec!["huge"]);
        assert!(!d.unschedulable[0].reason.contains("best packing"), "{}", d.unschedulable[0].reason);
        assert_eq!(s.claims.len(), 2);
    }

    #[test]
    fn pods_one_limited_pool_cannot_hold_go_to_the_next() {
        // Two pools of 16Gi each, 26 pods of 1 CPU / 1Gi: the plain loop fills an M in each (20 pods);
        // two XS in each hold 24.
        let mut a = example_pool();
        a.name = "a".into();
        a.weight = 10;
        let mut b = example_pool();
        b.name = "b".into();
        let i = input(vec![a, b], pods(26, 1000, GI));
        let d = solve(&i);
        let s = summary(&i, &d);
        assert_eq!(s.claims, vec!["a:XS", "a:XS", "b:XS", "b:XS"]);
        assert_eq!(s.unschedulable.len(), 2);
        for u in &d.unschedulable {
            assert!(u.reason.contains("nodepool a: limits") && u.reason.contains("nodepool b: limits"), "{}", u.reason);
        }
        assert_eq!(solve(&plain(&i)).unschedulable.len(), 6);
    }

    #[test]
    fn a_pod_too_large_for_what_the_limits_leave_is_told_so() {
        // 10 CPU, 4 used: 6 left; the 7-CPU pod needs an S (8), the 5-CPU one takes the XS (6).
        let mut p = pool("default");
        p.limits = Limits { cpu_millis: Some(10_000), ..Limits::default() };
        p.usage.resources.cpu_millis = 4000;
        let i = input(vec![p], vec![pod("seven", 7000, 0), pod("five", 5000, 0)]);
        let d = solve(&i);
        let s = summary(&i, &d);
        assert_eq!(s.claims, vec!["default:XS"]);
        assert_eq!(s.unschedulable, vec!["seven"]);
        let why = &d.unschedulable[0].reason;
        assert!(why.contains("every instance type that holds it exceeds") && why.contains("cpu=6"), "{why}");
    }

    #[test]
    fn the_example_pool_repacks_pods_with_topology_within_its_limits() {
        // Six 1.5-CPU replicas spread over hostnames (maxSkew 6): the loop launches one M; an XS and
        // a 2XS hold them for less, the spread and the limits kept.
        use crate::model::WhenUnsatisfiable;
        let web = |i: usize| {
            let mut x = pod(&format!("w{i}"), 1500, 512 * crate::testkit::MI);
            x.labels = labels_of(&[("app", "web")]);
            x.constraints.topology_spread =
                vec![spread(crds::labels::HOSTNAME, 6, WhenUnsatisfiable::DoNotSchedule, &[("app", "web")])];
            x
        };
        let i = input(vec![example_pool()], (0..6).map(web).collect());
        let (d, p) = (solve(&i), solve(&plain(&i)));
        let mut claims = summary(&i, &d).claims;
        claims.sort();
        assert_eq!(claims, vec!["default:2XS", "default:XS"]);
        assert_eq!(summary(&i, &p).claims, vec!["default:M"]);
        assert!(d.unschedulable.is_empty() && p.unschedulable.is_empty());
        assert!(d.total_price() + 0.01 < p.total_price());
    }

    #[test]
    fn spread_replicas_the_loop_leaves_pending_under_limits_are_packed_within_them() {
        // Six 1.5-CPU replicas, at most 3 per node: the loop charges its first claim an M (15.25Gi
        // of the 16Gi) and leaves 3 pending; three 2XS (11.2Gi, 2 replicas each) hold all six for
        // less than two XS would.
        use crate::model::WhenUnsatisfiable;
        let web = |i: usize| {
            let mut x = pod(&format!("w{i}"), 1500, 512 * crate::testkit::MI);
            x.labels = labels_of(&[("app", "web")]);
            x.constraints.topology_spread =
                vec![spread(crds::labels::HOSTNAME, 3, WhenUnsatisfiable::DoNotSchedule, &[("app", "web")])];
            x
        };
        let i = input(vec![example_pool()], (0..6).map(web).collect());
        let (d, p) = (solve(&i), solve(&plain(&i)));
        assert_eq!(p.unschedulable.len(), 3);
        let s = summary(&i, &d);
        assert!(s.unschedulable.is_empty(), "{:?}", d.unschedulable);
        assert_eq!(s.claims, vec!["default:2XS", "default:2XS", "default:2XS"]);
        assert!(s.claim_pods.iter().all(|pods| pods.len() <= 3), "{:?}", s.claim_pods);
    }

    #[test]
    fn a_catalogue_above_64_types_still_gets_the_cost_repack() {
        // The built-in flavors plus 94 dearer copies: the cheapest packing is the same as with the
        // six alone, and cheaper than Karpenter's loop.
        let mut p = pool("default");
        let base = flavors();
        for k in 0..94 {
            let mut t = base[k % 6].clone();
            t.name = format!("{}-copy{k}", t.name);
            t.labels.insert(crds::labels::INSTANCE_TYPE.to_string(), t.name.clone());
            for o in &mut t.offerings {
                o.price_hourly *= 1.5 + k as f64 / 100.0;
            }
            p.instance_types.push(t);
        }
        let pods: Vec<_> = (0..200).map(|i| pod(&format!("p{i:03}"), 250 + 250 * (i % 16), 128 * MI)).collect();
        let large = input(vec![p], pods.clone());
        let small = input(vec![pool("default")], pods);
        let price = |d: &crate::Decision| d.new_claims.iter().map(|c| c.price).sum::<f64>();
        let (d_large, d_small) = (solve(&large), solve(&small));
        assert!(d_large.unschedulable.is_empty());
        assert!((price(&d_large) - price(&d_small)).abs() < 1e-9, "{} vs {}", price(&d_large), price(&d_small));
        assert!(price(&d_large) + 0.01 < price(&solve(&plain(&large))));
    }

    #[test]
    fn pools_without_limits_are_left_to_the_cost_repack() {
        // Same pods, no limits: the cheapest packing, whatever the limited path would say.
        let mut p = example_pool();
        p.limits = Limits::default();
        let i = input(vec![p], pods(20, 1000, GI));
        let s = summary(&i, &solve(&i));
        assert!(s.unschedulable.is_empty());
        assert!(s.claims.iter().all(|c| c == "default:XS" || c == "default:2XS"), "{:?}", s.claims);
    }
}
