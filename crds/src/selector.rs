//! `ClusterSelector`: which registered clusters a fleet object selects, by their labels (fleet.md §1).
//!
//! The shape and meaning of Kubernetes' `metav1.LabelSelector` (`matchLabels` and
//! `matchExpressions` with `In`, `NotIn`, `Exists`, `DoesNotExist`, all ANDed; an empty selector
//! selects every cluster), as a type of our own so the schema bounds it and names the operator
//! values, and so matching is a pure function here. Must not: know where labels come from.

use std::collections::BTreeMap;

use kube::KubeSchema;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use crate::common::LABEL_VALUE_PATTERN;

/// Label key pattern: an optional DNS-subdomain prefix and a name, as Kubernetes qualifies names.
const LABEL_KEY_PATTERN: &str =
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$";

/// Selects registered clusters by their labels: the labels of the registration Secret over those of
/// the Cluster API `Cluster` of the same name. Every term must hold; an empty selector selects every
/// registered cluster of the namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSelector {
    /// Labels a cluster must carry, with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "match_labels")]
    pub match_labels: BTreeMap<String, String>,
    /// Further requirements on the cluster's labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub match_expressions: Vec<ClusterSelectorRequirement>,
}

/// One requirement on a cluster's label.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("self.operator in ['In', 'NotIn'] ? size(self.values) > 0 : size(self.values) == 0").message("values: In and NotIn need at least one value; Exists and DoesNotExist take none"))]
pub struct ClusterSelectorRequirement {
    /// The label key.
    #[schemars(
        length(min = 1, max = 316),
        regex(
            pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
        )
    )]
    pub key: String,
    /// How the label's value is compared with `values`.
    pub operator: SelectorOperator,
    /// Values for `In` and `NotIn` (at least one); none for `Exists` and `DoesNotExist`.
    #[serde(default)]
    #[schemars(schema_with = "selector_values")]
    pub values: Vec<String>,
}

/// A label selector operator.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SelectorOperator {
    /// The label is set to one of `values`.
    In,
    /// The label is absent or set to none of `values`.
    NotIn,
    /// The label is set, to any value.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

/// `matchLabels`: values by the schema; keys by a CEL rule, since a CRD schema has no
/// `propertyNames` (kube-apiserver's `JSONSchemaProps` lacks it: a `propertyNames` here would be
/// dropped from the CRD and check nothing).
fn match_labels(_: &mut SchemaGenerator) -> Schema {
    // The pattern in a CEL single-quoted string: each backslash doubled.
    let keys = format!("self.all(k, size(k) <= 316 && k.matches('{}'))", LABEL_KEY_PATTERN.replace('\\', "\\\\"));
    json_schema!({
        "type": "object",
        "maxProperties": 64,
        "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN},
        "x-kubernetes-validations": [
            {"rule": keys, "message": "matchLabels keys must be label keys of at most 316 characters ([prefix/]name, e.g. env or example.com/env)"}
        ]
    })
}

fn selector_values(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 64,
        "items": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN}
    })
}

impl ClusterSelector {
    /// Whether a cluster with `labels` is selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.matches(labels))
    }

    /// The first term a schema-less object would break (the webhook and `plan` say it; the CRD's
    /// schema and CEL rules refuse the same on a real server): `(field path, why and how to fix it)`.
    pub fn problem(&self) -> Option<(String, String)> {
        use crate::validation::{label_value, qualified_name};
        for (k, v) in &self.match_labels {
            let field = format!("matchLabels[{}]", crate::admission::shorten(k));
            if let Err(reason) = qualified_name(k) {
                return Some((
                    field,
                    format!("is not a valid label key: {reason}; write [prefix/]name, e.g. env or example.com/env"),
                ));
            }
            if let Err(reason) = label_value(v) {
                return Some((field, format!("{} is not a valid label value: {reason}", crate::admission::shorten(v))));
            }
        }
        for (i, r) in self.match_expressions.iter().enumerate() {
            if let Err(reason) = qualified_name(&r.key) {
                return Some((
                    format!("matchExpressions[{i}].key"),
                    format!(
                        "{} is not a valid label key: {reason}; write [prefix/]name, e.g. env or example.com/env",
                        crate::admission::shorten(&r.key)
                    ),
                ));
            }
            let field = format!("matchExpressions[{i}].values");
            match r.operator {
                SelectorOperator::In | SelectorOperator::NotIn if r.values.is_empty() => {
                    return Some((
                        field,
                        format!(
                            "operator {:?} needs at least one value, e.g. values: [prod]; or use Exists / DoesNotExist",
                            r.operator
                        ),
                    ));
                }
                SelectorOperator::Exists | SelectorOperator::DoesNotExist if !r.values.is_empty() => {
                    return Some((field, format!("operator {:?} takes no values: remove them", r.operator)));
                }
                _ => {}
            }
            if let Some((j, v, reason)) =
                r.values.iter().enumerate().find_map(|(j, v)| label_value(v).err().map(|e| (j, v, e)))
            {
                return Some((
                    format!("matchExpressions[{i}].values[{j}]"),
                    format!("{} is not a valid label value: {reason}", crate::admission::shorten(v)),
                ));
            }
        }
        None
    }
}

impl ClusterSelectorRequirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            SelectorOperator::In => value.is_some_and(|v| self.values.contains(v)),
            SelectorOperator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            SelectorOperator::Exists => value.is_some(),
            SelectorOperator::DoesNotExist => value.is_none(),
        }
    }
}

/// Whether an object targeting `name` or `selector` (a NodePool's or a CapacityBuffer's
/// `clusterName` | `clusterSelector`) serves the cluster `cluster` whose labels are `labels`, among
/// the clusters of its own namespace. Neither set (refused by the schema and the webhook): nothing.
pub fn targets(
    name: Option<&String>,
    selector: Option<&ClusterSelector>,
    cluster: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    match (name, selector) {
        (Some(name), _) => name == cluster,
        (None, Some(selector)) => selector.matches(labels),
        (None, None) => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn selector(v: serde_json::Value) -> ClusterSelector {
        serde_json::from_value(v).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn every_term_must_hold_and_an_empty_selector_selects_all() {
        let prod_eu = labels(&[("env", "prod"), ("region", "eu")]);
        let staging = labels(&[("env", "staging")]);
        assert!(selector(json!({})).matches(&staging));
        assert!(selector(json!({})).matches(&BTreeMap::new()));
        let s = selector(
            json!({"matchLabels": {"env": "prod"}, "matchExpressions": [{"key": "region", "operator": "In", "values": ["eu", "us"]}]}),
        );
        assert!(s.matches(&prod_eu));
        assert!(!s.matches(&staging));
        assert!(!s.matches(&labels(&[("env", "prod")])), "In needs the label");
        let table = [
            (json!({"key": "region", "operator": "NotIn", "values": ["eu"]}), [false, true]),
            (json!({"key": "region", "operator": "Exists"}), [true, false]),
            (json!({"key": "region", "operator": "DoesNotExist"}), [false, true]),
            (json!({"key": "env", "operator": "In", "values": ["prod"]}), [true, false]),
        ];
        for (term, [on_prod_eu, on_staging]) in table {
            let s = selector(json!({"matchExpressions": [term.clone()]}));
            assert_eq!(s.matches(&prod_eu), on_prod_eu, "{term} on prod/eu");
            assert_eq!(s.matches(&staging), on_staging, "{term} on staging");
        }
    }

    #[test]
    fn a_term_the_schema_refuses_is_named_with_its_path_and_fix() {
        let ok = selector(json!({
            "matchLabels": {"example.com/env": "prod"},
            "matchExpressions": [{"key": "tier", "operator": "Exists"}, {"key": "zone", "operator": "NotIn", "values": ["rbx"]}]
        }));
        assert_eq!(ok.problem(), None);
        let cases = [
            (json!({"matchLabels": {"bad key": "x"}}), "matchLabels[\"bad key\"]", "e.g. env or example.com/env"),
            (json!({"matchLabels": {"a/b/c": "x"}}), "matchLabels[\"a/b/c\"]", "not a valid label key"),
            (
                json!({"matchLabels": {"env": "not ok!"}}),
                "matchLabels[\"env\"]",
                "\"not ok!\" is not a valid label value",
            ),
            (
                json!({"matchExpressions": [{"key": "env", "operator": "In"}]}),
                "matchExpressions[0].values",
                "operator In needs at least one value, e.g. values: [prod]",
            ),
            (
                json!({"matchExpressions": [{"key": "env", "operator": "NotIn", "values": []}]}),
                "matchExpressions[0].values",
                "operator NotIn needs at least one value",
            ),
            (
                json!({"matchExpressions": [{"key": "env", "operator": "Exists", "values": ["a"]}]}),
                "matchExpressions[0].values",
                "operator Exists takes no values: remove them",
            ),
            (
                json!({"matchExpressions": [{"key": "env", "operator": "DoesNotExist", "values": ["a"]}]}),
                "matchExpressions[0].values",
                "operator DoesNotExist takes no values",
            ),
            (
                json!({"matchExpressions": [{"key": "env", "operator": "Exists"}, {"key": "-env", "operator": "Exists"}]}),
                "matchExpressions[1].key",
                "\"-env\" is not a valid label key",
            ),
            (
                json!({"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod", "a b"]}]}),
                "matchExpressions[0].values[1]",
                "\"a b\" is not a valid label value",
            ),
        ];
        for (v, path, text) in cases {
            let (got, why) = selector(v.clone()).problem().unwrap_or_else(|| panic!("{v} accepted"));
            assert_eq!(got, path, "{v}: {why}");
            assert!(why.contains(text), "{v}: {why}");
        }
    }

    #[test]
    fn a_huge_key_is_not_echoed_whole() {
        let key = "k ".repeat(50_000);
        let (path, why) = selector(json!({"matchLabels": {key: "x"}})).problem().unwrap();
        assert!(path.len() < 150 && path.contains("100000 characters"), "{path}");
        assert!(why.len() < 400, "{why}");
    }
}
