//! Packing under per-node rules: the tags each item marks or blocks ([`TagSet`]), the [`Rules`]
//! between items sharing a node (what hostname anti-affinity and spread and host ports become), and
//! the packings that obey them ([`pack_ruled`]).
//!
//! Owns the rules' arithmetic. Must not know what a tag stands for (the solver's `units` makes
//! them), nor about limits (that is `within`).

use crds::quantity::Resources;

use super::Bin;
use super::pack::{pack, pack_balanced, pack_ffd};

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
pub(super) struct NodeTags {
    marked: Vec<(u32, i64)>,
    blocked: Vec<u32>,
}

impl NodeTags {
    fn marked(&self, t: u32) -> i64 {
        self.marked.iter().find(|(x, _)| *x == t).map_or(0, |(_, c)| *c)
    }

    /// Whether an item of tag set `set` may join the node.
    pub(super) fn admits(&self, set: &TagSet, caps: &std::collections::HashMap<u32, i64>) -> bool {
        set.blocks.iter().all(|&b| self.marked(b) == 0)
            && set
                .marks
                .iter()
                .all(|&(m, c)| !self.blocked.contains(&m) && caps.get(&m).is_none_or(|&cap| self.marked(m) + c <= cap))
    }

    /// How many more items of tag set `set` the node admits (`i64::MAX`: no limit).
    pub(super) fn room_for(&self, set: &TagSet, caps: &std::collections::HashMap<u32, i64>) -> i64 {
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

    pub(super) fn add(&mut self, set: &TagSet) {
        self.add_n(set, 1);
    }

    pub(super) fn add_n(&mut self, set: &TagSet, n: i64) {
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

#[cfg(test)]
mod tests {
    use super::super::testing::{bin, r};
    use super::*;

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
}
