//! Client-side model of CKE's `NodeGroup` (`nodegroups.api.clever-cloud.com/v1`, cluster-scoped) and
//! the predicates the hub reads off its status.
//!
//! Clever Cloud owns and installs the real CRD; the hub never applies it. The CRD this module renders
//! ([`test_crd`]) is a stand-in for tests and the simulator only. Status parsing is lenient: every
//! member is optional and unknown phases, condition types and reasons are tolerated.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Spec of a CKE NodeGroup. `flavor`, `labels` and `taints` are immutable on the platform side.
// Repeated `type_ = ...` arguments of `printcolumn(...)` look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "api.clever-cloud.com",
    version = "v1",
    kind = "NodeGroup",
    plural = "nodegroups",
    status = "NodeGroupStatus",
    doc = "NodeGroup is Clever Cloud's group of identical worker nodes of a CKE cluster (stand-in CRD for tests; CKE installs the real one).",
    scale(spec_replicas_path = ".spec.nodeCount", status_replicas_path = ".status.nodeCount"),
    printcolumn(name = "Flavor", type_ = "string", json_path = ".spec.flavor"),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".spec.nodeCount"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct NodeGroupSpec {
    /// VM size (`2XS`, `XS`, `S`, `M`, `L`, `XL`). Immutable.
    pub flavor: String,
    /// Number of nodes wanted (0–16). The hub always writes 1 and never changes it.
    pub node_count: i32,
    /// Labels CKE puts on every node of the group at join. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Taints CKE puts on every node of the group at join. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taints: Option<Vec<NodeGroupTaint>>,
}

/// A taint as the NodeGroup API takes it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct NodeGroupTaint {
    /// Taint key.
    pub key: String,
    /// Optional taint value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Taint effect (`NoSchedule`, `PreferNoSchedule`, `NoExecute`).
    pub effect: String,
}

/// Status written by CKE. Every member is optional.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeGroupStatus {
    /// `Ready`, `ReconcileInProgress`, `ReconcileFailed`, `Terminating` (others tolerated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<NodeGroupCondition>>,
    /// Coarse state; observed: `Synced`, `QuotaExceeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Nodes currently in the group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_count: Option<i32>,
    /// Count the platform converges to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_node_count: Option<i32>,
    /// Identifier of the group on the platform side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_id: Option<String>,
    /// Echo of the applied labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Echo of the applied taints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taints: Option<Vec<NodeGroupTaint>>,
}

/// A NodeGroup condition: close to `metav1.Condition`, but every member optional.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeGroupCondition {
    /// Condition type.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// `True`, `False` or `Unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Last transition, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// Machine-readable reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable message (e.g. the quota text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Generation the condition was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The verdict CKE gave on a NodeGroup, read off its status (clever-cloud.md §1.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No verdict yet (just created, or reconciling).
    Pending,
    /// `Ready=True`: the platform accepted the group.
    Accepted,
    /// Refused for quota; carries the platform message when there is one.
    QuotaRejected(Option<String>),
    /// `ReconcileFailed=True` for a reason other than quota.
    Failed {
        /// The condition's reason.
        reason: Option<String>,
        /// The condition's message.
        message: Option<String>,
    },
}

impl NodeGroup {
    fn condition(&self, type_: &str) -> Option<&NodeGroupCondition> {
        self.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_.as_deref() == Some(type_))
    }

    /// Accepted: condition `Ready` with status `True`; no other condition counts.
    pub fn is_accepted(&self) -> bool {
        self.condition("Ready").is_some_and(|c| c.status.as_deref() == Some("True"))
    }

    /// Quota-rejected: phase `QuotaExceeded`, or `ReconcileFailed=True` with reason `QuotaExceeded`.
    pub fn is_quota_rejected(&self) -> bool {
        let phase = self.status.as_ref().and_then(|s| s.phase.as_deref());
        phase == Some("QuotaExceeded")
            || self
                .condition("ReconcileFailed")
                .is_some_and(|c| c.status.as_deref() == Some("True") && c.reason.as_deref() == Some("QuotaExceeded"))
    }

    /// Terminating: a deletion timestamp is set (CKE's finalizer still holds the object). The hub treats a
    /// terminating group as gone, or CKE's finalizer and the hub's Node finalizer wait on each other forever.
    pub fn is_terminating(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// The verdict, quota first (a rejected group may also carry other conditions).
    pub fn verdict(&self) -> Verdict {
        if self.is_quota_rejected() {
            let message = self
                .condition("ReconcileFailed")
                .and_then(|c| c.message.clone())
                .or_else(|| self.condition("Ready").and_then(|c| c.message.clone()));
            return Verdict::QuotaRejected(message);
        }
        if self.is_accepted() {
            return Verdict::Accepted;
        }
        match self.condition("ReconcileFailed") {
            Some(c) if c.status.as_deref() == Some("True") => {
                Verdict::Failed { reason: c.reason.clone(), message: c.message.clone() }
            }
            _ => Verdict::Pending,
        }
    }
}

/// The stand-in NodeGroup CRD for tests and the simulator: the derived schema with spec and status
/// preserving unknown fields, as CKE's loose schema does. Never applied to a real CKE cluster.
pub fn test_crd() -> CustomResourceDefinition {
    let mut crd = NodeGroup::crd();
    for version in &mut crd.spec.versions {
        let props =
            version.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()).and_then(|s| s.properties.as_mut());
        if let Some(props) = props {
            for key in ["spec", "status"] {
                if let Some(p) = props.get_mut(key) {
                    p.x_kubernetes_preserve_unknown_fields = Some(true);
                }
            }
        }
    }
    crate::crd::normalize(crd)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn group(status: serde_json::Value) -> NodeGroup {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "api.clever-cloud.com/v1",
            "kind": "NodeGroup",
            "metadata": {"name": "ng"},
            "spec": {"flavor": "XS", "nodeCount": 1},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn accepted_only_on_ready_true() {
        let g = group(
            serde_json::json!({"phase": "Synced", "conditions": [{"type": "Ready", "status": "True", "reason": "Synced"}]}),
        );
        assert!(g.is_accepted());
        assert_eq!(g.verdict(), Verdict::Accepted);
        let g = group(
            serde_json::json!({"conditions": [{"type": "ReconcileInProgress", "status": "True"}, {"type": "Terminating", "status": "True"}]}),
        );
        assert!(!g.is_accepted());
        assert_eq!(g.verdict(), Verdict::Pending);
    }

    #[test]
    fn quota_rejection_by_phase_or_condition() {
        let msg = "Quota exceeded: RAM max: limit = 40.0 GB | actual = 48.0 GB";
        let g = group(serde_json::json!({"phase": "QuotaExceeded"}));
        assert!(g.is_quota_rejected());
        let g = group(
            serde_json::json!({"conditions": [{"type": "ReconcileFailed", "status": "True", "reason": "QuotaExceeded", "message": msg}]}),
        );
        assert_eq!(g.verdict(), Verdict::QuotaRejected(Some(msg.to_string())));
        let g = group(
            serde_json::json!({"conditions": [{"type": "ReconcileFailed", "status": "False", "reason": "QuotaExceeded"}]}),
        );
        assert!(!g.is_quota_rejected());
        let g = group(
            serde_json::json!({"conditions": [{"type": "ReconcileFailed", "status": "True", "reason": "InvalidFlavor"}]}),
        );
        assert!(!g.is_quota_rejected());
        assert!(matches!(g.verdict(), Verdict::Failed { .. }));
    }

    #[test]
    fn lenient_status_parsing() {
        let g = group(
            serde_json::json!({"phase": "SomethingNew", "conditions": [{"type": "Weird"}, {}], "extra": {"a": 1}}),
        );
        assert_eq!(g.verdict(), Verdict::Pending);
        let g: NodeGroup = serde_json::from_value(serde_json::json!({
            "apiVersion": "api.clever-cloud.com/v1", "kind": "NodeGroup", "metadata": {"name": "ng"},
            "spec": {"flavor": "XS", "nodeCount": 0}
        }))
        .unwrap();
        // nodeCount is always serialised, even 0.
        assert!(serde_json::to_string(&g.spec).unwrap().contains("\"nodeCount\":0"));
    }

    #[test]
    fn test_crd_is_cluster_scoped_and_loose() {
        let crd = test_crd();
        assert_eq!(crd.spec.scope, "Cluster");
        let json = serde_json::to_value(&crd).unwrap();
        let props = &json["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
        assert_eq!(props["spec"]["x-kubernetes-preserve-unknown-fields"], true);
        assert_eq!(props["status"]["x-kubernetes-preserve-unknown-fields"], true);
        assert!(json["spec"]["versions"][0]["subresources"]["scale"].is_object());
    }
}
