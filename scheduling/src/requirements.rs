//! The requirement algebra of karpenter-semantics §1.3 and §3.4: per label key a finite allowed set
//! or "anything except a finite set", optional integer bounds, minValues; intersection, the
//! "undefined well-known allowed" compatibility of claims with pods, and strict label matching of
//! existing nodes.
//!
//! Owns set semantics only, over interned ids. Must not know about pods, pools or instance types.

use std::cmp::Ordering;
use std::fmt::Write as _;

use crate::intern::{Interner, Key, Val};
use crate::model::{NodeSelectorRequirement, Operator};

/// The allowed values of one key.
///
/// `complement = false`: exactly `values` (empty = the key must be absent, `DoesNotExist`).
/// `complement = true`: anything except `values` within the inclusive bounds `lo..=hi`
/// (no values and no bounds = `Exists`). Bounds only ever live on complement sets; a finite set is
/// filtered by them when intersected.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ValueSet {
    complement: bool,
    values: Vec<Val>,
    lo: Option<i64>,
    hi: Option<i64>,
    min_values: Option<u32>,
}

/// What a [`ValueSet`] reads as, in Kubernetes terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Finite, non-empty.
    In,
    /// Complement with excluded values.
    NotIn,
    /// Complement with nothing excluded.
    Exists,
    /// Empty finite set: the key must be absent.
    DoesNotExist,
}

impl ValueSet {
    /// `Exists`.
    pub fn exists() -> ValueSet {
        ValueSet { complement: true, values: Vec::new(), lo: None, hi: None, min_values: None }
    }

    /// `DoesNotExist`.
    pub fn does_not_exist() -> ValueSet {
        ValueSet { complement: false, values: Vec::new(), lo: None, hi: None, min_values: None }
    }

    /// `In [values]`.
    pub fn is_in(mut values: Vec<Val>) -> ValueSet {
        values.sort_unstable();
        values.dedup();
        ValueSet { complement: false, values, lo: None, hi: None, min_values: None }
    }

    /// `In [value]`.
    pub fn single(value: Val) -> ValueSet {
        ValueSet { complement: false, values: vec![value], lo: None, hi: None, min_values: None }
    }

    /// `NotIn [values]`.
    pub fn not_in(mut values: Vec<Val>) -> ValueSet {
        values.sort_unstable();
        values.dedup();
        ValueSet { complement: true, values, lo: None, hi: None, min_values: None }
    }

    /// Integers in `lo..=hi` (either side open).
    pub fn range(lo: Option<i64>, hi: Option<i64>) -> ValueSet {
        let mut set = ValueSet { complement: true, values: Vec::new(), lo, hi, min_values: None };
        if let (Some(l), Some(h)) = (lo, hi)
            && l > h
        {
            set = ValueSet::does_not_exist();
        }
        set
    }

    /// With `minValues`.
    #[must_use]
    pub fn with_min_values(mut self, min_values: Option<u32>) -> ValueSet {
        self.min_values = min_values;
        self
    }

    /// minValues of the key.
    pub fn min_values(&self) -> Option<u32> {
        self.min_values
    }

    /// Sets minValues (BestEffort lowers it).
    pub fn set_min_values(&mut self, min_values: Option<u32>) {
        self.min_values = min_values;
    }

    /// Complement set?
    pub fn is_complement(&self) -> bool {
        self.complement
    }

    /// The listed values (allowed for a finite set, excluded for a complement).
    pub fn values(&self) -> &[Val] {
        &self.values
    }

    /// Lower inclusive bound.
    pub fn lo(&self) -> Option<i64> {
        self.lo
    }

    /// Upper inclusive bound.
    pub fn hi(&self) -> Option<i64> {
        self.hi
    }

    /// How it reads in Kubernetes terms.
    pub fn shape(&self) -> Shape {
        match (self.complement, self.values.is_empty()) {
            (true, true) => Shape::Exists,
            (true, false) => Shape::NotIn,
            (false, true) => Shape::DoesNotExist,
            (false, false) => Shape::In,
        }
    }

    /// `NotIn` or `DoesNotExist`: satisfied by a node without the key.
    pub fn is_negative(&self) -> bool {
        matches!(self.shape(), Shape::NotIn | Shape::DoesNotExist) && self.lo.is_none() && self.hi.is_none()
    }

    fn within(&self, v: Val, ints: &Interner) -> bool {
        if self.lo.is_none() && self.hi.is_none() {
            return true;
        }
        match ints.int(v) {
            Some(n) => self.lo.is_none_or(|l| n >= l) && self.hi.is_none_or(|h| n <= h),
            None => false,
        }
    }

    /// Whether a node with label value `v` satisfies the set.
    pub fn has(&self, v: Val, ints: &Interner) -> bool {
        if self.complement {
            self.values.binary_search(&v).is_err() && self.within(v, ints)
        } else {
            self.values.binary_search(&v).is_ok()
        }
    }

    /// Number of allowed values (`usize::MAX`-ish for open sets).
    pub fn len(&self) -> usize {
        if !self.complement {
            return self.values.len();
        }
        match (self.lo, self.hi) {
            (Some(l), Some(h)) => {
                let span = usize::try_from(h.saturating_sub(l).saturating_add(1)).unwrap_or(usize::MAX);
                span.saturating_sub(self.values.len())
            }
            _ => usize::MAX - self.values.len(),
        }
    }

    /// No value allowed (and the key may not be absent either, unless negative).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The intersection (karpenter-semantics §3.4): allowed sets intersect, exclusions unite, bounds
    /// tighten, non-integers drop when bounds exist, minValues is the largest.
    pub fn intersect(&self, other: &ValueSet, ints: &Interner) -> ValueSet {
        let complement = self.complement && other.complement;
        let lo = max_opt(self.lo, other.lo);
        let hi = min_opt(self.hi, other.hi);
        let min_values = self.min_values.max(other.min_values);
        if let (Some(l), Some(h)) = (lo, hi)
            && l > h
        {
            return ValueSet::does_not_exist().with_min_values(min_values);
        }
        let mut values = match (self.complement, other.complement) {
            (true, true) => union(&self.values, &other.values),
            (true, false) => difference(&other.values, &self.values),
            (false, true) => difference(&self.values, &other.values),
            (false, false) => intersection(&self.values, &other.values),
        };
        if lo.is_some() || hi.is_some() {
            values.retain(|&v| match ints.int(v) {
                Some(n) => lo.is_none_or(|l| n >= l) && hi.is_none_or(|h| n <= h),
                None => false,
            });
        }
        let (lo, hi) = if complement { (lo, hi) } else { (None, None) };
        ValueSet { complement, values, lo, hi, min_values }
    }

    /// Whether two sets may meet (§3.4 `Intersects` for one key): some common value, or both negative.
    pub fn meets(&self, other: &ValueSet, ints: &Interner) -> bool {
        if self.is_negative() && other.is_negative() {
            return true;
        }
        !self.intersect(other, ints).is_empty()
    }

    /// Human form: `In [a, b]`, `NotIn [x]`, `Exists`, `DoesNotExist`, `Gt 3`, ...
    pub fn describe(&self, ints: &Interner) -> String {
        let names = |vs: &[Val]| vs.iter().map(|&v| ints.val_name(v)).collect::<Vec<_>>().join(", ");
        let mut out = match self.shape() {
            Shape::In => format!("In [{}]", names(&self.values)),
            Shape::NotIn => format!("NotIn [{}]", names(&self.values)),
            Shape::Exists if self.lo.is_some() || self.hi.is_some() => String::new(),
            Shape::Exists => "Exists".to_string(),
            Shape::DoesNotExist => "DoesNotExist".to_string(),
        };
        if let Some(l) = self.lo {
            let _ = write!(out, "{}Gte {l}", if out.is_empty() { "" } else { " and " });
        }
        if let Some(h) = self.hi {
            let _ = write!(out, "{}Lte {h}", if out.is_empty() { "" } else { " and " });
        }
        out
    }
}

fn max_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) | (None, x) => x,
    }
}

fn min_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) | (None, x) => x,
    }
}

fn union(a: &[Val], b: &[Val]) -> Vec<Val> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            Ordering::Less => {
                out.push(a[i]);
                i += 1;
            }
            Ordering::Greater => {
                out.push(b[j]);
                j += 1;
            }
            Ordering::Equal => {
                out.push(a[i]);
                i += 1;
                j += 1;
            }
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}

fn intersection(a: &[Val], b: &[Val]) -> Vec<Val> {
    a.iter().copied().filter(|v| b.binary_search(v).is_ok()).collect()
}

fn difference(a: &[Val], b: &[Val]) -> Vec<Val> {
    a.iter().copied().filter(|v| b.binary_search(v).is_err()).collect()
}

/// Requirements over several keys, sorted by key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Requirements {
    entries: Vec<(Key, ValueSet)>,
}

/// Why requirements are incompatible, naming the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incompatible {
    /// The pod selects a key the node side never defines.
    UndefinedKey {
        /// The key.
        key: Key,
    },
    /// Both sides define the key with no common value.
    NoOverlap {
        /// The key.
        key: Key,
        /// Node side.
        node: Box<ValueSet>,
        /// Pod side.
        pod: Box<ValueSet>,
    },
}

impl Incompatible {
    /// Human message, with a "did you mean" hint for undefined keys.
    pub fn describe(&self, ints: &Interner, defined: &[Key]) -> String {
        match self {
            Incompatible::UndefinedKey { key } => {
                let name = ints.key_name(*key);
                let hint = defined
                    .iter()
                    .map(|&k| ints.key_name(k))
                    .filter(|k| *k != name && close(k, name))
                    .min()
                    .map(|k| format!(" (did you mean {k}?)"))
                    .unwrap_or_default();
                format!("label {name} has no known values: no node of this pool would carry it{hint}")
            }
            Incompatible::NoOverlap { key, node, pod } => {
                format!("{} {} is not compatible with {}", ints.key_name(*key), pod.describe(ints), node.describe(ints))
            }
        }
    }
}

/// Two keys are close when they differ by case, by the prefix, or by an edit distance of at most 2.
fn close(a: &str, b: &str) -> bool {
    if a.eq_ignore_ascii_case(b) {
        return true;
    }
    let suffix = |s: &'_ str| s.rsplit('/').next().unwrap_or(s).to_ascii_lowercase();
    if suffix(a) == suffix(b) {
        return true;
    }
    edit_distance(a, b) <= 2
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

impl Requirements {
    /// No requirement.
    pub fn new() -> Requirements {
        Requirements::default()
    }

    /// From API requirements (legacy keys rewritten, §1.3). `Gt`/`Lt`/`Gte`/`Lte` with a non-integer
    /// value yield an empty set (nothing satisfies them).
    pub fn from_api(reqs: &[NodeSelectorRequirement], ints: &mut Interner) -> Requirements {
        let mut out = Requirements::new();
        for r in reqs {
            let key = ints.key(normalize_key(&r.key));
            let min_values = r.min_values.and_then(|m| u32::try_from(m).ok());
            out.add(key, value_set(r.operator, &r.values, ints).with_min_values(min_values), ints);
        }
        out
    }

    /// `key In [value]` for each label.
    pub fn from_labels<'a>(labels: impl IntoIterator<Item = (&'a String, &'a String)>, ints: &mut Interner) -> Self {
        let mut out = Requirements::new();
        for (k, v) in labels {
            let key = ints.key(normalize_key(k));
            let val = ints.val(v);
            out.add(key, ValueSet::single(val), ints);
        }
        out
    }

    /// The set of a key.
    pub fn get(&self, key: Key) -> Option<&ValueSet> {
        self.entries.binary_search_by_key(&key, |(k, _)| *k).ok().map(|i| &self.entries[i].1)
    }

    /// Mutable set of a key.
    pub fn get_mut(&mut self, key: Key) -> Option<&mut ValueSet> {
        match self.entries.binary_search_by_key(&key, |(k, _)| *k) {
            Ok(i) => Some(&mut self.entries[i].1),
            Err(_) => None,
        }
    }

    /// Whether the key is constrained.
    pub fn has_key(&self, key: Key) -> bool {
        self.get(key).is_some()
    }

    /// Entries in key order.
    pub fn iter(&self) -> impl Iterator<Item = (Key, &ValueSet)> {
        self.entries.iter().map(|(k, v)| (*k, v))
    }

    /// Keys.
    pub fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        self.entries.iter().map(|(k, _)| *k)
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No key.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Intersects a key's set into these requirements.
    pub fn add(&mut self, key: Key, set: ValueSet, ints: &Interner) {
        match self.entries.binary_search_by_key(&key, |(k, _)| *k) {
            Ok(i) => {
                let merged = self.entries[i].1.intersect(&set, ints);
                self.entries[i].1 = merged;
            }
            Err(i) => self.entries.insert(i, (key, set)),
        }
    }

    /// Removes a key.
    pub fn remove(&mut self, key: Key) {
        self.entries.retain(|(k, _)| *k != key);
    }

    /// The intersection of both.
    #[must_use]
    pub fn intersect(&self, other: &Requirements, ints: &Interner) -> Requirements {
        let mut out = self.clone();
        for (k, v) in &other.entries {
            out.add(*k, v.clone(), ints);
        }
        out
    }

    /// Whether intersecting `other` into `self` would change nothing (the common case of a pod whose
    /// constraints the claim already carries).
    pub fn subsumes(&self, other: &Requirements, ints: &Interner) -> bool {
        other.entries.iter().all(|(k, v)| match self.get(*k) {
            Some(mine) => &mine.intersect(v, ints) == mine,
            None => false,
        })
    }

    /// Compatibility of a claim or template (`self`, the node side) with a pod (`pod`), keys the
    /// node side lacks being allowed when `well_known` says so (§3.4). First failure in key order.
    pub fn compatible(
        &self,
        pod: &Requirements,
        ints: &Interner,
        well_known: impl Fn(Key) -> bool,
    ) -> Result<(), Incompatible> {
        for (k, b) in &pod.entries {
            match self.get(*k) {
                None => {
                    if !well_known(*k) && !b.is_negative() {
                        return Err(Incompatible::UndefinedKey { key: *k });
                    }
                }
                Some(a) => {
                    if !a.meets(b, ints) {
                        return Err(Incompatible::NoOverlap {
                            key: *k,
                            node: Box::new(a.clone()),
                            pod: Box::new(b.clone()),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Strict matching against a node's real labels (sorted `(key, value)`): a missing key satisfies
    /// only `NotIn`/`DoesNotExist`, even for well-known keys.
    pub fn matches_labels(&self, labels: &[(Key, Val)], ints: &Interner) -> Result<(), Incompatible> {
        for (k, b) in &self.entries {
            let ok = match labels.binary_search_by_key(k, |(lk, _)| *lk) {
                Ok(i) => b.has(labels[i].1, ints),
                Err(_) => b.is_negative(),
            };
            if !ok {
                let node = match labels.binary_search_by_key(k, |(lk, _)| *lk) {
                    Ok(i) => ValueSet::single(labels[i].1),
                    Err(_) => ValueSet::does_not_exist(),
                };
                return Err(Incompatible::NoOverlap { key: *k, node: Box::new(node), pod: Box::new(b.clone()) });
            }
        }
        Ok(())
    }

    /// Back to API requirements (values sorted by name; bounds as `Gt`/`Lt` entries).
    pub fn to_api(&self, ints: &Interner) -> Vec<NodeSelectorRequirement> {
        let mut out = Vec::new();
        for (k, v) in &self.entries {
            let key = ints.key_name(*k).to_string();
            let mut names: Vec<String> = v.values.iter().map(|&x| ints.val_name(x).to_string()).collect();
            names.sort();
            let min_values = v.min_values.and_then(|m| i32::try_from(m).ok());
            let op = match v.shape() {
                Shape::In => Some(Operator::In),
                Shape::NotIn => Some(Operator::NotIn),
                Shape::Exists if v.lo.is_some() || v.hi.is_some() => None,
                Shape::Exists => Some(Operator::Exists),
                Shape::DoesNotExist => Some(Operator::DoesNotExist),
            };
            if let Some(op) = op {
                out.push(NodeSelectorRequirement { key: key.clone(), operator: op, values: names, min_values });
            }
            if let Some(l) = v.lo {
                out.push(NodeSelectorRequirement {
                    key: key.clone(),
                    operator: Operator::Gt,
                    values: vec![l.saturating_sub(1).to_string()],
                    min_values: None,
                });
            }
            if let Some(h) = v.hi {
                out.push(NodeSelectorRequirement {
                    key: key.clone(),
                    operator: Operator::Lt,
                    values: vec![h.saturating_add(1).to_string()],
                    min_values: None,
                });
            }
        }
        out
    }

    /// Human form: `zone In [a] and team Exists`.
    pub fn describe(&self, ints: &Interner) -> String {
        self.entries
            .iter()
            .map(|(k, v)| format!("{} {}", ints.key_name(*k), v.describe(ints)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The set an API operator and values stand for.
pub fn value_set(op: Operator, values: &[String], ints: &mut Interner) -> ValueSet {
    let ids = |ints: &mut Interner| values.iter().map(|v| ints.val(v)).collect::<Vec<_>>();
    let bound = || values.first().and_then(|v| v.trim().parse::<i64>().ok());
    match op {
        Operator::In => ValueSet::is_in(ids(ints)),
        Operator::NotIn => ValueSet::not_in(ids(ints)),
        Operator::Exists => ValueSet::exists(),
        Operator::DoesNotExist => ValueSet::does_not_exist(),
        Operator::Gt => bound().map_or_else(ValueSet::does_not_exist, |n| ValueSet::range(n.checked_add(1), None)),
        Operator::Lt => bound().map_or_else(ValueSet::does_not_exist, |n| ValueSet::range(None, n.checked_sub(1))),
        Operator::Gte => bound().map_or_else(ValueSet::does_not_exist, |n| ValueSet::range(Some(n), None)),
        Operator::Lte => bound().map_or_else(ValueSet::does_not_exist, |n| ValueSet::range(None, Some(n))),
    }
}

/// Legacy label keys rewritten to their current names (§1.3).
pub fn normalize_key(key: &str) -> &str {
    match key {
        "failure-domain.beta.kubernetes.io/zone" => "topology.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region" => "topology.kubernetes.io/region",
        "beta.kubernetes.io/arch" => "kubernetes.io/arch",
        "beta.kubernetes.io/os" => "kubernetes.io/os",
        "beta.kubernetes.io/instance-type" => "node.kubernetes.io/instance-type",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(key: &str, op: Operator, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op,
            values: values.iter().map(|s| s.to_string()).collect(),
            min_values: None,
        }
    }

    fn reqs(list: &[NodeSelectorRequirement], ints: &mut Interner) -> Requirements {
        Requirements::from_api(list, ints)
    }

    #[test]
    fn in_sets_intersect_and_exclusions_unite() {
        let mut ints = Interner::default();
        let a = value_set(Operator::In, &["a".into(), "b".into(), "c".into()], &mut ints);
        let b = value_set(Operator::NotIn, &["b".into()], &mut ints);
        let c = a.intersect(&b, &ints);
        assert_eq!(c.describe(&ints), "In [a, c]");
        let n1 = value_set(Operator::NotIn, &["x".into()], &mut ints);
        let n2 = value_set(Operator::NotIn, &["y".into()], &mut ints);
        assert_eq!(n1.intersect(&n2, &ints).describe(&ints), "NotIn [x, y]");
    }

    #[test]
    fn exists_never_widens_an_in() {
        let mut ints = Interner::default();
        let a = value_set(Operator::In, &["gold".into()], &mut ints);
        let e = ValueSet::exists();
        assert_eq!(a.intersect(&e, &ints), a);
        assert_eq!(e.intersect(&a, &ints), a);
    }

    #[test]
    fn bounds_tighten_and_drop_non_integers() {
        let mut ints = Interner::default();
        let values = value_set(Operator::In, &["2".into(), "5".into(), "abc".into(), "9".into()], &mut ints);
        let gt = value_set(Operator::Gt, &["3".into()], &mut ints);
        let lt = value_set(Operator::Lt, &["9".into()], &mut ints);
        assert_eq!(values.intersect(&gt, &ints).intersect(&lt, &ints).describe(&ints), "In [5]");
        let range = gt.intersect(&lt, &ints);
        assert_eq!(range.len(), 5);
        let gte = value_set(Operator::Gte, &["7".into()], &mut ints);
        let lte = value_set(Operator::Lte, &["6".into()], &mut ints);
        assert!(gte.intersect(&lte, &ints).is_empty());
        assert!(gte.has(ints.lookup_val("9").unwrap_or(0), &ints));
    }

    #[test]
    fn does_not_exist_meets_only_negative_sets() {
        let mut ints = Interner::default();
        let dne = ValueSet::does_not_exist();
        let not_in = value_set(Operator::NotIn, &["x".into()], &mut ints);
        let in_x = value_set(Operator::In, &["x".into()], &mut ints);
        assert!(dne.meets(&not_in, &ints));
        assert!(dne.meets(&dne, &ints));
        assert!(!dne.meets(&ValueSet::exists(), &ints));
        assert!(!dne.meets(&in_x, &ints));
        // Two purely negative requirements always intersect.
        let not_in_y = value_set(Operator::NotIn, &["y".into()], &mut ints);
        assert!(not_in.meets(&not_in_y, &ints));
    }

    #[test]
    fn undefined_custom_keys_fail_unless_negative_and_well_known_are_allowed() {
        let mut ints = Interner::default();
        let node = reqs(&[req("team", Operator::In, &["a"])], &mut ints);
        let gpu = reqs(&[req("gpu", Operator::In, &["yes"])], &mut ints);
        let gpu_key = ints.lookup_key("gpu").unwrap_or(0);
        assert_eq!(node.compatible(&gpu, &ints, |_| false), Err(Incompatible::UndefinedKey { key: gpu_key }));
        assert!(node.compatible(&gpu, &ints, |k| k == gpu_key).is_ok());
        let not_in = reqs(&[req("gpu", Operator::NotIn, &["yes"])], &mut ints);
        let dne = reqs(&[req("gpu", Operator::DoesNotExist, &[])], &mut ints);
        assert!(node.compatible(&not_in, &ints, |_| false).is_ok());
        assert!(node.compatible(&dne, &ints, |_| false).is_ok());
    }

    #[test]
    fn strict_label_matching_refuses_missing_well_known_keys() {
        let mut ints = Interner::default();
        let pod = reqs(&[req("topology.kubernetes.io/zone", Operator::In, &["par"])], &mut ints);
        let labels = vec![(ints.key("team"), ints.val("a"))];
        assert!(pod.matches_labels(&labels, &ints).is_err());
        let zone = ints.key("topology.kubernetes.io/zone");
        let mut labels = vec![(zone, ints.val("par")), (ints.key("team"), ints.val("a"))];
        labels.sort_unstable();
        assert!(pod.matches_labels(&labels, &ints).is_ok());
    }

    #[test]
    fn legacy_keys_are_rewritten_and_min_values_is_the_largest() {
        let mut ints = Interner::default();
        let mut a = req("beta.kubernetes.io/arch", Operator::In, &["amd64"]);
        a.min_values = Some(1);
        let mut b = req("kubernetes.io/arch", Operator::In, &["amd64", "arm64"]);
        b.min_values = Some(2);
        let r = reqs(&[a, b], &mut ints);
        assert_eq!(r.len(), 1);
        let arch = ints.lookup_key("kubernetes.io/arch").unwrap_or(0);
        assert_eq!(r.get(arch).and_then(ValueSet::min_values), Some(2));
    }

    #[test]
    fn bounded_ranges_go_back_to_two_entries() {
        let mut ints = Interner::default();
        let r = reqs(&[req("tier", Operator::Gt, &["3"]), req("tier", Operator::Lt, &["9"])], &mut ints);
        let api = r.to_api(&ints);
        assert_eq!(api.len(), 2);
        assert_eq!(api[0].operator, Operator::Gt);
        assert_eq!(api[0].values, vec!["3"]);
        assert_eq!(api[1].operator, Operator::Lt);
        assert_eq!(api[1].values, vec!["9"]);
    }

    #[test]
    fn hints_suggest_close_keys() {
        let mut ints = Interner::default();
        let zone = ints.key("topology.kubernetes.io/zone");
        let typo = ints.key("topology.kubernetes.io/zones");
        let msg = Incompatible::UndefinedKey { key: typo }.describe(&ints, &[zone]);
        assert!(msg.contains("did you mean topology.kubernetes.io/zone?"), "{msg}");
    }
}
