//! `NodeOverlay`: upstream Karpenter's NodeOverlay (`karpenter.sh/v1alpha1`) for the hub, scoped to
//! a namespace: adjust the price of the flavors (and offerings) its requirements select, and add
//! extended resources to them (`capacity`), in the NodePools of its namespace, with weights deciding
//! between overlays and conflicts reported.
//!
//! Owns the API shape, the price arithmetic, which offerings an overlay selects, and the
//! evaluation (weights, conflicts) and application over a pool's instance types — pure functions,
//! shared by the hub, `plan` and the webhook. Must not: read anything, or know where pools come from.

use std::collections::{BTreeMap, BTreeSet};

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::catalog::InstanceType;
use crate::common::{Condition, Operator, ResourceMap};
use crate::labels;
use crate::quantity::{is_node_resource, parse_quantity};

/// Condition: the overlay is valid and in conflict with no other (`Conflict`, `Invalid` otherwise).
pub const VALIDATION_SUCCEEDED: &str = "ValidationSucceeded";
/// Condition: the overlay applies (mirrors `ValidationSucceeded`).
pub const READY: &str = "Ready";

/// Adjusts the price of the flavors its requirements select, and adds extended resources to them,
/// in the NodePools of its namespace (upstream's NodeOverlay, namespaced).
// Repeated `type_ = ...` arguments of `printcolumn(...)` look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "karpenter.clever-cloud.com",
    version = "v1alpha1",
    kind = "NodeOverlay",
    plural = "nodeoverlays",
    namespaced,
    status = "NodeOverlayStatus",
    shortname = "overlays",
    category = "karpenter",
    doc = "NodeOverlay adjusts the price the hub sees for the flavors its requirements select, and adds extended resources (GPUs, devices) to them, in every NodePool of its namespace (upstream Karpenter's NodeOverlay, scoped to a namespace): a percentage or an amount, or a price of its own; capacity per resource; overlays of higher weight win, and two of equal weight selecting the same flavor (for capacity: setting the same resource on it) conflict (status).",
    printcolumn(name = "Weight", type_ = "integer", json_path = ".spec.weight"),
    printcolumn(name = "Price", type_ = "string", json_path = ".spec.price"),
    printcolumn(name = "Adjustment", type_ = "string", json_path = ".spec.priceAdjustment"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.price) || !has(self.priceAdjustment)").message("cannot set both 'price' and 'priceAdjustment'"),
    validation = Rule::new("has(self.price) || has(self.priceAdjustment) || has(self.capacity)").message("set spec.price (a price of its own, EUR per hour), spec.priceAdjustment (e.g. \"-10%\", \"+0.02\") or spec.capacity (extended resources, e.g. nvidia.com/gpu: 1): an overlay without any changes nothing")
)]
pub struct NodeOverlaySpec {
    /// Which flavors and offerings of the namespace's NodePools the overlay selects, matched
    /// against each flavor's labels (`node.kubernetes.io/instance-type`, `clever-cloud.com/flavor`,
    /// `karpenter.clever-cloud.com/instance-cpu`, ...), its offerings' zone and capacity type, the
    /// pool's name (`karpenter.sh/nodepool`) and the pool's template labels. Empty selects every
    /// flavor of every pool.
    #[schemars(length(max = 100))]
    pub requirements: Vec<OverlayRequirement>,
    /// The selected offerings' price, EUR per hour, in place of the catalogue's (e.g. `"0.05"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^\d+(\.\d+)?$"), length(max = 32))]
    pub price: Option<String>,
    /// A change of the selected offerings' price: a signed amount in EUR per hour (`"+0.02"`,
    /// `"-0.01"`) or a signed percentage (`"-10%"`, `"+25%"`; at most `-100%`). A result below 0 is 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^(([+-]{1}(\d*\.?\d+))|(\+{1}\d*\.?\d+%)|(^(-\d{1,2}(\.\d+)?%)$)|(-100%))$"),
        length(max = 32)
    )]
    pub price_adjustment: Option<String>,
    /// Extended resources a node of each selected flavor offers (`nvidia.com/gpu: 1`), added to the
    /// flavor, or replacing what an overlay of lower weight set: pods requesting them are placed on
    /// these flavors, and a node counts as initialized once it reports them. Not `cpu`, `memory`,
    /// `ephemeral-storage` or `pods` (the flavor's own sizing); whole numbers. A flavor takes the
    /// capacity when any of its offerings is selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "overlay_capacity")]
    pub capacity: Option<ResourceMap>,
    /// Precedence: on a flavor several overlays select, the highest weight applies (for capacity:
    /// per resource); two of equal weight conflict, and the one whose name sorts first is refused
    /// everywhere. Absent: 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub weight: Option<i32>,
}

/// One requirement on a flavor's (or offering's, or pool's) labels.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[x_kube(
    validation = Rule::new("self.operator in ['In', 'NotIn'] ? size(self.values) > 0 : true").message("values: In and NotIn need at least one value"),
    validation = Rule::new("self.operator in ['Exists', 'DoesNotExist'] ? size(self.values) == 0 : true").message("values: Exists and DoesNotExist take none"),
    validation = Rule::new("self.operator in ['Gt', 'Lt', 'Gte', 'Lte'] ? (size(self.values) == 1 && self.values[0].matches('^[0-9]+$')) : true").message("values: Gt, Lt, Gte and Lte take one non-negative integer")
)]
pub struct OverlayRequirement {
    /// The label key.
    #[schemars(
        length(min = 1, max = 316),
        regex(
            pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
        )
    )]
    #[x_kube(validation = Rule::new("self != 'kubernetes.io/hostname'").message("label \"kubernetes.io/hostname\" is restricted: no flavor carries it"))]
    pub key: String,
    /// How the label's value is compared with `values`.
    pub operator: Operator,
    /// Values to compare with (label values).
    #[serde(default)]
    #[schemars(schema_with = "overlay_values")]
    pub values: Vec<String>,
}

fn overlay_capacity(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = crate::common::resource_map(generator);
    // resource_map's rules (no negative quantity), and: no node resource.
    if let Some(serde_json::Value::Array(rules)) = schema.get_mut("x-kubernetes-validations") {
        rules.push(serde_json::json!({
            "rule": "self.all(k, !(k in ['cpu', 'memory', 'ephemeral-storage', 'pods']))",
            "message": "capacity adds extended resources only: cpu, memory, ephemeral-storage and pods are the flavor's own sizing (FlavorCatalog)"
        }));
    }
    schema
}

fn overlay_values(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": 100,
        "items": {"type": "string", "maxLength": 63, "pattern": crate::common::LABEL_VALUE_PATTERN}
    })
}

/// Observed state of a `NodeOverlay`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeOverlayStatus {
    /// `ValidationSucceeded` (False: `Conflict` naming the other overlay, or `Invalid`) and `Ready`.
    /// The hub applies an overlay only once `ValidationSucceeded` is True for its generation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::common::conditions")]
    pub conditions: Vec<Condition>,
}

/// A price change, parsed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PriceChange {
    /// The price, whatever the catalogue says.
    Set(f64),
    /// Plus this amount (negative: minus).
    Add(f64),
    /// Times `1 + percent / 100`.
    Percent(f64),
}

impl PriceChange {
    /// The new price of an offering priced `base`; never below 0.
    pub fn apply(self, base: f64) -> f64 {
        let new = match self {
            PriceChange::Set(p) => p,
            PriceChange::Add(d) => base + d,
            PriceChange::Percent(p) => base * (1.0 + p / 100.0),
        };
        if new.is_finite() { new.max(0.0) } else { 0.0 }
    }
}

/// Why an overlay's spec cannot be used (repeats the schema's rules, for objects that never met an
/// API server).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverlayError {
    #[error("spec: set at most one of price and priceAdjustment")]
    PriceOrAdjustment,
    #[error("spec: set price, priceAdjustment or capacity: an overlay without any changes nothing")]
    Nothing,
    #[error("spec.capacity.{key}: {message}")]
    Capacity { key: String, message: String },
    #[error("spec.price: {0:?} is not a non-negative decimal such as 0.05")]
    Price(String),
    #[error(
        "spec.priceAdjustment: {0:?} is not a signed amount (+0.02, -0.01) or percentage (-10%, +25%; at least -100%)"
    )]
    Adjustment(String),
    #[error("spec.requirements[{index}]: {message}")]
    Requirement { index: usize, message: String },
}

/// `\d*\.?\d+` (the schema's number in an adjustment): digits, or digits around one dot with
/// at least one after it.
fn loose_number(s: &str) -> bool {
    let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    match s.split_once('.') {
        Some((int, frac)) => digits(int) && !frac.is_empty() && digits(frac),
        None => !s.is_empty() && digits(s),
    }
}

/// `\d+(\.\d+)?` (the schema's price).
fn strict_number(s: &str) -> bool {
    let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    match s.split_once('.') {
        Some((int, frac)) => digits(int) && digits(frac),
        None => digits(s),
    }
}

fn value(s: &str) -> Option<f64> {
    s.parse::<f64>().ok().filter(|v| v.is_finite())
}

impl NodeOverlaySpec {
    /// The whole spec, checked as the schema does: the price change (if any), the capacity, the
    /// requirements, and that it changes something.
    pub fn check(&self) -> Result<(), OverlayError> {
        self.parsed().map(drop)
    }

    /// The spec checked ([`Self::check`]) and parsed once: its price change and its capacity.
    pub fn parsed(&self) -> Result<(Option<PriceChange>, BTreeMap<String, i64>), OverlayError> {
        let price = self.price_change()?;
        let capacity = self.capacity_change()?;
        self.check_requirements()?;
        if price.is_none() && self.capacity.is_none() {
            return Err(OverlayError::Nothing);
        }
        Ok((price, capacity))
    }

    /// The extended resources the overlay sets, in units, checked as the schema does (no node
    /// resource, no negative) and whole numbers (as extended resources are counted).
    pub fn capacity_change(&self) -> Result<BTreeMap<String, i64>, OverlayError> {
        let mut out = BTreeMap::new();
        for (key, q) in self.capacity.iter().flatten() {
            let fail = |m: String| OverlayError::Capacity { key: key.clone(), message: m };
            if is_node_resource(key) {
                return Err(fail(
                    "cpu, memory, ephemeral-storage and pods are the flavor's own sizing: set extended resources only"
                        .into(),
                ));
            }
            let parsed = parse_quantity(q.0.trim()).map_err(|e| fail(e.to_string()))?;
            if parsed.is_negative() {
                return Err(fail(format!("{:?} is negative", q.0)));
            }
            if parsed.as_millis() % 1000 != 0 {
                return Err(fail(format!("{:?} is not a whole number: extended resources are counted in units", q.0)));
            }
            out.insert(key.clone(), parsed.as_units());
        }
        Ok(out)
    }

    /// The price change (none when the overlay sets neither price nor adjustment), checked as the
    /// schema does.
    pub fn price_change(&self) -> Result<Option<PriceChange>, OverlayError> {
        match (&self.price, &self.price_adjustment) {
            (None, None) => Ok(None),
            (Some(p), None) => strict_number(p)
                .then(|| value(p))
                .flatten()
                .map(|v| Some(PriceChange::Set(v)))
                .ok_or_else(|| OverlayError::Price(p.clone())),
            (None, Some(a)) => {
                let bad = || OverlayError::Adjustment(a.clone());
                let (negative, rest) = match a.as_bytes().first() {
                    Some(b'+') => (false, &a[1..]),
                    Some(b'-') => (true, &a[1..]),
                    _ => return Err(bad()),
                };
                let sign = if negative { -1.0 } else { 1.0 };
                let change = match rest.strip_suffix('%') {
                    // A decrease is at most 100 % (`-\d{1,2}(\.\d+)?%` or `-100%`).
                    Some(pct) if negative => {
                        let int = pct.split_once('.').map_or(pct, |(i, _)| i);
                        let ok = pct == "100" || (strict_number(pct) && (1..=2).contains(&int.len()));
                        ok.then(|| value(pct)).flatten().map(|v| PriceChange::Percent(-v)).ok_or_else(bad)
                    }
                    Some(pct) => {
                        loose_number(pct).then(|| value(pct)).flatten().map(PriceChange::Percent).ok_or_else(bad)
                    }
                    None => loose_number(rest)
                        .then(|| value(rest))
                        .flatten()
                        .map(|v| PriceChange::Add(sign * v))
                        .ok_or_else(bad),
                };
                change.map(Some)
            }
            (Some(_), Some(_)) => Err(OverlayError::PriceOrAdjustment),
        }
    }

    /// Every requirement's shape, as the schema checks it.
    pub fn check_requirements(&self) -> Result<(), OverlayError> {
        for (index, r) in self.requirements.iter().enumerate() {
            let fail = |m: &str| Err(OverlayError::Requirement { index, message: m.to_string() });
            match r.operator {
                Operator::In | Operator::NotIn if r.values.is_empty() => return fail("In and NotIn need a value"),
                Operator::Exists | Operator::DoesNotExist if !r.values.is_empty() => {
                    return fail("Exists and DoesNotExist take no value");
                }
                Operator::Gt | Operator::Lt | Operator::Gte | Operator::Lte
                    if r.values.len() != 1 || r.values[0].parse::<u64>().is_err() =>
                {
                    return fail("Gt, Lt, Gte and Lte take one non-negative integer");
                }
                _ => {}
            }
            if r.key == labels::HOSTNAME {
                return fail("kubernetes.io/hostname is restricted: no flavor carries it");
            }
        }
        Ok(())
    }
}

/// Whether `labels` satisfy every requirement: In, Exists, Gt, Lt, Gte and Lte need the key;
/// NotIn and DoesNotExist hold on an absent key (upstream's compatibility rule).
pub fn selects(requirements: &[OverlayRequirement], labels: &BTreeMap<String, String>) -> bool {
    requirements.iter().all(|r| {
        let value = labels.get(&r.key);
        // i128: every bound the checks accept (a u64) compares, as does any integer label value.
        let int = |v: &str| v.parse::<i128>().ok();
        let bound = r.values.first().and_then(|v| int(v));
        let cmp = |f: fn(i128, i128) -> bool| value.and_then(|v| int(v)).zip(bound).is_some_and(|(v, b)| f(v, b));
        match r.operator {
            Operator::In => value.is_some_and(|v| r.values.contains(v)),
            Operator::NotIn => value.is_none_or(|v| !r.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::Gt => cmp(|v, b| v > b),
            Operator::Lt => cmp(|v, b| v < b),
            Operator::Gte => cmp(|v, b| v >= b),
            Operator::Lte => cmp(|v, b| v <= b),
        }
    })
}

/// A pool an overlay may apply to: its name, template labels, and instance types (its node
/// class's catalogue).
#[derive(Debug, Clone, Copy)]
pub struct PoolTypes<'a> {
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub types: &'a [InstanceType],
}

/// The labels an offering is matched on: the flavor's (`type_labels`), the offering's zone and
/// capacity type, the pool's name and template labels.
fn offering_labels(
    pool: &str,
    pool_labels: &BTreeMap<String, String>,
    type_labels: &BTreeMap<String, String>,
    o: &crate::catalog::Offering,
) -> BTreeMap<String, String> {
    let mut l = pool_labels.clone();
    l.extend(type_labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    l.insert(labels::ZONE.to_string(), o.zone.clone());
    l.insert(labels::CAPACITY_TYPE.to_string(), o.capacity_type.clone());
    l.insert(labels::NODEPOOL.to_string(), pool.to_string());
    l
}

/// The overlays' verdicts over the pools of their namespace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evaluation {
    /// Overlays that apply, by name.
    pub accepted: BTreeSet<String>,
    /// Overlays refused, by name: the condition reason (`Conflict`, `Invalid`) and message.
    pub refused: BTreeMap<String, (&'static str, String)>,
}

impl Evaluation {
    /// The accepted ones of `overlays`.
    pub fn kept(&self, overlays: impl IntoIterator<Item = NodeOverlay>) -> Vec<NodeOverlay> {
        overlays.into_iter().filter(|o| o.metadata.name.as_ref().is_some_and(|n| self.accepted.contains(n))).collect()
    }
}

impl<'a> PoolTypes<'a> {
    /// `pool`'s name and template labels, with `types` (its node class's catalogue).
    pub fn of(pool: &'a crate::NodePool, types: &'a [InstanceType]) -> Self {
        PoolTypes { name: pool.metadata.name.as_deref().unwrap_or_default(), labels: pool.template_labels(), types }
    }
}

/// Upstream's evaluation: overlays by weight, highest first (ties: the name sorting last first);
/// an invalid overlay is refused; an overlay selecting an offering whose price an overlay of the
/// same weight already set, or setting a resource's capacity on a flavor where an overlay of the same
/// weight already set it, conflicts, and is refused in every pool (a higher weight wins quietly; at
/// one weight, different resources merge). Unlike upstream, an overlay already outranked on an
/// offering or resource does not make a later one of its own weight conflict there: only the weight
/// that applies counts.
pub fn evaluate(overlays: &[NodeOverlay], pools: &[PoolTypes<'_>]) -> Evaluation {
    let mut out = Evaluation::default();
    let mut order: Vec<&NodeOverlay> = overlays.iter().collect();
    order.sort_by(|a, b| precedence(a, b));
    // Per (pool, flavor, zone, capacity type): the weight and overlay that set its price.
    let mut price_owner: BTreeMap<(String, String, String, String), (i32, String)> = BTreeMap::new();
    // Per (pool, flavor, resource): the weight and overlay that set its capacity.
    let mut capacity_owner: BTreeMap<(String, String, String), (i32, String)> = BTreeMap::new();
    for o in order {
        let name = o.metadata.name.clone().unwrap_or_default();
        let (price, capacity) = match o.spec.parsed() {
            Ok(parsed) => parsed,
            Err(e) => {
                out.refused.insert(name, ("Invalid", e.to_string()));
                continue;
            }
        };
        let weight = o.spec.weight.unwrap_or(0);
        let (mut price_claims, mut capacity_claims) = (Vec::new(), Vec::new());
        // The other overlay, the pool, the flavor, and the resource for a capacity conflict.
        let mut conflict: Option<(String, String, String, Option<String>)> = None;
        for pool in pools {
            for t in pool.types {
                let mut selected = false;
                for off in &t.offerings {
                    if !selects(&o.spec.requirements, &offering_labels(pool.name, pool.labels, &t.labels, off)) {
                        continue;
                    }
                    selected = true;
                    if price.is_none() {
                        break;
                    }
                    let key = (pool.name.to_string(), t.name.clone(), off.zone.clone(), off.capacity_type.clone());
                    match price_owner.get(&key) {
                        Some((w, other)) if *w == weight => {
                            conflict
                                .get_or_insert_with(|| (other.clone(), pool.name.to_string(), t.name.clone(), None));
                        }
                        Some(_) => {}
                        None => price_claims.push(key),
                    }
                }
                if !selected {
                    continue;
                }
                for resource in capacity.keys() {
                    let key = (pool.name.to_string(), t.name.clone(), resource.clone());
                    match capacity_owner.get(&key) {
                        Some((w, other)) if *w == weight => {
                            conflict.get_or_insert_with(|| {
                                (other.clone(), pool.name.to_string(), t.name.clone(), Some(resource.clone()))
                            });
                        }
                        Some(_) => {}
                        None => capacity_claims.push(key),
                    }
                }
            }
        }
        if let Some((other, pool, flavor, resource)) = conflict {
            let on = match resource {
                Some(r) => format!("the capacity of {r} on flavor {flavor}"),
                None => format!("flavor {flavor}"),
            };
            let message = format!(
                "conflicts with NodeOverlay {other} (same weight {weight}) on {on} of NodePool {pool}: give one a \
                 higher weight, or narrow its requirements"
            );
            out.refused.insert(name, ("Conflict", message));
            continue;
        }
        for key in price_claims {
            price_owner.insert(key, (weight, name.clone()));
        }
        for key in capacity_claims {
            capacity_owner.insert(key, (weight, name.clone()));
        }
        out.accepted.insert(name);
    }
    out
}

/// Upstream's order of overlays: the highest weight first (absent: 0), then the name sorting last.
fn precedence(a: &NodeOverlay, b: &NodeOverlay) -> std::cmp::Ordering {
    let w = |o: &NodeOverlay| o.spec.weight.unwrap_or(0);
    w(b).cmp(&w(a)).then_with(|| b.metadata.name.cmp(&a.metadata.name))
}

/// A valid overlay, parsed.
type Parsed<'a> = (&'a NodeOverlay, Option<PriceChange>, BTreeMap<String, i64>);

/// Applies `overlays` (the accepted ones: [`Evaluation::kept`]) to the instance types of the pool
/// named `pool` with template labels `pool_labels`, in place: each offering takes the price change
/// of the first overlay in [`precedence`] selecting it with one; each resource of a flavor, the
/// capacity of the first overlay selecting any of its offerings with that resource (replacing what
/// the flavor had). Returns how many offerings and resources changed.
pub fn apply(
    overlays: &[NodeOverlay],
    pool: &str,
    pool_labels: &BTreeMap<String, String>,
    types: &mut [InstanceType],
) -> usize {
    let mut live: Vec<Parsed<'_>> =
        overlays.iter().filter_map(|o| o.spec.parsed().ok().map(|(price, capacity)| (o, price, capacity))).collect();
    live.sort_by(|(a, ..), (b, ..)| precedence(a, b));
    if live.is_empty() {
        return 0;
    }
    let mut changed = 0;
    for t in types.iter_mut() {
        let type_labels = &t.labels;
        let mut selected = vec![false; live.len()];
        for offering in t.offerings.iter_mut() {
            let labels = offering_labels(pool, pool_labels, type_labels, offering);
            let mut priced = false;
            for (i, (o, change, _)) in live.iter().enumerate() {
                if !selects(&o.spec.requirements, &labels) {
                    continue;
                }
                selected[i] = true;
                if let (false, Some(change)) = (priced, change) {
                    offering.price_hourly = change.apply(offering.price_hourly);
                    priced = true;
                    changed += 1;
                }
            }
        }
        let mut set: BTreeSet<&str> = BTreeSet::new();
        for (_, _, capacity) in live.iter().zip(&selected).filter(|(_, s)| **s).map(|(l, _)| l) {
            for (resource, amount) in capacity {
                if set.insert(resource) {
                    t.extended.insert(resource.clone(), *amount);
                    changed += 1;
                }
            }
        }
    }
    changed
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;
    use serde_json::json;

    fn overlay(name: &str, spec: serde_json::Value) -> NodeOverlay {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeOverlay",
            "metadata": {"name": name, "namespace": "demo"}, "spec": spec
        }))
        .unwrap()
    }

    fn change(price: Option<&str>, adjustment: Option<&str>) -> Result<PriceChange, OverlayError> {
        NodeOverlaySpec {
            requirements: Vec::new(),
            price: price.map(str::to_string),
            price_adjustment: adjustment.map(str::to_string),
            capacity: None,
            weight: None,
        }
        .price_change()
        .and_then(|c| c.ok_or(OverlayError::Nothing))
    }

    #[test]
    fn prices_change_as_upstream_computes_them() {
        // Upstream's AdjustedPrice examples.
        let at = |a: &str, base: f64| change(None, Some(a)).unwrap().apply(base);
        assert!((at("-10%", 10.0) - 9.0).abs() < 1e-9);
        assert!((at("+100%", 10.0) - 20.0).abs() < 1e-9);
        assert!((at("-25%", 1.5) - 1.125).abs() < 1e-9);
        assert_eq!(at("-15", 10.0), 0.0, "clamped at 0");
        assert!((at("+0.75", 1.25) - 2.0).abs() < 1e-9);
        assert!((at("+.5", 1.0) - 1.5).abs() < 1e-9);
        assert_eq!(at("-100%", 3.0), 0.0);
        assert!((change(Some("80.0"), None).unwrap().apply(1.0) - 80.0).abs() < 1e-9);
        assert!((change(Some("0"), None).unwrap().apply(1.0)).abs() < 1e-9);
        // Refused as the schema refuses them.
        for bad in ["1", "1%", "1.3", "-100.0%", "-101%", "-150%", "+", "+1e3", "--1", "+1.2.3", "+5.", "-5.%", "+%"] {
            assert!(change(None, Some(bad)).is_err(), "{bad}");
        }
        for bad in ["+42", ".5", "42.", "1e10", "-1", ""] {
            assert!(change(Some(bad), None).is_err(), "{bad}");
        }
        assert_eq!(change(Some("1"), Some("+1")), Err(OverlayError::PriceOrAdjustment));
        assert_eq!(change(None, None), Err(OverlayError::Nothing));
        for good in ["+298%", "+100.102%", "-34.43", "-129", "-99.5%", "-0%", "+.5%", "-100%"] {
            assert!(change(None, Some(good)).is_ok(), "{good}");
        }
    }

    #[test]
    fn requirements_select_as_upstream_matches_them() {
        let labels: BTreeMap<String, String> =
            [("clever-cloud.com/flavor", "XS"), ("karpenter.clever-cloud.com/instance-cpu", "6")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        let req = |key: &str, operator: Operator, values: &[&str]| OverlayRequirement {
            key: key.into(),
            operator,
            values: values.iter().map(|v| v.to_string()).collect(),
        };
        assert!(selects(&[], &labels), "no requirement: everything");
        assert!(selects(&[req("clever-cloud.com/flavor", Operator::In, &["XS", "S"])], &labels));
        assert!(!selects(&[req("clever-cloud.com/flavor", Operator::NotIn, &["XS"])], &labels));
        assert!(selects(&[req("team", Operator::NotIn, &["a"])], &labels), "NotIn on an absent key holds");
        assert!(selects(&[req("team", Operator::DoesNotExist, &[])], &labels));
        assert!(!selects(&[req("team", Operator::In, &["a"])], &labels), "In needs the key");
        assert!(selects(&[req("karpenter.clever-cloud.com/instance-cpu", Operator::Gt, &["4"])], &labels));
        assert!(!selects(&[req("karpenter.clever-cloud.com/instance-cpu", Operator::Lt, &["6"])], &labels));
        assert!(selects(&[req("karpenter.clever-cloud.com/instance-cpu", Operator::Lte, &["6"])], &labels));
    }

    fn types() -> Vec<InstanceType> {
        Catalog::builtin().instance_types("par")
    }

    fn price(types: &[InstanceType], flavor: &str) -> f64 {
        types.iter().find(|t| t.name == flavor).unwrap().offerings[0].price_hourly
    }

    #[test]
    fn weights_decide_and_equal_weights_conflict() {
        let base = types();
        let labels = BTreeMap::from([("team".to_string(), "web".to_string())]);
        let pools = [PoolTypes { name: "default", labels: &labels, types: &base }];
        let xs = json!([{"key": "clever-cloud.com/flavor", "operator": "In", "values": ["XS"]}]);
        let all = json!([]);
        // Upstream's S:189: equal weights on a shared flavor: the name sorting first is refused.
        let a = overlay("overlay-a", json!({"requirements": xs, "price": "1.03", "weight": 10}));
        let b = overlay("overlay-b", json!({"requirements": all, "priceAdjustment": "+23", "weight": 10}));
        let e = evaluate(&[a.clone(), b.clone()], &pools);
        assert_eq!(e.accepted, BTreeSet::from(["overlay-b".to_string()]));
        let (reason, message) = &e.refused["overlay-a"];
        assert_eq!(*reason, "Conflict");
        assert!(message.contains("overlay-b") && message.contains("XS") && message.contains("default"), "{message}");
        // A higher weight wins quietly: both apply, each where it ranks first.
        let a20 = overlay("overlay-a", json!({"requirements": xs, "price": "1.03", "weight": 20}));
        let e = evaluate(&[a20.clone(), b.clone()], &pools);
        assert!(e.refused.is_empty(), "{e:?}");
        let mut t = base.clone();
        apply(&e.kept([a20, b]), "default", &labels, &mut t);
        assert!((price(&t, "XS") - 1.03).abs() < 1e-9, "the higher weight's price");
        assert!((price(&t, "S") - (price(&base, "S") + 23.0)).abs() < 1e-9, "the other everywhere else");
        // Disjoint selections at one weight: no conflict.
        let s = json!([{"key": "clever-cloud.com/flavor", "operator": "In", "values": ["S"]}]);
        let c = overlay("overlay-c", json!({"requirements": s, "priceAdjustment": "-10%", "weight": 10}));
        assert!(evaluate(&[a.clone(), c], &pools).refused.is_empty());
        // Pool labels and name select: another pool's flavors are untouched.
        let only_web = overlay(
            "web-only",
            json!({"requirements": [{"key": "team", "operator": "In", "values": ["web"]}], "priceAdjustment": "-50%"}),
        );
        let none = BTreeMap::new();
        let e = evaluate(std::slice::from_ref(&only_web), &pools);
        let mut other = base.clone();
        assert_eq!(apply(&e.kept([only_web.clone()]), "batch", &none, &mut other), 0);
        let mut mine = base.clone();
        assert!(apply(&e.kept([only_web]), "default", &labels, &mut mine) > 0);
        assert!((price(&mine, "M") - price(&base, "M") / 2.0).abs() < 1e-9);
        // Refused overlays apply nowhere; invalid ones say why.
        let bad = overlay("bad", json!({"requirements": all, "priceAdjustment": "10%"}));
        let e = evaluate(std::slice::from_ref(&bad), &pools);
        assert_eq!(e.refused["bad"].0, "Invalid");
        let mut t = base.clone();
        assert_eq!(apply(&e.kept([bad]), "default", &labels, &mut t), 0);
    }

    #[test]
    fn an_outranked_overlay_makes_no_conflict_for_its_peers() {
        // Upstream's quirk (b): A(w10) wins the offering; B and C (w5) both select it. Upstream
        // refuses C; here only the applying weight counts, so B and C conflict only where neither
        // is outranked.
        let base = types();
        let none = BTreeMap::new();
        let pools = [PoolTypes { name: "default", labels: &none, types: &base }];
        let xs = json!([{"key": "clever-cloud.com/flavor", "operator": "In", "values": ["XS"]}]);
        let a = overlay("a", json!({"requirements": xs, "price": "1", "weight": 10}));
        let b = overlay("b", json!({"requirements": xs, "price": "2", "weight": 5}));
        let c = overlay("c", json!({"requirements": xs, "price": "3", "weight": 5}));
        let e = evaluate(&[a, b, c], &pools);
        assert!(e.refused.is_empty(), "{e:?}");
    }

    fn extended(types: &[InstanceType], flavor: &str) -> BTreeMap<String, i64> {
        types.iter().find(|t| t.name == flavor).unwrap().extended.clone()
    }

    #[test]
    fn capacity_is_set_per_resource_by_weight_and_conflicts_per_resource() {
        let base = types();
        let none = BTreeMap::new();
        let pools = [PoolTypes { name: "gpu", labels: &none, types: &base }];
        let m = json!([{"key": "clever-cloud.com/flavor", "operator": "In", "values": ["M"]}]);
        let a = overlay("a", json!({"requirements": m, "capacity": {"nvidia.com/gpu": 1}, "weight": 10}));
        let b = overlay("b", json!({"requirements": [], "capacity": {"example.com/fpga": "2"}, "weight": 10}));
        // At one weight, different resources merge; a price-only overlay beside them too.
        let p = overlay("p", json!({"requirements": m, "priceAdjustment": "+50%", "weight": 10}));
        let e = evaluate(&[a.clone(), b.clone(), p.clone()], &pools);
        assert!(e.refused.is_empty(), "{e:?}");
        let mut t = base.clone();
        apply(&e.kept([a.clone(), b.clone(), p]), "gpu", &none, &mut t);
        assert_eq!(extended(&t, "M"), BTreeMap::from([("example.com/fpga".into(), 2), ("nvidia.com/gpu".into(), 1)]));
        assert_eq!(extended(&t, "S"), BTreeMap::from([("example.com/fpga".into(), 2)]));
        assert!((price(&t, "M") - price(&base, "M") * 1.5).abs() < 1e-9);
        // The same resource on one flavor at one weight conflicts, naming the resource.
        let c = overlay("c", json!({"requirements": [], "capacity": {"nvidia.com/gpu": 2}, "weight": 10}));
        let e = evaluate(&[a.clone(), c.clone()], &pools);
        let (reason, message) = &e.refused["a"];
        assert_eq!(*reason, "Conflict");
        assert!(
            message.contains("nvidia.com/gpu") && message.contains("flavor M") && message.contains(" c "),
            "{message}"
        );
        // A higher weight replaces the resource where it selects; the lower applies elsewhere.
        let c5 = overlay("c", json!({"requirements": [], "capacity": {"nvidia.com/gpu": 2}, "weight": 5}));
        let e = evaluate(&[a.clone(), c5.clone()], &pools);
        assert!(e.refused.is_empty(), "{e:?}");
        let mut t = base.clone();
        apply(&e.kept([a, c5]), "gpu", &none, &mut t);
        assert_eq!(extended(&t, "M")["nvidia.com/gpu"], 1);
        assert_eq!(extended(&t, "XL")["nvidia.com/gpu"], 2);
        // Capacity alone is a change; node resources, fractions and negatives are refused.
        assert_eq!(b.spec.check(), Ok(()));
        for (capacity, what) in [
            (json!({"cpu": "2"}), "flavor's own sizing"),
            (json!({"nvidia.com/gpu": "500m"}), "whole number"),
            (json!({"nvidia.com/gpu": "-1"}), "negative"),
            (json!({"nvidia.com/gpu": "lots"}), "nvidia.com/gpu"),
        ] {
            let bad = overlay("bad", json!({"requirements": [], "capacity": capacity}));
            let e = evaluate(std::slice::from_ref(&bad), &pools);
            assert_eq!(e.refused["bad"].0, "Invalid");
            assert!(e.refused["bad"].1.contains(what), "{:?}", e.refused["bad"]);
        }
        let empty = overlay("empty", json!({"requirements": []}));
        assert_eq!(empty.spec.check(), Err(OverlayError::Nothing));
    }

    #[test]
    fn the_schema_refuses_what_price_change_refuses() {
        let o = overlay("x", json!({"requirements": [], "price": "1", "priceAdjustment": "+1"}));
        assert_eq!(o.spec.price_change(), Err(OverlayError::PriceOrAdjustment));
        let o = overlay("x", json!({"requirements": [{"key": "a", "operator": "In", "values": []}], "price": "1"}));
        assert!(o.spec.check_requirements().is_err());
    }
}
