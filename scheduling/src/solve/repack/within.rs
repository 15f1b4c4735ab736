//! Packing within a pool's limits ([`pack_within`], [`pack_within_ruled`]): the most items first,
//! the lowest price second, with the nodes' sizes (in each dimension the limits count) summing to no
//! more than the [`Budget`] the limits leave. Candidates: the unconstrained packings cut down to the
//! budget, greedies that open the bin placing the most items per share of the budget, each tidied.
//!
//! Owns the budget's arithmetic. Must not know about pools, pods or topology (the solver turns the
//! limits into a [`Budget`]).

use crds::quantity::Resources;

use super::Bin;
use super::pack::{Takes, fit_count, times};
use super::ruled::{NodeTags, Packing, Rules, TagSet, pack_ruled};

/// What the limits leave for a group of nodes: per dimension (`None` is unlimited), compared with
/// the sum of the nodes' sizes in that dimension (the solver chooses the dimensions: capacity as
/// Karpenter compares it, what a shared limit counts, ...), and a node count (`None` is unlimited).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Budget {
    pub res: Vec<Option<i64>>,
    pub nodes: Option<usize>,
}

impl Budget {
    /// Whether nodes of sizes summing to `used`, `count` of them, stay within the budget.
    pub fn holds(&self, used: &[i64], count: usize) -> bool {
        self.res.iter().zip(used).all(|(l, u)| l.is_none_or(|l| *u <= l)) && self.nodes.is_none_or(|n| count <= n)
    }

    /// [`Self::holds`] for `used + plus`, without building the sum (hot in the merges).
    fn holds_plus(&self, used: &[i64], plus: &[i64], count: usize) -> bool {
        self.res.iter().zip(used.iter().zip(plus)).all(|(l, (u, p))| l.is_none_or(|l| u.saturating_add(*p) <= l))
            && self.nodes.is_none_or(|n| count <= n)
    }

    /// Whether `a` is no larger than `b` on every limited dimension.
    pub fn no_larger(&self, a: &[i64], b: &[i64]) -> bool {
        self.res.iter().zip(a.iter().zip(b)).all(|(l, (x, y))| l.is_none() || x <= y)
    }
}

/// A node of a plan: its bin, its items and their summed requests.
#[derive(Debug, Clone)]
struct Node {
    bin: usize,
    items: Vec<usize>,
    used: Resources,
}

struct Ctx<'a> {
    items: &'a [Resources],
    bins: &'a [Bin],
    /// Each bin's size in the budget's dimensions.
    caps: &'a [Vec<i64>],
    budget: &'a Budget,
    rules: &'a Rules,
    /// Some item has tags: nodes must be checked against the rules.
    ruled: bool,
}

impl Ctx<'_> {
    fn set_of(&self, i: usize) -> &TagSet {
        &self.rules.sets[self.rules.item_set[i]]
    }

    fn tags_of(&self, items: &[usize]) -> NodeTags {
        let mut t = NodeTags::default();
        for &i in items {
            t.add(self.set_of(i));
        }
        t
    }

    /// Whether the items of two nodes may share one under the rules.
    fn may_merge(&self, a: &Node, b: &Node) -> bool {
        if !self.ruled {
            return true;
        }
        let mut t = self.tags_of(&a.items);
        b.items.iter().all(|&i| {
            let ok = t.admits(self.set_of(i), &self.rules.caps);
            t.add(self.set_of(i));
            ok
        })
    }

    fn usage(&self, plan: &[Node]) -> Vec<i64> {
        let mut u = vec![0i64; self.budget.res.len()];
        for n in plan {
            add(&mut u, &self.caps[n.bin]);
        }
        u
    }

    fn within(&self, plan: &[Node]) -> bool {
        self.budget.holds(&self.usage(plan), plan.len())
    }

    fn price(&self, plan: &[Node]) -> f64 {
        plan.iter().map(|n| self.bins[n.bin].price).sum()
    }

    /// The usage with a node of bin `old` switched to bin `new` (or removed when `new` is `None`).
    fn usage_with(&self, usage: &[i64], old: usize, new: Option<usize>) -> Vec<i64> {
        let mut u = usage.to_vec();
        for (a, o) in u.iter_mut().zip(&self.caps[old]) {
            *a = a.saturating_sub(*o);
        }
        if let Some(b) = new {
            add(&mut u, &self.caps[b]);
        }
        u
    }

    /// Cheapest bin holding `used` whose swap for `old` keeps the plan within the budget, or (when
    /// the plan is over it) at least lowers no limited resource; ties: smaller capacity, then index.
    fn cheapest_for(&self, used: &Resources, old: usize, usage: &[i64], count: usize) -> usize {
        let within = self.budget.holds(usage, count);
        let mut best = old;
        for (b, bin) in self.bins.iter().enumerate() {
            if !used.fits(&bin.room) {
                continue;
            }
            let ok = if within {
                self.budget.holds(&self.usage_with(usage, old, Some(b)), count)
            } else {
                self.budget.no_larger(&self.caps[b], &self.caps[old])
            };
            if !ok {
                continue;
            }
            let (pb, po) = (bin.price, self.bins[best].price);
            if pb < po || (pb == po && self.budget.no_larger(&self.caps[b], &self.caps[best]) && b < best) {
                best = b;
            }
        }
        best
    }

    /// Each node on the cheapest bin that holds it, then pairs of nodes merged into one bin while that
    /// is cheaper and within the budget (bounded: plans of at most `MERGE_MAX` nodes).
    fn tidy(&self, plan: &mut Vec<Node>) {
        let mut usage = self.usage(plan);
        for i in 0..plan.len() {
            let b = self.cheapest_for(&plan[i].used, plan[i].bin, &usage, plan.len());
            usage = self.usage_with(&usage, plan[i].bin, Some(b));
            plan[i].bin = b;
        }
        if plan.len() > MERGE_MAX {
            return;
        }
        loop {
            let mut best: Option<(f64, usize, usize, usize)> = None;
            for i in 0..plan.len() {
                for j in i + 1..plan.len() {
                    if !self.may_merge(&plan[i], &plan[j]) {
                        continue;
                    }
                    let used = plan[i].used + plan[j].used;
                    let old = self.bins[plan[i].bin].price + self.bins[plan[j].bin].price;
                    let without = self.usage_with(&self.usage_with(&usage, plan[i].bin, None), plan[j].bin, None);
                    for (b, bin) in self.bins.iter().enumerate() {
                        if bin.price >= old || !used.fits(&bin.room) {
                            continue;
                        }
                        if !self.budget.holds_plus(&without, &self.caps[b], plan.len() - 1) {
                            continue;
                        }
                        let gain = old - bin.price;
                        if best.is_none_or(|(g, ..)| gain > g) {
                            best = Some((gain, i, j, b));
                        }
                    }
                }
            }
            let Some((_, i, j, b)) = best else { break };
            let second = plan.remove(j);
            plan[i].items.extend(second.items);
            plan[i].used += second.used;
            plan[i].bin = b;
            usage = self.usage(plan);
        }
    }

    /// Drops whole nodes, those holding the fewest items per share of the budget first, until the
    /// plan is within the budget; their items then go into the room left on the kept nodes.
    fn repair(&self, plan: &mut Vec<Node>) {
        let mut dropped: Vec<usize> = Vec::new();
        while !self.within(plan) && !plan.is_empty() {
            let share = |n: &Node| -> f64 {
                let mut s: f64 = 0.0;
                for (l, c) in self.budget.res.iter().zip(&self.caps[n.bin]) {
                    if let Some(l) = l {
                        s = s.max(*c as f64 / (*l).max(1) as f64);
                    }
                }
                if let Some(n) = self.budget.nodes {
                    s = s.max(1.0 / n.max(1) as f64);
                }
                n.items.len() as f64 / s.max(1e-12)
            };
            let at = (0..plan.len()).min_by(|&a, &b| share(&plan[a]).total_cmp(&share(&plan[b])).then(b.cmp(&a)));
            let Some(at) = at else { break };
            dropped.extend(plan.remove(at).items);
        }
        dropped.sort_by(|&a, &b| size_cmp(&self.items[a], &self.items[b]).then(a.cmp(&b)));
        for i in dropped {
            let admits = |n: &Node| !self.ruled || self.tags_of(&n.items).admits(self.set_of(i), &self.rules.caps);
            if let Some(n) =
                plan.iter_mut().find(|n| (n.used + self.items[i]).fits(&self.bins[n.bin].room) && admits(n))
            {
                n.used += self.items[i];
                n.items.push(i);
            }
        }
    }

    /// Opens nodes one at a time, each of the bin taking the most of the smallest remaining items per
    /// share of the remaining budget (ties: lower price per item), filled smallest first; stops when
    /// no admissible bin takes an item. `only` restricts the bins to one.
    fn greedy(&self, order: &[usize], only: Option<usize>) -> Vec<Node> {
        // Distinct shapes, smallest first, as (shape, item indices still to place).
        let mut shapes: Vec<(Resources, Vec<usize>)> = Vec::new();
        for &i in order {
            match shapes.last_mut() {
                Some((s, list)) if *s == self.items[i] && self.rules.item_set[list[0]] == self.rules.item_set[i] => {
                    list.push(i)
                }
                _ => shapes.push((self.items[i], vec![i])),
            }
        }
        for (_, list) in &mut shapes {
            list.reverse(); // taken from the back: first in order first
        }
        let mut plan: Vec<Node> = Vec::new();
        let mut usage = vec![0i64; self.budget.res.len()];
        loop {
            let mut best: Option<(f64, f64, usize, Takes)> = None;
            for (b, bin) in self.bins.iter().enumerate() {
                if only.is_some_and(|o| o != b) {
                    continue;
                }
                if !self.budget.holds_plus(&usage, &self.caps[b], plan.len() + 1) {
                    continue;
                }
                let mut room = bin.room;
                let mut takes = Vec::new();
                let mut count = 0i64;
                let mut tags = NodeTags::default();
                for (si, (s, list)) in shapes.iter().enumerate() {
                    let Some(&first) = list.first() else { continue };
                    let mut k = fit_count(&room, s).min(i64::try_from(list.len()).unwrap_or(i64::MAX));
                    if self.ruled && k > 0 {
                        k = k.min(tags.room_for(self.set_of(first), &self.rules.caps));
                    }
                    if k > 0 {
                        room = room.saturating_sub(times(s, k));
                        if self.ruled {
                            tags.add_n(self.set_of(first), k);
                        }
                        takes.push((si, k));
                        count += k;
                    }
                }
                if count == 0 {
                    continue;
                }
                // Share of what the budget still leaves.
                let mut share: f64 = 1e-12;
                for ((l, c), u) in self.budget.res.iter().zip(&self.caps[b]).zip(&usage) {
                    if let Some(l) = l {
                        share = share.max(*c as f64 / l.saturating_sub(*u).max(1) as f64);
                    }
                }
                if let Some(n) = self.budget.nodes {
                    share = share.max(1.0 / (n.saturating_sub(plan.len()).max(1)) as f64);
                }
                let score = count as f64 / share;
                let per_item = bin.price / count as f64;
                let better = match &best {
                    None => true,
                    Some((bs, bp, ..)) => score > *bs * (1.0 + 1e-9) || (score >= *bs * (1.0 - 1e-9) && per_item < *bp),
                };
                if better {
                    best = Some((score, per_item, b, takes));
                }
            }
            let Some((_, _, b, takes)) = best else { break };
            let mut node = Node { bin: b, items: Vec::new(), used: Resources::ZERO };
            for (si, k) in takes {
                let list = &mut shapes[si].1;
                for _ in 0..k {
                    if let Some(i) = list.pop() {
                        node.used += self.items[i];
                        node.items.push(i);
                    }
                }
            }
            add(&mut usage, &self.caps[b]);
            plan.push(node);
        }
        plan
    }
}

/// Adds a size to a usage, dimension by dimension.
fn add(usage: &mut [i64], size: &[i64]) {
    for (a, c) in usage.iter_mut().zip(size) {
        *a = a.saturating_add(*c);
    }
}

/// Plans with more nodes than this skip the pairwise merge (quadratic in nodes).
const MERGE_MAX: usize = 96;

/// Smaller first: the larger of cpu and memory relative to a 1-CPU / 1-GiB unit, then cpu, memory.
fn size_cmp(a: &Resources, b: &Resources) -> std::cmp::Ordering {
    let key = |r: &Resources| (r.cpu_millis as f64 / 1000.0).max(r.memory_bytes as f64 / f64::from(1u32 << 30));
    key(a).total_cmp(&key(b)).then((a.cpu_millis, a.memory_bytes).cmp(&(b.cpu_millis, b.memory_bytes)))
}

/// Packs `items` into nodes of `bins` (sizes `caps`, charged against `budget`): the most items
/// first, the lowest price second, never beyond the budget. Returns `(bin, item indices)` per node;
/// items in no node are left out. Candidates: the unconstrained packings ([`pack`](fn@super::pack),
/// [`pack_balanced`](super::pack_balanced), [`pack_ffd`](super::pack_ffd)) when they fit the budget, else cut down to it; a greedy that
/// opens the bin placing the most items per share of the budget left; and one per bin with only that
/// bin; each tidied (cheapest bin per node, cheaper merges of two nodes). Pure and deterministic.
pub fn pack_within(items: &[Resources], bins: &[Bin], caps: &[Vec<i64>], budget: &Budget) -> Vec<(usize, Vec<usize>)> {
    let rules = Rules { sets: vec![TagSet::default()], item_set: vec![0; items.len()], caps: Default::default() };
    pack_within_ruled(items, &rules, bins, caps, budget)
}

/// [`pack_within`] under per-node [`Rules`]: every node of every candidate obeys them (the
/// packings through [`pack_ruled`], the greedies and the refills checking each item, merges only of
/// nodes whose items may share one), and items are interchangeable only with equal requests and
/// equal tags.
pub fn pack_within_ruled(
    items: &[Resources],
    rules: &Rules,
    bins: &[Bin],
    caps: &[Vec<i64>],
    budget: &Budget,
) -> Vec<(usize, Vec<usize>)> {
    let ruled = rules.sets.iter().any(|s| !s.marks.is_empty() || !s.blocks.is_empty());
    let ctx = Ctx { items, bins, caps, budget, rules, ruled };
    // Items some bin holds whose size alone is within the budget.
    let placeable: Vec<usize> = (0..items.len())
        .filter(|&i| bins.iter().zip(caps).any(|(b, c)| items[i].fits(&b.room) && budget.holds(c, 1)))
        .collect();
    if placeable.is_empty() {
        return Vec::new();
    }
    let sub: Vec<Resources> = placeable.iter().map(|&i| items[i]).collect();
    let sub_rules = Rules {
        sets: rules.sets.clone(),
        item_set: placeable.iter().map(|&i| rules.item_set[i]).collect(),
        caps: rules.caps.clone(),
    };
    let mut candidates: Vec<Vec<Node>> = Vec::new();
    for packed in [Packing::Value, Packing::Balanced, Packing::Ffd]
        .into_iter()
        .filter_map(|how| pack_ruled(&sub, &sub_rules, bins, how))
    {
        let mut plan: Vec<Node> = packed
            .into_iter()
            .map(|(bin, idx)| {
                let items: Vec<usize> = idx.iter().map(|&k| placeable[k]).collect();
                let used = items.iter().fold(Resources::ZERO, |a, &i| a + ctx.items[i]);
                Node { bin, items, used }
            })
            .collect();
        ctx.tidy(&mut plan);
        if !ctx.within(&plan) {
            ctx.repair(&mut plan);
            ctx.tidy(&mut plan);
        }
        candidates.push(plan);
    }
    // An unconstrained packing that already holds every placeable item within the budget is the
    // answer (the greedies only trade price for count).
    let complete =
        candidates.iter().any(|p| ctx.within(p) && p.iter().map(|n| n.items.len()).sum::<usize>() == placeable.len());
    let mut order = placeable.clone();
    order.sort_by(|&a, &b| size_cmp(&items[a], &items[b]).then(a.cmp(&b)));
    let greedies = if complete { 0 } else { bins.len() + 1 };
    for only in std::iter::once(None).chain((0..bins.len()).map(Some)).take(greedies) {
        let mut plan = ctx.greedy(&order, only);
        ctx.tidy(&mut plan);
        candidates.push(plan);
    }
    let placed = |p: &[Node]| p.iter().map(|n| n.items.len()).sum::<usize>();
    let mut best: Option<Vec<Node>> = None;
    for plan in candidates {
        if !ctx.within(&plan) {
            continue;
        }
        let better = match &best {
            None => true,
            Some(b) => {
                placed(&plan) > placed(b) || (placed(&plan) == placed(b) && ctx.price(&plan) + 1e-9 < ctx.price(b))
            }
        };
        if better {
            best = Some(plan);
        }
    }
    // Equal items are interchangeable: those listed first are the ones placed (the solver lists the
    // pods already placed by the loop first), whatever candidate won.
    let mut plan = best.unwrap_or_default();
    let key = |i: usize| {
        let r = &items[i];
        (r.cpu_millis, r.memory_bytes, r.ephemeral_storage_bytes, r.pods, rules.item_set[i])
    };
    // Per shape (requests and tags): its items in order and how many were handed out.
    type Shapes = std::collections::BTreeMap<(i64, i64, i64, i64, usize), (Vec<usize>, usize)>;
    let mut by_shape: Shapes = Default::default();
    for i in 0..items.len() {
        by_shape.entry(key(i)).or_default().0.push(i);
    }
    for node in &mut plan {
        for slot in &mut node.items {
            if let Some((list, next)) = by_shape.get_mut(&key(*slot))
                && let Some(&i) = list.get(*next)
            {
                *slot = i;
                *next += 1;
            }
        }
    }
    plan.into_iter()
        .map(|mut n| {
            n.items.sort_unstable();
            (n.bin, n.items)
        })
        .collect()
}
