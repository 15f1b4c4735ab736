//! The instance types of one pool as the solver uses them (karpenter-semantics §2.2, §3.13, §3.15):
//! sorted cheapest first so a [`Bits`] set iterates in price order; per-key value indexes so a claim's
//! requirements narrow the set with word operations; offering, resource and limit filters; minValues;
//! prices under requirements; and explanations of what eliminated which types.
//!
//! Zone and capacity-type values of a type come from its offerings, never from its labels, so a
//! type offered in several zones belongs to several zone domains. Must not place pods.

use std::collections::{BTreeMap, HashMap};

use crds::catalog::InstanceType;
use crds::labels;
use crds::quantity::{Resources, format_bytes, format_millis_cpu};

use crate::bitset::Bits;
use crate::intern::{Interner, Key, Val};
use crate::requirements::{Requirements, ValueSet};

/// One offering, interned.
#[derive(Debug, Clone, PartialEq)]
pub struct OfferingInfo {
    /// Zone.
    pub zone: Val,
    /// Capacity type.
    pub capacity_type: Val,
    /// EUR/h.
    pub price: f64,
    /// Launchable now.
    pub available: bool,
}

/// One instance type of a pool.
#[derive(Debug, Clone)]
pub struct TypeInfo {
    /// Flavor name.
    pub name: String,
    /// Capacity (limits compare with this).
    pub capacity: Resources,
    /// Allocatable (pods fit into this).
    pub allocatable: Resources,
    /// Extended resources offered (capacity = allocatable), from NodeOverlays.
    pub extended: BTreeMap<String, i64>,
    /// Cheapest available offering compatible with the pool template.
    pub price: f64,
    /// Single-valued labels, sorted by key (zone and capacity type excluded: see offerings).
    pub labels: Vec<(Key, Val)>,
    /// Offerings.
    pub offerings: Vec<OfferingInfo>,
    /// Index of its DaemonSet group.
    pub ds_group: usize,
}

#[derive(Debug, Clone)]
struct KeyIndex {
    by_value: Vec<(Val, Bits)>,
    lacking: Bits,
}

/// A pool's instance types, cheapest first, with indexes.
#[derive(Debug, Clone)]
pub struct TypeTable {
    /// Types, sorted by (price, name).
    pub types: Vec<TypeInfo>,
    index: Vec<(Key, KeyIndex)>,
    zone: Key,
    capacity_type: Key,
}

impl TypeTable {
    /// Indexes interned types (see [`intern_all`]), sorting them by (price, name).
    pub fn from_types(mut types: Vec<TypeInfo>, ints: &Interner) -> TypeTable {
        let zone = ints.lookup_key(labels::ZONE).unwrap_or(Key::MAX);
        let capacity_type = ints.lookup_key(labels::CAPACITY_TYPE).unwrap_or(Key::MAX);
        types.sort_by(|a, b| a.price.total_cmp(&b.price).then_with(|| a.name.cmp(&b.name)));
        let n = types.len();
        let mut index: HashMap<Key, HashMap<Val, Bits>> = HashMap::new();
        for (i, t) in types.iter().enumerate() {
            let mut add =
                |k: Key, v: Val| index.entry(k).or_default().entry(v).or_insert_with(|| Bits::empty(n)).set(i);
            for &(k, v) in &t.labels {
                add(k, v);
            }
            for o in &t.offerings {
                add(zone, o.zone);
                add(capacity_type, o.capacity_type);
            }
        }
        let mut index: Vec<(Key, KeyIndex)> = index
            .into_iter()
            .map(|(k, values)| {
                let mut lacking = Bits::full(n);
                for bits in values.values() {
                    for i in bits.iter() {
                        lacking.clear(i);
                    }
                }
                let mut by_value: Vec<(Val, Bits)> = values.into_iter().collect();
                by_value.sort_by_key(|(v, _)| *v);
                (k, KeyIndex { by_value, lacking })
            })
            .collect();
        index.sort_by_key(|(k, _)| *k);
        TypeTable { types, index, zone, capacity_type }
    }

    /// Number of types.
    pub fn len(&self) -> usize {
        self.types.len()
    }

    /// No type.
    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }

    /// Every type.
    pub fn all(&self) -> Bits {
        Bits::full(self.types.len())
    }

    /// Keys the types define (for "did you mean" hints).
    pub fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        self.index.iter().map(|(k, _)| *k)
    }

    /// Values of a key among the given types (for topology domains).
    pub fn values_of(&self, key: Key, set: &Bits) -> Vec<Val> {
        match self.index.binary_search_by_key(&key, |(k, _)| *k) {
            Ok(i) => self.index[i]
                .1
                .by_value
                .iter()
                .filter(|(_, bits)| {
                    let mut b = bits.clone();
                    b.and_with(set);
                    !b.is_empty()
                })
                .map(|(v, _)| *v)
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Types whose values intersect the requirements on every key they define (§3.13 (a)).
    pub fn requirement_mask(&self, reqs: &Requirements, ints: &Interner) -> Bits {
        let mut mask = self.all();
        for (k, set) in reqs.iter() {
            if let Ok(i) = self.index.binary_search_by_key(&k, |(ik, _)| *ik) {
                let ix = &self.index[i].1;
                let mut km = ix.lacking.clone();
                for (v, bits) in &ix.by_value {
                    if set.has(*v, ints) {
                        km.or_with(bits);
                    }
                }
                mask.and_with(&km);
            }
        }
        mask
    }

    /// Whether an offering is compatible with the requirements.
    pub fn offering_ok(&self, o: &OfferingInfo, reqs: &Requirements, ints: &Interner) -> bool {
        reqs.get(self.zone).is_none_or(|s| s.has(o.zone, ints))
            && reqs.get(self.capacity_type).is_none_or(|s| s.has(o.capacity_type, ints))
    }

    /// Keeps the types of `set` that have an available offering compatible with the requirements
    /// (§3.13 (c)).
    pub fn retain_offerings(&self, set: &mut Bits, reqs: &Requirements, ints: &Interner) {
        if !reqs.has_key(self.zone) && !reqs.has_key(self.capacity_type) {
            // Every type of the table has an available offering (pool pre-filter).
            return;
        }
        for i in set.clone().iter() {
            if !self.types[i].offerings.iter().any(|o| o.available && self.offering_ok(o, reqs, ints)) {
                set.clear(i);
            }
        }
    }

    /// Price of a type under requirements: its cheapest available compatible offering.
    pub fn price_under(&self, i: usize, reqs: &Requirements, ints: &Interner) -> f64 {
        self.types[i]
            .offerings
            .iter()
            .filter(|o| o.available && self.offering_ok(o, reqs, ints))
            .map(|o| o.price)
            .min_by(f64::total_cmp)
            .unwrap_or(f64::INFINITY)
    }

    /// Capacity types of the available offerings of `set` compatible with the requirements.
    pub fn capacity_types(&self, set: &Bits, reqs: &Requirements, ints: &Interner) -> Vec<Val> {
        let mut out: Vec<Val> = set
            .iter()
            .flat_map(|i| self.types[i].offerings.iter())
            .filter(|o| o.available && self.offering_ok(o, reqs, ints))
            .map(|o| o.capacity_type)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Distinct values of `key` among `set` (walking in price order), as minValues counts them.
    pub fn distinct_values(&self, key: Key, set: &Bits, reqs: &Requirements, ints: &Interner) -> usize {
        let mut seen: Vec<Val> = Vec::new();
        let allowed = reqs.get(key);
        for i in set.iter() {
            let t = &self.types[i];
            if key == self.zone || key == self.capacity_type {
                for o in t.offerings.iter().filter(|o| o.available && self.offering_ok(o, reqs, ints)) {
                    let v = if key == self.zone { o.zone } else { o.capacity_type };
                    if !seen.contains(&v) {
                        seen.push(v);
                    }
                }
            } else if let Ok(j) = t.labels.binary_search_by_key(&key, |(k, _)| *k) {
                let v = t.labels[j].1;
                if allowed.is_none_or(|s| s.has(v, ints)) && !seen.contains(&v) {
                    seen.push(v);
                }
            }
        }
        seen.len()
    }

    /// The first key whose minValues is not met by `set`: `(key, wanted, reached)`.
    pub fn min_values_unmet(&self, set: &Bits, reqs: &Requirements, ints: &Interner) -> Option<(Key, u32, u32)> {
        reqs.iter().find_map(|(k, s)| {
            let wanted = s.min_values()?;
            let reached = u32::try_from(self.distinct_values(k, set, reqs, ints)).unwrap_or(u32::MAX);
            (reached < wanted).then_some((k, wanted, reached))
        })
    }

    /// Per-resource maximum allocatable over `set` (after subtracting each type's overhead).
    pub fn max_headroom(&self, set: &Bits, overhead: impl Fn(usize) -> Resources) -> Resources {
        let mut out = Resources { cpu_millis: -1, memory_bytes: -1, ephemeral_storage_bytes: -1, pods: -1 };
        for i in set.iter() {
            let h = self.types[i].allocatable.saturating_sub(overhead(self.types[i].ds_group));
            out.cpu_millis = out.cpu_millis.max(h.cpu_millis);
            out.memory_bytes = out.memory_bytes.max(h.memory_bytes);
            out.ephemeral_storage_bytes = out.ephemeral_storage_bytes.max(h.ephemeral_storage_bytes);
            out.pods = out.pods.max(h.pods);
        }
        out
    }

    /// Per-resource maximum capacity over `set` (the pessimistic limit reservation of a claim).
    pub fn max_capacity(&self, set: &Bits) -> Resources {
        let mut out = Resources::ZERO;
        for i in set.iter() {
            let c = self.types[i].capacity;
            out.cpu_millis = out.cpu_millis.max(c.cpu_millis);
            out.memory_bytes = out.memory_bytes.max(c.memory_bytes);
            out.ephemeral_storage_bytes = out.ephemeral_storage_bytes.max(c.ephemeral_storage_bytes);
            out.pods = out.pods.max(c.pods);
        }
        out
    }
}

/// Interned view of instance types, in input order, unpriced (`price` +∞, DaemonSet group 0).
pub fn intern_all(all: &[InstanceType], ints: &mut Interner) -> Vec<TypeInfo> {
    let zone = ints.key(labels::ZONE);
    let capacity_type = ints.key(labels::CAPACITY_TYPE);
    all.iter().map(|it| interned(it, ints, zone, capacity_type)).collect()
}

fn interned(it: &InstanceType, ints: &mut Interner, zone: Key, capacity_type: Key) -> TypeInfo {
    let mut labels: Vec<(Key, Val)> = it
        .labels
        .iter()
        .map(|(k, v)| (ints.key(k), ints.val(v)))
        .filter(|(k, _)| *k != zone && *k != capacity_type)
        .collect();
    labels.sort_unstable();
    let offerings = it
        .offerings
        .iter()
        .map(|o| OfferingInfo {
            zone: ints.val(&o.zone),
            capacity_type: ints.val(&o.capacity_type),
            price: o.price_hourly,
            available: o.available && !it.synthesized,
        })
        .collect();
    TypeInfo {
        name: it.name.clone(),
        capacity: it.capacity,
        allocatable: it.allocatable,
        extended: it.extended.clone(),
        price: f64::INFINITY,
        labels,
        offerings,
        ds_group: 0,
    }
}

/// The requirement a type's own values form on a key (single label value, or its offerings' values).
pub fn type_values(t: &TypeInfo, key: Key, zone: Key, capacity_type: Key) -> Option<ValueSet> {
    if key == zone {
        return Some(ValueSet::is_in(t.offerings.iter().map(|o| o.zone).collect()));
    }
    if key == capacity_type {
        return Some(ValueSet::is_in(t.offerings.iter().map(|o| o.capacity_type).collect()));
    }
    t.labels.binary_search_by_key(&key, |(k, _)| *k).ok().map(|i| ValueSet::single(t.labels[i].1))
}

/// Whether a type intersects requirements on every key both define (used by pre-filters and
/// DaemonSet compatibility, where building a mask is not worth it).
pub fn type_meets(t: &TypeInfo, reqs: &Requirements, ints: &Interner) -> Result<(), Key> {
    let zone = ints.lookup_key(labels::ZONE);
    let capacity_type = ints.lookup_key(labels::CAPACITY_TYPE);
    for (k, set) in reqs.iter() {
        let values = if Some(k) == zone || Some(k) == capacity_type {
            let vals: Vec<Val> =
                t.offerings.iter().map(|o| if Some(k) == zone { o.zone } else { o.capacity_type }).collect();
            if vals.is_empty() {
                continue;
            }
            vals
        } else {
            match t.labels.binary_search_by_key(&k, |(lk, _)| *lk) {
                Ok(i) => vec![t.labels[i].1],
                Err(_) => continue,
            }
        };
        if !values.iter().any(|v| set.has(*v, ints)) {
            return Err(k);
        }
    }
    Ok(())
}

/// `cpu=4, memory=3.63Gi` (only the resources that matter for the message).
pub fn describe_resources(r: &Resources) -> String {
    // Only what is there: a reason names the resources that matter, not a row of zeros.
    let mut parts = Vec::new();
    if r.cpu_millis != 0 {
        parts.push(format!("cpu={}", format_millis_cpu(r.cpu_millis)));
    }
    if r.memory_bytes != 0 {
        parts.push(format!("memory={}", gib(r.memory_bytes)));
    }
    if r.ephemeral_storage_bytes != 0 {
        parts.push(format!("ephemeral-storage={}", gib(r.ephemeral_storage_bytes)));
    }
    if r.pods != 0 {
        parts.push(format!("pods={}", r.pods));
    }
    if parts.is_empty() {
        return "nothing".to_string();
    }
    parts.join(", ")
}

/// Memory for humans: `5Gi`, `1500Mi`, `3.63Gi`.
pub fn gib(bytes: i64) -> String {
    const GI: i64 = 1 << 30;
    if bytes % (1 << 20) == 0 || bytes.abs() < GI {
        format_bytes(bytes)
    } else {
        format!("{:.2}Gi", bytes as f64 / GI as f64)
    }
}
