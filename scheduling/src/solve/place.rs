//! The loop (§3.4–§3.7, §3.11): pods in queue order (largest first), each on an existing node, else
//! on a claim opened earlier this round (fewest pods first), else on a new claim of the first pool
//! in priority order that accepts it, relaxing its preferences one step per failed attempt (§3.5);
//! a pod placed is counted in its topology groups at once.
//!
//! Owns which target accepts a pod and the commits that follow. Must not re-pack claims (that is
//! `repack`) nor write the decision (that is `finish`).

use std::collections::{BTreeMap, VecDeque};

use crds::quantity::Resources;

use super::{Accepted, Claim, PoolCtx, Relax, Solver, charge_of, describe_left, describe_remaining, label_of, within};
use crate::bitset::Bits;
use crate::hostports;
use crate::instance_types::describe_resources;
use crate::intern::{Interner, Key, Val};
use crate::model::{HostPort, MinValuesPolicy, Pod};
use crate::requirements::{Requirements, ValueSet};
use crate::taints;
use crate::topology::{self, Kind, PodConstraint, Refused};

/// Why a pod found no place this pass; its text becomes the pod's unschedulable reason.
#[derive(Debug, Clone, thiserror::Error)]
pub(super) enum Unplaced {
    /// No pool is Ready for the cluster.
    #[error("no NodePool available (none is Ready for this cluster)")]
    NoNodePool,
    /// Every pool refused a new claim, each for its reason, in priority order.
    #[error("{}", join(.0))]
    Pools(Vec<PoolRefusal>),
}

fn join(reasons: &[PoolRefusal]) -> String {
    // A shared limit refusing several pools says so once.
    let mut texts: Vec<String> = Vec::new();
    for r in reasons.iter().map(ToString::to_string) {
        if !texts.contains(&r) {
            texts.push(r);
        }
    }
    texts.join("; ")
}

/// Why one pool did not open a claim for a pod.
#[derive(Debug, Clone, thiserror::Error)]
pub(super) enum PoolRefusal {
    /// The pool has no usable instance type at all (the text names the pool).
    #[error("{0}")]
    Unusable(String),
    /// `limits.nodes` is used up.
    #[error("nodepool {0}: node limits exhausted (limits.nodes)")]
    NodeLimit(String),
    /// Every type would exceed the remaining resource limits.
    #[error("nodepool {pool}: every instance type would exceed the remaining limits ({remaining})")]
    Limits { pool: String, remaining: String },
    /// Every type would exceed what is left of a shared limit (the name says whose).
    #[error("{name}: every instance type would exceed what is left ({left})")]
    Shared { name: String, left: String },
    /// Each type exceeds one limit or another, none of them excluding every type alone.
    #[error("nodepool {pool}: every instance type would exceed one of its limits: {limits}")]
    Together { pool: String, limits: String },
    /// A new claim of the pool does not accept the pod.
    #[error("nodepool {pool}: {why}")]
    Claim { pool: String, why: Refusal },
}

/// Why a node or a claim does not accept a pod.
#[derive(Debug, Clone, thiserror::Error)]
pub(super) enum Refusal {
    #[error("not enough room")]
    NoRoom,
    #[error("not enough {0} left")]
    NoExtendedRoom(String),
    #[error("untolerated taint {0}")]
    NodeTaint(String),
    #[error("host port {0} in use")]
    NodeHostPort(String),
    #[error("CSI driver {driver} attach limit {limit} reached")]
    CsiLimit { driver: String, limit: i64 },
    /// The pod's requirements, as [`crate::requirements`] describes the mismatch.
    #[error("{0}")]
    Requirements(String),
    #[error("the node is outside the topology of the pod's volumes")]
    VolumeTopology,
    /// A topology constraint, as [`crate::topology`] describes the refusal.
    #[error("{0}")]
    Topology(String),
    /// No volume alternative fits; the last one's reason.
    #[error("with the topology of its volumes: {0}")]
    WithVolumes(Box<Refusal>),
    #[error("did not tolerate taint {0}")]
    ClaimTaint(String),
    #[error("no instance type satisfies the requirements {0}")]
    NoTypeSatisfies(String),
    #[error("no instance type has an available offering for {0}")]
    NoOffering(String),
    #[error("host port {0} already used by a pod on this claim")]
    ClaimHostPort(String),
    #[error("host port {0} is used by a DaemonSet")]
    DaemonSetHostPort(String),
    /// No type is large enough; the texts are the described resources and the optional parts.
    #[error(
        "no instance type has enough resources: requests {requests}{on_claim}{overhead}, largest allocatable \
         {best}{limits}"
    )]
    TooSmall { requests: String, on_claim: String, overhead: String, best: String, limits: String },
    /// No type offers the extended resources (a NodeOverlay's `capacity` adds them to flavors).
    #[error(
        "no instance type offers {requests}{on_claim} (extended resources come from NodeOverlays' capacity; largest \
         offered: {best}){limits}"
    )]
    NoExtended { requests: String, on_claim: String, best: String, limits: String },
    #[error("minValues {wanted} of {key} not met: only {reached} values remain among the instance types that fit")]
    MinValues { wanted: u32, key: String, reached: u32 },
}

impl Solver<'_> {
    pub(super) fn run(&mut self) {
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
        // CapacityBuffer pods only once every real pod is placed or given up on (relaxations
        // included): the lowest priority, never taking room or a limit a real pod could use.
        let (buffer, real): (Vec<usize>, Vec<usize>) = order.into_iter().partition(|&p| pods[p].buffer.is_some());
        self.place_all(real);
        self.place_all(buffer);
    }

    /// Places the pods of `order` in turn; a pod that fails goes to the back of the queue (relaxed
    /// one step more when its turn comes again) until a full pass makes no progress.
    fn place_all(&mut self, order: Vec<usize>) {
        let mut queue: VecDeque<usize> = order.into();
        let mut pushed_at: Vec<usize> = vec![usize::MAX; self.input.pods.len()];
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
                    self.errors[p] = Some(e.to_string());
                    queue.push_back(p);
                    pushed_at[p] = queue.len();
                }
            }
        }
    }

    /// Places one pod, relaxing one step per failed attempt (§3.5).
    fn place(&mut self, p: usize) -> Result<(), Unplaced> {
        let class = self.pod_class[p];
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

    pub(super) fn working(&self, class: usize, r: Relax) -> Requirements {
        let c = &self.classes[class];
        let strict = &c.strict[r.term.min(c.strict.len() - 1)];
        match c.preferred.get(r.preferred) {
            Some(pref) => strict.intersect(pref, &self.ints),
            None => strict.clone(),
        }
    }

    /// The pod's active topology constraints under a relaxation state.
    pub(super) fn active(&self, class: usize, r: Relax) -> Vec<PodConstraint> {
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

    fn try_place(&mut self, p: usize, class: usize, r: Relax) -> Result<(), Unplaced> {
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
                &claim.extended,
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
        let mut reasons: Vec<PoolRefusal> = Vec::new();
        for pi in 0..self.pools.len() {
            let pool = &self.pools[pi];
            if let Some(why) = &pool.unusable {
                reasons.push(PoolRefusal::Unusable(why.clone()));
                continue;
            }
            if pool.remaining.nodes.is_some_and(|n| n <= 0) {
                reasons.push(PoolRefusal::NodeLimit(pool.name.clone()));
                continue;
            }
            if pool.within_limits.is_empty() {
                reasons.push(self.limits_refusal(pi));
                continue;
            }
            let hostname = self.ints.val(&format!("hostname-placeholder-{:04}", self.claims.len()));
            let pool = &self.pools[pi];
            match self.claim_accepts(
                pi,
                &pool.template,
                &pool.within_limits,
                Resources::ZERO,
                &BTreeMap::new(),
                &[],
                hostname,
                pod,
                class,
                r,
                &working,
                &active,
            ) {
                Ok(acc) => {
                    let charge = charge_of(&self.pools[pi], &acc.types);
                    if let Some(n) = &mut self.pools[pi].remaining.nodes {
                        *n -= 1;
                    }
                    let zero = vec![0; charge.len()];
                    self.recharge(pi, &zero, &charge);
                    self.claims.push(Claim {
                        pool: pi,
                        reqs: Requirements::new(),
                        types: Bits::empty(0),
                        used: Resources::ZERO,
                        extended: BTreeMap::new(),
                        ports: Vec::new(),
                        hostname,
                        pods: Vec::new(),
                        headroom: Resources::ZERO,
                        min_values_relaxed: false,
                        charged: charge,
                    });
                    let ci = self.claims.len() - 1;
                    self.claim_order.insert(0, ci);
                    self.commit_claim(ci, p, class, acc);
                    return Ok(());
                }
                Err(why) => reasons.push(PoolRefusal::Claim { pool: self.pools[pi].name.clone(), why }),
            }
        }
        if self.pools.is_empty() {
            return Err(Unplaced::NoNodePool);
        }
        Err(Unplaced::Pools(reasons))
    }

    /// Why no type of pool `pi` is within its limits: its own, or a shared one, each alone, else
    /// them together.
    fn limits_refusal(&self, pi: usize) -> PoolRefusal {
        let pool = &self.pools[pi];
        let own = &pool.remaining.res;
        let admitted_by_own = |i: usize| within(own, &super::sizes_of(pool, i)[..pool.own_dims()]);
        if !(0..pool.table.len()).any(admitted_by_own) {
            return PoolRefusal::Limits { pool: pool.name.clone(), remaining: describe_remaining(&pool.remaining) };
        }
        for s in &pool.shared {
            let left = &self.shared[s.limit].left;
            if !s.draws.iter().any(|d| within(left, d)) {
                return PoolRefusal::Shared { name: self.shared[s.limit].name.clone(), left: describe_left(left) };
            }
        }
        PoolRefusal::Together { pool: pool.name.clone(), limits: self.describe_limits_of(pi) }
    }

    /// The limits of pool `pi`, as `remaining limits cpu=4 and organisation orga-acme with cpu=2
    /// left` (no "; ": that separates the reasons of a pod).
    fn describe_limits_of(&self, pi: usize) -> String {
        let pool = &self.pools[pi];
        let mut parts = Vec::new();
        if pool.remaining.is_limited() {
            parts.push(format!("remaining limits {}", describe_remaining(&pool.remaining)));
        }
        for s in &pool.shared {
            let l = &self.shared[s.limit];
            if l.left.iter().any(Option::is_some) {
                parts.push(format!("{} with {} left", l.name, describe_left(&l.left)));
            }
        }
        parts.join(" and ")
    }

    /// The note of a too-small refusal when limits leave out some types: which limits.
    fn limits_excluding(&self, pi: usize) -> String {
        let pool = &self.pools[pi];
        let shared_excludes = pool.shared.iter().any(|s| {
            let left = &self.shared[s.limit].left;
            s.draws.iter().any(|d| !within(left, d))
        });
        if !shared_excludes {
            return format!(
                " (the pool's remaining limits {} exclude larger types)",
                describe_remaining(&pool.remaining)
            );
        }
        format!(" (what its limits leave excludes larger types: {})", self.describe_limits_of(pi))
    }

    fn node_accepts(
        &self,
        ni: usize,
        pod: &Pod,
        class: usize,
        r: Relax,
        active: &[PodConstraint],
    ) -> Result<(), Refusal> {
        let n = &self.nodes[ni];
        let c = &self.classes[class];
        if !pod.requests.fits(&n.remaining) {
            return Err(Refusal::NoRoom);
        }
        if let Some((r, _)) = pod.extended.iter().find(|(r, v)| n.extended.get(*r).is_none_or(|left| left < v)) {
            return Err(Refusal::NoExtendedRoom(r.clone()));
        }
        if let Some(t) = taints::first_untolerated(&n.taints, &c.tolerations, r.tolerate_pns) {
            return Err(Refusal::NodeTaint(taints::describe(t)));
        }
        if let Some(port) = hostports::first_clash(&c.host_ports, &n.ports) {
            return Err(Refusal::NodeHostPort(hostports::describe(port)));
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
                return Err(Refusal::CsiLimit { driver: driver.clone(), limit: *limit });
            }
        }
        let strict = &c.strict[r.term.min(c.strict.len() - 1)];
        strict.matches_labels(&n.labels, &self.ints).map_err(|e| Refusal::Requirements(e.describe(&self.ints, &[])))?;
        if !c.volume_alts.is_empty() && !c.volume_alts.iter().any(|a| a.matches_labels(&n.labels, &self.ints).is_ok()) {
            return Err(Refusal::VolumeTopology);
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
            .map_err(|Refused(e)| Refusal::Topology(e))?;
        }
        Ok(())
    }

    /// Claim acceptance (§3.7), once per volume alternative: the first that fits wins.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn claim_accepts(
        &self,
        pi: usize,
        reqs: &Requirements,
        types: &Bits,
        used: Resources,
        extended: &BTreeMap<String, i64>,
        ports: &[HostPort],
        hostname: Val,
        pod: &Pod,
        class: usize,
        r: Relax,
        working: &Requirements,
        active: &[PodConstraint],
    ) -> Result<Accepted, Refusal> {
        let alts = &self.classes[class].volume_alts;
        let Some((first, rest)) = alts.split_first() else {
            return self.claim_accepts_one(
                pi, reqs, types, used, extended, ports, hostname, pod, class, r, working, true, active,
            );
        };
        let with_volume = |alt: &Requirements| {
            let with_volume = working.intersect(alt, &self.ints);
            self.claim_accepts_one(
                pi,
                reqs,
                types,
                used,
                extended,
                ports,
                hostname,
                pod,
                class,
                r,
                &with_volume,
                false,
                active,
            )
        };
        // The last alternative's reason is the one reported.
        let mut last = match with_volume(first) {
            Ok(acc) => return Ok(acc),
            Err(e) => e,
        };
        for alt in rest {
            match with_volume(alt) {
                Ok(acc) => return Ok(acc),
                Err(e) => last = e,
            }
        }
        Err(Refusal::WithVolumes(Box::new(last)))
    }

    #[allow(clippy::too_many_arguments)]
    fn claim_accepts_one(
        &self,
        pi: usize,
        reqs: &Requirements,
        types: &Bits,
        used: Resources,
        extended: &BTreeMap<String, i64>,
        ports: &[HostPort],
        hostname: Val,
        pod: &Pod,
        class: usize,
        r: Relax,
        working: &Requirements,
        cached: bool,
        active: &[PodConstraint],
    ) -> Result<Accepted, Refusal> {
        let pool = &self.pools[pi];
        let c = &self.classes[class];
        // (1) Template taints (startup taints need no toleration).
        if let Some(t) = taints::first_untolerated(&pool.taints, &c.tolerations, r.tolerate_pns) {
            return Err(Refusal::ClaimTaint(taints::describe(t)));
        }
        // (2) Requirements.
        let well_known = self.well_known();
        if let Err(e) = reqs.compatible(working, &self.ints, &well_known) {
            let defined: Vec<Key> = reqs.keys().chain(pool.table.keys()).collect();
            return Err(Refusal::Requirements(e.describe(&self.ints, &defined)));
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
            .map_err(|Refused(e)| Refusal::Topology(e))?;
            if !hostname_key && !ok.is_empty() && possible.as_ref().is_some_and(|p| p.len() != ok.len()) {
                let mut pin = Requirements::new();
                pin.add(key, ValueSet::is_in(ok), &self.ints);
                new_types.and_with(&pool.table.requirement_mask(&pin, &self.ints));
                new_reqs = new_reqs.intersect(&pin, &self.ints);
                zone_or_ct |= key == self.zone_key || key == self.capacity_type_key;
            }
        }
        if new_types.is_empty() {
            return Err(Refusal::NoTypeSatisfies(working_description(working, &self.ints)));
        }
        if zone_or_ct {
            pool.table.retain_offerings(&mut new_types, &new_reqs, &self.ints);
            if new_types.is_empty() {
                return Err(Refusal::NoOffering(working_description(&new_reqs, &self.ints)));
            }
        }
        // (4) Extended resources: only the types offering what the claim's pods and this one ask.
        if !pod.extended.is_empty() {
            let mut wanted = extended.clone();
            crds::quantity::extended_add(&mut wanted, &pod.extended);
            let before = new_types.clone();
            for i in before.iter() {
                if !crds::quantity::extended_fits(&wanted, &pool.table.types[i].extended) {
                    new_types.clear(i);
                }
            }
            if new_types.is_empty() {
                return Err(Refusal::NoExtended {
                    requests: describe_extended(&pod.extended),
                    on_claim: if extended.is_empty() {
                        String::new()
                    } else {
                        format!(" (with {} already on the claim)", describe_extended(extended))
                    },
                    best: largest_extended(&pool.table.types, &before, pod),
                    // Named only when a type beyond them would offer it.
                    limits: if pool.within_limits.count() < pool.table.len()
                        && pool.table.types.iter().any(|t| crds::quantity::extended_fits(&wanted, &t.extended))
                    {
                        format!(" (its limits exclude the others: {})", self.describe_limits_of(pi))
                    } else {
                        String::new()
                    },
                });
            }
        }
        // (5) Resources and host ports, per type with its DaemonSet group.
        let total = used + pod.requests;
        let mut fitting = new_types.clone();
        let mut port_clash: Option<String> = None;
        if let Some(port) = hostports::first_clash(&c.host_ports, ports) {
            return Err(Refusal::ClaimHostPort(hostports::describe(port)));
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
                return Err(Refusal::DaemonSetHostPort(port));
            }
            let (lo, hi) = overhead_range(pool, &new_types);
            let best = pool.table.max_headroom(&new_types, |_| Resources::ZERO);
            let limits =
                if pool.within_limits.count() < pool.table.len() { self.limits_excluding(pi) } else { String::new() };
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
            return Err(Refusal::TooSmall {
                requests: describe_resources(&pod.requests),
                on_claim,
                overhead,
                best: describe_resources(&best),
                limits,
            });
        }
        // (6) minValues.
        let mut relaxed_min_values = false;
        if new_reqs.iter().any(|(_, s)| s.min_values().is_some())
            && let Some((key, wanted, reached)) = pool.table.min_values_unmet(&fitting, &new_reqs, &self.ints)
        {
            match self.input.settings.min_values_policy {
                MinValuesPolicy::Strict => {
                    return Err(Refusal::MinValues { wanted, key: self.ints.key_name(key).to_string(), reached });
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

    fn commit_node(&mut self, ni: usize, p: usize, class: usize) {
        let pod = &self.input.pods[p];
        let n = &mut self.nodes[ni];
        n.remaining = n.remaining.saturating_sub(pod.requests);
        crds::quantity::extended_sub(&mut n.extended, &pod.extended);
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
        crds::quantity::extended_add(&mut claim.extended, &pod.extended);
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

/// `nvidia.com/gpu=2, example.com/fpga=1`.
fn describe_extended(e: &BTreeMap<String, i64>) -> String {
    e.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")
}

/// What the types of `set` offer at most of each extended resource the pod asks for, `none` when
/// they offer none of them.
fn largest_extended(types: &[crate::instance_types::TypeInfo], set: &Bits, pod: &Pod) -> String {
    let mut most: BTreeMap<String, i64> = BTreeMap::new();
    for i in set.iter() {
        for k in pod.extended.keys() {
            if let Some(v) = types[i].extended.get(k) {
                let e = most.entry(k.clone()).or_insert(0);
                *e = (*e).max(*v);
            }
        }
    }
    if most.is_empty() { "none".to_string() } else { describe_extended(&most) }
}

fn working_description(r: &Requirements, ints: &Interner) -> String {
    if r.is_empty() { "of the pool".to_string() } else { r.describe(ints) }
}
