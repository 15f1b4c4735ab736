//! Admission of a `CleverOrganization` (fleet.md §4, §5): the quota in Clever Cloud's own units
//! (whole vCPUs, decimal gigabytes of nominal flavor size), the cost ceiling as decimal EUR, and the
//! selectors of the registered clusters it spans.

use crate::admission::{Verdict, shorten};
use crate::labels::PRICE_PER_HOUR;
use crate::organization::{CleverOrganization, OrganizationQuota};
use crate::quantity::{Quantity, QuantityError, parse_quantity};
use crate::selector::ClusterSelector;

/// Nodes of the control plane of one CKE cluster, all of flavor [`CONTROL_PLANE_FLAVOR`]; they count
/// against the organisation's quota like any node.
const CONTROL_PLANE_NODES: i64 = 2;
/// Flavor of the control-plane nodes.
const CONTROL_PLANE_FLAVOR: &str = "S";
/// vCPUs of one control-plane node (`S`).
const CONTROL_PLANE_NODE_CPU: i64 = 8;
/// Nominal GB of one control-plane node (`S`).
const CONTROL_PLANE_NODE_GB: i64 = 12;
/// Millicores the control plane of a single cluster takes: 16 vCPU.
const CONTROL_PLANE_CPU_MILLIS: i64 = CONTROL_PLANE_NODES * CONTROL_PLANE_NODE_CPU * 1000;
/// Bytes the control plane of a single cluster counts: 24 GB.
const CONTROL_PLANE_MEMORY_BYTES: i64 = CONTROL_PLANE_NODES * CONTROL_PLANE_NODE_GB * 1_000_000_000;

/// What a price ceiling may be, for the denials.
const PRICE_FORM: &str = "write EUR per hour as a decimal number, digits with an optional point and at most 6 \
                          decimals, e.g. \"2.5\", \"12\" or \"0.0611\"";
/// The one key `spec.limits` takes and what it means.
const LIMITS_FORM: &str = "spec.limits takes only karpenter.clever-cloud.com/price-per-hour (EUR per hour across the \
                           organisation's clusters)";

/// Validates a `CleverOrganization` (create or update; the old object changes nothing today).
///
/// Denied: a spec with neither a quota nor a cost ceiling (an empty `quota: {}` or `limits: {}`
/// counts as absent), quota values that are not non-negative quantities, `spec.limits` keys other
/// than the price ceiling, a price that is not decimal EUR (digits, optional point, at most 6
/// decimals), and selector terms the CRD refuses. Warned: a memory quota with a binary suffix
/// (`40Gi`: Clever Cloud counts decimal GB), a fractional vCPU quota, a quota below what one
/// cluster's control plane takes (16 vCPU / 24 GB), a ceiling of 0, and a selector matching every
/// registered cluster of every namespace.
pub fn validate_organization(new: &CleverOrganization, _old: Option<&CleverOrganization>) -> Verdict {
    let mut verdict = Verdict::default();
    let spec = &new.spec;
    let has_quota = spec.quota.as_ref().is_some_and(|q| q.cpu.is_some() || q.memory.is_some());
    let has_limits = spec.limits.as_ref().is_some_and(|l| !l.is_empty());
    if !has_quota && !has_limits {
        let empty = if spec.quota.is_some() || spec.limits.is_some() {
            " (an empty spec.quota or spec.limits counts as absent)"
        } else {
            ""
        };
        verdict.deny(
            "spec",
            format!(
                "set spec.quota (the organisation's vCPU and memory quota, e.g. quota: {{cpu: \"40\", memory: 40G}}) or \
                 spec.limits (its cost ceiling, karpenter.clever-cloud.com/price-per-hour), or both: an organisation \
                 with neither limits nothing{empty}"
            ),
        );
    }
    check_selectors(&mut verdict, &spec.cluster_selector, spec.namespace_selector.as_ref());
    if let Some(quota) = &spec.quota {
        check_quota(&mut verdict, quota);
    }
    for (key, value) in spec.limits.iter().flatten() {
        let field = format!("spec.limits[{}]", bounded(key));
        if key != PRICE_PER_HOUR {
            let hint = match key.as_str() {
                "cpu" | "memory" => format!("move it to spec.quota.{key}"),
                _ => "resource quotas go in spec.quota (cpu, memory)".to_string(),
            };
            verdict.deny(field, format!("{LIMITS_FORM}; {hint}"));
            continue;
        }
        match parse_price_micros(&value.0) {
            Err(problem) => verdict.deny(field, problem.to_string()),
            Ok(0) => verdict.warn(field, "a price ceiling of 0 lets the organisation's clusters launch no node"),
            Ok(_) => {}
        }
    }
    verdict
}

/// The selectors' terms (as a NodePool's `clusterSelector`), and a selection of everything.
fn check_selectors(verdict: &mut Verdict, clusters: &ClusterSelector, namespaces: Option<&ClusterSelector>) {
    if let Some((path, why)) = clusters.problem() {
        verdict.deny(format!("spec.clusterSelector.{path}"), why);
    }
    if let Some((path, why)) = namespaces.and_then(ClusterSelector::problem) {
        verdict.deny(format!("spec.namespaceSelector.{path}"), why);
    }
    let everything = ClusterSelector::default();
    if *clusters == everything && namespaces.is_none_or(|n| *n == everything) {
        verdict.warn(
            "spec.clusterSelector",
            "{} without a narrowing namespaceSelector selects every registered cluster of every namespace: all of them \
             count against this organisation's quota and ceiling; select the organisation's clusters by label, e.g. \
             matchLabels: {clever-cloud.com/organisation: orga-acme}",
        );
    }
}

fn check_quota(verdict: &mut Verdict, quota: &OrganizationQuota) {
    if let Some(text) = &quota.cpu {
        let field = "spec.quota.cpu";
        let form = "write a number of vCPUs, e.g. \"40\"";
        if let Some(cpu) = quota_quantity(verdict, field, text, form) {
            let millis = cpu.as_millis();
            // (A saturated value is not a fraction.)
            if millis % 1000 != 0 && millis != i64::MAX {
                verdict.warn(
                    field,
                    format!(
                        "{} is not a whole number of vCPUs: Clever Cloud counts whole vCPUs (every flavor has a whole \
                         number), so it acts as {}; write \"{}\"",
                        shorten(text),
                        millis / 1000,
                        millis / 1000
                    ),
                );
            }
            if millis < CONTROL_PLANE_CPU_MILLIS {
                verdict.warn(
                    field,
                    format!(
                        "{} is below {} vCPU, what the control plane of a single CKE cluster already takes ({} \
                         {CONTROL_PLANE_FLAVOR} nodes of {CONTROL_PLANE_NODE_CPU} vCPU): the organisation's clusters \
                         could launch no worker node; give the organisation's quota as Clever Cloud enforces it",
                        shorten(text),
                        CONTROL_PLANE_CPU_MILLIS / 1000,
                        CONTROL_PLANE_NODES
                    ),
                );
            }
        }
    }
    if let Some(text) = &quota.memory {
        let field = "spec.quota.memory";
        let form = "write bytes with a decimal suffix (k M G T P E), e.g. 40G for forty gigabytes, as Clever Cloud \
                    counts them";
        if let Some(memory) = quota_quantity(verdict, field, text, form) {
            let bytes = memory.as_units();
            let trimmed = text.trim();
            if let Some((number, decimal)) = binary_suffix_mistake(trimmed) {
                verdict.warn(
                    field,
                    format!(
                        "{} is {}: Clever Cloud counts memory in decimal GB (an XS counts 8G, 8 x 10^9 bytes), so a \
                         binary suffix sets a quota above the platform's; write {number}{decimal} for {number} {decimal}B \
                         as Clever Cloud counts it",
                        shorten(trimmed),
                        decimal_size(bytes)
                    ),
                );
            }
            if bytes < CONTROL_PLANE_MEMORY_BYTES {
                let unitless = if trimmed.bytes().all(|b| b.is_ascii_digit() || b == b'.' || b == b'+') {
                    " (a number without a unit is bytes: write 40G for forty gigabytes)"
                } else {
                    ""
                };
                verdict.warn(
                    field,
                    format!(
                        "{} is below {}G, what the control plane of a single CKE cluster already counts ({} \
                         {CONTROL_PLANE_FLAVOR} nodes of {CONTROL_PLANE_NODE_GB}G): the organisation's clusters could \
                         launch no worker node{unitless}",
                        shorten(text),
                        CONTROL_PLANE_MEMORY_BYTES / 1_000_000_000,
                        CONTROL_PLANE_NODES
                    ),
                );
            }
        }
    }
}

/// A quota value as a non-negative quantity, or a denial naming `field` (and `None`). The parser's
/// own messages quote the whole value; these quote it shortened.
fn quota_quantity(verdict: &mut Verdict, field: &str, text: &str, form: &str) -> Option<Quantity> {
    let problem = match parse_quantity(text.trim()) {
        Ok(q) if q.is_negative() => format!("{} is negative: a quota is at least 0", shorten(text)),
        Ok(q) => return Some(q),
        Err(QuantityError::Empty) => "is empty".to_string(),
        Err(QuantityError::UnknownSuffix { suffix, .. }) => format!(
            "{} is not a quantity: unknown suffix {} (suffixes are case-sensitive)",
            shorten(text),
            shorten(&suffix)
        ),
        Err(QuantityError::ExponentOutOfRange { .. }) => {
            format!("{} is not a quantity: exponent out of range", shorten(text))
        }
        Err(_) => format!("{} is not a quantity: the number has no digits", shorten(text)),
    };
    verdict.deny(field, format!("{problem}; {form}"));
    None
}

/// `40Gi` → `Some(("40", "G"))`: the number and the decimal suffix, when a binary one was given.
fn binary_suffix_mistake(text: &str) -> Option<(&str, &'static str)> {
    [("Ki", "k"), ("Mi", "M"), ("Gi", "G"), ("Ti", "T"), ("Pi", "P"), ("Ei", "E")]
        .into_iter()
        .find_map(|(binary, decimal)| text.strip_suffix(binary).map(|number| (number, decimal)))
}

/// Bytes in decimal units, two decimals at most: `42949672960` → `42.95G`.
fn decimal_size(bytes: i64) -> String {
    const UNITS: [(i128, &str); 6] = [
        (1_000_000_000_000_000_000, "E"),
        (1_000_000_000_000_000, "P"),
        (1_000_000_000_000, "T"),
        (1_000_000_000, "G"),
        (1_000_000, "M"),
        (1_000, "k"),
    ];
    let bytes = i128::from(bytes);
    for (unit, suffix) in UNITS {
        if bytes >= unit {
            let hundredths = (bytes * 100 + unit / 2) / unit;
            let text = format!("{}.{:02}", hundredths / 100, hundredths % 100);
            return format!("{}{suffix}", text.trim_end_matches('0').trim_end_matches('.'));
        }
    }
    format!("{bytes} bytes")
}

/// A map key for a field path, cut when it is too long to echo.
fn bounded(key: &str) -> String {
    if key.chars().count() <= 80 { key.to_string() } else { shorten(key) }
}

/// An organisation's price ceiling the webhook refuses: the value (shortened: it is echoed) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", price_problem(.shown, .error))]
pub(crate) struct PriceProblem {
    shown: String,
    error: crate::quantity::PriceError,
}

fn price_problem(shown: &str, error: &crate::quantity::PriceError) -> String {
    use crate::quantity::PriceError;
    match error {
        PriceError::Negative(_) => format!("{shown} is negative: a price ceiling is at least 0; {PRICE_FORM}"),
        PriceError::TooPrecise(_) => format!("{shown} has more than 6 decimals: {PRICE_FORM}"),
        PriceError::TooLarge(_) => format!("{shown} is too large: {PRICE_FORM}"),
        PriceError::NotDecimal(_) => {
            format!("{shown} is not a decimal number (no exponent, sign or unit suffix): {PRICE_FORM}")
        }
    }
}

/// A decimal EUR string (`"2.5"`, `"12"`, `"0.0611"`, `".5"`) as micro-EUR, read by the one parser
/// the hub and the scheduler use ([`crate::quantity::parse_price_micros`]); the problem otherwise,
/// with the value shortened and the accepted form.
pub(crate) fn parse_price_micros(text: &str) -> Result<i64, PriceProblem> {
    crate::quantity::parse_price_micros(text).map_err(|error| PriceProblem { shown: shorten(text), error })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::admission::verdict_checks::{denied, fields, warned};
    use crate::catalog::builtin;
    use serde_json::{Value, json};

    fn org(spec: Value) -> CleverOrganization {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1",
            "kind": "CleverOrganization",
            "metadata": {"name": "orga-acme"},
            "spec": spec
        }))
        .unwrap()
    }

    /// The spec's example (fleet.md §4) with `edit` applied.
    fn edited(edit: impl FnOnce(&mut Value)) -> Verdict {
        let mut spec = json!({
            "clusterSelector": {"matchLabels": {"clever-cloud.com/organisation": "orga-acme"}},
            "quota": {"cpu": "40", "memory": "40G"}
        });
        edit(&mut spec);
        validate_organization(&org(spec), None)
    }

    #[test]
    fn the_documented_example_is_allowed_without_warnings() {
        assert_eq!(edited(|_| {}), Verdict::default());
        let v = edited(|s| {
            s["namespaceSelector"] = json!({});
            s["limits"] = json!({"karpenter.clever-cloud.com/price-per-hour": "2.5"});
        });
        assert_eq!(v, Verdict::default());
        // A ceiling alone, a quota of one resource alone.
        assert!(edited(|s| s["quota"] = json!({"memory": "40G"})).is_allowed());
        let v = edited(|s| {
            s.as_object_mut().unwrap().remove("quota");
            s["limits"] = json!({"karpenter.clever-cloud.com/price-per-hour": 12});
        });
        assert_eq!(v, Verdict::default());
    }

    #[test]
    fn neither_quota_nor_limits_is_denied_as_the_cel_rule_does() {
        let v = edited(|s| {
            s.as_object_mut().unwrap().remove("quota");
        });
        assert_eq!(fields(&v.denials), ["spec"]);
        assert!(denied(&v, "spec", "set spec.quota"), "{v:?}");
        assert!(denied(&v, "spec", "an organisation with neither limits nothing"), "{v:?}");
        // Empty maps limit nothing either (the CEL rule's has() lets them through).
        for spec in [json!({"quota": {}}), json!({"limits": {}}), json!({"quota": {}, "limits": {}})] {
            let v = edited(|s| {
                s.as_object_mut().unwrap().remove("quota");
                s.as_object_mut().unwrap().extend(spec.as_object().unwrap().clone());
            });
            assert!(denied(&v, "spec", "counts as absent"), "{spec}: {v:?}");
        }
    }

    #[test]
    fn quota_values_must_be_non_negative_quantities() {
        let cases = [
            (json!({"cpu": "forty"}), "spec.quota.cpu", "\"forty\" is not a quantity: the number has no digits"),
            (json!({"cpu": "4O"}), "spec.quota.cpu", "unknown suffix \"O\" (suffixes are case-sensitive)"),
            (json!({"cpu": "1e99999999999"}), "spec.quota.cpu", "exponent out of range"),
            (json!({"cpu": "forty"}), "spec.quota.cpu", "write a number of vCPUs, e.g. \"40\""),
            (json!({"cpu": "-4"}), "spec.quota.cpu", "\"-4\" is negative: a quota is at least 0"),
            (json!({"cpu": ""}), "spec.quota.cpu", "is empty"),
            (json!({"memory": "40GB"}), "spec.quota.memory", "unknown suffix \"GB\""),
            (json!({"memory": "40GB"}), "spec.quota.memory", "e.g. 40G for forty gigabytes"),
            (json!({"memory": "40 G"}), "spec.quota.memory", "unknown suffix \" G\""),
            (json!({"memory": "-1G"}), "spec.quota.memory", "is negative"),
        ];
        for (quota, field, text) in cases {
            let v = edited(|s| s["quota"] = quota.clone());
            assert!(denied(&v, field, text), "{quota}: {v:?}");
            assert_eq!(v.denials.len(), 1, "{quota}: {v:?}");
        }
        // Both are reported at once.
        let v = edited(|s| s["quota"] = json!({"cpu": "x", "memory": "y"}));
        assert_eq!(fields(&v.denials), ["spec.quota.cpu", "spec.quota.memory"]);
        // Every quantity form is accepted.
        for quota in [json!({"cpu": "+40", "memory": "4e10"}), json!({"cpu": "0.04k", "memory": "40000M"})] {
            let v = edited(|s| s["quota"] = quota.clone());
            assert_eq!(v, Verdict::default(), "{quota}");
        }
    }

    #[test]
    fn a_binary_memory_suffix_is_warned_with_its_decimal_size() {
        let v = edited(|s| s["quota"]["memory"] = json!("40Gi"));
        assert!(v.is_allowed());
        assert_eq!(fields(&v.warnings), ["spec.quota.memory"]);
        let w = &v.warnings[0].message;
        assert!(w.starts_with("\"40Gi\" is 42.95G: Clever Cloud counts memory in decimal GB"), "{w}");
        assert!(w.contains("write 40G for 40 GB as Clever Cloud counts it"), "{w}");
        let v = edited(|s| s["quota"]["memory"] = json!("40960Mi"));
        assert!(warned(&v, "spec.quota.memory", "\"40960Mi\" is 42.95G") && warned(&v, "spec.quota.memory", "40960M"));
        let v = edited(|s| s["quota"]["memory"] = json!("1Ti"));
        assert!(warned(&v, "spec.quota.memory", "is 1.1T:"), "{v:?}");
        assert!(warned(&v, "spec.quota.memory", "write 1T"), "{v:?}");
        let v = edited(|s| s["quota"]["memory"] = json!("41943040Ki"));
        assert!(warned(&v, "spec.quota.memory", "write 41943040k for 41943040 kB"), "{v:?}");
    }

    #[test]
    fn a_fractional_cpu_is_warned_clever_cloud_counts_whole_vcpus() {
        for (cpu, acts) in [("40.5", "acts as 40; write \"40\""), ("40500m", "acts as 40"), ("16001m", "write \"16\"")]
        {
            let v = edited(|s| s["quota"]["cpu"] = json!(cpu));
            assert!(v.is_allowed());
            assert_eq!(fields(&v.warnings), ["spec.quota.cpu"], "{cpu}");
            assert!(warned(&v, "spec.quota.cpu", "Clever Cloud counts whole vCPUs"), "{cpu}: {v:?}");
            assert!(warned(&v, "spec.quota.cpu", acts), "{cpu}: {v:?}");
        }
        assert!(edited(|s| s["quota"]["cpu"] = json!("40000m")).warnings.is_empty());
    }

    #[test]
    fn a_quota_below_one_control_plane_is_warned() {
        // The numbers are two S nodes of the built-in catalogue.
        let s = builtin(CONTROL_PLANE_FLAVOR).unwrap();
        assert_eq!((s.cpu, s.nominal_gb), (CONTROL_PLANE_NODE_CPU, CONTROL_PLANE_NODE_GB));

        let v = edited(|s| s["quota"] = json!({"cpu": "15", "memory": "23G"}));
        assert!(v.is_allowed());
        assert_eq!(fields(&v.warnings), ["spec.quota.cpu", "spec.quota.memory"]);
        assert!(warned(&v, "spec.quota.cpu", "below 16 vCPU, what the control plane of a single CKE cluster"), "{v:?}");
        assert!(warned(&v, "spec.quota.cpu", "2 S nodes of 8 vCPU"), "{v:?}");
        assert!(warned(&v, "spec.quota.memory", "below 24G"), "{v:?}");
        assert!(warned(&v, "spec.quota.memory", "2 S nodes of 12G"), "{v:?}");
        assert!(!warned(&v, "spec.quota.memory", "without a unit"), "{v:?}");
        // Exactly one control plane is quiet; a unitless memory is bytes, and said so.
        assert!(edited(|s| s["quota"] = json!({"cpu": "16", "memory": "24G"})).warnings.is_empty());
        let v = edited(|s| s["quota"]["memory"] = json!("40"));
        assert!(warned(&v, "spec.quota.memory", "a number without a unit is bytes: write 40G"), "{v:?}");
        let v = edited(|s| s["quota"]["cpu"] = json!("0"));
        assert!(warned(&v, "spec.quota.cpu", "could launch no worker node"), "{v:?}");
    }

    #[test]
    fn limits_take_only_the_price_ceiling() {
        let v = edited(|s| s["limits"] = json!({"cpu": "100", "nodes": "10"}));
        assert_eq!(fields(&v.denials), ["spec.limits[cpu]", "spec.limits[nodes]"]);
        assert!(denied(&v, "spec.limits[cpu]", "takes only karpenter.clever-cloud.com/price-per-hour"), "{v:?}");
        assert!(denied(&v, "spec.limits[cpu]", "move it to spec.quota.cpu"), "{v:?}");
        assert!(denied(&v, "spec.limits[nodes]", "resource quotas go in spec.quota"), "{v:?}");
        // Another key beside the ceiling still limits something, but is refused.
        let v = edited(|s| {
            s.as_object_mut().unwrap().remove("quota");
            s["limits"] = json!({"memory": "40G", "karpenter.clever-cloud.com/price-per-hour": "1"});
        });
        assert_eq!(fields(&v.denials), ["spec.limits[memory]"]);
    }

    #[test]
    fn the_price_ceiling_is_decimal_euros() {
        let key = PRICE_PER_HOUR;
        let field = format!("spec.limits[{key}]");
        for ok in ["2.5", "12", "0.0611", ".5", "3.", "0.000001", "999999999.999999"] {
            let v = edited(|s| s["limits"] = json!({key: ok}));
            assert_eq!(v, Verdict::default(), "{ok}");
        }
        let cases = [
            ("1e3", "is not a decimal number (no exponent, sign or unit suffix)"),
            ("5Gi", "is not a decimal number"),
            ("2k", "is not a decimal number"),
            ("+2", "is not a decimal number"),
            ("-1", "is negative"),
            ("0.1234567", "more than 6 decimals"),
            ("10000000000000", "too large"),
            (".", "is not a decimal number"),
        ];
        for (bad, text) in cases {
            let v = edited(|s| s["limits"] = json!({key: bad}));
            assert!(denied(&v, &field, text), "{bad}: {v:?}");
            assert!(denied(&v, &field, "digits with an optional point and at most 6 decimals, e.g. \"2.5\""), "{v:?}");
        }
        let v = edited(|s| s["limits"] = json!({key: "0"}));
        assert!(v.is_allowed() && warned(&v, &field, "launch no node"), "{v:?}");
        // The micro-EUR value, as the hub reads it.
        assert_eq!(parse_price_micros("2.5"), Ok(2_500_000));
        assert_eq!(parse_price_micros(" 0.0611 "), Ok(61_100));
        assert_eq!(parse_price_micros(".5"), Ok(500_000));
    }

    #[test]
    fn selectors_are_checked_as_a_node_pools_cluster_selector() {
        let v = edited(|s| {
            s["clusterSelector"] = json!({"matchExpressions": [{"key": "env", "operator": "In"}]});
            s["namespaceSelector"] = json!({"matchLabels": {"bad key": "x"}});
        });
        assert_eq!(
            fields(&v.denials),
            ["spec.clusterSelector.matchExpressions[0].values", "spec.namespaceSelector.matchLabels[\"bad key\"]"]
        );
        assert!(denied(&v, "spec.clusterSelector.matchExpressions[0].values", "operator In needs at least one value"));
        assert!(denied(&v, "spec.namespaceSelector.matchLabels[\"bad key\"]", "is not a valid label key"));
        let v = edited(|s| {
            s["clusterSelector"] = json!({"matchExpressions": [{"key": "env", "operator": "Exists", "values": ["a"]}]})
        });
        assert!(denied(&v, "spec.clusterSelector.matchExpressions[0].values", "takes no values: remove them"), "{v:?}");
    }

    #[test]
    fn a_selector_of_everything_is_warned() {
        for namespaces in [None, Some(json!({}))] {
            let v = edited(|s| {
                s["clusterSelector"] = json!({});
                if let Some(n) = &namespaces {
                    s["namespaceSelector"] = n.clone();
                }
            });
            assert!(v.is_allowed());
            assert_eq!(fields(&v.warnings), ["spec.clusterSelector"], "{namespaces:?}");
            assert!(warned(&v, "spec.clusterSelector", "selects every registered cluster of every namespace"));
        }
        // Narrowed by either selector: quiet.
        let v = edited(|s| {
            s["clusterSelector"] = json!({});
            s["namespaceSelector"] = json!({"matchLabels": {"team": "platform"}});
        });
        assert!(v.warnings.is_empty(), "{v:?}");
    }

    #[test]
    fn hostile_values_are_not_echoed_whole() {
        let long = "9".repeat(10_000);
        let v = edited(|s| {
            s["quota"]["cpu"] = json!(format!("{long}x"));
            s["limits"] = json!({"k ".repeat(5_000): "1", PRICE_PER_HOUR: format!("{long}x")});
        });
        assert_eq!(v.denials.len(), 3, "{v:?}");
        for d in &v.denials {
            assert!(d.field.len() < 150 && d.message.len() < 1200, "{d:?}");
        }
        // Huge but valid quantities saturate instead of overflowing.
        let v = edited(|s| s["quota"] = json!({"cpu": format!("{long}"), "memory": "9E"}));
        assert_eq!(v, Verdict::default());
    }
}
