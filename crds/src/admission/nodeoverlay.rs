//! Admission of a `NodeOverlay`: the schema and CEL rules of the type repeated (at most one of a
//! price and a price adjustment, in the forms the schema's patterns and
//! [`NodeOverlaySpec::price_change`] accept; something to change; whole counts of extended
//! resources only in `capacity`; the requirements' count, keys, operators and values, as
//! the schema and [`NodeOverlaySpec::check_requirements`] check them; the weight's range), and
//! warnings for an overlay that makes offerings free or selects every flavor of its namespace.
//! Nothing is read: which pools and flavors an overlay selects, and whether it conflicts with
//! another overlay, is the hub's to evaluate (the overlay's `ValidationSucceeded` condition).

use crate::admission::{Verdict, shorten};
use crate::common::Operator;
use crate::labels;
use crate::overlay::{NodeOverlay, NodeOverlaySpec, OverlayRequirement, PriceChange};
use crate::validation::label_value;

/// Most requirements (the schema's `maxItems`).
const MAX_REQUIREMENTS: usize = 100;
/// Most values of one requirement (the schema's `maxItems`).
const MAX_VALUES: usize = 100;
/// Longest requirement key (the schema's `maxLength`).
const MAX_KEY_CHARS: usize = 316;
/// Longest `price` and `priceAdjustment` (the schema's `maxLength`).
const MAX_PRICE_CHARS: usize = 32;
/// Most resources in `capacity` (the schema's `maxProperties`).
const MAX_CAPACITY_KEYS: usize = 32;
/// Longest capacity quantity (the schema's `maxLength`).
const MAX_QUANTITY_CHARS: usize = 64;
/// The weight's range (the schema's `minimum` and `maximum`).
const MIN_WEIGHT: i32 = 1;
const MAX_WEIGHT: i32 = 10_000;

/// What a price looks like, for the denials.
const PRICE_FORM: &str = "write the selected offerings' price in EUR per hour as a non-negative decimal with digits on \
                          both sides of the point, e.g. \"0.05\" or \"2\" (no sign, exponent or unit)";
/// What a price adjustment looks like, for the denials.
const ADJUSTMENT_FORM: &str = "write a signed amount in EUR per hour (\"+0.02\", \"-0.01\") or a signed percentage \
                               (\"+25%\", \"-10%\"); a decrease is at most 100%: \"-100%\", or one or two digits \
                               before the point, e.g. \"-99.5%\"";

/// Validates a `NodeOverlay` (create or update; the old object changes nothing: the type has no
/// immutable field).
///
/// Denied: both of `price` and `priceAdjustment`, or none of them and `capacity`; a `capacity` of
/// more than 32 resources, naming `cpu`, `memory`, `ephemeral-storage` or `pods`, or with a quantity
/// that is not a whole non-negative count or longer than 64 characters; a `price` that is not a non-negative
/// decimal (`^\d+(\.\d+)?$`) or longer than 32 characters; a `priceAdjustment` that is not a signed
/// amount or percentage as the schema's pattern writes them (a decrease of at most `-100%`) or
/// longer than 32 characters; more than 100 requirements; a key that is empty, longer than 316
/// characters, not `[prefix/]name` as the schema's pattern, or `kubernetes.io/hostname`; `In` and
/// `NotIn` without values, `Exists` and `DoesNotExist` with values, `Gt`, `Lt`, `Gte` and `Lte`
/// without exactly one non-negative integer; more than 100 values; a value that is not a label value
/// (at most 63 characters); a `weight` outside 1–10000. Whatever
/// [`NodeOverlaySpec::price_change`] or [`NodeOverlaySpec::check_requirements`] refuses (the hub's
/// `Invalid`) is denied. Warned: a `price` of 0 and a `priceAdjustment` of `-100%` (free offerings:
/// every cheapest-first choice goes to them), and empty `requirements` (every flavor of every
/// NodePool of the namespace).
pub fn validate_node_overlay(new: &NodeOverlay, _old: Option<&NodeOverlay>) -> Verdict {
    let mut verdict = Verdict::default();
    let spec = &new.spec;
    match (&spec.price, &spec.price_adjustment) {
        (Some(_), Some(_)) => verdict.deny(
            "spec",
            "price and priceAdjustment are both set: keep price for a price of the overlay's own (EUR per hour, e.g. \
             price: \"0.05\"), or priceAdjustment for a change of the catalogue's price (e.g. priceAdjustment: \
             \"-10%\")",
        ),
        (None, None) if spec.capacity.is_none() => verdict.deny(
            "spec",
            "none of price, priceAdjustment and capacity is set, and an overlay without any changes nothing: set price \
             (the selected offerings' price, EUR per hour, e.g. price: \"0.05\"), priceAdjustment (a change of the \
             catalogue's price, e.g. priceAdjustment: \"-10%\" or \"+0.02\") or capacity (extended resources of the \
             selected flavors, e.g. capacity: {nvidia.com/gpu: 1})",
        ),
        _ => {}
    }
    if let Some(price) = &spec.price
        && let Some(change) = check_price(&mut verdict, "spec.price", price, PriceKind::Price)
        && change == PriceChange::Set(0.0)
    {
        verdict.warn(
            "spec.price",
            format!(
                "{} makes the selected offerings free: every cheapest-first choice of the hub (new nodes, \
                 consolidation) goes to them before any other flavor; give their real hourly price, e.g. \"0.05\", \
                 unless that is what you want",
                shorten(price)
            ),
        );
    }
    if let Some(adjustment) = &spec.price_adjustment
        && let Some(PriceChange::Percent(percent)) =
            check_price(&mut verdict, "spec.priceAdjustment", adjustment, PriceKind::Adjustment)
        && percent <= -100.0
    {
        verdict.warn(
            "spec.priceAdjustment",
            format!(
                "{} makes the selected offerings free: every cheapest-first choice of the hub (new nodes, \
                 consolidation) goes to them before any other flavor; use a smaller decrease, e.g. \"-50%\", unless \
                 that is what you want",
                shorten(adjustment)
            ),
        );
    }

    check_capacity(&mut verdict, spec);
    check_requirements(&mut verdict, &spec.requirements);
    if spec.requirements.is_empty() {
        let namespace = match new.metadata.namespace.as_deref().filter(|n| !n.is_empty()) {
            Some(namespace) => format!("namespace {}", shorten(namespace)),
            None => "its namespace".to_string(),
        };
        verdict.warn(
            "spec.requirements",
            format!(
                "is empty: the overlay selects every flavor of every NodePool in {namespace}; add requirements to \
                 narrow it (e.g. {{key: node.kubernetes.io/instance-type, operator: In, values: [XS]}}), unless every \
                 price of the namespace should change"
            ),
        );
    }

    if let Some(weight) = spec.weight
        && !(MIN_WEIGHT..=MAX_WEIGHT).contains(&weight)
    {
        verdict.deny(
            "spec.weight",
            format!(
                "{weight} is out of range: give {MIN_WEIGHT} to {MAX_WEIGHT} (on a flavor several overlays select, the \
                 highest weight applies), or remove the field (weight 0, below every overlay that sets one)"
            ),
        );
    }
    verdict
}

/// `capacity`: at most [`MAX_CAPACITY_KEYS`] resources, each an extended resource (not one of the
/// four node resources) with a whole, non-negative quantity of at most 64 characters.
fn check_capacity(verdict: &mut Verdict, spec: &NodeOverlaySpec) {
    let Some(capacity) = &spec.capacity else { return };
    if capacity.len() > MAX_CAPACITY_KEYS {
        verdict.deny(
            "spec.capacity",
            format!("has {} resources, more than {MAX_CAPACITY_KEYS}: split the overlay", capacity.len()),
        );
        return;
    }
    for (key, q) in capacity {
        // A resource name as it is; anything else (a hostile key) quoted and cut.
        let plain = key.len() <= 80 && key.bytes().all(|b| b.is_ascii_alphanumeric() || b"./-_".contains(&b));
        let field = if plain { format!("spec.capacity.{key}") } else { format!("spec.capacity.{}", shorten(key)) };
        if q.0.chars().count() > MAX_QUANTITY_CHARS {
            verdict.deny(
                &field,
                format!("{} is longer than {MAX_QUANTITY_CHARS} characters: give a count, e.g. 1", shorten(&q.0)),
            );
            continue;
        }
        let alone = NodeOverlaySpec {
            requirements: Vec::new(),
            price: None,
            price_adjustment: None,
            capacity: Some([(key.clone(), q.clone())].into()),
            weight: None,
        };
        if let Err(e) = alone.capacity_change() {
            let why = match e {
                crate::overlay::OverlayError::Capacity { message, .. } => message,
                other => other.to_string(),
            };
            verdict.deny(&field, format!("{why}: give a whole count of an extended resource, e.g. nvidia.com/gpu: 1"));
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum PriceKind {
    Price,
    Adjustment,
}

/// Checks one of `price` and `priceAdjustment` on its own (the schema checks each field even when
/// both are set): its length, the schema's pattern and [`NodeOverlaySpec::price_change`]'s form.
/// Returns the change when every check passes.
fn check_price(verdict: &mut Verdict, field: &str, text: &str, kind: PriceKind) -> Option<PriceChange> {
    let form = match kind {
        PriceKind::Price => PRICE_FORM,
        PriceKind::Adjustment => ADJUSTMENT_FORM,
    };
    if text.chars().count() > MAX_PRICE_CHARS {
        verdict.deny(field, format!("{} is longer than {MAX_PRICE_CHARS} characters: {form}", shorten(text)));
        return None;
    }
    let alone = NodeOverlaySpec {
        requirements: Vec::new(),
        price: (kind == PriceKind::Price).then(|| text.to_string()),
        price_adjustment: (kind == PriceKind::Adjustment).then(|| text.to_string()),
        capacity: None,
        weight: None,
    };
    let pattern = match kind {
        PriceKind::Price => price_pattern(text),
        PriceKind::Adjustment => adjustment_pattern(text),
    };
    match alone.price_change() {
        Ok(Some(change)) if pattern => Some(change),
        _ => {
            let what = match kind {
                PriceKind::Price => "a price",
                PriceKind::Adjustment => "a price adjustment",
            };
            verdict.deny(field, format!("{} is not {what}: {form}", shorten(text)));
            None
        }
    }
}

/// The schema's pattern of `price`: `^\d+(\.\d+)?$`.
fn price_pattern(s: &str) -> bool {
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    match s.split_once('.') {
        Some((whole, fraction)) => digits(whole) && digits(fraction),
        None => digits(s),
    }
}

/// The schema's pattern of `priceAdjustment`:
/// `^(([+-]{1}(\d*\.?\d+))|(\+{1}\d*\.?\d+%)|(^(-\d{1,2}(\.\d+)?%)$)|(-100%))$`.
fn adjustment_pattern(s: &str) -> bool {
    let all_digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    // `\d*\.?\d+`
    let number = |p: &str| match p.split_once('.') {
        Some((whole, fraction)) => all_digits(whole) && !fraction.is_empty() && all_digits(fraction),
        None => !p.is_empty() && all_digits(p),
    };
    if s == "-100%" {
        return true;
    }
    if let Some(rest) = s.strip_prefix('+') {
        return number(rest.strip_suffix('%').unwrap_or(rest));
    }
    let Some(rest) = s.strip_prefix('-') else { return false };
    match rest.strip_suffix('%') {
        // `-\d{1,2}(\.\d+)?%`
        Some(percent) => {
            let (whole, fraction) = percent.split_once('.').map_or((percent, None), |(w, f)| (w, Some(f)));
            (1..=2).contains(&whole.len())
                && all_digits(whole)
                && fraction.is_none_or(|f| !f.is_empty() && all_digits(f))
        }
        None => number(rest),
    }
}

/// The requirements' count, and each one's key, operator and values.
fn check_requirements(verdict: &mut Verdict, requirements: &[OverlayRequirement]) {
    if requirements.len() > MAX_REQUIREMENTS {
        verdict.deny(
            "spec.requirements",
            format!(
                "{} requirements, at most {MAX_REQUIREMENTS}: merge the requirements on one key, or split the overlay \
                 in several",
                requirements.len()
            ),
        );
    }
    for (i, r) in requirements.iter().enumerate() {
        let field = format!("spec.requirements[{i}]");
        if let Some(problem) = key_problem(&r.key) {
            verdict.deny(format!("{field}.key"), problem);
        }
        check_values(verdict, &field, r);
    }
}

/// Why a requirement key is refused (the schema's length, pattern and CEL rule).
fn key_problem(key: &str) -> Option<String> {
    const EXAMPLE: &str = "e.g. node.kubernetes.io/instance-type or clever-cloud.com/flavor";
    let len = key.chars().count();
    if len == 0 {
        return Some(format!("is empty: name the label to match, {EXAMPLE}"));
    }
    if len > MAX_KEY_CHARS {
        return Some(format!(
            "{} is longer than {MAX_KEY_CHARS} characters: name a label key, {EXAMPLE}",
            shorten(key)
        ));
    }
    if !key_pattern(key) {
        return Some(format!(
            "{} is not a valid label key: write [prefix/]name, the prefix lowercase letters, digits, '-' and '.', the \
             name letters, digits, '-', '_' and '.', each starting and ending with a letter or digit, {EXAMPLE}",
            shorten(key)
        ));
    }
    if key == labels::HOSTNAME {
        return Some(format!(
            "{} is restricted: no flavor carries it (an overlay prices flavors, not nodes); select by \
             node.kubernetes.io/instance-type or clever-cloud.com/flavor instead",
            labels::HOSTNAME
        ));
    }
    None
}

/// The schema's pattern of a key:
/// `^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`.
fn key_pattern(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let ends =
        |s: &str, ok: fn(&u8) -> bool| s.as_bytes().first().is_some_and(ok) && s.as_bytes().last().is_some_and(ok);
    let prefix_ok = prefix.is_none_or(|p| {
        p.split('.').all(|part| {
            ends(part, |b| b.is_ascii_lowercase() || b.is_ascii_digit())
                && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
    });
    prefix_ok
        && ends(name, u8::is_ascii_alphanumeric)
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The values a requirement's operator takes (the CEL rules and
/// [`NodeOverlaySpec::check_requirements`]), their count, and each one as a label value.
fn check_values(verdict: &mut Verdict, field: &str, r: &OverlayRequirement) {
    let op = r.operator.as_str();
    let values = format!("{field}.values");
    let integer = matches!(r.operator, Operator::Gt | Operator::Lt | Operator::Gte | Operator::Lte);
    match r.operator {
        Operator::In | Operator::NotIn if r.values.is_empty() => verdict.deny(
            values.as_str(),
            format!(
                "operator {op} needs at least one value, e.g. values: [\"XS\", \"S\"]; or use Exists / DoesNotExist"
            ),
        ),
        Operator::Exists | Operator::DoesNotExist if !r.values.is_empty() => {
            verdict.deny(values.as_str(), format!("operator {op} takes no values: remove them"))
        }
        // As the CEL rule (digits only) and `check_requirements` (fits a u64) read it.
        _ if integer
            && (r.values.len() != 1
                || !r.values[0].bytes().all(|b| b.is_ascii_digit())
                || r.values[0].parse::<u64>().is_err()) =>
        {
            verdict.deny(
                values.as_str(),
                format!(
                    "operator {op} needs exactly one non-negative integer value (digits only, at most {}), e.g. \
                     values: [\"4\"]; got {}",
                    u64::MAX,
                    shorten(&format!("{:?}", r.values))
                ),
            );
        }
        _ => {}
    }
    if r.values.len() > MAX_VALUES {
        verdict.deny(
            values.as_str(),
            format!(
                "{} values, at most {MAX_VALUES}: keep the ones flavors carry, or select by a numeric label with Gt / \
                 Lt (e.g. karpenter.clever-cloud.com/instance-cpu)",
                r.values.len()
            ),
        );
    }
    // An integer operator's value was checked as digits above (a label value if it fits a u64).
    if !integer {
        for (j, value) in r.values.iter().enumerate() {
            if let Err(reason) = label_value(value) {
                verdict.deny(
                    format!("{values}[{j}]"),
                    format!(
                        "{} is not a valid label value: it {reason}; no flavor carries it, write the value as the \
                         label holds it, e.g. XS",
                        shorten(value)
                    ),
                );
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::admission::MAX_DENIALS;
    use crate::admission::verdict_checks::{denied, fields, warned};
    use serde_json::{Value, json};

    fn overlay(spec: Value) -> NodeOverlay {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1",
            "kind": "NodeOverlay",
            "metadata": {"name": "cheaper-xs", "namespace": "team-a"},
            "spec": spec
        }))
        .unwrap()
    }

    /// A valid overlay with `edit` applied to its spec.
    fn edited(edit: impl FnOnce(&mut Value)) -> Verdict {
        let mut spec = json!({
            "requirements": [{"key": "clever-cloud.com/flavor", "operator": "In", "values": ["XS", "S"]}],
            "priceAdjustment": "-10%",
            "weight": 10
        });
        edit(&mut spec);
        validate_node_overlay(&overlay(spec), None)
    }

    fn remove(spec: &mut Value, key: &str) {
        spec.as_object_mut().unwrap().remove(key);
    }

    fn requirement(key: &str, operator: &str, values: Value) -> Value {
        json!([{"key": key, "operator": operator, "values": values}])
    }

    #[test]
    fn a_valid_overlay_is_allowed_without_warnings() {
        assert_eq!(edited(|_| {}), Verdict::default());
        // Every form of the schema, each operator, the weight's bounds, on update too.
        for adjustment in ["+0.02", "-0.01", "+.5", "-.5", "+25%", "+1000%", "+.5%", "-10%", "-99.5%", "-0.5%", "-5%"] {
            let v = edited(|s| s["priceAdjustment"] = json!(adjustment));
            assert_eq!(v, Verdict::default(), "{adjustment}");
        }
        for price in ["0.05", "2", "80.0", "0.000001", "12345678901234567890123456789012"] {
            let v = edited(|s| {
                remove(s, "priceAdjustment");
                s["price"] = json!(price);
            });
            assert_eq!(v, Verdict::default(), "{price}");
        }
        let spec = json!({
            "requirements": [
                {"key": "node.kubernetes.io/instance-type", "operator": "NotIn", "values": ["XL", "2XL"]},
                {"key": "karpenter.clever-cloud.com/instance-cpu", "operator": "Gte", "values": ["4"]},
                {"key": "karpenter.clever-cloud.com/instance-memory", "operator": "Lt", "values": ["18446744073709551615"]},
                {"key": "topology.kubernetes.io/zone", "operator": "Exists"},
                {"key": "team", "operator": "DoesNotExist", "values": []},
                {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["default", ""]},
                {"key": "Team_Name.v2", "operator": "Gt", "values": ["0"]},
            ],
            "price": "0.05",
            "weight": 10000
        });
        assert_eq!(validate_node_overlay(&overlay(spec.clone()), Some(&overlay(spec))), Verdict::default());
        assert_eq!(edited(|s| s["weight"] = json!(1)), Verdict::default());
        assert_eq!(edited(|s| remove(s, "weight")), Verdict::default(), "absent: weight 0");
    }

    #[test]
    fn at_most_one_of_price_and_price_adjustment_and_something_to_change() {
        let v = edited(|s| s["price"] = json!("0.05"));
        assert_eq!(fields(&v.denials), ["spec"]);
        assert!(denied(&v, "spec", "price and priceAdjustment are both set"), "{v:?}");
        assert!(denied(&v, "spec", "keep price for"), "{v:?}");
        let v = edited(|s| remove(s, "priceAdjustment"));
        assert_eq!(fields(&v.denials), ["spec"]);
        assert!(denied(&v, "spec", "none of price, priceAdjustment and capacity is set"), "{v:?}");
        assert!(denied(&v, "spec", "price: \"0.05\""), "{v:?}");
        // Capacity alone is a change.
        let v = edited(|s| {
            remove(s, "priceAdjustment");
            s["capacity"] = json!({"nvidia.com/gpu": 1});
        });
        assert_eq!(v, Verdict::default());
        // Both set and each malformed: each field is reported too, as the schema does.
        let v = edited(|s| {
            s["price"] = json!("-1");
            s["priceAdjustment"] = json!("10%");
        });
        assert_eq!(fields(&v.denials), ["spec", "spec.price", "spec.priceAdjustment"], "{v:?}");
    }

    #[test]
    fn capacity_takes_whole_counts_of_extended_resources() {
        for (capacity, field, says) in [
            (json!({"cpu": "2"}), "spec.capacity.cpu", "flavor's own sizing"),
            (json!({"pods": 10}), "spec.capacity.pods", "flavor's own sizing"),
            (json!({"nvidia.com/gpu": "500m"}), "spec.capacity.nvidia.com/gpu", "not a whole number"),
            (json!({"nvidia.com/gpu": "-1"}), "spec.capacity.nvidia.com/gpu", "negative"),
            (json!({"nvidia.com/gpu": "many"}), "spec.capacity.nvidia.com/gpu", "e.g. nvidia.com/gpu: 1"),
            (json!({"nvidia.com/gpu": "1".repeat(100)}), "spec.capacity.nvidia.com/gpu", "longer than 64"),
        ] {
            let v = edited(|s| s["capacity"] = capacity.clone());
            assert_eq!(fields(&v.denials), [field], "{capacity}: {v:?}");
            assert!(denied(&v, field, says), "{capacity}: {v:?}");
        }
        let many: serde_json::Map<String, Value> = (0..33).map(|i| (format!("example.com/r{i}"), json!(1))).collect();
        let v = edited(|s| s["capacity"] = Value::Object(many));
        assert!(denied(&v, "spec.capacity", "more than 32"), "{v:?}");
        assert_eq!(
            edited(|s| s["capacity"] = json!({"nvidia.com/gpu": "2", "example.com/fpga": 1})),
            Verdict::default()
        );
    }

    #[test]
    fn a_price_is_a_non_negative_decimal() {
        for bad in ["-1", "+42", ".5", "42.", "1e10", "", "0,05", "1.2.3", "EUR 1", "１"] {
            let v = edited(|s| {
                remove(s, "priceAdjustment");
                s["price"] = json!(bad);
            });
            assert_eq!(fields(&v.denials), ["spec.price"], "{bad}: {v:?}");
            assert!(denied(&v, "spec.price", "is not a price: write the selected offerings' price"), "{bad}: {v:?}");
            assert!(denied(&v, "spec.price", "e.g. \"0.05\""), "{bad}: {v:?}");
        }
        let v = edited(|s| {
            remove(s, "priceAdjustment");
            s["price"] = json!("1".repeat(33));
        });
        assert_eq!(fields(&v.denials), ["spec.price"]);
        assert!(denied(&v, "spec.price", "is longer than 32 characters"), "{v:?}");
    }

    #[test]
    fn a_price_adjustment_is_a_signed_amount_or_percentage() {
        // Refused by price_change, by the schema's pattern, or both.
        let bad = [
            "1", "1%", "1.3", "10%", "-101%", "-100.0%", "-100.5%", "-099%", "-.5%", "+", "-", "+%", "+1e3", "--1",
            "+1.2.3", "+5.", "-5.", "+5.%", "-5.%", "", "+ 1", "+1 %", "+1%%", "+1€",
        ];
        for bad in bad {
            let v = edited(|s| s["priceAdjustment"] = json!(bad));
            assert_eq!(fields(&v.denials), ["spec.priceAdjustment"], "{bad}: {v:?}");
            assert!(denied(&v, "spec.priceAdjustment", "is not a price adjustment: write a signed amount"), "{bad}");
            assert!(denied(&v, "spec.priceAdjustment", "a decrease is at most 100%"), "{bad}: {v:?}");
        }
        let v = edited(|s| s["priceAdjustment"] = json!(format!("+{}", "1".repeat(32))));
        assert_eq!(fields(&v.denials), ["spec.priceAdjustment"]);
        assert!(denied(&v, "spec.priceAdjustment", "is longer than 32 characters"), "{v:?}");
    }

    #[test]
    fn free_offerings_are_warned() {
        for zero in ["0", "0.0", "000.000"] {
            let v = edited(|s| {
                remove(s, "priceAdjustment");
                s["price"] = json!(zero);
            });
            assert!(v.is_allowed(), "{zero}: {v:?}");
            assert_eq!(fields(&v.warnings), ["spec.price"], "{zero}");
            assert!(warned(&v, "spec.price", "makes the selected offerings free"), "{v:?}");
            assert!(warned(&v, "spec.price", "every cheapest-first choice"), "{v:?}");
            assert!(warned(&v, "spec.price", "give their real hourly price"), "{v:?}");
        }
        let v = edited(|s| s["priceAdjustment"] = json!("-100%"));
        assert!(v.is_allowed(), "{v:?}");
        assert_eq!(fields(&v.warnings), ["spec.priceAdjustment"]);
        assert!(warned(&v, "spec.priceAdjustment", "\"-100%\" makes the selected offerings free"), "{v:?}");
        assert!(warned(&v, "spec.priceAdjustment", "use a smaller decrease"), "{v:?}");
        // Not free: no warning.
        for quiet in ["-99.99%", "-15", "+0%", "-0"] {
            assert_eq!(edited(|s| s["priceAdjustment"] = json!(quiet)), Verdict::default(), "{quiet}");
        }
    }

    #[test]
    fn empty_requirements_are_warned() {
        let v = edited(|s| s["requirements"] = json!([]));
        assert!(v.is_allowed(), "{v:?}");
        assert_eq!(fields(&v.warnings), ["spec.requirements"]);
        assert!(
            warned(&v, "spec.requirements", "selects every flavor of every NodePool in namespace \"team-a\""),
            "{v:?}"
        );
        assert!(warned(&v, "spec.requirements", "add requirements to narrow it"), "{v:?}");
        // Both warnings at once: free and everywhere.
        let v = edited(|s| {
            s["requirements"] = json!([]);
            s["priceAdjustment"] = json!("-100%");
        });
        assert_eq!(fields(&v.warnings), ["spec.priceAdjustment", "spec.requirements"]);
    }

    #[test]
    fn at_most_100_requirements() {
        let many: Vec<Value> = (0..101).map(|i| json!({"key": format!("k{i}"), "operator": "Exists"})).collect();
        let v = edited(|s| s["requirements"] = json!(many));
        assert_eq!(fields(&v.denials), ["spec.requirements"]);
        assert!(denied(&v, "spec.requirements", "101 requirements, at most 100"), "{v:?}");
        let v = edited(|s| s["requirements"] = json!(many[..100]));
        assert_eq!(v, Verdict::default());
    }

    #[test]
    fn keys_follow_the_schemas_pattern_and_length() {
        let cases = [
            ("", "is empty: name the label to match"),
            ("bad key", "is not a valid label key"),
            ("-team", "is not a valid label key"),
            ("team-", "is not a valid label key"),
            ("Example.com/team", "is not a valid label key"),
            ("example..com/team", "is not a valid label key"),
            ("/team", "is not a valid label key"),
            ("example.com/", "is not a valid label key"),
            ("a/b/c", "is not a valid label key"),
            ("équipe", "is not a valid label key"),
        ];
        for (key, text) in cases {
            let v = edited(|s| s["requirements"] = requirement(key, "Exists", json!([])));
            assert_eq!(fields(&v.denials), ["spec.requirements[0].key"], "{key:?}: {v:?}");
            assert!(denied(&v, "spec.requirements[0].key", text), "{key:?}: {v:?}");
            assert!(denied(&v, "spec.requirements[0].key", "e.g. node.kubernetes.io/instance-type"), "{key:?}");
        }
        // The schema bounds the whole key at 316, not its parts.
        let long = format!("{}/{}", "a".repeat(250), "b".repeat(65));
        assert_eq!(long.len(), 316);
        assert_eq!(edited(|s| s["requirements"] = requirement(&long, "Exists", json!([]))), Verdict::default());
        let v = edited(|s| s["requirements"] = requirement(&format!("{long}b"), "Exists", json!([])));
        assert_eq!(fields(&v.denials), ["spec.requirements[0].key"]);
        assert!(denied(&v, "spec.requirements[0].key", "is longer than 316 characters"), "{v:?}");
        // The index names the requirement.
        let v = edited(|s| {
            s["requirements"] = json!([
                {"key": "team", "operator": "Exists"},
                {"key": "team", "operator": "Exists"},
                {"key": "bad key", "operator": "Exists"}
            ]);
        });
        assert_eq!(fields(&v.denials), ["spec.requirements[2].key"]);
    }

    #[test]
    fn the_hostname_key_is_restricted() {
        let v = edited(|s| s["requirements"] = requirement("kubernetes.io/hostname", "In", json!(["node-1"])));
        assert_eq!(fields(&v.denials), ["spec.requirements[0].key"]);
        assert!(denied(&v, "spec.requirements[0].key", "kubernetes.io/hostname is restricted: no flavor carries it"));
        assert!(denied(&v, "spec.requirements[0].key", "select by node.kubernetes.io/instance-type"), "{v:?}");
    }

    #[test]
    fn operators_take_the_values_they_need() {
        let cases = [
            ("In", json!([]), "operator In needs at least one value"),
            ("NotIn", json!([]), "operator NotIn needs at least one value"),
            ("Exists", json!(["x"]), "operator Exists takes no values: remove them"),
            ("DoesNotExist", json!([""]), "operator DoesNotExist takes no values"),
            ("Gt", json!([]), "operator Gt needs exactly one non-negative integer value"),
            ("Lt", json!(["1", "2"]), "operator Lt needs exactly one"),
            ("Gte", json!(["-1"]), "operator Gte needs exactly one"),
            ("Lte", json!(["four"]), "operator Lte needs exactly one"),
            // Rust's u64 parser takes a sign; the CEL rule does not.
            ("Gt", json!(["+4"]), "digits only"),
            ("Gt", json!(["4.0"]), "digits only"),
            // The CEL rule takes any digits; check_requirements a u64.
            ("Lt", json!(["18446744073709551616"]), "at most 18446744073709551615"),
            ("Gt", json!([""]), "e.g. values: [\"4\"]"),
        ];
        for (op, values, text) in cases {
            let v = edited(|s| {
                s["requirements"] = requirement("karpenter.clever-cloud.com/instance-cpu", op, values.clone())
            });
            assert_eq!(fields(&v.denials), ["spec.requirements[0].values"], "{op} {values}: {v:?}");
            assert!(denied(&v, "spec.requirements[0].values", text), "{op} {values}: {v:?}");
        }
        // `values` may be left out where none is needed.
        let v = edited(|s| s["requirements"] = json!([{"key": "team", "operator": "DoesNotExist"}]));
        assert_eq!(v, Verdict::default());
    }

    #[test]
    fn values_are_label_values_and_at_most_100() {
        let cases = [
            ("a b", "is not a valid label value: it must consist of alphanumerics"),
            ("-xs", "must consist of alphanumerics"),
            ("xs_", "must consist of alphanumerics"),
            (&"x".repeat(64), "must be at most 63 characters (has 64)"),
        ];
        for (value, text) in cases {
            let v =
                edited(|s| s["requirements"] = requirement("clever-cloud.com/flavor", "NotIn", json!(["XS", value])));
            assert_eq!(fields(&v.denials), ["spec.requirements[0].values[1]"], "{value}: {v:?}");
            assert!(denied(&v, "spec.requirements[0].values[1]", text), "{value}: {v:?}");
            assert!(denied(&v, "spec.requirements[0].values[1]", "write the value as the label holds it"), "{v:?}");
        }
        let x63 = "x".repeat(63);
        assert_eq!(
            edited(|s| s["requirements"] = requirement("clever-cloud.com/flavor", "In", json!([x63]))),
            Verdict::default()
        );
        let values: Vec<String> = (0..101).map(|i| format!("v{i}")).collect();
        let v = edited(|s| s["requirements"] = requirement("clever-cloud.com/flavor", "In", json!(values)));
        assert_eq!(fields(&v.denials), ["spec.requirements[0].values"]);
        assert!(denied(&v, "spec.requirements[0].values", "101 values, at most 100"), "{v:?}");
        let v = edited(|s| s["requirements"] = requirement("clever-cloud.com/flavor", "In", json!(values[..100])));
        assert_eq!(v, Verdict::default());
    }

    #[test]
    fn the_weight_is_1_to_10000() {
        for bad in [0, -1, 10_001, i32::MIN, i32::MAX] {
            let v = edited(|s| s["weight"] = json!(bad));
            assert_eq!(fields(&v.denials), ["spec.weight"], "{bad}");
            assert!(denied(&v, "spec.weight", "is out of range: give 1 to 10000"), "{v:?}");
            assert!(denied(&v, "spec.weight", "or remove the field"), "{v:?}");
        }
    }

    /// Whatever the hub refuses as `Invalid` (price_change, check_requirements), the webhook denies.
    #[test]
    fn everything_the_hubs_checks_refuse_is_denied() {
        let prices = [None, Some("0.05"), Some("0"), Some("-1"), Some(".5"), Some("5.")];
        let adjustments = [None, Some("-10%"), Some("-100%"), Some("-100.0%"), Some("+5."), Some("-101%"), Some("7")];
        let requirements = [
            json!([]),
            requirement("team", "In", json!([])),
            requirement("team", "Exists", json!(["a"])),
            requirement("n", "Gt", json!(["+4"])),
            requirement("n", "Gt", json!(["99999999999999999999"])),
            requirement("kubernetes.io/hostname", "Exists", json!([])),
            requirement("team", "In", json!(["web"])),
        ];
        let capacities =
            [None, Some(json!({"nvidia.com/gpu": 1})), Some(json!({"cpu": 1})), Some(json!({"x.io/y": "1.5"}))];
        for (price, adjustment, capacity) in prices
            .iter()
            .flat_map(|p| adjustments.iter().map(move |a| (p, a)))
            .flat_map(|(p, a)| capacities.iter().map(move |c| (p, a, c)))
        {
            {
                for reqs in &requirements {
                    let mut spec = json!({"requirements": reqs});
                    if let Some(c) = capacity {
                        spec["capacity"] = c.clone();
                    }
                    if let Some(p) = price {
                        spec["price"] = json!(p);
                    }
                    if let Some(a) = adjustment {
                        spec["priceAdjustment"] = json!(a);
                    }
                    let o = overlay(spec.clone());
                    let hub = o.spec.check();
                    let v = validate_node_overlay(&o, None);
                    if hub.is_err() {
                        assert!(!v.is_allowed(), "{spec}: the hub refuses ({hub:?}) but the webhook allows");
                    }
                }
            }
        }
    }

    #[test]
    fn hostile_values_are_not_echoed_whole() {
        let long = "9".repeat(10_000);
        let v = edited(|s| {
            s["price"] = json!(long);
            s["priceAdjustment"] = json!(long);
            s["requirements"] = json!([
                {"key": "k ".repeat(5_000), "operator": "In", "values": [long, "a b".repeat(5_000)]},
                {"key": "n", "operator": "Gt", "values": [long]},
            ]);
        });
        assert_eq!(v.denials.len(), 7, "{v:?}");
        for d in &v.denials {
            assert!(d.field.len() < 150 && d.message.len() < 600, "{d:?}");
        }
        // A flood of bad values stays within the verdict's cap.
        let values: Vec<String> = (0..10_000).map(|i| format!("-{i}")).collect();
        let v = edited(|s| s["requirements"] = requirement("team", "In", json!(values)));
        assert_eq!(v.denials.len(), MAX_DENIALS);
        assert!(v.denial_message().unwrap().ends_with("more problems"), "{v:?}");
    }
}
