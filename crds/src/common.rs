//! Building blocks shared by the NodePool and NodeClaim APIs: requirements, taints, node class
//! references, conditions and resource maps, each with the schema checks an API server can run.
//!
//! Owns shapes and their declarative validation only; semantic checks that need code (cron parsing,
//! qualified-name lengths) live in [`crate::validation`].

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::KubeSchema;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// Conditions are `metav1.Condition`, exactly as Karpenter uses them.
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// Qualified name (`[prefix/]name`) as Kubernetes accepts it for label keys and taint keys. Lengths of
/// each part are checked in code (`crate::validation`); the schema bounds the whole.
pub const QUALIFIED_NAME_PATTERN: &str =
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$";
/// Label value: empty, or alphanumerics with `-`, `_`, `.` inside, at most 63 characters.
pub const LABEL_VALUE_PATTERN: &str = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";
/// Go-style duration restricted to seconds, minutes and hours, or `Never`.
pub const NILLABLE_DURATION_PATTERN: &str = r"^(([0-9]+(s|m|h))+|Never)$";
/// Go-style duration restricted to seconds, minutes and hours.
pub const DURATION_PATTERN: &str = r"^([0-9]+(s|m|h))+$";
/// A non-negative Kubernetes quantity (`2`, `500m`, `16Gi`, `1e3`).
pub const QUANTITY_PATTERN: &str =
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$";

/// Reference to the `CleverNodeClass` a NodePool or NodeClaim uses.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, KubeSchema)]
pub struct NodeClassReference {
    /// API group of the node class: always `karpenter.clever-cloud.com`.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self == 'karpenter.clever-cloud.com'").message("nodeClassRef.group must be karpenter.clever-cloud.com"))]
    pub group: String,
    /// Kind of the node class: always `CleverNodeClass`.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self == 'CleverNodeClass'").message("nodeClassRef.kind must be CleverNodeClass"))]
    pub kind: String,
    /// Name of the `CleverNodeClass`, in the same namespace.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,
}

/// Operator of a node selector requirement.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum Operator {
    /// The node label value is one of `values`.
    In,
    /// The node label is absent, or its value is none of `values`.
    NotIn,
    /// The node label is present (any value).
    Exists,
    /// The node label is absent.
    DoesNotExist,
    /// The node label value is an integer greater than the single value.
    Gt,
    /// The node label value is an integer less than the single value.
    Lt,
    /// The node label value is an integer greater than or equal to the single value.
    Gte,
    /// The node label value is an integer less than or equal to the single value.
    Lte,
}

impl Operator {
    /// The operator as written in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Operator::In => "In",
            Operator::NotIn => "NotIn",
            Operator::Exists => "Exists",
            Operator::DoesNotExist => "DoesNotExist",
            Operator::Gt => "Gt",
            Operator::Lt => "Lt",
            Operator::Gte => "Gte",
            Operator::Lte => "Lte",
        }
    }
}

/// A node selector requirement with Karpenter's optional `minValues`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorRequirement {
    /// Node label key the requirement applies to (e.g. `node.kubernetes.io/instance-type`,
    /// `clever-cloud.com/flavor`, `karpenter.sh/capacity-type`, or a label of your own).
    #[schemars(
        length(min = 1, max = 316),
        regex(
            pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
        )
    )]
    pub key: String,
    /// How the label value is compared with `values`.
    pub operator: Operator,
    /// Values to compare with: at least one for `In` and `NotIn`, none for `Exists` and `DoesNotExist`, exactly
    /// one non-negative integer for `Gt`, `Lt`, `Gte` and `Lte`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "label_value_list")]
    pub values: Vec<String>,
    /// Minimum number of distinct values of this key that must remain among the instance types a NodeClaim may
    /// launch (e.g. `minValues: 2` on `node.kubernetes.io/instance-type` keeps at least two flavors as options).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 50))]
    pub min_values: Option<i32>,
}

fn label_value_list(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 1000,
        "items": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN}
    })
}

/// Effect of a taint on pods that do not tolerate it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum TaintEffect {
    /// New pods that do not tolerate the taint are not scheduled on the node.
    NoSchedule,
    /// The scheduler tries to avoid the node for pods that do not tolerate the taint.
    PreferNoSchedule,
    /// Pods that do not tolerate the taint are evicted, and new ones are not scheduled.
    NoExecute,
}

impl TaintEffect {
    /// The effect as written in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// A node taint (`core/v1` Taint without `timeAdded`, which only the node lifecycle controller sets).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub struct Taint {
    /// Taint key, a qualified name such as `team` or `example.com/dedicated`.
    #[schemars(
        length(min = 1, max = 316),
        regex(
            pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
        )
    )]
    pub key: String,
    /// Optional taint value, a valid label value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63), regex(pattern = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"))]
    pub value: Option<String>,
    /// Effect on pods that do not tolerate the taint.
    pub effect: TaintEffect,
}

impl Taint {
    /// The `core/v1` form, for writing onto Nodes.
    pub fn to_k8s(&self) -> k8s_openapi::api::core::v1::Taint {
        k8s_openapi::api::core::v1::Taint {
            key: self.key.clone(),
            value: self.value.clone(),
            effect: self.effect.as_str().to_string(),
            time_added: None,
        }
    }
}

/// Schema of a resource map (`cpu: "8"`, `memory: 16Gi`, `nodes: 3`): non-negative quantities.
///
/// The values are bounded (`maxLength`) because kube-apiserver estimates the cost of the CEL rule
/// from the largest value the schema allows: `string(x)` on an unbounded int-or-string is charged
/// as a traversal of a whole request, and 32 of those exceed the per-rule budget, so a real API
/// server refuses the CRD. 64 characters hold any quantity a node or a limit can have.
pub(crate) fn resource_map(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": 32,
        "additionalProperties": {
            "x-kubernetes-int-or-string": true,
            "maxLength": 64,
            "pattern": QUANTITY_PATTERN
        },
        "x-kubernetes-validations": [{
            "rule": "self.all(k, !string(self[k]).startsWith('-'))",
            "message": "resource quantities must not be negative"
        }]
    })
}

/// Schema of a resource map reported in a status (no validation: written by the hub only).
pub(crate) fn status_resource_map(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "additionalProperties": {"x-kubernetes-int-or-string": true}
    })
}

/// Schema of a condition list: `metav1.Condition`s keyed by `type`.
pub(crate) fn conditions(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = <Vec<Condition>>::json_schema(generator);
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert("x-kubernetes-list-map-keys".into(), serde_json::json!(["type"]));
    schema
}

/// A resource map: resource name to quantity.
pub type ResourceMap = BTreeMap<String, Quantity>;
