//! `NodeOverlay`: upstream Karpenter's NodeOverlay (`karpenter.sh/v1alpha1`) for the hub, scoped to
//! a namespace: adjust the price of the flavors (and offerings) its requirements select, in the
//! NodePools of its namespace, with weights deciding between overlays and conflicts reported.
//!
//! Owns the API shape, the price arithmetic, which offerings an overlay selects, and the
//! evaluation (weights, conflicts) and application over a pool's instance types — pure functions,
//! shared by the hub, `plan` and the webhook. Must not: read anything, or know where pools come from.

use std::collections::{BTreeMap, BTreeSet};

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::catalog::InstanceType;
use crate::common::{Condition, Operator};
use crate::labels;

/// Condition: the overlay is valid and in conflict with no other (`Conflict`, `Invalid` otherwise).
pub const VALIDATION_SUCCEEDED: &str = "ValidationSucceeded";
/// Condition: the overlay applies (mirrors `ValidationSucceeded`).
pub const READY: &str = "Ready";

/// Adjusts the price of the flavors its requirements select, in the NodePools of its namespace
/// (upstream's NodeOverlay, namespaced).
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
    doc = "NodeOverlay adjusts the price the hub sees for the flavors its requirements select, in every NodePool of its namespace (upstream Karpenter's NodeOverlay, scoped to a namespace): a percentage or an amount, or a price of its own; overlays of higher weight win, and two of equal weight selecting the same flavor conflict (status).",
    printcolumn(name = "Weight", type_ = "integer", json_path = ".spec.weight"),
    printcolumn(name = "Price", type_ = "string", json_path = ".spec.price"),
    printcolumn(name = "Adjustment", type_ = "string", json_path = ".spec.priceAdjustment"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.price) || !has(self.priceAdjustment)").message("cannot set both 'price' and 'priceAdjustment'"),
    validation = Rule::new("has(self.price) || has(self.priceAdjustment)").message("set spec.price (a price of its own, EUR per hour) or spec.priceAdjustment (e.g. \"-10%\", \"+0.02\"): an overlay without either changes nothing")
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
    /// Precedence: on a flavor several overlays select, the highest weight applies; two of equal
    /// weight conflict, and the one whose name sorts first is refused everywhere. Absent: 0.
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
    #[error("spec: set exactly one of price and priceAdjustment")]
    PriceOrAdjustment,
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
    /// The price change, checked as the schema does.
    pub fn price_change(&self) -> Result<PriceChange, OverlayError> {
        match (&self.price, &self.price_adjustment) {
            (Some(p), None) => strict_number(p)
                .then(|| value(p))
                .flatten()
                .map(PriceChange::Set)
                .ok_or_else(|| OverlayError::Price(p.clone())),
            (None, Some(a)) => {
                let bad = || OverlayError::Adjustment(a.clone());
                let (negative, rest) = match a.as_bytes().first() {
                    Some(b'+') => (false, &a[1..]),
                    Some(b'-') => (true, &a[1..]),
                    _ => return Err(bad()),
                };
                let sign = if negative { -1.0 } else { 1.0 };
                match rest.strip_suffix('%') {
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
                }
            }
            _ => Err(OverlayError::PriceOrAdjustment),
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
/// an invalid overlay is refused; an overlay selecting an offering that an overlay of the same
/// weight already selected conflicts, and is refused in every pool (a higher weight wins quietly).
/// Unlike upstream, an overlay already outranked on an offering does not make a later one of its
/// own weight conflict there: only the weight that applies counts.
pub fn evaluate(overlays: &[NodeOverlay], pools: &[PoolTypes<'_>]) -> Evaluation {
    let mut out = Evaluation::default();
    let mut order: Vec<&NodeOverlay> = overlays.iter().collect();
    order.sort_by(|a, b| precedence(a, b));
    // Per (pool, flavor, zone, capacity type): the weight and overlay that set its price.
    let mut owner: BTreeMap<(String, String, String, String), (i32, String)> = BTreeMap::new();
    for o in order {
        let name = o.metadata.name.clone().unwrap_or_default();
        if let Err(e) = o.spec.price_change().and_then(|_| o.spec.check_requirements()) {
            out.refused.insert(name, ("Invalid", e.to_string()));
            continue;
        }
        let weight = o.spec.weight.unwrap_or(0);
        let mut claims = Vec::new();
        let mut conflict = None;
        for pool in pools {
            for t in pool.types {
                for off in &t.offerings {
                    if !selects(&o.spec.requirements, &offering_labels(pool.name, pool.labels, &t.labels, off)) {
                        continue;
                    }
                    let key = (pool.name.to_string(), t.name.clone(), off.zone.clone(), off.capacity_type.clone());
                    match owner.get(&key) {
                        Some((w, other)) if *w == weight => {
                            conflict.get_or_insert_with(|| (other.clone(), pool.name.to_string(), t.name.clone()));
                        }
                        Some(_) => {}
                        None => claims.push(key),
                    }
                }
            }
        }
        if let Some((other, pool, flavor)) = conflict {
            let message = format!(
                "conflicts with NodeOverlay {other} (same weight {weight}) on flavor {flavor} of NodePool {pool}: give \
                 one a higher weight, or narrow its requirements"
            );
            out.refused.insert(name, ("Conflict", message));
            continue;
        }
        for key in claims {
            owner.insert(key, (weight, name.clone()));
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

/// Applies `overlays` (the accepted ones: [`Evaluation::kept`]) to the instance types of the pool
/// named `pool` with template labels `pool_labels`, in place: each offering takes the price change
/// of the first overlay in [`precedence`] selecting it. Returns how many offerings changed.
pub fn apply(
    overlays: &[NodeOverlay],
    pool: &str,
    pool_labels: &BTreeMap<String, String>,
    types: &mut [InstanceType],
) -> usize {
    let mut live: Vec<(&NodeOverlay, PriceChange)> =
        overlays.iter().filter_map(|o| Some((o, o.spec.price_change().ok()?))).collect();
    live.sort_by(|(a, _), (b, _)| precedence(a, b));
    if live.is_empty() {
        return 0;
    }
    let mut changed = 0;
    for t in types.iter_mut() {
        let type_labels = &t.labels;
        for offering in t.offerings.iter_mut() {
            let labels = offering_labels(pool, pool_labels, type_labels, offering);
            if let Some((_, change)) = live.iter().find(|(o, _)| selects(&o.spec.requirements, &labels)) {
                offering.price_hourly = change.apply(offering.price_hourly);
                changed += 1;
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
            weight: None,
        }
        .price_change()
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
        assert_eq!(change(None, None), Err(OverlayError::PriceOrAdjustment));
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

    #[test]
    fn the_schema_refuses_what_price_change_refuses() {
        let o = overlay("x", json!({"requirements": [], "price": "1", "priceAdjustment": "+1"}));
        assert_eq!(o.spec.price_change(), Err(OverlayError::PriceOrAdjustment));
        let o = overlay("x", json!({"requirements": [{"key": "a", "operator": "In", "values": []}], "price": "1"}));
        assert!(o.spec.check_requirements().is_err());
    }
}
