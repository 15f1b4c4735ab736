//! The limits repack (issue 14): in each pool with limits (its own, or shared limits it draws on),
//! the claims holding only pods free to move, with the pods the loop left pending that such a claim would take, re-packed to place the
//! most pods first and cost least second within what the limits leave ([`super::pack_within_ruled`]);
//! the pods still left out are told why.
//!
//! Owns the limits' part in the packing and the reasons of the pods it leaves out. Must not touch a
//! pool without limits (that is `cost`).

use std::collections::BTreeMap;

use crds::quantity::Resources;

use super::units::sum_charges;
use super::{Bin, Budget, candidates, pack_within_ruled};
use crate::bitset::Bits;
use crate::intern::Val;
use crate::requirements::Requirements;
use crate::solve::{
    Claim, Relax, Remaining, SHARED_DIMS, Solver, charge_of, describe_left, describe_remaining, sizes_of,
};

impl Solver<'_> {
    /// Limits as part of the packing: per limited pool (cpu, memory, ephemeral storage, pods or node
    /// count, or a shared limit it draws on), the claims holding only free pods, group by group (same requirements), are re-packed
    /// together with the free pods left pending that such a claim would take, into the mix of types
    /// placing the most pods first and costing least second within what the limits leave
    /// ([`super::pack_within`]). Each new claim keeps only the options no larger than its
    /// chosen type on the limited dimensions, so what it charges (its largest option) stays within the
    /// limits and `nodes` is counted exactly. Shared limits are spent in pool order: a pool re-packed
    /// later sees what earlier ones left. Kept only when it places more pods, or as many for less.
    /// Pods still left out for want of room within the limits are told so.
    pub(super) fn repack_limited(&mut self) {
        let placeholder = self.ints.val("hostname-placeholder-limits");
        let mut replaced: Vec<usize> = Vec::new();
        let mut added: Vec<Claim> = Vec::new();
        let mut taken = vec![false; self.input.pods.len()];
        for pi in 0..self.pools.len() {
            let pool = &self.pools[pi];
            let limited = self.left(pi).iter().any(Option::is_some) || pool.remaining.nodes.is_some();
            if !limited || pool.unusable.is_some() {
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
        let bins: Vec<Bin> = types
            .iter()
            .zip(&prices)
            .map(|(&i, &price)| Bin { room: table.types[i].allocatable.saturating_sub(overhead(i)), price })
            .collect();
        // Each type's size in the limit vector: capacity, then what the shared limits count.
        let caps: Vec<Vec<i64>> = types.iter().map(|&i| sizes_of(pool, i)).collect();
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
                    &BTreeMap::new(),
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
        let nodes_left = pool.remaining.nodes;
        let mut res = self.left(pi);
        for &ci in claims {
            for (r, c) in res.iter_mut().zip(&self.claims[ci].charged) {
                if let Some(r) = r {
                    *r = r.saturating_add(*c);
                }
            }
        }
        let budget = Budget { res, nodes: nodes_left.map(|n| usize::try_from(n.max(0)).unwrap_or(0) + claims.len()) };
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
        let cand = candidates(&bins, &items);
        let (sub_bins, sub_caps): (Vec<Bin>, Vec<Vec<i64>>) = cand.iter().map(|&k| (bins[k], caps[k].clone())).unzip();
        let plan: Vec<(usize, Vec<usize>)> = pack_within_ruled(&items, &rules, &sub_bins, &sub_caps, &budget)
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
            bins.iter().zip(&caps).any(|(b, c)| self.input.pods[p].requests.fits(&b.room) && budget.holds(c, 1))
        };
        let nodes_left = budget.nodes.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
        let own_limits = describe_limits(&self.input.pools[pool.input].limits);
        let own = pool.own_dims();
        let own_left = describe_remaining(&Remaining {
            res: budget.res.iter().take(own).copied().collect(),
            extended: pool.remaining.extended.clone(),
            nodes: nodes_left,
        });
        // The shared limits that count here, each with what it leaves for this group's nodes.
        let shared_left: Vec<String> = pool
            .shared
            .iter()
            .enumerate()
            .filter_map(|(j, s)| {
                let mut left = [None; SHARED_DIMS];
                for (d, l) in left.iter_mut().enumerate() {
                    *l = budget.res.get(own + SHARED_DIMS * j + d).copied().flatten();
                }
                left.iter()
                    .any(Option::is_some)
                    .then(|| format!("{} leaves {}", self.shared[s.limit].name, describe_left(&left)))
            })
            .collect();
        // Earlier reasons this one supersedes: the pool's own, and the refusals of its shared limits.
        let prefixes: Vec<String> = std::iter::once(format!("nodepool {}: ", pool.name))
            .chain(pool.shared.iter().map(|s| format!("{}: ", self.shared[s.limit].name)))
            .collect();
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
            let old_charged = sum_charges(claims.iter().map(|&c| &self.claims[c].charged));
            let mut new_charged: Vec<i64> = Vec::new();
            let n_new = nodes.len();
            for (members, used, fit, _) in nodes {
                let headroom = table.max_headroom(&fit, |g| pool.groups[g].overhead).saturating_sub(used);
                let charged = charge_of(pool, &fit);
                new_charged = sum_charges([&new_charged, &charged]);
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
                    extended: BTreeMap::new(),
                    ports: Vec::new(),
                    hostname,
                    pods: members,
                    headroom,
                    min_values_relaxed: false,
                    charged,
                });
            }
            if let Some(n) = &mut self.pools[pi].remaining.nodes {
                *n += i64::try_from(claims.len()).unwrap_or(0) - i64::try_from(n_new).unwrap_or(0);
            }
            self.recharge(pi, &old_charged, &new_charged);
        }
        // Pods left out stay candidates for the next limited pools.
        for p in left_out {
            if !fits_a_type(p) {
                continue;
            }
            self.placed[p] = false;
            let reason = match (fits_alone(p), shared_left.is_empty()) {
                (true, true) => format!(
                    "nodepool {name}: limits {own_limits} reached: the best packing within them places {placed_now} \
                     of the {} pods that could share these nodes",
                    pods.len()
                ),
                (false, true) => format!(
                    "nodepool {name}: every instance type that holds it exceeds what the limits {own_limits} leave \
                     for new nodes ({own_left})"
                ),
                (true, false) => format!(
                    "nodepool {name}: limits reached ({}): the best packing within them places {placed_now} of the \
                     {} pods that could share these nodes",
                    with_own(&own_limits, &shared_left),
                    pods.len()
                ),
                (false, false) => format!(
                    "nodepool {name}: every instance type that holds it exceeds what its limits leave for new nodes \
                     ({})",
                    with_own(&own_left, &shared_left)
                ),
            };
            let others: Vec<String> = self.errors[p]
                .take()
                .unwrap_or_default()
                .split("; ")
                .filter(|s| !s.is_empty() && !prefixes.iter().any(|x| s.starts_with(x.as_str())))
                .map(str::to_string)
                .collect();
            self.errors[p] = Some(std::iter::once(reason).chain(others).collect::<Vec<_>>().join("; "));
        }
    }
}

/// `cpu=6 and organisation orga-acme leaves cpu=2`: the pool's own part when it has one, then the
/// shared ones (no "; ": that separates the reasons of a pod).
fn with_own(own: &str, shared: &[String]) -> String {
    std::iter::once(own)
        .filter(|o| !o.is_empty())
        .chain(shared.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" and ")
}

/// A pool's `limits` as `cpu=24, memory=16Gi`.
fn describe_limits(l: &crate::model::Limits) -> String {
    let mut res = vec![l.cpu_millis, l.memory_bytes, l.ephemeral_storage_bytes, l.pods];
    res.extend(l.extended.values().map(|v| Some(*v)));
    describe_remaining(&Remaining { res, extended: l.extended.keys().cloned().collect(), nodes: l.nodes })
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
