//! Admission of a `CapacityBuffer`: the schema and CEL rules of the type repeated (one cluster or a
//! selection, a count or limits, the bounds, the one strategy, the PodTemplate's name, the limits'
//! quantities), and warnings for a buffer that keeps no room or whose limits may bound nothing.
//! The PodTemplate is not read: whether it exists and what its pods request is the hub's to report
//! (the `ReadyForProvisioning` condition), not a reason to refuse the buffer.

use crate::admission::{Verdict, check_cluster_target, shorten};
use crate::capacitybuffer::{ACTIVE_CAPACITY, CapacityBuffer};
use crate::quantity::{CPU, MEMORY, PODS, parse_quantity};
use crate::validation::dns1123_subdomain;

/// Most buffer pods per cluster (the schema's maximum of `spec.replicas`).
const MAX_REPLICAS: i32 = 10_000;
/// Most keys of `spec.limits` (the schema's `maxProperties`).
const MAX_LIMITS: usize = 32;
/// Longest quantity text in `spec.limits` (the schema's `maxLength`).
const MAX_QUANTITY_CHARS: usize = 64;
/// Longest map key echoed whole in a field path.
const MAX_KEY_CHARS: usize = 80;

/// Validates a `CapacityBuffer` (create or update; the old object changes nothing today: the type has
/// no immutable field).
///
/// Denied: both or neither of `clusterName` and `clusterSelector`; a `clusterName` that is not a DNS
/// label; `clusterSelector` terms a label selector refuses; neither `replicas` nor `limits` (an
/// empty `limits: {}` counts as absent); `replicas` outside 0–10000; a `provisioningStrategy` other
/// than `buffer.x-k8s.io/active-capacity`; a `podTemplateRef.name` that is not a DNS subdomain;
/// `limits` with more than 32 keys, or values that are not quantities, longer than 64 characters,
/// or negative. Warned: `replicas: 0` (the buffer keeps no room), and `limits` naming none of
/// `cpu`, `memory` and `pods` (only what a buffer pod requests bounds the count).
pub fn validate_capacity_buffer(new: &CapacityBuffer, _old: Option<&CapacityBuffer>) -> Verdict {
    let mut verdict = Verdict::default();
    let spec = &new.spec;
    check_cluster_target(
        &mut verdict,
        spec.cluster_name.as_ref(),
        spec.cluster_selector.as_ref(),
        (
            "a buffer in one cluster",
            "a buffer in every registered cluster of the namespace whose labels match",
            "this buffer",
        ),
    );

    let has_limits = spec.limits.as_ref().is_some_and(|l| !l.is_empty());
    if spec.replicas.is_none() && !has_limits {
        let empty =
            if spec.limits.is_some() { " (an empty spec.limits counts as absent: it bounds nothing)" } else { "" };
        verdict.deny(
            "spec",
            format!(
                "set spec.replicas (how many buffer pods per cluster, e.g. replicas: 3), spec.limits (as many pods as \
                 fit in these resources, e.g. limits: {{cpu: \"8\"}}), or both (the smaller count){empty}"
            ),
        );
    }
    match spec.replicas {
        Some(replicas) if !(0..=MAX_REPLICAS).contains(&replicas) => verdict.deny(
            "spec.replicas",
            format!("{replicas} is out of range: give 0 to {MAX_REPLICAS} buffer pods per cluster"),
        ),
        Some(0) => verdict.warn(
            "spec.replicas",
            "0 keeps room for no pod: the buffer provisions nothing (with limits too, the smaller count wins); set the \
             number of pods to keep room for, or delete the buffer",
        ),
        _ => {}
    }

    if spec.provisioning_strategy != ACTIVE_CAPACITY {
        verdict.deny(
            "spec.provisioningStrategy",
            format!(
                "{} is not supported: the only strategy is {ACTIVE_CAPACITY} (room kept as running nodes); set it or \
                 remove the field",
                shorten(&spec.provisioning_strategy)
            ),
        );
    }

    let template = &spec.pod_template_ref.name;
    let template_problem = if template.is_empty() {
        Some("is empty".to_string())
    } else {
        dns1123_subdomain(template)
            .err()
            .map(|reason| format!("{} is not a valid name: it {reason}", shorten(template)))
    };
    if let Some(problem) = template_problem {
        verdict.deny(
            "spec.podTemplateRef.name",
            format!("{problem}; name a PodTemplate of this namespace (a DNS subdomain of 1 to 253 characters), e.g. web-burst"),
        );
    }

    if let Some(limits) = &spec.limits {
        check_limits(&mut verdict, limits, spec.replicas.is_some());
    }
    verdict
}

/// The limits' count and quantities (the schema's and CEL's rules), and whether one may bound the
/// buffer at all.
fn check_limits(verdict: &mut Verdict, limits: &crate::common::ResourceMap, has_replicas: bool) {
    if limits.len() > MAX_LIMITS {
        verdict.deny(
            "spec.limits",
            format!(
                "{} resources listed, at most {MAX_LIMITS}: keep the resources one buffer pod requests (cpu, memory, \
                 pods, ...)",
                limits.len()
            ),
        );
    }
    for (name, quantity) in limits {
        let field = format!("spec.limits[{}]", bounded(name));
        let text = &quantity.0;
        if text.chars().count() > MAX_QUANTITY_CHARS {
            verdict.deny(
                field,
                format!(
                    "{} is longer than {MAX_QUANTITY_CHARS} characters: write the quantity with a suffix, e.g. 64Gi or \
                     1e12",
                    shorten(text)
                ),
            );
            continue;
        }
        match parse_quantity(text) {
            Err(problem) => verdict.deny(field, problem.to_string()),
            Ok(q) if q.is_negative() => {
                verdict.deny(field, format!("{} is negative: limits are at least 0; remove the sign", shorten(text)))
            }
            Ok(_) => {}
        }
    }
    // (Empty limits without replicas are denied already.)
    let bounding = [CPU, MEMORY, PODS].iter().any(|key| limits.contains_key(*key));
    if !bounding && (has_replicas || !limits.is_empty()) {
        let bound = if has_replicas {
            "the buffer is then bounded by spec.replicas alone"
        } else {
            "the buffer's size may then be bounded by nothing"
        };
        verdict.warn(
            "spec.limits",
            format!(
                "names none of cpu, memory and pods: a limit bounds the buffer only through a resource one buffer pod \
                 requests (pods: one per pod), and pods seldom request the others, so {bound}; add cpu, memory or \
                 pods, e.g. pods: \"10\""
            ),
        );
    }
}

/// A map key for a field path, cut when it is too long to echo.
fn bounded(key: &str) -> String {
    if key.chars().count() <= MAX_KEY_CHARS { key.to_string() } else { shorten(key) }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::admission::verdict_checks::{denied, fields, warned};
    use serde_json::{Value, json};

    fn buffer(spec: Value) -> CapacityBuffer {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1",
            "kind": "CapacityBuffer",
            "metadata": {"name": "web-burst", "namespace": "team-a"},
            "spec": spec
        }))
        .unwrap()
    }

    /// A valid buffer with `edit` applied to its spec.
    fn edited(edit: impl FnOnce(&mut Value)) -> Verdict {
        let mut spec = json!({
            "clusterName": "prod-paris",
            "podTemplateRef": {"name": "web-burst"},
            "replicas": 3
        });
        edit(&mut spec);
        validate_capacity_buffer(&buffer(spec), None)
    }

    fn remove(spec: &mut Value, key: &str) {
        spec.as_object_mut().unwrap().remove(key);
    }

    #[test]
    fn a_valid_buffer_is_allowed_without_warnings() {
        assert_eq!(edited(|_| {}), Verdict::default());
        // The strategy spelled out, on update too.
        let spec = json!({"clusterName": "prod-paris", "podTemplateRef": {"name": "web.burst-1"}, "replicas": 10000,
                          "provisioningStrategy": "buffer.x-k8s.io/active-capacity"});
        assert_eq!(validate_capacity_buffer(&buffer(spec.clone()), Some(&buffer(spec))), Verdict::default());
        // A fleet buffer bounded by limits only; every quantity form.
        let v = edited(|s| {
            remove(s, "clusterName");
            remove(s, "replicas");
            s["clusterSelector"] = json!({"matchLabels": {"env": "prod"}});
            s["limits"] = json!({"cpu": "8", "memory": "16Gi", "pods": 20, "ephemeral-storage": "1e11"});
        });
        assert_eq!(v, Verdict::default());
        // `{}` selects every registered cluster of the namespace: legal, quiet.
        let v = edited(|s| {
            remove(s, "clusterName");
            s["clusterSelector"] = json!({});
        });
        assert_eq!(v, Verdict::default());
        // Both replicas and limits (the smaller count).
        assert_eq!(edited(|s| s["limits"] = json!({"memory": "+4G"})), Verdict::default());
    }

    #[test]
    fn exactly_one_of_cluster_name_and_cluster_selector() {
        let v = edited(|s| s["clusterSelector"] = json!({"matchLabels": {"env": "prod"}}));
        assert_eq!(fields(&v.denials), ["spec"]);
        assert!(denied(&v, "spec", "clusterName and clusterSelector are both set"), "{v:?}");
        let v = edited(|s| remove(s, "clusterName"));
        assert_eq!(fields(&v.denials), ["spec"]);
        assert!(denied(&v, "spec", "neither clusterName nor clusterSelector is set"), "{v:?}");
        assert!(denied(&v, "spec", "clusterName: prod-paris"), "{v:?}");
    }

    #[test]
    fn the_cluster_name_is_a_dns_label() {
        for bad in ["Prod_Paris", "", "-prod", &"a".repeat(64)] {
            let v = edited(|s| s["clusterName"] = json!(bad));
            assert_eq!(fields(&v.denials), ["spec.clusterName"], "{bad}");
            assert!(denied(&v, "spec.clusterName", "is not a valid cluster name"), "{bad}: {v:?}");
            assert!(denied(&v, "spec.clusterName", "<clusterName>-kubeconfig"), "{bad}: {v:?}");
        }
    }

    #[test]
    fn cluster_selector_terms_are_checked_as_a_node_pools() {
        let v = edited(|s| {
            remove(s, "clusterName");
            s["clusterSelector"] = json!({"matchExpressions": [{"key": "env", "operator": "In"}]});
        });
        assert_eq!(fields(&v.denials), ["spec.clusterSelector.matchExpressions[0].values"]);
        assert!(denied(&v, "spec.clusterSelector.matchExpressions[0].values", "operator In needs at least one value"));
        let v = edited(|s| {
            remove(s, "clusterName");
            s["clusterSelector"] = json!({"matchLabels": {"bad key": "x"}});
        });
        assert!(denied(&v, "spec.clusterSelector.matchLabels[\"bad key\"]", "is not a valid label key"), "{v:?}");
    }

    #[test]
    fn replicas_or_limits_is_required_and_empty_limits_count_as_absent() {
        let v = edited(|s| remove(s, "replicas"));
        assert_eq!(fields(&v.denials), ["spec"]);
        assert!(denied(&v, "spec", "set spec.replicas"), "{v:?}");
        assert!(denied(&v, "spec", "spec.limits (as many pods as fit in these resources"), "{v:?}");
        assert!(!denied(&v, "spec", "counts as absent"), "{v:?}");
        let v = edited(|s| {
            remove(s, "replicas");
            s["limits"] = json!({});
        });
        assert_eq!(fields(&v.denials), ["spec"]);
        assert!(denied(&v, "spec", "an empty spec.limits counts as absent"), "{v:?}");
    }

    #[test]
    fn replicas_are_bounded_and_zero_is_warned() {
        for bad in [-1, 10_001, i32::MIN, i32::MAX] {
            let v = edited(|s| s["replicas"] = json!(bad));
            assert_eq!(fields(&v.denials), ["spec.replicas"], "{bad}");
            assert!(denied(&v, "spec.replicas", "is out of range: give 0 to 10000 buffer pods per cluster"), "{v:?}");
            assert!(v.warnings.is_empty(), "{v:?}");
        }
        let v = edited(|s| s["replicas"] = json!(0));
        assert!(v.is_allowed(), "{v:?}");
        assert_eq!(fields(&v.warnings), ["spec.replicas"]);
        assert!(warned(&v, "spec.replicas", "keeps room for no pod"), "{v:?}");
        assert!(warned(&v, "spec.replicas", "or delete the buffer"), "{v:?}");
    }

    #[test]
    fn only_the_active_capacity_strategy() {
        for bad in ["buffer.x-k8s.io/resource-only", "", "Buffer.x-k8s.io/active-capacity"] {
            let v = edited(|s| s["provisioningStrategy"] = json!(bad));
            assert_eq!(fields(&v.denials), ["spec.provisioningStrategy"], "{bad}");
            assert!(
                denied(&v, "spec.provisioningStrategy", "the only strategy is buffer.x-k8s.io/active-capacity"),
                "{v:?}"
            );
        }
    }

    #[test]
    fn the_pod_template_name_is_a_dns_subdomain() {
        let v = edited(|s| s["podTemplateRef"]["name"] = json!(""));
        assert_eq!(fields(&v.denials), ["spec.podTemplateRef.name"]);
        assert!(denied(&v, "spec.podTemplateRef.name", "is empty; name a PodTemplate of this namespace"), "{v:?}");
        for bad in ["Web", "web_burst", "web..burst", "web.", &"a".repeat(254)] {
            let v = edited(|s| s["podTemplateRef"]["name"] = json!(bad));
            assert_eq!(fields(&v.denials), ["spec.podTemplateRef.name"], "{bad}");
            assert!(denied(&v, "spec.podTemplateRef.name", "is not a valid name: it"), "{bad}: {v:?}");
            assert!(denied(&v, "spec.podTemplateRef.name", "a DNS subdomain of 1 to 253 characters"), "{v:?}");
        }
        // 253 characters in labels of at most 63 is fine.
        let long = ["a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(61)].join(".");
        assert_eq!(long.len(), 253);
        assert_eq!(edited(|s| s["podTemplateRef"]["name"] = json!(long)), Verdict::default());
    }

    #[test]
    fn limits_are_non_negative_quantities() {
        let cases = [
            ("cpu", json!("eight"), "the number has no digits"),
            ("memory", json!("16GB"), "unknown suffix \"GB\""),
            ("memory", json!("1e99999999999"), "exponent out of range"),
            ("cpu", json!(""), "empty quantity"),
            ("cpu", json!("-1"), "\"-1\" is negative: limits are at least 0; remove the sign"),
            ("memory", json!(-5), "is negative"),
            ("memory", json!("1".repeat(65)), "is longer than 64 characters"),
        ];
        for (key, value, text) in cases {
            let v = edited(|s| s["limits"] = json!({key: value.clone()}));
            let field = format!("spec.limits[{key}]");
            assert_eq!(fields(&v.denials), [field.as_str()], "{value}: {v:?}");
            assert!(denied(&v, &field, text), "{value}: {v:?}");
        }
        // The parser's messages say what a quantity looks like.
        let v = edited(|s| s["limits"] = json!({"cpu": "eight"}));
        assert!(denied(&v, "spec.limits[cpu]", "e.g. \"500m\""), "{v:?}");
        // Each bad value is reported.
        let v = edited(|s| s["limits"] = json!({"cpu": "x", "memory": "y", "pods": "3"}));
        assert_eq!(fields(&v.denials), ["spec.limits[cpu]", "spec.limits[memory]"]);
    }

    #[test]
    fn at_most_32_limits() {
        let mut limits: serde_json::Map<String, Value> = (0..32).map(|i| (format!("r{i}"), json!("1"))).collect();
        limits.insert("pods".into(), json!("10"));
        let v = edited(|s| s["limits"] = Value::Object(limits.clone()));
        assert_eq!(fields(&v.denials), ["spec.limits"]);
        assert!(denied(&v, "spec.limits", "33 resources listed, at most 32"), "{v:?}");
        limits.remove("r0");
        assert_eq!(edited(|s| s["limits"] = Value::Object(limits)), Verdict::default());
    }

    #[test]
    fn limits_naming_no_cpu_memory_or_pods_are_warned() {
        let v = edited(|s| {
            remove(s, "replicas");
            s["limits"] = json!({"nvidia.com/gpu": "2"});
        });
        assert!(v.is_allowed(), "{v:?}");
        assert_eq!(fields(&v.warnings), ["spec.limits"]);
        assert!(warned(&v, "spec.limits", "names none of cpu, memory and pods"), "{v:?}");
        assert!(warned(&v, "spec.limits", "may then be bounded by nothing"), "{v:?}");
        assert!(warned(&v, "spec.limits", "e.g. pods: \"10\""), "{v:?}");
        // With replicas, the count is still bounded: said so.
        let v = edited(|s| s["limits"] = json!({"ephemeral-storage": "10Gi"}));
        assert!(warned(&v, "spec.limits", "bounded by spec.replicas alone"), "{v:?}");
        let v = edited(|s| s["limits"] = json!({}));
        assert!(v.is_allowed() && warned(&v, "spec.limits", "names none"), "{v:?}");
        // Any one of the three is enough.
        for key in ["cpu", "memory", "pods"] {
            let v = edited(|s| s["limits"] = json!({key: "4", "ephemeral-storage": "10Gi"}));
            assert_eq!(v, Verdict::default(), "{key}");
        }
    }

    #[test]
    fn hostile_values_are_not_echoed_whole() {
        let long = "9".repeat(10_000);
        let v = edited(|s| {
            s["clusterName"] = json!(long);
            s["podTemplateRef"]["name"] = json!(long);
            s["provisioningStrategy"] = json!(long);
            s["limits"] = json!({"k ".repeat(5_000): format!("{long}x"), "cpu": format!("{long}x")});
        });
        assert_eq!(v.denials.len(), 5, "{v:?}");
        for d in &v.denials {
            assert!(d.field.len() < 150 && d.message.len() < 600, "{d:?}");
        }
    }
}
