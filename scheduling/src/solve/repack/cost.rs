//! The cost repack: the loop's claims, group by group (same pool, same requirements), re-packed
//! into the mix of types the packings find cheapest, kept only when cheaper (minValues as shared
//! room, limits as a budget the new claims' charges stay within).
//!
//! Owns which groups are re-packed for cost and whether their packing replaces them. Must not place
//! a pod the loop left pending (that is `limits`).

use std::collections::BTreeMap;

use crds::quantity::Resources;

use super::units::sum_charges;
use super::{Bin, Budget, Packing, candidates, pack_ruled};
use crate::bitset::Bits;
use crate::intern::{Key, Val};
use crate::model::HostPort;
use crate::requirements::Requirements;
use crate::solve::{Claim, Solver, charge_of, sizes_of};

/// A re-packed node: its pods, their requests, its options.
type PackedNode = (Vec<usize>, Resources, Bits);

impl Solver<'_> {
    /// Re-packs the new claims for cost (see the module documentation), group by group (same pool, same
    /// requirements), keeping the result only when cheaper. Every constraint stays exact:
    /// - topology on keys other than the hostname: a group's claims share their requirements, and a
    ///   claim joins only when each such key its pods are constrained or counted on is pinned there
    ///   to one value (or not defined by the pool's types), so every pod keeps its domain;
    /// - hostname topology and host ports become per-node rules ([`Rules`](super::Rules)); pods held
    ///   together by hostname pod affinity move as one bundle;
    /// - minValues: each type is packed as the room it shares with enough other types to meet the
    ///   minimum, and a node whose options would still miss it voids the packing.
    ///
    /// Constraints a pod was relaxed out of are not kept; those in force when it was placed are.
    /// Under a pool's limits the free pods first get their own packing ([`Self::repack_limited`],
    /// which may place more pods); then this one may only lower the price of the same pods, its
    /// claims charged within what the limits leave.
    pub(in crate::solve) fn repack(&mut self) {
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
                // What the limits have left: the old claims' charges back, the new ones taken.
                let old = sum_charges(claims.iter().map(|&c| &self.claims[c].charged));
                let new = sum_charges(new_claims.iter().map(|c| &c.charged));
                if let Some(n) = &mut self.pools[pi].remaining.nodes {
                    *n += i64::try_from(claims.len()).unwrap_or(0) - i64::try_from(new_claims.len()).unwrap_or(0);
                }
                self.recharge(pi, &old, &new);
                replaced.extend(claims.iter().copied());
                added.extend(new_claims);
            }
        }
        self.replace_claims(replaced, added);
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
        let all_bins: Vec<Bin> = rooms.iter().zip(&prices).map(|(&room, &price)| Bin { room, price }).collect();
        let (units, rules) = self.units(claims);
        let items: Vec<Resources> =
            units.iter().map(|u| u.iter().fold(Resources::ZERO, |a, &p| a + self.input.pods[p].requests)).collect();
        // Large catalogues: the packings see a bounded set of types; each node is then priced on
        // the cheapest of all the types that hold it.
        let bins: Vec<Bin> = candidates(&all_bins, &items).into_iter().map(|k| all_bins[k]).collect();
        let mut by_price: Vec<usize> = (0..types.len()).collect();
        by_price.sort_by(|&a, &b| prices[a].total_cmp(&prices[b]).then(a.cmp(&b)));
        let holds = |k: usize, used: &Resources| (*used + overhead(types[k])).fits(&table.types[types[k]].allocatable);
        // Under limits (the pool's own and the shared ones): what they leave for this group's nodes
        // (the old claims' charges back).
        let nodes_left = pool.remaining.nodes;
        let left = self.left(pi);
        let budget = (left.iter().any(Option::is_some) || nodes_left.is_some()).then(|| {
            let mut res = left;
            for &ci in claims {
                for (r, c) in res.iter_mut().zip(&self.claims[ci].charged) {
                    if let Some(r) = r {
                        *r = r.saturating_add(*c);
                    }
                }
            }
            let nodes = nodes_left.map(|n| usize::try_from(n.max(0)).unwrap_or(0) + claims.len());
            Budget { res, nodes }
        });
        let sizes: Vec<Vec<i64>> =
            if budget.is_some() { types.iter().map(|&i| sizes_of(pool, i)).collect() } else { Vec::new() };
        // What finishing would launch for a node: its cheapest option, at that price; its options: the
        // types holding it, under limits only those no larger than that one on the limited
        // dimensions (so that the claim's charge, its largest option, is that type's size).
        // The options are only needed while comparing packings under limits or minValues; else
        // they are listed for the winner alone.
        let listed = budget.is_some() || min_values;
        let options = |used: &Resources, list: bool| -> Option<(f64, Bits)> {
            let &c = by_price.iter().find(|&&k| holds(k, used))?;
            let mut fit = Bits::empty(if list { table.len() } else { 0 });
            for (k, &i) in types.iter().enumerate().filter(|_| list) {
                if holds(k, used) && budget.as_ref().is_none_or(|b| b.no_larger(&sizes[k], &sizes[c])) {
                    fit.set(i);
                }
            }
            Some((prices[c], fit))
        };
        let price_of =
            |fit: &Bits| fit.iter().map(|i| table.price_under(i, reqs, &self.ints)).fold(f64::INFINITY, f64::min);
        let old: f64 = claims.iter().map(|&c| price_of(&self.claims[c].types)).sum();
        let mut best: Option<(f64, Vec<PackedNode>)> = None;
        for how in [Packing::Value, Packing::Balanced, Packing::Ffd] {
            let Some(packed) = pack_ruled(&items, &rules, &bins, how) else { continue };
            let mut nodes = Vec::new();
            let mut cost = 0.0;
            let mut charged: Vec<i64> = Vec::new();
            for (_, idx) in packed {
                let members: Vec<usize> = idx.iter().flat_map(|&k| units[k].iter().copied()).collect();
                let used = idx.iter().fold(Resources::ZERO, |a, &k| a + items[k]);
                match options(&used, listed) {
                    Some((price, fit)) if !min_values || table.min_values_unmet(&fit, reqs, &self.ints).is_none() => {
                        cost += price;
                        if budget.is_some() {
                            charged = sum_charges([&charged, &charge_of(pool, &fit)]);
                        }
                        nodes.push((members, used, fit));
                    }
                    _ => {
                        cost = f64::INFINITY;
                        break;
                    }
                }
            }
            if budget.as_ref().is_some_and(|b| !b.holds(&charged, nodes.len())) {
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
                charged: charge_of(pool, &fit),
                types: fit,
                used,
                extended: BTreeMap::new(),
                ports,
                hostname,
                pods: members,
                headroom,
                min_values_relaxed: relaxed,
            });
        }
        Some(out)
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
}
