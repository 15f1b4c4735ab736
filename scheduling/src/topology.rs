//! Pod topology (karpenter-semantics §3.11): spread constraints, pod affinity and anti-affinity, and
//! the inverse anti-affinity of running and already placed pods, as groups of counted pods per
//! domain.
//!
//! Owns groups, their counts and the admissible domains of one pod on one target. Must not choose
//! nodes or instance types (the solver does, and narrows claims to the domains returned here).

use std::collections::{BTreeMap, HashMap};

use crate::affinity::{Namespaces, selector_matches, with_match_label_keys};
use crate::intern::{Interner, Key, Val};
use crate::model::{
    LabelSelector, NodeInclusionPolicy, PodAffinityTerm, SpreadConstraint, Taint, Toleration, WhenUnsatisfiable,
};
use crate::requirements::Requirements;
use crate::taints;

/// What a group constrains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Topology spread: counts of selected pods per domain stay within `maxSkew`.
    Spread,
    /// Pod affinity: land where selected pods are.
    Affinity,
    /// Pod anti-affinity: land where no selected pod is.
    AntiAffinity,
    /// Required anti-affinity of other pods, applied in reverse: counts are of the *owners*; pods
    /// the owners' selector matches keep out of their domains.
    Inverse,
}

/// Identity of a group: pods sharing it share counts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupKey {
    /// Kind.
    pub kind: Kind,
    /// Topology key.
    pub key: Key,
    /// Namespaces counted.
    pub namespaces: Namespaces,
    /// Selector with `matchLabelKeys` folded in; `None` selects nothing.
    pub selector: Option<LabelSelector>,
    /// `maxSkew` (spread only, else 0).
    pub max_skew: i32,
    /// `minDomains` (spread only).
    pub min_domains: Option<i32>,
    /// Node filter, `nodeAffinityPolicy: Honor`: the owner's strict requirement alternatives.
    pub affinity_filter: Option<Vec<Requirements>>,
    /// Node filter, `nodeTaintsPolicy: Honor`: the owner's tolerations.
    pub taints_filter: Option<Vec<Toleration>>,
}

/// A group and its counts.
#[derive(Debug, Clone)]
pub struct Group {
    /// Identity.
    pub id: GroupKey,
    /// Counted pods per domain value.
    pub counts: HashMap<Val, i32>,
    /// Σ counts.
    pub total: i64,
}

impl Group {
    /// Count of a domain.
    pub fn count(&self, v: Val) -> i32 {
        self.counts.get(&v).copied().unwrap_or(0)
    }

    /// Adds one pod to a domain.
    pub fn record(&mut self, v: Val) {
        *self.counts.entry(v).or_insert(0) += 1;
        self.total += 1;
    }

    /// Whether a pod of that namespace and labels is counted by the group.
    pub fn selects(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        self.id.namespaces.contains(namespace) && self.id.selector.as_ref().is_some_and(|s| selector_matches(s, labels))
    }

    /// Whether a node with these labels and taints passes the group's node filter (spread).
    pub fn node_passes(&self, labels: &[(Key, Val)], node_taints: &[Taint], ints: &Interner) -> bool {
        self.id.affinity_filter.as_ref().is_none_or(|alts| alts.iter().any(|a| a.matches_labels(labels, ints).is_ok()))
            && self
                .id
                .taints_filter
                .as_ref()
                .is_none_or(|tol| taints::first_untolerated(node_taints, tol, true).is_none())
    }

    /// Human form for messages.
    pub fn describe(&self, ints: &Interner) -> String {
        let key = ints.key_name(self.id.key);
        match self.id.kind {
            Kind::Spread => format!("topology spread on {key} (maxSkew {})", self.id.max_skew),
            Kind::Affinity => format!("pod affinity on {key}"),
            Kind::AntiAffinity => format!("pod anti-affinity on {key}"),
            Kind::Inverse => format!("the pod anti-affinity of other pods on {key}"),
        }
    }
}

/// One constraint of a pod, on a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodConstraint {
    /// Group index.
    pub group: usize,
    /// Soft: a preferred term or a `ScheduleAnyway` spread (relaxable).
    pub soft: bool,
    /// Rank among the pod's soft constraints of the same kind (relaxation drops rank 0 first).
    pub rank: usize,
}

/// All groups of a round.
#[derive(Debug, Clone, Default)]
pub struct Topology {
    /// Groups.
    pub groups: Vec<Group>,
    index: HashMap<GroupKey, usize>,
}

impl Topology {
    /// The group of that identity, added if new.
    pub fn group(&mut self, id: GroupKey) -> usize {
        if let Some(&i) = self.index.get(&id) {
            return i;
        }
        self.groups.push(Group { id: id.clone(), counts: HashMap::new(), total: 0 });
        self.index.insert(id, self.groups.len() - 1);
        self.groups.len() - 1
    }

    /// No group at all.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }
}

/// Group identity of a spread constraint of a pod.
pub fn spread_key(
    c: &SpreadConstraint,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    strict: &[Requirements],
    tolerations: &[Toleration],
    ints: &mut Interner,
) -> GroupKey {
    GroupKey {
        kind: Kind::Spread,
        key: ints.key(crate::requirements::normalize_key(&c.topology_key)),
        namespaces: Namespaces::List(vec![namespace.to_string()]),
        selector: c.selector.as_ref().map(|s| with_match_label_keys(s, &c.match_label_keys, labels)),
        max_skew: c.max_skew.max(1),
        min_domains: c.min_domains,
        affinity_filter: (c.node_affinity_policy == NodeInclusionPolicy::Honor).then(|| strict.to_vec()),
        taints_filter: (c.node_taints_policy == NodeInclusionPolicy::Honor).then(|| tolerations.to_vec()),
    }
}

/// Whether a spread constraint is soft.
pub fn spread_is_soft(c: &SpreadConstraint) -> bool {
    c.when_unsatisfiable == WhenUnsatisfiable::ScheduleAnyway
}

/// Group identity of a pod (anti-)affinity term.
pub fn term_key(
    kind: Kind,
    term: &PodAffinityTerm,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    namespace_labels: &BTreeMap<String, BTreeMap<String, String>>,
    ints: &mut Interner,
) -> GroupKey {
    GroupKey {
        kind,
        key: ints.key(crate::requirements::normalize_key(&term.topology_key)),
        namespaces: Namespaces::resolve(
            namespace,
            &term.namespaces,
            term.namespace_selector.as_ref(),
            namespace_labels,
        ),
        selector: term.selector.as_ref().map(|s| with_match_label_keys(s, &term.match_label_keys, labels)),
        max_skew: 0,
        min_domains: None,
        affinity_filter: None,
        taints_filter: None,
    }
}

/// Where a domain value comes from.
#[derive(Debug, Clone)]
pub struct DomainSource {
    /// The value.
    pub value: Val,
    /// Taints of the pool or node offering it.
    pub taints: Vec<Taint>,
    /// Labels of the node, when it is one.
    pub node_labels: Option<Vec<(Key, Val)>>,
}

/// The domains of a key a spread constraint may count.
#[derive(Debug, Clone, Default)]
pub struct Domains {
    /// Sources, in pool then node order.
    pub sources: Vec<DomainSource>,
}

/// Why no domain is admissible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

/// The admissible domains of a target for one constraint of a pod.
///
/// `possible`: the target's possible values of the key (`None`: the target lacks the key). `self_match`:
/// whether the pod is counted by the group. `eligible_min`: for a spread over a non-hostname key,
/// the lowest count among eligible domains (already 0 when `minDomains` is not met). `may_bootstrap`
/// (affinity): the pod selects itself and no domain its own requirements allow holds a matching pod,
/// so it may open a domain of its own (upstream's `nextDomainAffinity`).
pub fn admissible(
    group: &Group,
    possible: Option<&[Val]>,
    self_match: bool,
    hostname: bool,
    eligible_min: i32,
    may_bootstrap: bool,
    ints: &Interner,
) -> Result<Vec<Val>, Refused> {
    let Some(possible) = possible else {
        return match group.id.kind {
            // A target without the key is outside every domain: spread and affinity cannot hold there;
            // anti-affinity holds trivially.
            Kind::AntiAffinity | Kind::Inverse => Ok(Vec::new()),
            _ => {
                Err(Refused(format!("{}: the node has no {} label", group.describe(ints), ints.key_name(group.id.key))))
            }
        };
    };
    let me = i32::from(self_match);
    let out: Vec<Val> = match group.id.kind {
        Kind::Spread => {
            let min = if hostname { 0 } else { eligible_min };
            let mut ok: Vec<(i32, Val)> = possible
                .iter()
                .map(|&v| (group.count(v), v))
                .filter(|(c, _)| c.saturating_add(me).saturating_sub(min) <= group.id.max_skew)
                .collect();
            // Pin to the admissible domain with the lowest count (ties: first in value order).
            ok.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| ints.val_name(a.1).cmp(ints.val_name(b.1))));
            ok.first().map(|&(_, v)| vec![v]).unwrap_or_default()
        }
        Kind::Affinity => {
            let ok: Vec<Val> = possible.iter().copied().filter(|&v| group.count(v) > 0).collect();
            if ok.is_empty() && may_bootstrap {
                // Bootstrap: the first pod of a self-affine set within the domains it allows picks one.
                let mut first: Vec<Val> = possible.to_vec();
                first.sort_by(|a, b| ints.val_name(*a).cmp(ints.val_name(*b)));
                first.truncate(1);
                first
            } else {
                ok
            }
        }
        Kind::AntiAffinity | Kind::Inverse => possible.iter().copied().filter(|&v| group.count(v) == 0).collect(),
    };
    if out.is_empty() {
        let why = match group.id.kind {
            Kind::Spread => "every domain would exceed the skew".to_string(),
            Kind::Affinity if group.total == 0 => "no pod matching the selector exists".to_string(),
            Kind::Affinity => "no domain the pod may use holds a pod matching the selector".to_string(),
            Kind::AntiAffinity | Kind::Inverse => "every domain already holds a matching pod".to_string(),
        };
        return Err(Refused(format!("{}: {why}", group.describe(ints))));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(kind: Kind, max_skew: i32) -> Group {
        Group {
            id: GroupKey {
                kind,
                key: 0,
                namespaces: Namespaces::All,
                selector: Some(LabelSelector::default()),
                max_skew,
                min_domains: None,
                affinity_filter: None,
                taints_filter: None,
            },
            counts: HashMap::new(),
            total: 0,
        }
    }

    #[test]
    fn spread_pins_the_lowest_count() {
        let mut ints = Interner::default();
        let (a, b, c) = (ints.val("a"), ints.val("b"), ints.val("c"));
        let mut g = group(Kind::Spread, 1);
        g.record(a);
        g.record(a);
        assert_eq!(admissible(&g, Some(&[a, b, c]), true, false, 0, true, &ints), Ok(vec![b]));
        assert!(admissible(&g, Some(&[a]), true, false, 0, true, &ints).is_err());
    }

    #[test]
    fn affinity_bootstraps_only_when_self_matching() {
        let mut ints = Interner::default();
        let (a, b) = (ints.val("a"), ints.val("b"));
        let g = group(Kind::Affinity, 0);
        assert_eq!(admissible(&g, Some(&[b, a]), true, false, 0, true, &ints), Ok(vec![a]));
        assert!(admissible(&g, Some(&[a, b]), false, false, 0, false, &ints).is_err());
    }

    #[test]
    fn anti_affinity_keeps_out_of_counted_domains() {
        let mut ints = Interner::default();
        let (a, b) = (ints.val("a"), ints.val("b"));
        let mut g = group(Kind::AntiAffinity, 0);
        g.record(a);
        assert_eq!(admissible(&g, Some(&[a, b]), true, false, 0, true, &ints), Ok(vec![b]));
        assert_eq!(admissible(&g, None, true, false, 0, true, &ints), Ok(vec![]));
    }
}
