//! Cost-aware re-packing of unconstrained pods (a hub addition, `Settings::repack`).
//!
//! Karpenter's loop fills each new claim until its largest option is full and then launches the
//! cheapest option that still fits; with Clever's flavors (a 2XS costs less per vCPU than an XL) that
//! leaves up to 60 % on the table for CPU-heavy workloads, which upstream recovers later through
//! consolidation (churn). The solver therefore re-packs, after the loop, the pods that carry no
//! topology constraint and no host port, claim group by claim group (same pool, same requirements):
//! nodes are opened one at a time with the instance type that packs the most value per euro, where a
//! pod's value is its requests priced at the shadow prices of the LP relaxation (the cheapest
//! fractional mix of types covering the group's demand). The result is kept only when cheaper.
//!
//! Under a pool's limits ([`pack_within`]) the goal changes: the most pods first, the lowest price
//! second, with the nodes' capacities summing to no more than what the limits leave. Karpenter's loop
//! charges each claim its largest option and fills it before opening the next, so a limit that two
//! small nodes would respect can be spent on one large node holding fewer pods.
//!
//! Owns the packing arithmetic. Must not know about pools or topology (the solver decides which
//! claims are eligible and turns the limits into a [`Budget`]).

use crds::quantity::Resources;

/// A node type to pack into.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bin {
    /// Room for pods: allocatable minus DaemonSet overhead.
    pub room: Resources,
    /// EUR/h.
    pub price: f64,
}

/// Most types for which the LP is solved (vertex enumeration is cubic in it).
pub const MAX_TYPES: usize = 64;

fn vec3(r: &Resources) -> [f64; 3] {
    [r.cpu_millis as f64, r.memory_bytes as f64, r.pods as f64]
}

fn det3(m: [[f64; 3]; 3]) -> f64 {
    m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
        + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
}

/// Shadow prices (per millicore, byte, pod slot) of the LP `min Σ price·x, Σ room·x ≥ demand, x ≥ 0`,
/// from its dual `max demand·y, room_i·y ≤ price_i, y ≥ 0` by vertex enumeration; with the optimal
/// value (the LP lower bound).
pub fn shadow_prices(bins: &[Bin], demand: &Resources) -> ([f64; 3], f64) {
    // Scale to comparable magnitudes: cores, GiB, pods.
    let scale = [1e-3, 1.0 / f64::from(1u32 << 30), 1.0];
    let rows: Vec<([f64; 3], f64)> = bins
        .iter()
        .map(|b| {
            let v = vec3(&b.room);
            ([v[0] * scale[0], v[1] * scale[1], v[2] * scale[2]], b.price)
        })
        .chain((0..3).map(|k| {
            let mut v = [0.0; 3];
            v[k] = -1.0;
            (v, 0.0)
        }))
        .collect();
    let d = vec3(demand);
    let d = [d[0] * scale[0], d[1] * scale[1], d[2] * scale[2]];
    let mut best = ([0.0; 3], 0.0f64);
    let n = rows.len();
    for i in 0..n {
        for j in i + 1..n {
            for k in j + 1..n {
                let m = [rows[i].0, rows[j].0, rows[k].0];
                let det = det3(m);
                if det.abs() < 1e-12 {
                    continue;
                }
                let r = [rows[i].1, rows[j].1, rows[k].1];
                let mut y = [0.0; 3];
                for (col, yc) in y.iter_mut().enumerate() {
                    let mut mc = m;
                    for (row, rr) in r.iter().enumerate() {
                        mc[row][col] = *rr;
                    }
                    *yc = det3(mc) / det;
                }
                if rows.iter().all(|(a, p)| a[0] * y[0] + a[1] * y[1] + a[2] * y[2] <= p + 1e-9) {
                    let v = d[0] * y[0] + d[1] * y[1] + d[2] * y[2];
                    if v > best.1 {
                        best = (y, v);
                    }
                }
            }
        }
    }
    let (y, v) = best;
    ([y[0] * scale[0], y[1] * scale[1], y[2] * scale[2]], v)
}

/// How many pods of shape `s` fit in `room`.
fn fit_count(room: &Resources, s: &Resources) -> i64 {
    let per = |r: i64, q: i64| if q <= 0 { i64::MAX } else { (r / q).max(0) };
    per(room.cpu_millis, s.cpu_millis)
        .min(per(room.memory_bytes, s.memory_bytes))
        .min(per(room.ephemeral_storage_bytes, s.ephemeral_storage_bytes))
        .min(per(room.pods, s.pods))
}

fn times(s: &Resources, k: i64) -> Resources {
    Resources {
        cpu_millis: s.cpu_millis.saturating_mul(k),
        memory_bytes: s.memory_bytes.saturating_mul(k),
        ephemeral_storage_bytes: s.ephemeral_storage_bytes.saturating_mul(k),
        pods: s.pods.saturating_mul(k),
    }
}

/// Packs `items` (pod requests) into nodes: `(bin index, item indices)` per node, or `None` when some
/// item fits no bin.
pub fn pack(items: &[Resources], bins: &[Bin]) -> Option<Vec<(usize, Vec<usize>)>> {
    pack_with(items, bins, false)
}

/// [`pack`], filling each node by value density (see [`fill`]).
pub fn pack_balanced(items: &[Resources], bins: &[Bin]) -> Option<Vec<(usize, Vec<usize>)>> {
    pack_with(items, bins, true)
}

fn pack_with(items: &[Resources], bins: &[Bin], balanced: bool) -> Option<Vec<(usize, Vec<usize>)>> {
    if items.is_empty() {
        return Some(Vec::new());
    }
    let demand = items.iter().fold(Resources::ZERO, |a, r| a + *r);
    let (y, _) = shadow_prices(bins, &demand);
    let value = |r: &Resources| {
        let v = vec3(r);
        v[0] * y[0] + v[1] * y[1] + v[2] * y[2] + 1e-12 * (v[0] + v[1] / 1e6 + v[2])
    };
    // Distinct shapes, most valuable first.
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| value(&items[b]).total_cmp(&value(&items[a])).then_with(|| a.cmp(&b)));
    let mut shapes: Vec<(Resources, f64, Vec<usize>)> = Vec::new();
    for i in order {
        match shapes.iter_mut().find(|(s, ..)| *s == items[i]) {
            Some((_, _, list)) => list.push(i),
            None => shapes.push((items[i], value(&items[i]), vec![i])),
        }
    }
    // The balanced fill's order of shapes per bin depends on neither counts nor nodes: sorted once.
    let by_tilt: Vec<Vec<usize>> =
        if balanced { bins.iter().map(|bin| tilt_order(bin, &shapes)).collect() } else { Vec::new() };
    let mut left = items.len();
    let mut out = Vec::new();
    while left > 0 {
        let mut best: Option<(f64, f64, usize, Takes)> = None;
        for (b, bin) in bins.iter().enumerate() {
            let (takes, v) = fill(bin, &shapes, by_tilt.get(b).map(Vec::as_slice));
            if takes.is_empty() {
                continue;
            }
            let score = bin.price / v.max(1e-300);
            if best.as_ref().is_none_or(|(bs, bv, ..)| score < *bs || (score == *bs && v > *bv)) {
                best = Some((score, v, b, takes));
            }
        }
        let (_, _, b, takes) = best?;
        let mut taken = Vec::new();
        for (si, k) in takes {
            let list = &mut shapes[si].2;
            let at = list.len() - usize::try_from(k).unwrap_or(0).min(list.len());
            taken.extend(list.drain(at..));
        }
        left -= taken.len();
        taken.sort_unstable();
        out.push((b, taken));
    }
    Some(out)
}

/// `(shape index, count)` taken by one node.
type Takes = Vec<(usize, i64)>;

/// Shapes ordered by how memory-heavy they are relative to the node (ties: index).
fn tilt_order(bin: &Bin, shapes: &[(Resources, f64, Vec<usize>)]) -> Vec<usize> {
    let full = vec3(&bin.room);
    let tilt = |s: &Resources| {
        let x = vec3(s);
        let c = if full[0] > 0.0 { x[0] / full[0] } else { 0.0 };
        let m = if full[1] > 0.0 { x[1] / full[1] } else { 0.0 };
        (m + 1e-12) / (c + 1e-12)
    };
    let keys: Vec<f64> = shapes.iter().map(|(s, ..)| tilt(s)).collect();
    let mut by_tilt: Vec<usize> = (0..shapes.len()).collect();
    by_tilt.sort_by(|&a, &b| keys[a].total_cmp(&keys[b]).then(a.cmp(&b)));
    by_tilt
}

/// What one node of `bin` would take from the remaining shapes: `(shape, count)` and their value.
/// Plain: shapes in value order, as many of each as fit. Balanced: one pod at a time, from the
/// memory-heavy or the cpu-heavy end, whichever keeps cpu and memory filling together.
/// `by_tilt`: the balanced fill's shape order for this bin ([`tilt_order`]); `None`: plain fill.
fn fill(bin: &Bin, shapes: &[(Resources, f64, Vec<usize>)], by_tilt: Option<&[usize]>) -> (Takes, f64) {
    let mut room = bin.room;
    let mut takes: Takes = Vec::new();
    let mut v = 0.0;
    let mut left: Vec<i64> = shapes.iter().map(|(_, _, l)| i64::try_from(l.len()).unwrap_or(i64::MAX)).collect();
    let Some(by_tilt) = by_tilt else {
        for (si, (s, sv, _)) in shapes.iter().enumerate() {
            let k = fit_count(&room, s).min(left[si]);
            if k > 0 {
                room = room.saturating_sub(times(s, k));
                v += sv * k as f64;
                takes.push((si, k));
            }
        }
        return (takes, v);
    };
    // Two-pointer balance: shapes ordered by how memory-heavy they are relative to the node; add
    // from the memory-heavy end while memory is the less filled resource, else from the cpu-heavy end.
    let full = vec3(&bin.room);
    let (mut used_c, mut used_m) = (0.0f64, 0.0f64);
    loop {
        let memory_first = used_m / full[1].max(1.0) < used_c / full[0].max(1.0);
        let mut iter: Box<dyn Iterator<Item = &usize>> =
            if memory_first { Box::new(by_tilt.iter().rev()) } else { Box::new(by_tilt.iter()) };
        let Some(&si) = iter.find(|&&si| left[si] > 0 && fit_count(&room, &shapes[si].0) > 0) else { break };
        let s = &shapes[si].0;
        room = room.saturating_sub(*s);
        used_c += s.cpu_millis as f64;
        used_m += s.memory_bytes as f64;
        v += shapes[si].1;
        left[si] -= 1;
        match takes.iter_mut().find(|(x, _)| *x == si) {
            Some(t) => t.1 += 1,
            None => takes.push((si, 1)),
        }
    }
    (takes, v)
}

/// First-fit decreasing (cpu, then memory) into open nodes; an item that fits none opens the cheapest
/// bin it fits. A second candidate beside [`pack`]: the solver keeps the cheaper, so re-packing is
/// never worse than this classic baseline.
pub fn pack_ffd(items: &[Resources], bins: &[Bin]) -> Option<Vec<(usize, Vec<usize>)>> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| {
        (items[b].cpu_millis, items[b].memory_bytes).cmp(&(items[a].cpu_millis, items[a].memory_bytes)).then(a.cmp(&b))
    });
    let mut by_price: Vec<usize> = (0..bins.len()).collect();
    by_price.sort_by(|&a, &b| bins[a].price.total_cmp(&bins[b].price).then(a.cmp(&b)));
    let mut open: Vec<(Resources, usize, Vec<usize>)> = Vec::new();
    for i in order {
        if let Some(node) = open.iter_mut().find(|(room, ..)| items[i].fits(room)) {
            node.0 = node.0.saturating_sub(items[i]);
            node.2.push(i);
            continue;
        }
        let b = *by_price.iter().find(|&&b| items[i].fits(&bins[b].room))?;
        open.push((bins[b].room.saturating_sub(items[i]), b, vec![i]));
    }
    Some(
        open.into_iter()
            .map(|(_, b, mut list)| {
                list.sort_unstable();
                (b, list)
            })
            .collect(),
    )
}

/// What a pool's limits leave for a group of nodes: capacity per resource (cpu, memory,
/// ephemeral storage, pods; `None` is unlimited), compared with the nodes' **capacity** as
/// Karpenter does, and a node count (`None` is unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Budget {
    pub res: [Option<i64>; 4],
    pub nodes: Option<usize>,
}

fn dims(r: &Resources) -> [i64; 4] {
    [r.cpu_millis, r.memory_bytes, r.ephemeral_storage_bytes, r.pods]
}

impl Budget {
    /// Whether nodes of capacities summing to `used`, `count` of them, stay within the budget.
    pub fn holds(&self, used: &[i64; 4], count: usize) -> bool {
        self.res.iter().zip(used).all(|(l, u)| l.is_none_or(|l| *u <= l)) && self.nodes.is_none_or(|n| count <= n)
    }

    /// Whether `a` is no larger than `b` on every limited resource.
    pub fn no_larger(&self, a: &Resources, b: &Resources) -> bool {
        self.res.iter().zip(dims(a).into_iter().zip(dims(b))).all(|(l, (x, y))| l.is_none() || x <= y)
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
    caps: &'a [Resources],
    budget: &'a Budget,
}

impl Ctx<'_> {
    fn usage(&self, plan: &[Node]) -> [i64; 4] {
        let mut u = [0i64; 4];
        for n in plan {
            for (a, c) in u.iter_mut().zip(dims(&self.caps[n.bin])) {
                *a = a.saturating_add(c);
            }
        }
        u
    }

    fn within(&self, plan: &[Node]) -> bool {
        self.budget.holds(&self.usage(plan), plan.len())
    }

    fn price(&self, plan: &[Node]) -> f64 {
        plan.iter().map(|n| self.bins[n.bin].price).sum()
    }

    /// The usage with node `at` switched to bin `b` (or removed when `b` is `None`).
    fn usage_with(&self, usage: &[i64; 4], old: usize, new: Option<usize>) -> [i64; 4] {
        let mut u = *usage;
        let o = dims(&self.caps[old]);
        let n = new.map(|b| dims(&self.caps[b])).unwrap_or([0; 4]);
        for k in 0..4 {
            u[k] = u[k].saturating_sub(o[k]).saturating_add(n[k]);
        }
        u
    }

    /// Cheapest bin holding `used` whose swap for `old` keeps the plan within the budget, or (when
    /// the plan is over it) at least lowers no limited resource; ties: smaller capacity, then index.
    fn cheapest_for(&self, used: &Resources, old: usize, usage: &[i64; 4], count: usize) -> usize {
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
                    let used = plan[i].used + plan[j].used;
                    let old = self.bins[plan[i].bin].price + self.bins[plan[j].bin].price;
                    let without = self.usage_with(&self.usage_with(&usage, plan[i].bin, None), plan[j].bin, None);
                    for (b, bin) in self.bins.iter().enumerate() {
                        if bin.price >= old || !used.fits(&bin.room) {
                            continue;
                        }
                        let mut u = without;
                        for (a, c) in u.iter_mut().zip(dims(&self.caps[b])) {
                            *a = a.saturating_add(c);
                        }
                        if !self.budget.holds(&u, plan.len() - 1) {
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
                let c = dims(&self.caps[n.bin]);
                let mut s: f64 = 0.0;
                for (l, c) in self.budget.res.iter().zip(c) {
                    if let Some(l) = l {
                        s = s.max(c as f64 / (*l).max(1) as f64);
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
            if let Some(n) = plan.iter_mut().find(|n| (n.used + self.items[i]).fits(&self.bins[n.bin].room)) {
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
                Some((s, list)) if *s == self.items[i] => list.push(i),
                _ => shapes.push((self.items[i], vec![i])),
            }
        }
        for (_, list) in &mut shapes {
            list.reverse(); // taken from the back: first in order first
        }
        let mut plan: Vec<Node> = Vec::new();
        let mut usage = [0i64; 4];
        loop {
            let mut best: Option<(f64, f64, usize, Takes)> = None;
            for (b, bin) in self.bins.iter().enumerate() {
                if only.is_some_and(|o| o != b) {
                    continue;
                }
                let mut u = usage;
                for (a, c) in u.iter_mut().zip(dims(&self.caps[b])) {
                    *a = a.saturating_add(c);
                }
                if !self.budget.holds(&u, plan.len() + 1) {
                    continue;
                }
                let mut room = bin.room;
                let mut takes = Vec::new();
                let mut count = 0i64;
                for (si, (s, list)) in shapes.iter().enumerate() {
                    let k = fit_count(&room, s).min(i64::try_from(list.len()).unwrap_or(i64::MAX));
                    if k > 0 {
                        room = room.saturating_sub(times(s, k));
                        takes.push((si, k));
                        count += k;
                    }
                }
                if count == 0 {
                    continue;
                }
                // Share of what the budget still leaves.
                let c = dims(&self.caps[b]);
                let mut share: f64 = 1e-12;
                for ((l, c), u) in self.budget.res.iter().zip(c).zip(usage) {
                    if let Some(l) = l {
                        share = share.max(c as f64 / (l - u).max(1) as f64);
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
            for (a, c) in usage.iter_mut().zip(dims(&self.caps[b])) {
                *a = a.saturating_add(c);
            }
            plan.push(node);
        }
        plan
    }
}

/// Plans with more nodes than this skip the pairwise merge (quadratic in nodes).
const MERGE_MAX: usize = 96;

/// Smaller first: the larger of cpu and memory relative to a 1-CPU / 1-GiB unit, then cpu, memory.
fn size_cmp(a: &Resources, b: &Resources) -> std::cmp::Ordering {
    let key = |r: &Resources| (r.cpu_millis as f64 / 1000.0).max(r.memory_bytes as f64 / f64::from(1u32 << 30));
    key(a).total_cmp(&key(b)).then((a.cpu_millis, a.memory_bytes).cmp(&(b.cpu_millis, b.memory_bytes)))
}

/// Packs `items` into nodes of `bins` (capacities `caps`, charged against `budget`): the most items
/// first, the lowest price second, never beyond the budget. Returns `(bin, item indices)` per node;
/// items in no node are left out. Candidates: the unconstrained packings ([`pack`],
/// [`pack_balanced`], [`pack_ffd`]) when they fit the budget, else cut down to it; a greedy that
/// opens the bin placing the most items per share of the budget left; and one per bin with only that
/// bin; each tidied (cheapest bin per node, cheaper merges of two nodes). Pure and deterministic.
pub fn pack_within(items: &[Resources], bins: &[Bin], caps: &[Resources], budget: &Budget) -> Vec<(usize, Vec<usize>)> {
    let ctx = Ctx { items, bins, caps, budget };
    let alone = Budget { res: budget.res, nodes: budget.nodes.map(|n| n.min(1)) };
    // Items some bin holds whose capacity alone is within the budget.
    let placeable: Vec<usize> = (0..items.len())
        .filter(|&i| bins.iter().zip(caps).any(|(b, c)| items[i].fits(&b.room) && alone.holds(&dims(c), 1)))
        .collect();
    if placeable.is_empty() {
        return Vec::new();
    }
    let sub: Vec<Resources> = placeable.iter().map(|&i| items[i]).collect();
    let mut candidates: Vec<Vec<Node>> = Vec::new();
    for packed in [pack(&sub, bins), pack_balanced(&sub, bins), pack_ffd(&sub, bins)].into_iter().flatten() {
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
    let key = |r: &Resources| (r.cpu_millis, r.memory_bytes, r.ephemeral_storage_bytes, r.pods);
    // Per shape: its items in order and how many were handed out.
    type Shapes = std::collections::BTreeMap<(i64, i64, i64, i64), (Vec<usize>, usize)>;
    let mut by_shape: Shapes = Default::default();
    for (i, r) in items.iter().enumerate() {
        by_shape.entry(key(r)).or_default().0.push(i);
    }
    for node in &mut plan {
        for slot in &mut node.items {
            if let Some((list, next)) = by_shape.get_mut(&key(&items[*slot]))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn r(cpu: i64, mem_gi: i64) -> Resources {
        Resources { cpu_millis: cpu, memory_bytes: mem_gi << 30, ephemeral_storage_bytes: 0, pods: 1 }
    }

    fn bin(cpu: i64, mem_gi: i64, price: f64) -> Bin {
        Bin { room: Resources { pods: 110, ..r(cpu, mem_gi) }, price }
    }

    #[test]
    fn lp_prefers_the_cheapest_per_unit_type() {
        // 4-CPU bins at 1 € beat 16-CPU bins at 5 €: 16 CPU of demand costs 4 €.
        let bins = [bin(4000, 4, 1.0), bin(16000, 32, 5.0)];
        let (_, v) = shadow_prices(&bins, &Resources { pods: 16, ..r(16000, 1) });
        assert!((v - 4.0).abs() < 1e-6, "{v}");
    }

    #[test]
    fn packs_cpu_heavy_pods_into_small_cheap_bins() {
        let bins = [bin(4000, 4, 1.0), bin(16000, 32, 5.0)];
        let items = vec![r(1000, 0); 16];
        let p = pack(&items, &bins).unwrap_or_default();
        assert_eq!(p.len(), 4);
        assert!(p.iter().all(|(b, items)| *b == 0 && items.len() == 4));
    }

    #[test]
    fn balanced_fill_pairs_cpu_heavy_with_memory_heavy_pods() {
        // One 8-CPU/8-GiB type: 8 pods of (1 CPU, 0) and 8 of (0, 1 GiB) fit exactly in one node
        // when mixed, and the balanced fill finds it.
        let bins = [bin(8000, 8, 1.0)];
        let mut items = vec![r(1000, 0); 8];
        items.extend(vec![r(0, 1); 8]);
        let p = pack_balanced(&items, &bins).unwrap_or_default();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].1.len(), 16);
    }

    #[test]
    fn an_item_too_large_for_every_bin_fails() {
        assert!(pack(&[r(99_000, 0)], &[bin(4000, 4, 1.0)]).is_none());
    }
}
