//! `CleverNodeClass`: the Clever-specific settings of nodes (labels carried by the NodeGroup, the
//! flavor catalogue to use).
//!
//! Owns the API shape and its schema/CEL checks. The drift hash of a class lives in [`crate::drift`],
//! and the checks a schema cannot express in [`crate::validation`].

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::Condition;

/// Clever-specific settings of the nodes of the NodePools that reference this class.
// Repeated `type_ = ...` arguments of `printcolumn(...)` look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "karpenter.clever-cloud.com",
    version = "v1alpha1",
    kind = "CleverNodeClass",
    plural = "clevernodeclasses",
    namespaced,
    status = "CleverNodeClassStatus",
    shortname = "cnc",
    category = "karpenter",
    doc = "CleverNodeClass holds the Clever-specific settings of nodes: labels carried by their NodeGroups, and the flavor catalogue to use.",
    printcolumn(name = "Catalog", type_ = "string", json_path = ".spec.flavorCatalogRef.name"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct CleverNodeClassSpec {
    /// Extra labels CKE puts on the nodes when they join (through the NodeGroup's `spec.labels`), so they are
    /// there from the node's first second. Keys under `kubernetes.io/`, `node.kubernetes.io/` and
    /// `clever-cloud.com/` are refused by the platform; keys containing `kubernetes.io/`, and keys under
    /// `karpenter.sh/` or `karpenter.clever-cloud.com/`, belong to the system. Changing labels makes the
    /// existing nodes drifted: the hub replaces them within their pools' `Drifted` disruption budgets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "class_labels")]
    pub labels: BTreeMap<String, String>,
    /// Optional `FlavorCatalog` of this namespace whose overrides apply to the nodes of this class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flavor_catalog_ref: Option<FlavorCatalogReference>,
}

/// Reference to a `FlavorCatalog` in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct FlavorCatalogReference {
    /// Name of the `FlavorCatalog`.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,
}

fn class_labels(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": 64,
        "additionalProperties": {"type": "string", "maxLength": 63, "pattern": crate::common::LABEL_VALUE_PATTERN},
        "x-kubernetes-validations": [
            {
                "rule": "self.all(k, !k.startsWith('kubernetes.io/') && !k.startsWith('node.kubernetes.io/') && !k.startsWith('clever-cloud.com/'))",
                "message": "label keys must not start with kubernetes.io/, node.kubernetes.io/ or clever-cloud.com/: CKE refuses them on NodeGroups"
            },
            {
                "rule": "self.all(k, !k.contains('kubernetes.io/'))",
                "message": "label keys containing kubernetes.io/ are set by the hub at registration, not through the node class"
            },
            {
                "rule": "self.all(k, !k.find('^([^/]+)').endsWith('karpenter.sh') && !k.find('^([^/]+)').endsWith('karpenter.clever-cloud.com'))",
                "message": "label domains karpenter.sh and karpenter.clever-cloud.com are reserved for the system"
            },
            {
                "rule": "self.all(k, k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$'))",
                "message": "label keys must be qualified names ([prefix/]name, e.g. team or example.com/team)"
            }
        ]
    })
}

/// Observed state of a `CleverNodeClass`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CleverNodeClassStatus {
    /// `ValidationSucceeded`, `NodeGroupAPIServed` and the root `Ready` (True only when both are True). Launches
    /// require `Ready=True`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::common::conditions")]
    pub conditions: Vec<Condition>,
}
