//! Building the solver's state from the input (§3.3): pools in priority order with the instance
//! types they may launch (each priced, with its DaemonSet group and overhead) and their remaining
//! limits; existing nodes and in-flight claims with the room left on them; pods grouped into classes
//! of equal constraints; topology groups with the counts of running pods, and the domains of spreads.
//!
//! Owns the preparation of the round. Must not place a pod or open a claim (that is `place`).

use std::collections::{BTreeMap, HashMap};

use crds::labels;
use crds::quantity::Resources;

use super::{
    Class, NodeState, PoolCtx, PoolShare, Relax, Remaining, SHARED_DIMS, SharedCtx, Solver, label_of, refresh_limits,
    well_known_keys,
};
use crate::daemonsets::{self, DsGroup, DsPod};
use crate::instance_types::{TypeInfo, TypeTable, describe_resources, type_meets};
use crate::intern::{Interner, Key, Val};
use crate::model::{Constraints, Input, Pod, PreferencePolicy, SharedLimit, TaintEffect, price_micros};
use crate::requirements::{Requirements, ValueSet};
use crate::taints;
use crate::topology::{self, Domains, Kind, PodConstraint, Topology};

impl<'a> Solver<'a> {
    pub(super) fn new(input: &'a Input) -> Self {
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
            shared: input
                .shared
                .iter()
                .map(|l| SharedCtx {
                    name: l.name.clone(),
                    left: [l.remaining.cpu_millis, l.remaining.memory_bytes, l.remaining.price_micros],
                })
                .collect(),
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

    pub(super) fn well_known(&self) -> impl Fn(Key) -> bool + use<> {
        let n = self.n_well_known;
        move |k| k < n
    }

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
            let mut res = vec![
                limit(pool.limits.cpu_millis, pool.usage.resources.cpu_millis),
                limit(pool.limits.memory_bytes, pool.usage.resources.memory_bytes),
                limit(pool.limits.ephemeral_storage_bytes, pool.usage.resources.ephemeral_storage_bytes),
                limit(pool.limits.pods, pool.usage.resources.pods),
            ];
            for (k, l) in &pool.limits.extended {
                res.push(limit(Some(*l), pool.usage.extended.get(k).copied().unwrap_or(0)));
            }
            let remaining = Remaining {
                res,
                extended: pool.limits.extended.keys().cloned().collect(),
                nodes: limit(pool.limits.nodes, pool.usage.nodes),
            };
            let shared = self
                .input
                .shared
                .iter()
                .enumerate()
                .filter(|(_, l)| l.pools.as_ref().is_none_or(|names| names.contains(&pool.name)))
                .map(|(limit, l)| PoolShare { limit, draws: table.types.iter().map(|t| draw_of(l, t)).collect() })
                .collect();
            let mut ctx = PoolCtx {
                input: i,
                name: pool.name.clone(),
                template,
                taints: pool.taints.clone(),
                shared,
                within_limits: table.all(),
                table,
                groups,
                remaining,
                unusable,
                has_prefer_no_schedule: pool.taints.iter().any(|t| t.effect == TaintEffect::PreferNoSchedule),
            };
            refresh_limits(&mut ctx, &self.shared);
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
            let mut extended = n.extended.clone();
            let mut ports = Vec::new();
            let mut volumes: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
            for p in &n.pods {
                used += p.requests;
                crds::quantity::extended_sub(&mut extended, &p.extended);
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
                extended,
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
}

/// What one node of a type draws on a shared limit: as the limit lists it, else its capacity's cpu
/// and memory and its price in the pool (negative draws count 0: a node never gives quota back).
fn draw_of(limit: &SharedLimit, t: &TypeInfo) -> [i64; SHARED_DIMS] {
    let d = match limit.sizes.get(&t.name) {
        Some(d) => [d.cpu_millis, d.memory_bytes, d.price_micros],
        None => [t.capacity.cpu_millis, t.capacity.memory_bytes, price_micros(t.price)],
    };
    d.map(|x| x.max(0))
}

/// Why an instance type is left out of a pool's table; the pool's `unusable` text lists a few.
#[derive(Debug, Clone, thiserror::Error)]
enum Excluded {
    /// A template requirement on this key rules the type out.
    #[error("excluded by the requirement on {0}")]
    Requirement(String),
    /// No available offering in the template's zones and capacity types.
    #[error("no available offering")]
    NoOffering,
    /// The DaemonSet pods that would run on it do not fit (the overhead as described).
    #[error("daemonset overhead {0} does not fit")]
    Overhead(String),
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
) -> Result<(f64, usize), Excluded> {
    if let Err(k) = type_meets(t, template, ints) {
        return Err(Excluded::Requirement(ints.key_name(k).to_string()));
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
        return Err(Excluded::NoOffering);
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
        return Err(Excluded::Overhead(describe_resources(&groups[group].overhead)));
    }
    Ok((price, group))
}
