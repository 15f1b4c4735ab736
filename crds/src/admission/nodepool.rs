//! Admission of a `NodePool` (karpenter-semantics §1.1–§1.3, §1.8, §9 D5): template labels and
//! taints, requirement semantics (operators, values, minValues, capacity type, legacy and restricted
//! keys, contradictions), durations, budgets (cron, windows, reasons), limits (quantities, and the
//! price ceiling as decimal EUR), immutable fields, and — given the node class and its catalogue —
//! whether any flavor can satisfy the pool at all.

use std::collections::{BTreeMap, BTreeSet};

use crate::admission::schedule::{self, BudgetNodes, format_seconds};
use crate::admission::{
    Lookup, Verdict, check_cluster_target, check_label_value, check_name_is_label_value, label_key_problem, shorten,
};
use crate::catalog::{
    BUILTIN_FLAVORS, CAPACITY_TYPE_ON_DEMAND, CAPACITY_TYPE_RESERVED, CAPACITY_TYPE_SPOT, DEFAULT_ZONE, Flavor,
    InstanceType,
};
use crate::common::{NodeSelectorRequirement, Operator, Taint};
use crate::drift::nodepool_hash;
use crate::flavorcatalog::FlavorCatalog;
use crate::labels;
use crate::nodeclass::CleverNodeClass;
use crate::nodepool::{ConsolidationPolicy, DisruptionReason, NodePool};
use crate::quantity::parse_quantity;
use crate::validation::{dns1123_label, dns1123_subdomain, in_domain, label_value};

/// Largest `minValues` (karpenter-semantics Appendix A).
const MAX_MIN_VALUES: i32 = 50;
/// Nodes expiring sooner than this churn the pool: expiry ignores budgets.
const SHORT_EXPIRY_SECONDS: u64 = 3600;
/// Capacity types Karpenter knows.
const KNOWN_CAPACITY_TYPES: [&str; 3] = [CAPACITY_TYPE_ON_DEMAND, CAPACITY_TYPE_SPOT, CAPACITY_TYPE_RESERVED];
/// Taints the hub manages on every node: a pool setting them would break registration or termination.
const HUB_TAINTS: [&str; 2] = [labels::UNREGISTERED_TAINT, labels::DISRUPTED_TAINT];
/// Well-known labels whose values come from the flavor: they depend on the catalogue.
const FLAVOR_KEYS: [&str; 4] =
    [labels::INSTANCE_TYPE, labels::CLEVER_FLAVOR, labels::INSTANCE_CPU, labels::INSTANCE_MEMORY];
/// Legacy label keys and the key the hub rewrites each to.
const LEGACY_KEYS: [(&str, &str); 5] = [
    ("failure-domain.beta.kubernetes.io/zone", labels::ZONE),
    ("failure-domain.beta.kubernetes.io/region", labels::REGION),
    ("beta.kubernetes.io/arch", labels::ARCH),
    ("beta.kubernetes.io/os", labels::OS),
    ("beta.kubernetes.io/instance-type", labels::INSTANCE_TYPE),
];
/// Flavor names listed in a message before "...".
const MAX_LISTED_FLAVORS: usize = 8;

/// The objects a NodePool refers to, as the caller could read them.
#[derive(Debug, Clone)]
pub struct NodePoolReferences<'a> {
    /// The `CleverNodeClass` named by `spec.template.spec.nodeClassRef`.
    pub node_class: Lookup<&'a CleverNodeClass>,
    /// The `FlavorCatalog` named by that class's `flavorCatalogRef` (ignored when it names none).
    pub flavor_catalog: Lookup<&'a FlavorCatalog>,
    /// The base catalogue the hub serves; `None` for the built-in one (the webhook cannot see a price
    /// refresh, so it judges against the built-in flavors).
    pub base: Option<&'a [Flavor]>,
}

impl NodePoolReferences<'_> {
    /// Nothing could be read (no API client, or the read failed): cross-object checks become warnings.
    pub fn unchecked(why: &str) -> Self {
        NodePoolReferences {
            node_class: Lookup::Unchecked(why.to_string()),
            flavor_catalog: Lookup::Unchecked(why.to_string()),
            base: None,
        }
    }
}

/// Validates a `NodePool`. Every denial names its field and the fix; see the module comment for the
/// rule groups, and docs/webhook.md for the full list.
pub fn validate_node_pool(new: &NodePool, old: Option<&NodePool>, references: NodePoolReferences<'_>) -> Verdict {
    let mut verdict = Verdict::default();
    let spec = &new.spec;
    check_name_is_label_value(&mut verdict, new.metadata.name.as_deref(), labels::NODEPOOL);
    check_cluster_target(
        &mut verdict,
        spec.cluster_name.as_ref(),
        spec.cluster_selector.as_ref(),
        (
            "a pool serving one cluster",
            "a fleet pool serving every registered cluster of the namespace whose labels match",
            "this pool",
        ),
    );
    if let Some(rollout) = &spec.rollout {
        check_rollout(&mut verdict, rollout, spec.cluster_selector.is_some());
    }
    if let Some(weight) = spec.weight
        && !(1..=100).contains(&weight)
    {
        verdict.deny("spec.weight", format!("{weight} is out of range: use 1 to 100, or omit it for 0"));
    }
    if let Some(replicas) = spec.replicas {
        check_static(&mut verdict, spec, replicas);
    }

    let template = &spec.template;
    let empty = BTreeMap::new();
    let template_labels = template.metadata.as_ref().map_or(&empty, |m| &m.labels);
    for (key, value) in template_labels {
        let field = format!("spec.template.metadata.labels[{key}]");
        if let Some(problem) = label_key_problem(key).or_else(|| restricted_key_problem(key, "label")) {
            verdict.deny(&field, problem);
        } else if let Some(new_key) = legacy_replacement(key) {
            verdict.warn(&field, format!("{key} is a deprecated label key: write {new_key}"));
        }
        check_label_value(&mut verdict, &field, value);
    }
    for key in template.metadata.as_ref().map(|m| m.annotations.keys()).into_iter().flatten() {
        if let Some(problem) = label_key_problem(key) {
            verdict.deny(
                format!("spec.template.metadata.annotations[{key}]"),
                problem.replace("label key", "annotation key"),
            );
        }
    }

    check_taints(&mut verdict, &template.spec.taints, &template.spec.startup_taints);
    let usable = check_requirements(&mut verdict, &template.spec.requirements);
    let constraints = constraints(&template.spec.requirements, &usable, template_labels);
    check_contradictions(&mut verdict, &constraints);

    let class_ref = &template.spec.node_class_ref;
    let class_ref_ok = check_node_class_ref(&mut verdict, class_ref);
    check_durations(&mut verdict, new);
    check_budgets(&mut verdict, new);
    let limits = check_limits(&mut verdict, new);

    if class_ref_ok {
        check_flavors(&mut verdict, new, &constraints, &limits, references);
    }
    if let Some(old) = old {
        check_update(&mut verdict, new, old);
    }
    verdict
}

/// The problem with a key in the system's domains (§1.8), for template labels and requirements.
fn restricted_key_problem(key: &str, what: &str) -> Option<String> {
    if key == labels::NODEPOOL {
        return Some(format!("{key} is set by the hub on every node of the pool; remove this {what}"));
    }
    if key == labels::HOSTNAME {
        return Some(format!("{key} is set by the kubelet and differs per node; remove this {what}"));
    }
    if in_domain(key, "karpenter.sh") && key != labels::CAPACITY_TYPE {
        return Some(format!(
            "domain karpenter.sh is restricted (only {} may be used); use your own prefix, e.g. example.com/team",
            labels::CAPACITY_TYPE
        ));
    }
    if in_domain(key, labels::GROUP) && key != labels::INSTANCE_CPU && key != labels::INSTANCE_MEMORY {
        return Some(format!(
            "domain {} carries the hub's ownership labels (only instance-cpu and instance-memory may be used); use \
             your own prefix, e.g. example.com/team",
            labels::GROUP
        ));
    }
    None
}

fn legacy_replacement(key: &str) -> Option<&'static str> {
    LEGACY_KEYS.iter().find(|(old, _)| *old == key).map(|(_, new)| *new)
}

fn normalized_key(key: &str) -> &str {
    legacy_replacement(key).unwrap_or(key)
}

fn check_taints(verdict: &mut Verdict, taints: &[Taint], startup_taints: &[Taint]) {
    let mut seen: BTreeMap<(&str, &str), String> = BTreeMap::new();
    for (list, name) in [(taints, "taints"), (startup_taints, "startupTaints")] {
        for (i, taint) in list.iter().enumerate() {
            let field = format!("spec.template.spec.{name}[{i}]");
            if let Some(problem) = label_key_problem(&taint.key) {
                verdict.deny(format!("{field}.key"), problem.replace("label key", "taint key"));
            } else if HUB_TAINTS.contains(&taint.key.as_str()) {
                verdict.deny(
                    format!("{field}.key"),
                    format!("{} is managed by the hub on every node (registration, termination); remove it", taint.key),
                );
            }
            if let Some(value) = &taint.value
                && let Err(reason) = label_value(value)
            {
                verdict
                    .deny(format!("{field}.value"), format!("{} is not a valid taint value: {reason}", shorten(value)));
            }
            let effect = taint.effect.as_str();
            match seen.get(&(taint.key.as_str(), effect)) {
                Some(first) => verdict.deny(
                    &field,
                    format!(
                        "taint {}:{effect} is already set at {first}; a key and effect may appear once across taints \
                         and startupTaints: remove one",
                        taint.key
                    ),
                ),
                None => {
                    seen.insert((taint.key.as_str(), effect), field);
                }
            }
        }
    }
}

fn is_integer_operator(op: Operator) -> bool {
    matches!(op, Operator::Gt | Operator::Lt | Operator::Gte | Operator::Lte)
}

/// Checks each requirement on its own; returns which ones are well-formed (only those feed the
/// cross-requirement checks, so one mistake is reported once).
fn check_requirements(verdict: &mut Verdict, requirements: &[NodeSelectorRequirement]) -> Vec<bool> {
    let mut usable = Vec::with_capacity(requirements.len());
    for (i, r) in requirements.iter().enumerate() {
        let field = format!("spec.template.spec.requirements[{i}]");
        let before = verdict.denials.len();
        let key = r.key.as_str();
        if let Some(problem) = label_key_problem(key).or_else(|| restricted_key_problem(key, "requirement")) {
            verdict.deny(format!("{field}.key"), problem);
        } else if let Some(new_key) = legacy_replacement(key) {
            verdict.warn(format!("{field}.key"), format!("{key} is deprecated and read as {new_key}: write {new_key}"));
        }
        let op = r.operator.as_str();
        match r.operator {
            Operator::In | Operator::NotIn if r.values.is_empty() => verdict.deny(
                format!("{field}.values"),
                format!(
                    "operator {op} needs at least one value, e.g. values: [\"XS\", \"S\"]; or use Exists / DoesNotExist"
                ),
            ),
            Operator::Exists | Operator::DoesNotExist if !r.values.is_empty() => {
                verdict.deny(format!("{field}.values"), format!("operator {op} takes no values: remove them"))
            }
            o if is_integer_operator(o)
                && (r.values.len() != 1 || r.values.first().and_then(|v| parse_integer(v)).is_none()) =>
            {
                verdict.deny(
                    format!("{field}.values"),
                    format!(
                        "operator {op} needs exactly one non-negative integer value, e.g. values: [\"4\"]; got {}",
                        shorten(&format!("{:?}", r.values))
                    ),
                );
            }
            _ => {}
        }
        if !is_integer_operator(r.operator) {
            for (j, value) in r.values.iter().enumerate() {
                if let Err(reason) = label_value(value) {
                    verdict.deny(
                        format!("{field}.values[{j}]"),
                        format!("{} is not a valid label value: {reason}", shorten(value)),
                    );
                }
            }
        }
        if let Some(min) = r.min_values {
            if !(1..=MAX_MIN_VALUES).contains(&min) {
                verdict.deny(format!("{field}.minValues"), format!("{min} is out of range: use 1 to {MAX_MIN_VALUES}"));
            } else if r.operator == Operator::In && distinct(&r.values) < min as usize {
                verdict.deny(
                    format!("{field}.minValues"),
                    format!(
                        "minValues {min} needs at least {min} distinct values, {} listed: add values or lower minValues",
                        distinct(&r.values)
                    ),
                );
            }
        }
        if key == labels::CAPACITY_TYPE && r.operator == Operator::In {
            let known = r.values.iter().filter(|v| KNOWN_CAPACITY_TYPES.contains(&v.as_str())).collect::<BTreeSet<_>>();
            let unknown: Vec<&String> =
                r.values.iter().filter(|v| !KNOWN_CAPACITY_TYPES.contains(&v.as_str())).collect();
            if known.is_empty() {
                verdict.deny(
                    format!("{field}.values"),
                    format!(
                        "lists no known capacity type: use {} (CKE offers on-demand only)",
                        KNOWN_CAPACITY_TYPES.join(", ")
                    ),
                );
            } else if let Some(min) = r.min_values.filter(|m| known.len() < *m as usize) {
                verdict.deny(
                    format!("{field}.minValues"),
                    format!("minValues {min} needs {min} known capacity types, {} listed", known.len()),
                );
            } else if !unknown.is_empty() {
                verdict.warn(
                    format!("{field}.values"),
                    format!(
                        "unknown capacity types {unknown:?} are ignored; known: {}",
                        KNOWN_CAPACITY_TYPES.join(", ")
                    ),
                );
            }
        }
        usable.push(verdict.denials.len() == before);
    }
    usable
}

/// Digits only, fitting an `i64`: the value of a Gt/Lt/Gte/Lte requirement.
fn parse_integer(value: &str) -> Option<i64> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

fn distinct(values: &[String]) -> usize {
    values.iter().collect::<BTreeSet<_>>().len()
}

/// Everything the requirements (and template labels) say about one key.
#[derive(Debug, Default)]
struct KeyConstraint {
    /// Intersection of the `In` sets (and template label values), when any.
    allowed: Option<BTreeSet<String>>,
    forbidden: BTreeSet<String>,
    exists: bool,
    absent: bool,
    /// Smallest and largest integer value allowed.
    lower: Option<i64>,
    upper: Option<i64>,
    /// Largest `minValues` given on the key, with its field.
    min_values: Option<(i32, String)>,
    /// Fields that constrain the key, for messages.
    fields: Vec<String>,
}

impl KeyConstraint {
    fn add(&mut self, field: String, operator: Operator, values: &[String], min_values: Option<i32>) {
        let integer = values.first().and_then(|v| parse_integer(v));
        match operator {
            Operator::In => {
                let set: BTreeSet<String> = values.iter().cloned().collect();
                self.allowed = Some(match self.allowed.take() {
                    Some(previous) => previous.intersection(&set).cloned().collect(),
                    None => set,
                });
            }
            Operator::NotIn => self.forbidden.extend(values.iter().cloned()),
            Operator::Exists => self.exists = true,
            Operator::DoesNotExist => self.absent = true,
            Operator::Gt => self.raise(integer.and_then(|n| n.checked_add(1))),
            Operator::Gte => self.raise(integer),
            Operator::Lt => self.lower_upper(integer.map(|n| n - 1)),
            Operator::Lte => self.lower_upper(integer),
        }
        if let Some(min) = min_values
            && self.min_values.as_ref().is_none_or(|(m, _)| min > *m)
        {
            self.min_values = Some((min, format!("{field}.minValues")));
        }
        self.fields.push(field);
    }

    fn raise(&mut self, bound: Option<i64>) {
        // An unrepresentable bound (Gt i64::MAX) admits nothing.
        let bound = bound.unwrap_or(i64::MAX);
        self.lower = Some(self.lower.map_or(bound, |l| l.max(bound)));
    }

    fn lower_upper(&mut self, bound: Option<i64>) {
        let bound = bound.unwrap_or(-1);
        self.upper = Some(self.upper.map_or(bound, |u| u.min(bound)));
    }

    fn has_bounds(&self) -> bool {
        self.lower.is_some() || self.upper.is_some()
    }

    fn within_bounds(&self, value: &str) -> bool {
        if !self.has_bounds() {
            return true;
        }
        // Karpenter compares label values as integers; a value that is not one never satisfies a bound.
        value.parse::<i64>().is_ok_and(|n| self.lower.is_none_or(|l| n >= l) && self.upper.is_none_or(|u| n <= u))
    }

    /// Whether a node label value (None: label absent) satisfies every constraint on the key.
    fn admits(&self, value: Option<&str>) -> bool {
        match value {
            None => !self.exists && self.allowed.is_none() && !self.has_bounds(),
            Some(v) => {
                !self.absent
                    && self.allowed.as_ref().is_none_or(|a| a.contains(v))
                    && !self.forbidden.contains(v)
                    && self.within_bounds(v)
            }
        }
    }

    /// Values the key may take, when it is restricted to a set.
    fn remaining(&self) -> Option<Vec<&String>> {
        self.allowed
            .as_ref()
            .map(|a| a.iter().filter(|v| !self.forbidden.contains(*v) && self.within_bounds(v)).collect())
    }
}

/// The constraints of the well-formed requirements and of the template labels (which Karpenter adds to
/// every NodeClaim as `In [value]`), by key, legacy keys read as their replacements.
fn constraints(
    requirements: &[NodeSelectorRequirement],
    usable: &[bool],
    template_labels: &BTreeMap<String, String>,
) -> BTreeMap<String, KeyConstraint> {
    let mut by_key: BTreeMap<String, KeyConstraint> = BTreeMap::new();
    for (i, r) in requirements.iter().enumerate() {
        if usable.get(i) == Some(&true) {
            by_key.entry(normalized_key(&r.key).to_string()).or_default().add(
                format!("spec.template.spec.requirements[{i}]"),
                r.operator,
                &r.values,
                r.min_values,
            );
        }
    }
    for (key, value) in template_labels {
        if label_key_problem(key).is_none() && restricted_key_problem(key, "label").is_none() {
            by_key.entry(normalized_key(key).to_string()).or_default().add(
                format!("spec.template.metadata.labels[{key}]"),
                Operator::In,
                std::slice::from_ref(value),
                None,
            );
        }
    }
    by_key
}

/// Requirements that no node could satisfy at once, whatever the catalogue.
fn check_contradictions(verdict: &mut Verdict, constraints: &BTreeMap<String, KeyConstraint>) {
    for (key, c) in constraints {
        let Some(last) = c.fields.last() else { continue };
        let sources = c.fields.join(", ");
        let contradiction = if c.absent && (c.exists || c.allowed.is_some() || c.has_bounds()) {
            true
        } else if let Some(remaining) = c.remaining() {
            if remaining.is_empty() {
                true
            } else {
                if let Some((min, field)) = &c.min_values
                    && remaining.len() < *min as usize
                    && c.fields.len() > 1
                {
                    verdict.deny(
                        field,
                        format!(
                            "only {} value(s) of {key} remain once {sources} are combined, fewer than minValues {min}",
                            remaining.len()
                        ),
                    );
                }
                false
            }
        } else {
            matches!((c.lower, c.upper), (Some(l), Some(u)) if l > u)
        };
        if contradiction {
            verdict.deny(
                last,
                format!("{sources} cannot all hold for {key}: no node could satisfy them; remove or relax one"),
            );
        }
    }
}

fn check_node_class_ref(verdict: &mut Verdict, r: &crate::common::NodeClassReference) -> bool {
    let field = "spec.template.spec.nodeClassRef";
    let mut ok = true;
    if r.group != labels::GROUP {
        verdict.deny(format!("{field}.group"), format!("must be {}", labels::GROUP));
        ok = false;
    }
    if r.kind != labels::NODECLASS_KIND {
        verdict.deny(format!("{field}.kind"), format!("must be {}", labels::NODECLASS_KIND));
        ok = false;
    }
    let name_problem = dns1123_subdomain(&r.name).err().or_else(|| label_value(&r.name).err());
    if let Some(reason) = name_problem {
        verdict
            .deny(format!("{field}.name"), format!("{} cannot name a CleverNodeClass: it {reason}", shorten(&r.name)));
        ok = false;
    }
    ok
}

fn check_durations(verdict: &mut Verdict, pool: &NodePool) {
    let spec = &pool.spec.template.spec;
    match schedule::parse_duration(&spec.expire_after, true) {
        Err(problem) => verdict.deny("spec.template.spec.expireAfter", problem.to_string()),
        Ok(Some(0)) => verdict.deny(
            "spec.template.spec.expireAfter",
            "0s would expire every node as soon as it launches (an endless replacement loop); use Never or e.g. 720h",
        ),
        Ok(Some(s)) if s < SHORT_EXPIRY_SECONDS => verdict.warn(
            "spec.template.spec.expireAfter",
            format!(
                "nodes are replaced every {}, ignoring budgets (expiry is forceful): expect constant churn",
                format_seconds(s)
            ),
        ),
        Ok(_) => {}
    }
    if let Some(tgp) = &spec.termination_grace_period {
        match schedule::parse_duration(tgp, false) {
            Err(problem) => verdict.deny("spec.template.spec.terminationGracePeriod", problem.to_string()),
            Ok(Some(0)) => verdict.warn(
                "spec.template.spec.terminationGracePeriod",
                "0s deletes a draining node's pods at once, ignoring PDBs and do-not-disrupt",
            ),
            Ok(_) => {}
        }
    }
    let disruption = &pool.spec.disruption;
    match schedule::parse_duration(&disruption.consolidate_after, true) {
        Err(problem) => verdict.deny("spec.disruption.consolidateAfter", problem.to_string()),
        Ok(Some(0)) if disruption.consolidation_policy == ConsolidationPolicy::WhenEmptyOrUnderutilized => verdict
            .warn(
                "spec.disruption.consolidateAfter",
                "0s (the default) will let a node be consolidated the moment its pods change, e.g. mid-rollout, which \
             churns nodes; consider 1m or more",
            ),
        Ok(_) => {}
    }
}

const REASONS: [DisruptionReason; 3] =
    [DisruptionReason::Empty, DisruptionReason::Drifted, DisruptionReason::Underutilized];

fn reason_name(r: DisruptionReason) -> &'static str {
    match r {
        DisruptionReason::Empty => "Empty",
        DisruptionReason::Drifted => "Drifted",
        DisruptionReason::Underutilized => "Underutilized",
    }
}

fn check_budgets(verdict: &mut Verdict, pool: &NodePool) {
    let disruption = &pool.spec.disruption;
    let mut parsed: Vec<Option<BudgetNodes>> = Vec::new();
    for (i, budget) in disruption.budgets.iter().enumerate() {
        let field = format!("spec.disruption.budgets[{i}]");
        let nodes = schedule::parse_budget_nodes(&budget.nodes);
        if let Err(problem) = &nodes {
            verdict.deny(format!("{field}.nodes"), problem.to_string());
        }
        parsed.push(nodes.ok());
        match (&budget.schedule, &budget.duration) {
            (Some(_), None) => verdict.deny(
                format!("{field}.duration"),
                "a budget with a schedule needs a duration (how long each window lasts), e.g. duration: 8h",
            ),
            (None, Some(_)) => verdict.deny(
                format!("{field}.schedule"),
                "a budget with a duration needs a schedule (when each window starts), e.g. schedule: \"0 9 * * 1-5\"",
            ),
            _ => {}
        }
        if let Some(cron) = &budget.schedule
            && let Err(problem) = schedule::parse_schedule(cron)
        {
            verdict.deny(format!("{field}.schedule"), format!("{} {problem}", shorten(cron)));
        }
        if let Some(duration) = &budget.duration {
            match schedule::parse_budget_duration(duration) {
                Err(problem) => verdict.deny(format!("{field}.duration"), problem.to_string()),
                Ok(0) => verdict.warn(format!("{field}.duration"), "a window of 0 minutes is never active"),
                Ok(_) => {}
            }
        }
    }

    // Which reasons can happen at all: WhenEmpty never consolidates under-used nodes, Never consolidates nothing.
    let consolidation_off = disruption.consolidate_after == "Never";
    let happens = |r: DisruptionReason| match r {
        DisruptionReason::Drifted => true,
        DisruptionReason::Empty => !consolidation_off,
        DisruptionReason::Underutilized => {
            !consolidation_off && disruption.consolidation_policy != ConsolidationPolicy::WhenEmpty
        }
    };
    let applies =
        |b: &crate::nodepool::Budget, r: DisruptionReason| b.reasons.as_ref().is_none_or(|rs| rs.contains(&r));
    let mut scheduled_only = Vec::new();
    let mut uncovered = Vec::new();
    let mut frozen = Vec::new();
    for r in REASONS.into_iter().filter(|r| happens(*r)) {
        let always = disruption.budgets.iter().filter(|b| b.schedule.is_none() && applies(b, r));
        if always.clone().next().is_none() {
            if disruption.budgets.iter().any(|b| applies(b, r)) {
                scheduled_only.push(reason_name(r));
            } else {
                uncovered.push(reason_name(r));
            }
        }
        let zero = |b: &&crate::nodepool::Budget| {
            let i = disruption.budgets.iter().position(|x| std::ptr::eq(x, *b));
            matches!(
                i.and_then(|i| parsed.get(i).copied().flatten()),
                Some(BudgetNodes::Count(0) | BudgetNodes::Percent(0))
            )
        };
        if disruption.budgets.iter().filter(|b| b.schedule.is_none() && applies(b, r)).any(|b| zero(&b)) {
            frozen.push(reason_name(r));
        }
    }
    if !scheduled_only.is_empty() {
        verdict.warn(
            "spec.disruption.budgets",
            format!(
                "{} only limited by scheduled budgets: outside their windows the hub allows 10% (upstream Karpenter: \
                 no limit); add a budget without schedule, e.g. nodes: \"100%\" for no limit",
                scheduled_only.join(", ")
            ),
        );
    }
    if !uncovered.is_empty() {
        verdict.warn(
            "spec.disruption.budgets",
            format!("no budget covers {}: the hub allows 10% (upstream Karpenter: no limit)", uncovered.join(", ")),
        );
    }
    if !frozen.is_empty() {
        verdict.warn(
            "spec.disruption.budgets",
            format!("a budget of 0 nodes without schedule blocks {} at all times", frozen.join(", ")),
        );
    }
}

/// Limits as (name, value in the unit instance types use): cpu in millicores, the price ceiling
/// in micro-EUR per hour, others in units.
fn check_limits(verdict: &mut Verdict, pool: &NodePool) -> Vec<(String, i64)> {
    let mut parsed = Vec::new();
    for (name, quantity) in pool.spec.limits.iter().flatten() {
        let field = format!("spec.limits[{name}]");
        // The price ceiling is EUR, not a resource quantity (`1e3` or `5Gi` would read as one).
        if name == labels::PRICE_PER_HOUR {
            // The scheduler reads the ceiling with the same function.
            match crate::quantity::parse_price_micros(&quantity.0) {
                Err(problem) => verdict.deny(&field, problem.to_string()),
                Ok(micros) => {
                    if micros == 0 {
                        verdict.warn(&field, "a price ceiling of 0 lets the pool create no node");
                    }
                    parsed.push((name.clone(), micros));
                }
            }
            continue;
        }
        match parse_quantity(&quantity.0) {
            Err(problem) => verdict.deny(&field, problem.to_string()),
            Ok(q) if q.is_negative() => {
                verdict.deny(&field, format!("{} is negative: limits are at least 0", quantity.0))
            }
            Ok(q) => {
                let value = if name == crate::quantity::CPU { q.as_millis() } else { q.as_units() };
                if value == 0 && (name == "nodes" || name == crate::quantity::CPU || name == crate::quantity::MEMORY) {
                    verdict.warn(&field, "a limit of 0 lets the pool create no node");
                }
                parsed.push((name.clone(), value));
            }
        }
    }
    parsed
}

/// Does the instance type satisfy every constraint on a key it defines? (Keys it does not define —
/// the pool's own labels — do not restrict flavors.)
fn type_admits(it: &InstanceType, constraints: &BTreeMap<String, KeyConstraint>, only: Option<&str>) -> bool {
    constraints.iter().filter(|(k, _)| only.is_none_or(|o| o == k.as_str())).all(|(key, c)| match it.labels.get(key) {
        Some(value) => c.admits(Some(value)),
        None => true,
    })
}

fn list_names(types: &[&InstanceType]) -> String {
    let mut names: Vec<&str> = types.iter().take(MAX_LISTED_FLAVORS).map(|t| t.name.as_str()).collect();
    if types.len() > MAX_LISTED_FLAVORS {
        names.push("...");
    }
    names.join(", ")
}

/// Whether any flavor of the served catalogue satisfies the pool, its minValues and its limits.
fn check_flavors(
    verdict: &mut Verdict,
    pool: &NodePool,
    constraints: &BTreeMap<String, KeyConstraint>,
    limits: &[(String, i64)],
    references: NodePoolReferences<'_>,
) {
    let class_name = &pool.spec.template.spec.node_class_ref.name;
    let builtin: Vec<Flavor>;
    let base = match references.base {
        Some(base) => base,
        None => {
            builtin = BUILTIN_FLAVORS.iter().map(|f| f.to_flavor()).collect();
            &builtin
        }
    };
    let field = "spec.template.spec.nodeClassRef.name";
    // Whether the served catalogue is known for sure: only then do catalogue checks deny.
    let (catalog, known) = match &references.node_class {
        Lookup::Found(class) => match (&class.spec.flavor_catalog_ref, &references.flavor_catalog) {
            (None, _) => super::flavorcatalog::served(base, None),
            (Some(_), Lookup::Found(fc)) => super::flavorcatalog::served(base, Some(fc)),
            (Some(r), Lookup::Missing) => {
                verdict.warn(
                    field,
                    format!("its FlavorCatalog {} does not exist yet: checked against the built-in flavors", r.name),
                );
                (super::flavorcatalog::served(base, None).0, false)
            }
            (Some(_), Lookup::Unchecked(why)) => {
                verdict.warn(
                    field,
                    format!("could not read its FlavorCatalog ({why}): checked against the built-in flavors"),
                );
                (super::flavorcatalog::served(base, None).0, false)
            }
        },
        Lookup::Missing => {
            verdict.warn(
                field,
                format!("CleverNodeClass {class_name} does not exist in this namespace: the pool stays not Ready until it does"),
            );
            (super::flavorcatalog::served(base, None).0, false)
        }
        Lookup::Unchecked(why) => {
            verdict.warn(
                field,
                format!("could not read CleverNodeClass {class_name} ({why}): flavor checks used the built-in flavors"),
            );
            (super::flavorcatalog::served(base, None).0, false)
        }
    };
    let types = catalog.instance_types(DEFAULT_ZONE);
    let matching: Vec<&InstanceType> = types.iter().filter(|t| type_admits(t, constraints, None)).collect();
    if matching.is_empty() {
        // Keys whose values are the same for every flavor (zone, capacity type, arch, os, role) do not
        // depend on the catalogue: a pool excluded by them is certainly unusable.
        let excluded_by_fixed_keys = types.iter().all(|t| {
            !constraints.iter().filter(|(k, _)| !FLAVOR_KEYS.contains(&k.as_str())).all(|(key, c)| {
                match t.labels.get(key) {
                    Some(v) => c.admits(Some(v)),
                    None => true,
                }
            })
        });
        let culprit = constraints
            .iter()
            .find(|(key, _)| types.iter().all(|t| !type_admits(t, constraints, Some(key.as_str()))))
            .and_then(|(_, c)| c.fields.last().cloned());
        let all: Vec<&InstanceType> = types.iter().collect();
        let which = match &culprit {
            Some(f) => format!("{f} excludes every flavor"),
            None => "the requirements together exclude every flavor".to_string(),
        };
        verdict.deny_or_warn(
            known || excluded_by_fixed_keys,
            culprit.unwrap_or_else(|| "spec.template.spec.requirements".to_string()),
            format!(
                "{which} of the catalogue ({}; CKE: zone {DEFAULT_ZONE}, on-demand, amd64, linux, worker): the pool \
                 could never create a node; relax the requirements",
                list_names(&all)
            ),
        );
        return;
    }
    for (key, c) in constraints {
        let Some((min, min_field)) = &c.min_values else { continue };
        let values: BTreeSet<&String> = matching.iter().filter_map(|t| t.labels.get(key)).collect();
        let defined = matching.iter().any(|t| t.labels.contains_key(key));
        if defined && values.len() < *min as usize {
            verdict.warn(
                min_field,
                format!(
                    "only {} value(s) of {key} remain among the catalogue's flavors ({}), fewer than minValues {min}: \
                     with the default minValues policy (Strict) the pool creates no node",
                    values.len(),
                    list_names(&matching)
                ),
            );
        }
    }
    for (name, limit) in limits {
        if name == labels::PRICE_PER_HOUR {
            check_price_ceiling(verdict, &matching, *limit);
            continue;
        }
        let size = |t: &InstanceType| match name.as_str() {
            crate::quantity::CPU => Some(t.capacity.cpu_millis),
            crate::quantity::MEMORY => Some(t.capacity.memory_bytes),
            _ => None,
        };
        if *limit > 0 && matching.iter().all(|t| size(t).is_some_and(|s| s > *limit)) {
            verdict.warn(
                format!("spec.limits[{name}]"),
                format!(
                    "is below every allowed flavor's capacity ({}): the pool can create no node",
                    list_names(&matching)
                ),
            );
        }
    }
}

/// Warns when every allowed flavor costs more per hour than the pool's price ceiling (micro-EUR): the
/// pool could launch nothing. Prices only: the ceiling never meets cpu or memory.
fn check_price_ceiling(verdict: &mut Verdict, matching: &[&InstanceType], limit: i64) {
    // A flavor's price: its cheapest offering, compared in micro-EUR as the scheduler counts it.
    let price = |t: &InstanceType| t.offerings.iter().map(|o| o.price_hourly).min_by(f64::total_cmp);
    let micros = |p: f64| (p * 1e6).round() as i64;
    let cheapest = matching
        .iter()
        .filter_map(|t| price(t).map(|p| (p, t.name.as_str())))
        .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(b.1)));
    if let Some((p, flavor)) = cheapest
        && limit > 0
        && micros(p) > limit
    {
        verdict.warn(
            format!("spec.limits[{}]", labels::PRICE_PER_HOUR),
            format!(
                "is below every allowed flavor's price (the cheapest, {flavor}, costs {p} EUR per hour): the pool \
                 can create no node"
            ),
        );
    }
}

/// `spec.rollout` (fleet.md §3): fleet pools only, a count or a percentage, a duration, cluster names.
fn check_rollout(verdict: &mut Verdict, rollout: &crate::nodepool::Rollout, fleet: bool) {
    if !fleet {
        verdict.deny(
            "spec.rollout",
            "rollout applies to fleet pools only (spec.clusterSelector): a pool naming one cluster has nothing to \
             roll out cluster by cluster; remove spec.rollout",
        );
    }
    let max = &rollout.max_clusters;
    let valid_max = match max.strip_suffix('%') {
        Some(p) => p.parse::<u32>().is_ok_and(|p| (1..=100).contains(&p)) && !p.starts_with('0'),
        None => max.parse::<u64>().is_ok_and(|n| n >= 1) && !max.starts_with('0') && !max.starts_with('+'),
    };
    if !valid_max {
        verdict.deny(
            "spec.rollout.maxClusters",
            format!(
                "{} is neither a count of clusters (\"1\") nor a percentage of the selected ones (\"25%\"): use a \
                 positive integer or 1% to 100%, as a string",
                shorten(max)
            ),
        );
    }
    if let Err(e) = schedule::parse_duration(&rollout.soak, false) {
        verdict.deny(
            "spec.rollout.soak",
            format!("{} is not a duration: {e}; use e.g. 10m, 1h or 0s", shorten(&rollout.soak)),
        );
    }
    for (i, name) in rollout.order.iter().enumerate() {
        if let Err(reason) = dns1123_label(name) {
            verdict.deny(
                format!("spec.rollout.order[{i}]"),
                format!("{} is not a cluster name: it {reason}", shorten(name)),
            );
        }
    }
}

/// A static pool (`spec.replicas`): a count of nodes, not a response to pods, so what shapes the
/// response to pods (weight, resource limits) does not apply.
fn check_static(verdict: &mut Verdict, spec: &crate::nodepool::NodePoolSpec, replicas: i64) {
    if replicas < 0 {
        verdict.deny("spec.replicas", format!("{replicas} is negative: a static pool keeps 0 nodes or more"));
    }
    if spec.weight.is_some() {
        verdict.deny(
            "spec.weight",
            "weight does not apply to a static pool (spec.replicas): it makes no node for pending pods; remove \
             spec.weight",
        );
    }
    for name in spec.limits.iter().flatten().map(|(k, _)| k).filter(|k| k.as_str() != "nodes") {
        verdict.deny(
            format!("spec.limits[{name}]"),
            "a static pool (spec.replicas) takes only limits.nodes: its size is its replicas; remove this limit",
        );
    }
}

fn check_update(verdict: &mut Verdict, new: &NodePool, old: &NodePool) {
    match (old.spec.replicas, new.spec.replicas) {
        (Some(_), None) => verdict.deny(
            "spec.replicas",
            "replicas cannot be removed: this pool is static for its whole life; create a new NodePool without \
             replicas for nodes made for pending pods",
        ),
        (None, Some(_)) => verdict.deny(
            "spec.replicas",
            "replicas cannot be added: this pool makes nodes for pending pods for its whole life; create a new \
             NodePool with replicas for a fixed number of nodes",
        ),
        _ => {}
    }
    match (&old.spec.cluster_name, &new.spec.cluster_name) {
        (Some(was), Some(now)) if was != now => verdict.deny(
            "spec.clusterName",
            format!(
                "clusterName is immutable ({} → {}): create a new NodePool for the other cluster",
                shorten(was),
                shorten(now)
            ),
        ),
        (Some(was), None) => verdict.deny(
            "spec.clusterName",
            format!(
                "clusterName {} cannot be removed: a pool serves one named cluster or a clusterSelector's clusters for \
                 its whole life; keep clusterName, or create a new NodePool with the clusterSelector",
                shorten(was)
            ),
        ),
        (None, Some(now)) => verdict.deny(
            "spec.clusterName",
            format!(
                "clusterName {} cannot be added to a pool created with a clusterSelector: a pool serves a selection \
                 or one named cluster for its whole life; keep the clusterSelector (edit it to select other \
                 clusters), or create a new NodePool with clusterName",
                shorten(now)
            ),
        ),
        _ => {}
    }
    if let (Some(was), Some(now)) = (&old.spec.cluster_selector, &new.spec.cluster_selector)
        && was != now
    {
        verdict.warn(
            "spec.clusterSelector",
            "clusters that no longer match get no new node from this pool, and its nodes there drift \
             (ClusterNotSelected) and leave within the pool's Drifted budgets, replaced by the pools still serving \
             them; check the selected clusters in status.clusters",
        );
    }
    let (n, o) = (&new.spec.template.spec.node_class_ref, &old.spec.template.spec.node_class_ref);
    if n.group != o.group {
        verdict.deny("spec.template.spec.nodeClassRef.group", "nodeClassRef.group is immutable: create a new NodePool");
    }
    if n.kind != o.kind {
        verdict.deny("spec.template.spec.nodeClassRef.kind", "nodeClassRef.kind is immutable: create a new NodePool");
    }
    if nodepool_hash(&new.spec) != nodepool_hash(&old.spec) {
        verdict.warn(
            "spec.template",
            "this change makes the pool's nodes drifted: the hub replaces them, a new node launched before each old \
             one goes, within the pool's Drifted disruption budgets",
        );
    } else if new.spec.template.spec.requirements != old.spec.template.spec.requirements {
        verdict.warn(
            "spec.template.spec.requirements",
            "nodes that no longer satisfy the new requirements are drifted: the hub replaces them within the pool's \
             Drifted disruption budgets",
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::admission::Violation;
    use crate::flavorcatalog::{FlavorCatalogSpec, FlavorOverride};
    use crate::nodeclass::{CleverNodeClassSpec, FlavorCatalogReference};

    const POOL: &str = r#"
apiVersion: karpenter.clever-cloud.com/v1alpha1
kind: NodePool
metadata: {name: default, namespace: team-a}
spec:
  clusterName: prod-paris
  template:
    spec:
      nodeClassRef: {group: karpenter.clever-cloud.com, kind: CleverNodeClass, name: default}
      requirements:
        - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}
  disruption:
    consolidateAfter: 1m
"#;

    fn pool(yaml: &str) -> NodePool {
        serde_saphyr::from_str(yaml).unwrap()
    }

    /// The base pool with `edit` applied to its JSON form.
    fn edited(edit: impl FnOnce(&mut serde_json::Value)) -> NodePool {
        let mut value = serde_json::to_value(pool(POOL)).unwrap();
        edit(&mut value);
        serde_json::from_value(value).unwrap()
    }

    fn class(catalog: Option<&str>) -> CleverNodeClass {
        CleverNodeClass::new(
            "default",
            CleverNodeClassSpec {
                labels: Default::default(),
                flavor_catalog_ref: catalog.map(|n| FlavorCatalogReference { name: n.into() }),
            },
        )
    }

    fn known(class: &CleverNodeClass) -> NodePoolReferences<'_> {
        NodePoolReferences { node_class: Lookup::Found(class), flavor_catalog: Lookup::Missing, base: None }
    }

    fn check(p: &NodePool) -> Verdict {
        let c = class(None);
        validate_node_pool(p, None, known(&c))
    }

    fn requirements(value: serde_json::Value) -> NodePool {
        edited(|v| v["spec"]["template"]["spec"]["requirements"] = value)
    }

    fn denied(v: &Verdict, field: &str, text: &str) -> bool {
        v.denials.iter().any(|d: &Violation| d.field == field && d.message.contains(text))
    }

    fn warned(v: &Verdict, text: &str) -> bool {
        v.warnings.iter().any(|w| w.message.contains(text))
    }

    #[test]
    fn the_base_pool_is_allowed_without_warnings() {
        assert_eq!(check(&pool(POOL)), Verdict::default());
    }

    #[test]
    fn restricted_template_labels_are_denied_capacity_type_allowed() {
        for (key, text) in [
            ("karpenter.sh/nodepool", "set by the hub"),
            ("kubernetes.io/hostname", "set by the kubelet"),
            ("karpenter.sh/team", "domain karpenter.sh is restricted"),
            ("karpenter.clever-cloud.com/hub", "ownership labels"),
            ("x/y/z", "not a valid label key"),
        ] {
            let p = edited(|v| v["spec"]["template"]["metadata"] = serde_json::json!({"labels": {key: "a"}}));
            let v = check(&p);
            assert!(denied(&v, &format!("spec.template.metadata.labels[{key}]"), text), "{key}: {v:?}");
        }
        let p = edited(|v| {
            v["spec"]["template"]["metadata"] =
                serde_json::json!({"labels": {"karpenter.sh/capacity-type": "on-demand"}})
        });
        assert!(check(&p).is_allowed());
    }

    #[test]
    fn requirement_operators_values_and_min_values() {
        use serde_json::json;
        let cases = [
            (json!([{"key": "kubernetes.io/hostname", "operator": "Exists"}]), "requirements[0].key", "kubelet"),
            (json!([{"key": "karpenter.sh/nodepool", "operator": "Exists"}]), "requirements[0].key", "set by the hub"),
            (json!([{"key": "team", "operator": "In"}]), "requirements[0].values", "at least one value"),
            (
                json!([{"key": "team", "operator": "Exists", "values": ["a"]}]),
                "requirements[0].values",
                "takes no values",
            ),
            (
                json!([{"key": "team", "operator": "In", "values": ["a", "b"], "minValues": 3}]),
                "requirements[0].minValues",
                "distinct values",
            ),
            (
                json!([{"key": "team", "operator": "In", "values": ["a", "a"], "minValues": 2}]),
                "requirements[0].minValues",
                "distinct values",
            ),
            (json!([{"key": "team", "operator": "Exists", "minValues": 51}]), "requirements[0].minValues", "1 to 50"),
            (
                json!([{"key": "n", "operator": "Gt", "values": ["-1"]}]),
                "requirements[0].values",
                "non-negative integer",
            ),
            (
                json!([{"key": "n", "operator": "Gt", "values": ["abc"]}]),
                "requirements[0].values",
                "non-negative integer",
            ),
            (json!([{"key": "n", "operator": "Lte", "values": ["1", "2"]}]), "requirements[0].values", "exactly one"),
            (
                json!([{"key": "n", "operator": "Gt", "values": ["99999999999999999999"]}]),
                "requirements[0].values",
                "non-negative integer",
            ),
            (
                json!([{"key": "team", "operator": "In", "values": ["a b"]}]),
                "requirements[0].values[0]",
                "not a valid label value",
            ),
            (
                json!([{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["cheap"]}]),
                "requirements[0].values",
                "no known capacity type",
            ),
            (
                json!([{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand", "cheap"], "minValues": 2}]),
                "requirements[0].minValues",
                "known capacity types",
            ),
        ];
        for (reqs, field, text) in cases {
            let v = check(&requirements(reqs.clone()));
            assert!(denied(&v, &format!("spec.template.spec.{field}"), text), "{reqs}: {v:?}");
        }
        let v = check(&requirements(json!([{"key": "n", "operator": "Gt", "values": ["4"]}])));
        assert!(v.is_allowed(), "{v:?}");
        let v = check(&requirements(
            json!([{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand", "cheap"]}]),
        ));
        assert!(v.is_allowed() && warned(&v, "unknown capacity types"), "{v:?}");
        let v =
            check(&requirements(json!([{"key": "beta.kubernetes.io/arch", "operator": "In", "values": ["amd64"]}])));
        assert!(v.is_allowed() && warned(&v, "write kubernetes.io/arch"), "{v:?}");
    }

    #[test]
    fn contradictions_are_denied() {
        use serde_json::json;
        for reqs in [
            json!([{"key": "team", "operator": "In", "values": ["a"]}, {"key": "team", "operator": "NotIn", "values": ["a"]}]),
            json!([{"key": "team", "operator": "In", "values": ["a"]}, {"key": "team", "operator": "In", "values": ["b"]}]),
            json!([{"key": "team", "operator": "Exists"}, {"key": "team", "operator": "DoesNotExist"}]),
            json!([{"key": "n", "operator": "Gt", "values": ["10"]}, {"key": "n", "operator": "Lt", "values": ["5"]}]),
            json!([{"key": "n", "operator": "In", "values": ["3", "x"]}, {"key": "n", "operator": "Gte", "values": ["4"]}]),
        ] {
            let v = check(&requirements(reqs.clone()));
            assert!(v.denials.iter().any(|d| d.message.contains("cannot all hold")), "{reqs}: {v:?}");
        }
        // A template label contradicting a requirement.
        let p = edited(|v| {
            v["spec"]["template"]["metadata"] = json!({"labels": {"team": "a"}});
            v["spec"]["template"]["spec"]["requirements"] = json!([{"key": "team", "operator": "In", "values": ["b"]}]);
        });
        let v = check(&p);
        assert!(denied(&v, "spec.template.metadata.labels[team]", "cannot all hold"), "{v:?}");
        // minValues after intersection.
        let v = check(&requirements(json!([
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["XS", "S", "M"], "minValues": 3},
            {"key": "node.kubernetes.io/instance-type", "operator": "NotIn", "values": ["M"]}
        ])));
        assert!(v.denials.iter().any(|d| d.message.contains("fewer than minValues 3")), "{v:?}");
    }

    #[test]
    fn taints() {
        use serde_json::json;
        let with = |taints: serde_json::Value, startup: serde_json::Value| {
            check(&edited(|v| {
                v["spec"]["template"]["spec"]["taints"] = taints;
                v["spec"]["template"]["spec"]["startupTaints"] = startup;
            }))
        };
        let v = with(
            json!([{"key": "team", "effect": "NoSchedule"}]),
            json!([{"key": "team", "effect": "NoSchedule", "value": "x"}]),
        );
        assert!(
            denied(&v, "spec.template.spec.startupTaints[0]", "already set at spec.template.spec.taints[0]"),
            "{v:?}"
        );
        let v = with(json!([{"key": "team", "effect": "NoSchedule"}]), json!([{"key": "team", "effect": "NoExecute"}]));
        assert!(v.is_allowed(), "{v:?}");
        let v = with(json!([{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]), json!([]));
        assert!(denied(&v, "spec.template.spec.taints[0].key", "managed by the hub"), "{v:?}");
        let v = with(json!([{"key": format!("a/{}", "b".repeat(64)), "effect": "NoSchedule"}]), json!([]));
        assert!(denied(&v, "spec.template.spec.taints[0].key", "taint key"), "{v:?}");
    }

    #[test]
    fn budgets() {
        use serde_json::json;
        let with = |budgets: serde_json::Value| check(&edited(|v| v["spec"]["disruption"]["budgets"] = budgets));
        for (budgets, field, text) in [
            (json!([{"nodes": "101%"}]), "budgets[0].nodes", "percentage"),
            (json!([{"nodes": "10.5%"}]), "budgets[0].nodes", "percentage"),
            (json!([{"nodes": "-1"}]), "budgets[0].nodes", "node count"),
            (json!([{"nodes": "0", "schedule": "0 9 * * *"}]), "budgets[0].duration", "needs a duration"),
            (json!([{"nodes": "0", "duration": "8h"}]), "budgets[0].schedule", "needs a schedule"),
            (
                json!([{"nodes": "0", "schedule": "0 9 * * *", "duration": "30s"}]),
                "budgets[0].duration",
                "whole minutes",
            ),
            (
                json!([{"nodes": "0", "schedule": "0 25 * * *", "duration": "1h"}]),
                "budgets[0].schedule",
                "out of range",
            ),
            (
                json!([{"nodes": "0", "schedule": "TZ=Europe/Paris 0 9 * * *", "duration": "1h"}]),
                "budgets[0].schedule",
                "UTC",
            ),
        ] {
            let v = with(budgets.clone());
            assert!(denied(&v, &format!("spec.disruption.{field}"), text), "{budgets}: {v:?}");
        }
        for nodes in ["0", "25", "100%"] {
            let v = with(json!([{"nodes": nodes}]));
            assert!(v.is_allowed(), "{nodes}: {v:?}");
        }
        let v = with(json!([{"nodes": "1", "schedule": "@daily", "duration": "1h30m"}, {"nodes": "10%"}]));
        assert_eq!(v, Verdict::default());
    }

    #[test]
    fn budget_coverage_warnings_follow_d5() {
        use serde_json::json;
        let with = |budgets: serde_json::Value| check(&edited(|v| v["spec"]["disruption"]["budgets"] = budgets));
        let v = with(json!([{"nodes": "0", "schedule": "0 9 * * *", "duration": "8h"}]));
        assert!(v.is_allowed());
        assert!(warned(&v, "Empty, Drifted, Underutilized only limited by scheduled budgets"), "{v:?}");
        let v = with(json!([{"nodes": "0", "reasons": ["Drifted"]}]));
        assert!(warned(&v, "no budget covers Empty, Underutilized"), "{v:?}");
        assert!(warned(&v, "blocks Drifted at all times"), "{v:?}");
        let v = with(json!([]));
        assert!(warned(&v, "no budget covers Empty, Drifted, Underutilized"), "{v:?}");
        // WhenEmpty never disrupts for Underutilized: not mentioned.
        let v = check(&edited(|v| {
            v["spec"]["disruption"]["consolidationPolicy"] = json!("WhenEmpty");
            v["spec"]["disruption"]["budgets"] = json!([{"nodes": "10%", "reasons": ["Empty", "Drifted"]}]);
        }));
        assert_eq!(v, Verdict::default());
    }

    #[test]
    fn durations() {
        use serde_json::json;
        let v = check(&edited(|v| v["spec"]["template"]["spec"]["expireAfter"] = json!("30d")));
        assert!(denied(&v, "spec.template.spec.expireAfter", "168h"), "{v:?}");
        let v = check(&edited(|v| v["spec"]["template"]["spec"]["expireAfter"] = json!("0s")));
        assert!(denied(&v, "spec.template.spec.expireAfter", "Never"), "{v:?}");
        let v = check(&edited(|v| v["spec"]["template"]["spec"]["expireAfter"] = json!("2m")));
        assert!(v.is_allowed() && warned(&v, "replaced every 2m"), "{v:?}");
        let v = check(&edited(|v| v["spec"]["disruption"]["consolidateAfter"] = json!("0s")));
        assert!(v.is_allowed() && warned(&v, "churns"), "{v:?}");
        let v = check(&edited(|v| v["spec"]["template"]["spec"]["terminationGracePeriod"] = json!("1x")));
        assert!(denied(&v, "spec.template.spec.terminationGracePeriod", "not a duration"), "{v:?}");
    }

    #[test]
    fn names_limits_and_weight() {
        use serde_json::json;
        let v = check(&edited(|v| v["metadata"]["name"] = json!("a".repeat(64))));
        assert!(denied(&v, "metadata.name", "karpenter.sh/nodepool"), "{v:?}");
        let v = check(&edited(|v| v["spec"]["clusterName"] = json!("Prod_Paris")));
        assert!(denied(&v, "spec.clusterName", "kubeconfig"), "{v:?}");
        let v = check(&edited(|v| v["spec"]["weight"] = json!(0)));
        assert!(denied(&v, "spec.weight", "1 to 100"), "{v:?}");
        let v = check(&edited(|v| v["spec"]["limits"] = json!({"cpu": "-1"})));
        assert!(denied(&v, "spec.limits[cpu]", "negative"), "{v:?}");
        let v = check(&edited(|v| v["spec"]["limits"] = json!({"memory": "1KB"})));
        assert!(denied(&v, "spec.limits[memory]", "suffix"), "{v:?}");
        let v = check(&edited(|v| v["spec"]["limits"] = json!({"cpu": "3"})));
        assert!(v.is_allowed() && warned(&v, "below every allowed flavor"), "{v:?}");
        let v = check(&edited(|v| v["spec"]["limits"] = json!({"cpu": "8", "memory": "64Gi", "nodes": 4})));
        assert_eq!(v, Verdict::default());
        let v = check(&edited(|v| v["spec"]["template"]["spec"]["nodeClassRef"]["kind"] = json!("OtherNodeClass")));
        assert!(denied(&v, "spec.template.spec.nodeClassRef.kind", "CleverNodeClass"), "{v:?}");
    }

    #[test]
    fn the_price_ceiling_is_decimal_eur_compared_with_prices_only() {
        use serde_json::json;
        let key = labels::PRICE_PER_HOUR;
        let field = format!("spec.limits[{key}]");
        let with = |price: serde_json::Value| check(&edited(|v| v["spec"]["limits"] = json!({ key: price })));
        for fine in [json!("0.5"), json!("12"), json!("0.0611"), json!(".5"), json!(3)] {
            assert_eq!(with(fine.clone()), Verdict::default(), "{fine}");
        }
        // Exactly the cheapest flavor's price fits; a ceiling of 12 EUR/h is never read as 12 CPUs.
        assert_eq!(with(json!("0.0333")), Verdict::default());
        let v = check(&edited(|v| v["spec"]["limits"] = json!({ key: "12", "cpu": "3" })));
        assert!(v.is_allowed() && v.warnings.len() == 1 && v.warnings[0].field == "spec.limits[cpu]", "{v:?}");
        for (bad, why) in [
            ("1e3", "no exponent"),
            ("1E-2", "no exponent"),
            ("5Gi", "no exponent, sign or unit"),
            ("-1", "negative"),
            ("0.1234567", "more than 6 decimals"),
            ("abc", "not a decimal number"),
            ("99999999999999", "too large"),
        ] {
            let v = with(json!(bad));
            assert!(denied(&v, &field, why), "{bad}: {v:?}");
            assert!(v.denials.iter().all(|d| d.field == field), "{bad}: {v:?}");
        }
        assert!(v_denies_with_the_form(&with(json!("1e3")), &field));
        // Below every allowed flavor's price: allowed, with a warning naming the cheapest.
        let v = with(json!("0.03"));
        assert!(v.is_allowed() && warned(&v, "below every allowed flavor's price") && warned(&v, "2XS"), "{v:?}");
        let pinned = edited(|v| {
            v["spec"]["limits"] = json!({ key: "0.05" });
            v["spec"]["template"]["spec"]["requirements"] =
                json!([{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["S", "M"]}]);
        });
        let v = check(&pinned);
        assert!(v.is_allowed() && warned(&v, "the cheapest, S, costs 0.0889 EUR per hour"), "{v:?}");
        let v = with(json!("0"));
        assert!(v.is_allowed() && warned(&v, "a price ceiling of 0"), "{v:?}");
    }

    fn v_denies_with_the_form(v: &Verdict, field: &str) -> bool {
        v.denials.iter().any(|d| d.field == field && d.message.contains("e.g. \"0.5\", \"12\" or \"0.0611\""))
    }

    #[test]
    fn flavors_must_remain() {
        use serde_json::json;
        let pinned = |flavor: &str| {
            requirements(json!([{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [flavor]}]))
        };
        // Known catalogue: denied, naming the requirement.
        let v = check(&pinned("XXL"));
        assert!(denied(&v, "spec.template.spec.requirements[0]", "excludes every flavor"), "{v:?}");
        assert!(check(&pinned("XS")).is_allowed());
        // Unknown catalogue: a warning only (the class's catalogue may declare XXL).
        let v = validate_node_pool(&pinned("XXL"), None, NodePoolReferences::unchecked("no API client"));
        assert!(v.is_allowed() && warned(&v, "excludes every flavor") && warned(&v, "no API client"), "{v:?}");
        // Catalogue-independent keys are certain even unchecked: CKE is on-demand, amd64, par.
        for (key, value) in [
            ("karpenter.sh/capacity-type", "spot"),
            ("kubernetes.io/arch", "arm64"),
            ("topology.kubernetes.io/zone", "rbx"),
        ] {
            let p = requirements(json!([{"key": key, "operator": "In", "values": [value]}]));
            let v = validate_node_pool(&p, None, NodePoolReferences::unchecked("no API client"));
            assert!(denied(&v, "spec.template.spec.requirements[0]", "excludes every flavor"), "{key}: {v:?}");
        }
        // A flavor from the class's catalogue.
        let c = class(Some("extra"));
        let fc = FlavorCatalog::new(
            "extra",
            FlavorCatalogSpec {
                flavors: vec![FlavorOverride {
                    name: "XXL".into(),
                    cpu: Some(32),
                    memory_ki: Some(64_000_000),
                    price_hourly: Some(0.4),
                }],
            },
        );
        let refs = NodePoolReferences { node_class: Lookup::Found(&c), flavor_catalog: Lookup::Found(&fc), base: None };
        assert_eq!(validate_node_pool(&pinned("XXL"), None, refs), Verdict::default());
        // Numeric requirements against the catalogue.
        let v = check(&requirements(
            json!([{"key": "karpenter.clever-cloud.com/instance-cpu", "operator": "Gt", "values": ["64"]}]),
        ));
        assert!(denied(&v, "spec.template.spec.requirements[0]", "excludes every flavor"), "{v:?}");
        // minValues larger than what the catalogue offers.
        let v = check(&requirements(
            json!([{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand", "spot"], "minValues": 2}]),
        ));
        assert!(v.is_allowed() && warned(&v, "fewer than minValues 2"), "{v:?}");
        // A missing class is a warning.
        let v = validate_node_pool(
            &pool(POOL),
            None,
            NodePoolReferences { node_class: Lookup::Missing, flavor_catalog: Lookup::Missing, base: None },
        );
        assert!(v.is_allowed() && warned(&v, "does not exist"), "{v:?}");
    }

    #[test]
    fn immutable_fields_and_drift_on_update() {
        use serde_json::json;
        let old = pool(POOL);
        let c = class(None);
        let update = |new: &NodePool| validate_node_pool(new, Some(&old), known(&c));
        let v = update(&edited(|v| v["spec"]["clusterName"] = json!("staging-paris")));
        assert!(denied(&v, "spec.clusterName", "immutable"), "{v:?}");
        let v = update(&edited(|v| v["spec"]["template"]["spec"]["nodeClassRef"]["kind"] = json!("OtherNodeClass")));
        assert!(denied(&v, "spec.template.spec.nodeClassRef.kind", "immutable"), "{v:?}");
        let v = update(&edited(|v| v["spec"]["template"]["spec"]["nodeClassRef"]["name"] = json!("other")));
        assert!(v.is_allowed() && warned(&v, "drift"), "{v:?}");
        let v = update(&edited(|v| v["spec"]["weight"] = json!(10)));
        assert_eq!(v, Verdict::default());
        let v = update(&requirements(json!([])));
        assert!(v.is_allowed() && warned(&v, "no longer satisfy"), "{v:?}");
    }

    /// The base pool as a fleet pool: `clusterName` replaced by `selector`.
    fn fleet(selector: serde_json::Value) -> NodePool {
        edited(|v| {
            v["spec"].as_object_mut().unwrap().remove("clusterName");
            v["spec"]["clusterSelector"] = selector;
        })
    }

    #[test]
    fn a_rollout_is_for_fleet_pools_with_a_count_or_percentage_a_duration_and_cluster_names() {
        use serde_json::json;
        let with = |rollout: serde_json::Value| {
            let mut p = fleet(json!({"matchLabels": {"env": "prod"}}));
            p.spec.rollout = Some(serde_json::from_value(rollout).unwrap());
            p
        };
        assert_eq!(check(&with(json!({"maxClusters": "25%", "order": ["canary"], "soak": "10m"}))), Verdict::default());
        assert_eq!(check(&with(json!({}))), Verdict::default(), "defaults: one cluster, 5m soak");
        for (rollout, field, text) in [
            (json!({"maxClusters": "0"}), "spec.rollout.maxClusters", "use a positive integer or 1% to 100%"),
            (json!({"maxClusters": "150%"}), "spec.rollout.maxClusters", "use a positive integer or 1% to 100%"),
            (json!({"maxClusters": "one"}), "spec.rollout.maxClusters", "as a string"),
            (json!({"soak": "ten minutes"}), "spec.rollout.soak", "use e.g. 10m, 1h or 0s"),
            (json!({"order": ["Canary_1"]}), "spec.rollout.order[0]", "is not a cluster name"),
        ] {
            let v = check(&with(rollout.clone()));
            assert!(denied(&v, field, text), "{rollout}: {v:?}");
        }
        let mut named = edited(|_| {});
        named.spec.rollout = Some(serde_json::from_value(json!({})).unwrap());
        let v = check(&named);
        assert!(denied(&v, "spec.rollout", "rollout applies to fleet pools only"), "{v:?}");
    }

    #[test]
    fn a_pool_names_one_cluster_or_selects_clusters_never_both_nor_neither() {
        use serde_json::json;
        let v = check(&fleet(json!({"matchLabels": {"env": "prod"}})));
        assert_eq!(v, Verdict::default());
        // `{}` selects every registered cluster of the namespace: allowed.
        assert_eq!(check(&fleet(json!({}))), Verdict::default());
        let both = edited(|v| v["spec"]["clusterSelector"] = json!({"matchLabels": {"env": "prod"}}));
        let v = check(&both);
        assert!(denied(&v, "spec", "clusterName and clusterSelector are both set"), "{v:?}");
        assert!(denied(&v, "spec", "keep clusterName for a pool serving one cluster, or clusterSelector"), "{v:?}");
        let neither = edited(|v| {
            v["spec"].as_object_mut().unwrap().remove("clusterName");
        });
        let v = check(&neither);
        assert!(denied(&v, "spec", "neither clusterName nor clusterSelector is set"), "{v:?}");
        assert!(denied(&v, "spec", "clusterName: prod-paris"), "{v:?}");
        assert_eq!(v.denials.len(), 1, "{v:?}");
        // The message the API server's user reads starts with the field.
        let message = v.denial_message().unwrap_or_default();
        assert!(message.starts_with("spec: neither clusterName nor clusterSelector"), "{message}");
    }

    #[test]
    fn an_invalid_cluster_selector_is_denied_naming_the_term_and_the_fix() {
        use serde_json::json;
        for (selector, field, text) in [
            (
                json!({"matchExpressions": [{"key": "env", "operator": "In"}]}),
                "spec.clusterSelector.matchExpressions[0].values",
                "operator In needs at least one value, e.g. values: [prod]",
            ),
            (
                json!({"matchExpressions": [{"key": "env", "operator": "Exists"}, {"key": "tier", "operator": "Exists", "values": ["web"]}]}),
                "spec.clusterSelector.matchExpressions[1].values",
                "operator Exists takes no values: remove them",
            ),
            (
                json!({"matchExpressions": [{"key": "example.com/", "operator": "Exists"}]}),
                "spec.clusterSelector.matchExpressions[0].key",
                "write [prefix/]name, e.g. env or example.com/env",
            ),
            (
                json!({"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["prod!"]}]}),
                "spec.clusterSelector.matchExpressions[0].values[0]",
                "not a valid label value",
            ),
            (
                json!({"matchLabels": {"deployment env": "prod"}}),
                "spec.clusterSelector.matchLabels[\"deployment env\"]",
                "write [prefix/]name, e.g. env or example.com/env",
            ),
            (
                json!({"matchLabels": {"env": "prod paris"}}),
                "spec.clusterSelector.matchLabels[\"env\"]",
                "\"prod paris\" is not a valid label value",
            ),
        ] {
            let v = check(&fleet(selector.clone()));
            assert!(denied(&v, field, text), "{selector}: {v:?}");
            assert_eq!(v.denials.len(), 1, "{selector}: one problem, said once: {v:?}");
        }
        // Beside clusterName, the selector is still checked (both problems said at once).
        let v = check(&edited(|v| v["spec"]["clusterSelector"] = json!({"matchLabels": {"bad key": "x"}})));
        assert!(
            denied(&v, "spec", "both set") && denied(&v, "spec.clusterSelector.matchLabels[\"bad key\"]", "label key")
        );
    }

    /// Issue 28 item 1: a static pool takes replicas, only limits.nodes and no weight; replicas is
    /// never added or removed.
    #[test]
    fn a_static_pool_takes_only_limits_nodes_no_weight_and_stays_static() {
        use serde_json::json;
        let v = check(&edited(|v| v["spec"]["replicas"] = json!(3)));
        assert_eq!(v, Verdict::default());
        let v = check(&edited(|v| {
            v["spec"]["replicas"] = json!(3);
            v["spec"]["limits"] = json!({"nodes": 5});
        }));
        assert_eq!(v, Verdict::default());
        let v = check(&edited(|v| {
            v["spec"]["replicas"] = json!(3);
            v["spec"]["limits"] = json!({"nodes": 5, "cpu": "100"});
            v["spec"]["weight"] = json!(10);
        }));
        assert!(denied(&v, "spec.limits[cpu]", "only limits.nodes"), "{v:?}");
        assert!(denied(&v, "spec.weight", "remove spec.weight"), "{v:?}");
        let v = check(&edited(|v| v["spec"]["replicas"] = json!(-1)));
        assert!(denied(&v, "spec.replicas", "negative"), "{v:?}");
        let c = class(None);
        let dynamic = pool(POOL);
        let fixed = edited(|v| v["spec"]["replicas"] = json!(2));
        let v = validate_node_pool(&fixed, Some(&dynamic), known(&c));
        assert!(denied(&v, "spec.replicas", "cannot be added"), "{v:?}");
        let v = validate_node_pool(&dynamic, Some(&fixed), known(&c));
        assert!(denied(&v, "spec.replicas", "cannot be removed"), "{v:?}");
        let more = edited(|v| v["spec"]["replicas"] = json!(5));
        assert_eq!(validate_node_pool(&more, Some(&fixed), known(&c)), Verdict::default(), "scaling is an edit");
    }

    #[test]
    fn cluster_name_cannot_change_be_added_or_removed_but_the_selector_may_change() {
        use serde_json::json;
        let c = class(None);
        let named = pool(POOL);
        let prod = fleet(json!({"matchLabels": {"env": "prod"}}));
        let update = |old: &NodePool, new: &NodePool| validate_node_pool(new, Some(old), known(&c));
        // Removed: the named pool switched to a selector.
        let v = update(&named, &prod);
        assert!(denied(&v, "spec.clusterName", "clusterName \"prod-paris\" cannot be removed"), "{v:?}");
        assert!(denied(&v, "spec.clusterName", "create a new NodePool with the clusterSelector"), "{v:?}");
        assert_eq!(v.denials.len(), 1, "{v:?}");
        // Added: the fleet pool switched to a name, or given one beside its selector.
        let v = update(&prod, &named);
        assert!(denied(&v, "spec.clusterName", "clusterName \"prod-paris\" cannot be added"), "{v:?}");
        assert!(denied(&v, "spec.clusterName", "create a new NodePool with clusterName"), "{v:?}");
        let both = edited(|v| v["spec"]["clusterSelector"] = json!({"matchLabels": {"env": "prod"}}));
        let v = update(&prod, &both);
        assert!(denied(&v, "spec.clusterName", "cannot be added") && denied(&v, "spec", "both set"), "{v:?}");
        // Changed.
        let v = update(&named, &edited(|v| v["spec"]["clusterName"] = json!("staging-paris")));
        assert!(denied(&v, "spec.clusterName", "immutable (\"prod-paris\" → \"staging-paris\")"), "{v:?}");
        // The selector is mutable: allowed, with a warning saying what happens to the clusters left.
        for edit in [
            json!({"matchLabels": {"env": "staging"}}),
            json!({"matchLabels": {"env": "prod"}, "matchExpressions": [{"key": "example.com/retiring", "operator": "DoesNotExist"}]}),
            json!({}),
        ] {
            let v = update(&prod, &fleet(edit.clone()));
            assert!(v.is_allowed(), "{edit}: {v:?}");
            assert!(warned(&v, "drift (ClusterNotSelected)"), "{edit}: {v:?}");
        }
        // A fleet pool updated without touching its selector: nothing to say.
        let v = update(
            &prod,
            &edited(|v| {
                v["spec"].as_object_mut().unwrap().remove("clusterName");
                v["spec"]["clusterSelector"] = json!({"matchLabels": {"env": "prod"}});
                v["spec"]["weight"] = json!(10);
            }),
        );
        assert_eq!(v, Verdict::default());
        // An update to an invalid selector is denied as a create would be.
        let v = update(&prod, &fleet(json!({"matchExpressions": [{"key": "env", "operator": "In"}]})));
        assert!(denied(&v, "spec.clusterSelector.matchExpressions[0].values", "at least one value"), "{v:?}");
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_requirements_never_panic(
            reqs in proptest::collection::vec(
                (
                    proptest::sample::select(vec!["team", "node.kubernetes.io/instance-type", "karpenter.sh/capacity-type", "karpenter.clever-cloud.com/instance-cpu", "n", "beta.kubernetes.io/arch", "a/b/c", ""]),
                    proptest::sample::select(vec!["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Gte", "Lte"]),
                    proptest::collection::vec("[0-9A-Za-z\\-]{0,5}|on-demand|XS|9223372036854775807", 0..4),
                    proptest::option::of(-2i32..60),
                ),
                0..6,
            )
        ) {
            let reqs: Vec<serde_json::Value> = reqs
                .into_iter()
                .map(|(k, o, v, m)| serde_json::json!({"key": k, "operator": o, "values": v, "minValues": m}))
                .collect();
            let p = requirements(serde_json::Value::Array(reqs));
            let v = check(&p);
            let again = check(&p);
            proptest::prop_assert_eq!(v, again);
        }
    }
}
