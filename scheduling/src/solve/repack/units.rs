//! The solver's side of re-packing, shared by the cost and the limits repack: which claims and
//! pending pods may move with every constraint in force kept exact, the units that move together
//! (hostname pod affinity) and the per-node [`Rules`] their hostname topology and host ports become,
//! and the swap of the old claims for the new.
//!
//! Owns the translation from the solver's pods and claims to the packings' items and rules. Must not
//! decide a packing nor keep or drop one (that is `cost` and `limits`).

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{Rules, TagSet};
use crate::intern::Key;
use crate::solve::{Claim, Relax, Solver};
use crate::topology::Kind;

impl Solver<'_> {
    /// Whether a pod the loop left pending may join a limited pool's packing: no resource the types
    /// lack, every constraint on it on the hostname (kept by the packing's rules), no hostname
    /// affinity of its own (it would need a node of matching pods), no host port a DaemonSet of the
    /// pool may hold.
    pub(super) fn pending_movable(&self, p: usize, pi: usize) -> bool {
        if self.is_free(p) {
            return true;
        }
        let class = self.pod_class[p];
        let c = &self.classes[class];
        let ds_ports = self.pools[pi].groups.iter().any(|g| !g.ports.is_empty());
        if self.has_extended(p) || (ds_ports && !c.host_ports.is_empty()) {
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
    pub(super) fn claim_movable(&self, ci: usize) -> bool {
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
            if self.has_extended(p) || (ds_ports && !c.host_ports.is_empty()) {
                return false;
            }
            if !c.has_topology {
                return true;
            }
            let own = self.active(class, self.relax_of[p]);
            own.iter().map(|pc| pc.group).chain(c.selected.iter().copied()).all(|g| stable(self.topo.groups[g].id.key))
        })
    }

    /// The claims' pods as units that move together (a pod alone, or the pods its hostname pod
    /// affinity keeps on its node), and the per-node rules between units: hostname anti-affinity
    /// (the owner blocks its group, the pods it selects mark it), hostname spread (marks capped at
    /// `maxSkew`), host ports (mark and block).
    pub(super) fn units(&self, claims: &[usize]) -> (Vec<Vec<usize>>, Rules) {
        let lists: Vec<Vec<usize>> = claims.iter().map(|&c| self.claims[c].pods.clone()).collect();
        self.units_of(&lists)
    }

    /// [`Self::units`] of lists of pods, each list the pods of one node.
    pub(super) fn units_of(&self, lists: &[Vec<usize>]) -> (Vec<Vec<usize>>, Rules) {
        let hostname = |g: usize| self.topo.groups[g].id.key == self.hostname_key;
        let mut units: Vec<Vec<usize>> = Vec::new();
        let mut caps: HashMap<u32, i64> = HashMap::new();
        let mut spread_owned = HashSet::new();
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
        let mut sets: Vec<TagSet> = Vec::new();
        let mut index: HashMap<TagSet, usize> = HashMap::new();
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
            let set = TagSet { marks: marks.into_iter().collect(), blocks };
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
        (units, Rules { sets, item_set, caps })
    }

    /// Drops the claims at the indexes `replaced` and appends `added` (a repack's result).
    pub(super) fn replace_claims(&mut self, mut replaced: Vec<usize>, added: Vec<Claim>) {
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
    /// other pods, and with no extended resource: free to move between claims.
    fn is_free(&self, p: usize) -> bool {
        let c = &self.classes[self.pod_class[p]];
        !c.has_topology && c.host_ports.is_empty() && c.inverse_selected.is_empty() && !self.has_extended(p)
    }

    /// A pod requesting extended resources: the packings count only the four node resources, so
    /// it stays where the loop placed it (or pending).
    fn has_extended(&self, p: usize) -> bool {
        !self.input.pods[p].extended.is_empty()
    }
}

/// Claims' charges on a limit vector, summed dimension by dimension (a missing one counts 0).
pub(super) fn sum_charges<'a>(charges: impl IntoIterator<Item = &'a Vec<i64>>) -> Vec<i64> {
    let mut sum: Vec<i64> = Vec::new();
    for c in charges {
        if sum.len() < c.len() {
            sum.resize(c.len(), 0);
        }
        for (a, x) in sum.iter_mut().zip(c) {
            *a = a.saturating_add(*x);
        }
    }
    sum
}
