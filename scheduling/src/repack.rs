//! Cost-aware re-packing of unconstrained pods (a hub addition, `Settings::repack`).
//!
//! Karpenter's loop fills each new claim until its largest option is full and then launches the
//! cheapest option that still fits; with Clever's flavors (a 2XS costs less per vCPU than an XL) that
//! leaves up to 60 % on the table for CPU-heavy workloads, which upstream recovers later through
//! consolidation (churn). The solver therefore re-packs the loop's claims, claim group by claim
//! group (same pool, same requirements): nodes are opened one at a time with the instance type that
//! packs the most value per euro, where a pod's value is its requests priced at the shadow prices of
//! the LP relaxation (the cheapest fractional mix of types covering the group's demand). The result
//! is kept only when cheaper. Hostname topology and host ports travel as per-node [`Rules`]; the
//! solver keeps the other topology exact by re-packing only within equal requirements, and
//! catalogues above [`MAX_TYPES`] are cut down to that many [`candidates`].
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

/// Most bins a packing considers: the fills are linear in the bins, the merges of [`pack_within`]
/// too, and the LP's vertex enumeration is quartic. Larger catalogues are cut down by [`candidates`].
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
/// value (the LP lower bound). Above 16 bins the enumeration (quartic in the bins) runs on a working
/// set of bins, to which the bins whose constraint the answer violates are added until none is (the
/// answer is then optimal for all of them).
pub fn shadow_prices(bins: &[Bin], demand: &Resources) -> ([f64; 3], f64) {
    // Scale to comparable magnitudes: cores, GiB, pods.
    let scale = [1e-3, 1.0 / f64::from(1u32 << 30), 1.0];
    let rows: Vec<[f64; 3]> = bins
        .iter()
        .map(|b| {
            let v = vec3(&b.room);
            [v[0] * scale[0], v[1] * scale[1], v[2] * scale[2]]
        })
        .collect();
    let d = vec3(demand);
    let d = [d[0] * scale[0], d[1] * scale[1], d[2] * scale[2]];
    let unscale = |(y, v): ([f64; 3], f64)| ([y[0] * scale[0], y[1] * scale[1], y[2] * scale[2]], v);
    let all: Vec<usize> = (0..bins.len()).collect();
    if bins.len() <= 16 {
        return unscale(dual_vertices(&rows, bins, &all, &d));
    }
    // Working set: per resource, the bins offering the most of it per euro.
    let mut set: Vec<usize> = Vec::new();
    for k in [0usize, 1, 2] {
        let mut by: Vec<usize> = all.clone();
        by.sort_by(|&a, &b| (rows[b][k] / bins[b].price).total_cmp(&(rows[a][k] / bins[a].price)).then(a.cmp(&b)));
        for &i in by.iter().take(4) {
            if !set.contains(&i) {
                set.push(i);
            }
        }
    }
    let mut best = dual_vertices(&rows, bins, &set, &d);
    // Each round adds the most violated constraints; bounded so that a degenerate catalogue cannot
    // make it loop (the last answer is then a slight over-estimate of the prices, never unsafe).
    for _ in 0..12 {
        let y = best.0;
        let mut violated: Vec<(f64, usize)> = all
            .iter()
            .filter(|i| !set.contains(i))
            .map(|&i| ((rows[i][0] * y[0] + rows[i][1] * y[1] + rows[i][2] * y[2]) / bins[i].price, i))
            .filter(|(r, _)| *r > 1.0 + 1e-9)
            .collect();
        if violated.is_empty() {
            break;
        }
        violated.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        set.extend(violated.iter().take(8).map(|&(_, i)| i));
        best = dual_vertices(&rows, bins, &set, &d);
    }
    unscale(best)
}

/// The dual's best vertex over the bins `set` (and `y ≥ 0`), in scaled units.
fn dual_vertices(scaled: &[[f64; 3]], bins: &[Bin], set: &[usize], d: &[f64; 3]) -> ([f64; 3], f64) {
    let rows: Vec<([f64; 3], f64)> = set
        .iter()
        .map(|&i| (scaled[i], bins[i].price))
        .chain((0..3).map(|k| {
            let mut v = [0.0; 3];
            v[k] = -1.0;
            (v, 0.0)
        }))
        .collect();
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
    best
}

/// The bins worth packing into when there are more than [`MAX_TYPES`]: at most that many (plus, rarely,
/// one per item shape that none of them holds). Ranked by how much of the items' LP value (shadow
/// prices of their total demand) a euro buys; first the best of each size class (cpu by powers of
/// two × memory per cpu by powers of two), so that small nodes for the remainder and shapes for
/// memory- or cpu-heavy mixes stay available, then the best of the rest. Indices into `bins`,
/// ascending.
pub fn candidates(bins: &[Bin], items: &[Resources]) -> Vec<usize> {
    if bins.len() <= MAX_TYPES {
        return (0..bins.len()).collect();
    }
    let demand = items.iter().fold(Resources::ZERO, |a, r| a + *r);
    let (y, _) = shadow_prices(bins, &demand);
    let efficiency = |b: &Bin| {
        let v = vec3(&b.room);
        (v[0] * y[0] + v[1] * y[1] + v[2] * y[2]) / b.price.max(1e-12)
    };
    let eff: Vec<f64> = bins.iter().map(efficiency).collect();
    let mut order: Vec<usize> = (0..bins.len()).collect();
    order.sort_by(|&a, &b| eff[b].total_cmp(&eff[a]).then(bins[a].price.total_cmp(&bins[b].price)).then(a.cmp(&b)));
    let class = |b: &Bin| {
        let cpu = b.room.cpu_millis.max(1) as f64;
        let per_cpu = b.room.memory_bytes.max(1) as f64 / cpu;
        (cpu.log2().floor() as i64, per_cpu.log2().round() as i64)
    };
    let mut chosen: Vec<usize> = Vec::new();
    let mut classes: Vec<(i64, i64)> = Vec::new();
    for &i in &order {
        let c = class(&bins[i]);
        if !classes.contains(&c) {
            classes.push(c);
            chosen.push(i);
        }
    }
    chosen.truncate(MAX_TYPES);
    for &i in &order {
        if chosen.len() >= MAX_TYPES {
            break;
        }
        if !chosen.contains(&i) {
            chosen.push(i);
        }
    }
    // Every item some bin holds keeps a bin holding it: the most efficient one.
    let mut shapes: Vec<Resources> = items.to_vec();
    shapes.sort_by_key(|r| (r.cpu_millis, r.memory_bytes, r.ephemeral_storage_bytes, r.pods));
    shapes.dedup();
    for s in shapes {
        if chosen.iter().any(|&i| s.fits(&bins[i].room)) {
            continue;
        }
        if let Some(&i) = order.iter().find(|&&i| s.fits(&bins[i].room)) {
            chosen.push(i);
        }
    }
    chosen.sort_unstable();
    chosen
}

/// Whether one pod of shape `s` fits in `room` (`fit_count(room, s) > 0`, without dividing).
fn fits_once(room: &Resources, s: &Resources) -> bool {
    let ok = |r: i64, q: i64| q <= 0 || r >= q;
    ok(room.cpu_millis, s.cpu_millis)
        && ok(room.memory_bytes, s.memory_bytes)
        && ok(room.ephemeral_storage_bytes, s.ephemeral_storage_bytes)
        && ok(room.pods, s.pods)
}

/// How many pods of shape `s` fit in `room`.
fn fit_count(room: &Resources, s: &Resources) -> i64 {
    // Most calls are for shapes that no longer fit: compare before dividing.
    if !fits_once(room, s) {
        return 0;
    }
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
    let mut index: std::collections::HashMap<Resources, usize> = std::collections::HashMap::new();
    for i in order {
        match index.get(&items[i]) {
            Some(&si) => shapes[si].2.push(i),
            None => {
                index.insert(items[i], shapes.len());
                shapes.push((items[i], value(&items[i]), vec![i]));
            }
        }
    }
    // The balanced fill's order of shapes per bin depends on neither counts nor nodes: sorted once.
    let by_tilt: Vec<Vec<usize>> =
        if balanced { bins.iter().map(|bin| tilt_order(bin, &shapes)).collect() } else { Vec::new() };
    // A bin's fill depends on the counts left only through min(left, most of the shape an empty bin
    // holds): it is kept from one node to the next until a count it may depend on drops below that.
    let most: Vec<Vec<i64>> =
        bins.iter().map(|b| shapes.iter().map(|(s, ..)| fit_count(&b.room, s)).collect()).collect();
    let mut left: Vec<i64> = shapes.iter().map(|(_, _, l)| i64::try_from(l.len()).unwrap_or(i64::MAX)).collect();
    let mut cache: Vec<Option<(Takes, f64)>> = vec![None; bins.len()];
    // A node's value never exceeds its room's (shadow prices are non-negative): `price / value(room)`
    // bounds a bin's score from below, so a bin whose bound is already worse than the best score
    // found need not be filled. Bins are tried best bound first.
    let bound: Vec<f64> = bins.iter().map(|b| b.price / value(&b.room).max(1e-300)).collect();
    let mut tries: Vec<usize> = (0..bins.len()).collect();
    tries.sort_by(|&a, &b| bound[a].total_cmp(&bound[b]).then(a.cmp(&b)));
    let mut remaining = items.len();
    let mut out = Vec::new();
    while remaining > 0 {
        let mut best: Option<(f64, f64, usize)> = None;
        for &b in &tries {
            let bin = &bins[b];
            if cache[b].is_none() && best.is_some_and(|(bs, ..)| bound[b] > bs) {
                continue;
            }
            let (takes, v) =
                cache[b].get_or_insert_with(|| fill(bin, &shapes, &left, by_tilt.get(b).map(Vec::as_slice)));
            if takes.is_empty() {
                continue;
            }
            let score = bin.price / v.max(1e-300);
            // Ties: the larger value, then the lower index.
            if best.is_none_or(|(bs, bv, bb)| score < bs || (score == bs && (*v > bv || (*v == bv && b < bb)))) {
                best = Some((score, *v, b));
            }
        }
        let (_, _, b) = best?;
        let takes = cache[b].as_ref().map(|(t, _)| t.clone()).unwrap_or_default();
        let mut taken = Vec::new();
        for &(si, k) in &takes {
            let list = &mut shapes[si].2;
            let at = list.len() - usize::try_from(k).unwrap_or(0).min(list.len());
            taken.extend(list.drain(at..));
            left[si] -= k;
            for (c, m) in cache.iter_mut().zip(&most) {
                if left[si] < m[si] {
                    *c = None;
                }
            }
        }
        remaining -= taken.len();
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

/// What one node of `bin` would take from the remaining shapes (`left` of each): `(shape, count)`
/// and their value. Plain: shapes in value order, as many of each as fit. Balanced: one pod at a
/// time, from the memory-heavy or the cpu-heavy end, whichever keeps cpu and memory filling
/// together. `by_tilt`: the balanced fill's shape order for this bin ([`tilt_order`]); `None`: plain.
fn fill(bin: &Bin, shapes: &[(Resources, f64, Vec<usize>)], left: &[i64], by_tilt: Option<&[usize]>) -> (Takes, f64) {
    let mut room = bin.room;
    let mut takes: Takes = Vec::new();
    let mut v = 0.0;
    let Some(by_tilt) = by_tilt else {
        for (si, (s, sv, _)) in shapes.iter().enumerate() {
            // All that is left of a shape often fits: a product is cheaper than four divisions.
            let k = if left[si] > 0 && fits_once(&room, &times(s, left[si])) {
                left[si]
            } else {
                fit_count(&room, s).min(left[si])
            };
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
    // A shape that is used up or no longer fits stays so (room only shrinks): each end's pointer
    // only moves inwards, so a fill costs O(shapes + pods).
    let full = vec3(&bin.room);
    let (mut used_c, mut used_m) = (0.0f64, 0.0f64);
    let mut taken: Vec<i64> = vec![0; shapes.len()];
    let (mut lo, mut hi) = (0usize, by_tilt.len());
    let alive = |si: usize, room: &Resources, taken: &[i64]| left[si] > taken[si] && fits_once(room, &shapes[si].0);
    while lo < hi {
        let memory_first = used_m / full[1].max(1.0) < used_c / full[0].max(1.0);
        let si = if memory_first {
            while lo < hi && !alive(by_tilt[hi - 1], &room, &taken) {
                hi -= 1;
            }
            if lo == hi {
                break;
            }
            by_tilt[hi - 1]
        } else {
            while lo < hi && !alive(by_tilt[lo], &room, &taken) {
                lo += 1;
            }
            if lo == hi {
                break;
            }
            by_tilt[lo]
        };
        let s = &shapes[si].0;
        room = room.saturating_sub(*s);
        used_c += s.cpu_millis as f64;
        used_m += s.memory_bytes as f64;
        v += shapes[si].1;
        if taken[si] == 0 {
            takes.push((si, 0));
        }
        taken[si] += 1;
    }
    for t in &mut takes {
        t.1 = taken[t.0];
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

/// Tags of one item for the per-node rules of [`Rules`]: the tags it is counted by (`marks`, with
/// how many times: a bundle of pods counts each) and the tags whose marked items may not share its
/// node (`blocks`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct TagSet {
    /// `(tag, count)`, sorted by tag.
    pub marks: Vec<(u32, i64)>,
    /// Sorted, no duplicates.
    pub blocks: Vec<u32>,
}

/// Rules between items sharing a node: what hostname topology and host ports become once the
/// solver has turned them into tags. Anti-affinity: the owner blocks its term's tag and the pods the
/// term selects mark it. A host port: its pods mark and block it. A hostname spread: its tag is
/// capped at `maxSkew` marked items per node.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    /// Distinct tag sets.
    pub sets: Vec<TagSet>,
    /// Per item, its index in `sets`.
    pub item_set: Vec<usize>,
    /// Most marked items per node, per capped tag.
    pub caps: std::collections::HashMap<u32, i64>,
}

/// The tags present on one node.
#[derive(Debug, Clone, Default)]
struct NodeTags {
    marked: Vec<(u32, i64)>,
    blocked: Vec<u32>,
}

impl NodeTags {
    fn marked(&self, t: u32) -> i64 {
        self.marked.iter().find(|(x, _)| *x == t).map_or(0, |(_, c)| *c)
    }

    /// Whether an item of tag set `set` may join the node.
    fn admits(&self, set: &TagSet, caps: &std::collections::HashMap<u32, i64>) -> bool {
        set.blocks.iter().all(|&b| self.marked(b) == 0)
            && set
                .marks
                .iter()
                .all(|&(m, c)| !self.blocked.contains(&m) && caps.get(&m).is_none_or(|&cap| self.marked(m) + c <= cap))
    }

    /// How many more items of tag set `set` the node admits (`i64::MAX`: no limit).
    fn room_for(&self, set: &TagSet, caps: &std::collections::HashMap<u32, i64>) -> i64 {
        if !self.admits(set, caps) {
            return 0;
        }
        let mut k = i64::MAX;
        if set.blocks.iter().any(|b| set.marks.iter().any(|(m, _)| m == b)) {
            k = 1;
        }
        for &(m, c) in &set.marks {
            if let Some(&cap) = caps.get(&m) {
                k = k.min((cap - self.marked(m)) / c.max(1));
            }
        }
        k
    }

    fn add(&mut self, set: &TagSet) {
        self.add_n(set, 1);
    }

    fn add_n(&mut self, set: &TagSet, n: i64) {
        for &(m, c) in &set.marks {
            match self.marked.iter_mut().find(|(x, _)| *x == m) {
                Some(e) => e.1 += c * n,
                None => self.marked.push((m, c * n)),
            }
        }
        for &b in &set.blocks {
            if !self.blocked.contains(&b) {
                self.blocked.push(b);
            }
        }
    }
}

/// Which packing [`pack_ruled`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packing {
    /// [`pack`], then the items dealt out again under the rules.
    Value,
    /// [`pack_balanced`], then the same.
    Balanced,
    /// First-fit decreasing that checks the rules as it goes.
    Ffd,
}

/// Packs items under per-node [`Rules`]. The value and balanced packings work on resources alone
/// (their speed comes from treating equal requests alike); their nodes are then re-dealt: each
/// item takes a slot of its own requests on a node whose tags admit it, and the items left over go,
/// largest first, into the room left on a node that admits them, else onto a new node of the
/// cheapest bin holding them. Every node of the result obeys the rules.
pub fn pack_ruled(items: &[Resources], rules: &Rules, bins: &[Bin], how: Packing) -> Option<Vec<(usize, Vec<usize>)>> {
    let trivial = rules.sets.iter().all(|s| s.marks.is_empty() && s.blocks.is_empty());
    let base = match how {
        Packing::Value => pack(items, bins)?,
        Packing::Balanced => pack_balanced(items, bins)?,
        Packing::Ffd if trivial => return pack_ffd(items, bins),
        Packing::Ffd => return ffd_ruled(items, rules, bins, Vec::new(), (0..items.len()).collect()),
    };
    if trivial {
        return Some(base);
    }
    // Slots per request shape, node by node.
    let mut slots: std::collections::HashMap<Resources, Vec<usize>> = std::collections::HashMap::new();
    for (n, (_, idx)) in base.iter().enumerate() {
        for &i in idx {
            slots.entry(items[i]).or_default().push(n);
        }
    }
    // The most constrained items first (more tags), so that plain items fill what is left.
    let weight = |i: usize| {
        let s = &rules.sets[rules.item_set[i]];
        s.marks.len() + s.blocks.len()
    };
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| weight(b).cmp(&weight(a)).then(rules.item_set[a].cmp(&rules.item_set[b])).then(a.cmp(&b)));
    let mut nodes: Vec<(usize, Vec<usize>, NodeTags)> =
        base.iter().map(|(b, _)| (*b, Vec::new(), NodeTags::default())).collect();
    let mut left_over: Vec<usize> = Vec::new();
    for i in order {
        let set = &rules.sets[rules.item_set[i]];
        let Some(list) = slots.get_mut(&items[i]) else {
            left_over.push(i);
            continue;
        };
        match list.iter().position(|&n| nodes[n].2.admits(set, &rules.caps)) {
            Some(at) => {
                let n = list.swap_remove(at);
                nodes[n].1.push(i);
                nodes[n].2.add(set);
            }
            None => left_over.push(i),
        }
    }
    ffd_ruled(items, rules, bins, nodes, left_over)
}

/// First-fit decreasing of `todo` under the rules into `nodes` (bin, items, tags), then new nodes of
/// the cheapest bin holding each item.
fn ffd_ruled(
    items: &[Resources],
    rules: &Rules,
    bins: &[Bin],
    nodes: Vec<(usize, Vec<usize>, NodeTags)>,
    mut todo: Vec<usize>,
) -> Option<Vec<(usize, Vec<usize>)>> {
    todo.sort_by(|&a, &b| {
        (items[b].cpu_millis, items[b].memory_bytes).cmp(&(items[a].cpu_millis, items[a].memory_bytes)).then(a.cmp(&b))
    });
    let mut by_price: Vec<usize> = (0..bins.len()).collect();
    by_price.sort_by(|&a, &b| bins[a].price.total_cmp(&bins[b].price).then(a.cmp(&b)));
    let mut open: Vec<(Resources, usize, Vec<usize>, NodeTags)> = nodes
        .into_iter()
        .map(|(b, list, tags)| {
            let used = list.iter().fold(Resources::ZERO, |a, &i| a + items[i]);
            (bins[b].room.saturating_sub(used), b, list, tags)
        })
        .collect();
    for i in todo {
        let set = &rules.sets[rules.item_set[i]];
        if let Some(node) =
            open.iter_mut().find(|(room, _, _, tags)| items[i].fits(room) && tags.admits(set, &rules.caps))
        {
            node.0 = node.0.saturating_sub(items[i]);
            node.2.push(i);
            node.3.add(set);
            continue;
        }
        let b = *by_price.iter().find(|&&b| items[i].fits(&bins[b].room))?;
        let mut tags = NodeTags::default();
        tags.add(set);
        open.push((bins[b].room.saturating_sub(items[i]), b, vec![i], tags));
    }
    Some(
        open.into_iter()
            .filter(|(_, _, list, _)| !list.is_empty())
            .map(|(_, b, mut list, _)| {
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
    caps: &[Resources],
    budget: &Budget,
) -> Vec<(usize, Vec<usize>)> {
    let ruled = rules.sets.iter().any(|s| !s.marks.is_empty() || !s.blocks.is_empty());
    let ctx = Ctx { items, bins, caps, budget, rules, ruled };
    let alone = Budget { res: budget.res, nodes: budget.nodes.map(|n| n.min(1)) };
    // Items some bin holds whose capacity alone is within the budget.
    let placeable: Vec<usize> = (0..items.len())
        .filter(|&i| bins.iter().zip(caps).any(|(b, c)| items[i].fits(&b.room) && alone.holds(&dims(c), 1)))
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

    /// Deterministic pseudo-random bins of 1–64 CPU, 1–8 GiB per CPU, priced with some noise.
    fn many_bins(n: usize) -> Vec<Bin> {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        (0..n)
            .map(|_| {
                let cpu = 1 + next(64) as i64;
                let mem = cpu * (1 + next(8) as i64);
                let price = cpu as f64 * 0.01 + mem as f64 * 0.004 + next(100) as f64 * 1e-4;
                bin(cpu * 1000, mem, price)
            })
            .collect()
    }

    #[test]
    fn the_lp_over_a_large_catalogue_is_the_full_enumerations_optimum() {
        for n in [17, 80, 400] {
            let bins = many_bins(n);
            let demand = Resources { pods: 900, ..r(700_000, 2000) };
            let (_, v) = shadow_prices(&bins, &demand);
            let scale = [1e-3, 1.0 / f64::from(1u32 << 30), 1.0];
            let rows: Vec<[f64; 3]> = bins
                .iter()
                .map(|b| {
                    let v = vec3(&b.room);
                    [v[0] * scale[0], v[1] * scale[1], v[2] * scale[2]]
                })
                .collect();
            let d = vec3(&demand);
            let all: Vec<usize> = (0..n).collect();
            let (_, full) = dual_vertices(&rows, &bins, &all, &[d[0] * scale[0], d[1] * scale[1], d[2] * scale[2]]);
            assert!((v - full).abs() <= 1e-9 * full.max(1.0), "{n} bins: {v} vs {full}");
        }
    }

    #[test]
    fn a_large_catalogue_is_cut_to_a_bounded_set_holding_every_item() {
        let bins = many_bins(400);
        let mut items: Vec<Resources> = (0..200).map(|i| r(100 + 37 * (i % 40), 1 + i % 7)).collect();
        items.push(r(60_000, 100)); // held only by some of the largest bins
        let cand = candidates(&bins, &items);
        assert!(cand.len() <= MAX_TYPES + 1, "{}", cand.len());
        assert!(cand.windows(2).all(|w| w[0] < w[1]));
        for it in &items {
            if bins.iter().any(|b| it.fits(&b.room)) {
                assert!(cand.iter().any(|&k| it.fits(&bins[k].room)), "{it:?} fits no candidate");
            }
        }
    }

    #[test]
    fn ruled_packings_obey_the_rules() {
        // 12 pods, 4 of each of three apps with self anti-affinity (tags 0–2), in bins of room 8.
        let items = vec![r(1000, 1); 12];
        let sets: Vec<TagSet> = (0..3).map(|t| TagSet { marks: vec![(t, 1)], blocks: vec![t] }).collect();
        let rules = Rules { sets, item_set: (0..12).map(|i| i % 3).collect(), caps: Default::default() };
        for how in [Packing::Value, Packing::Balanced, Packing::Ffd] {
            let p = pack_ruled(&items, &rules, &[bin(8000, 8, 1.0)], how).unwrap_or_default();
            assert_eq!(p.iter().map(|(_, l)| l.len()).sum::<usize>(), 12, "{how:?}");
            for (_, list) in &p {
                let mut apps: Vec<usize> = list.iter().map(|&i| i % 3).collect();
                apps.sort_unstable();
                let n = apps.len();
                apps.dedup();
                assert_eq!(apps.len(), n, "{how:?}: two pods of one app on a node");
            }
            assert_eq!(p.len(), 4, "{how:?}");
        }
    }

    #[test]
    fn an_item_too_large_for_every_bin_fails() {
        assert!(pack(&[r(99_000, 0)], &[bin(4000, 4, 1.0)]).is_none());
    }
}
