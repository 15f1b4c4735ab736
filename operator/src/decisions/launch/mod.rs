//! Launch of one NodeClaim (karpenter-semantics §2.1, §6.1; clever-cloud.md §3.4): the flavor to
//! create, the NodeGroup to write, whether an existing group of the derived name may be adopted
//! after a crash, and how CKE's verdict maps to Karpenter's error kinds. The decisions the launch
//! sequence takes between its API calls (the class, the next step, the verdict, the claim's writes
//! after the outcome) are `sequence`'s, re-exported here.
//!
//! Owns: pure decisions. Must not: create anything (the lifecycle controller does, idempotently,
//! with the name from [`crate::decisions::ownership`]), or choose a flavor in cool-down.

mod sequence;

pub use sequence::{
    Adoption, Attempt, ClaimWrite, Conclusion, Counter, Creation, End, Facts, Judged, Launched, RETRY_SOON, Step,
    VerdictFacts, Write, acceptance_timeout, adoption, class_ready, conclude, judge_class, judge_verdict, next_step,
    still_to_launch,
};

use std::collections::BTreeMap;

use crds::{
    NodeClaim, NodeGroup, NodeGroupSpec,
    catalog::{InstanceType, Offering},
    common::{NodeSelectorRequirement, Operator},
    labels,
    nodegroup::NodeGroupTaint,
    quantity::Resources,
};
use kube::api::ObjectMeta;

use crate::decisions::ownership::{ClaimIdentity, Owner, Ownership, nodegroup_spec_labels, prove};

/// Why a claim cannot be launched; the reaction follows karpenter-semantics §2.3.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    /// Delete the claim; its pods are re-planned.
    #[error("insufficient capacity: {0}")]
    InsufficientCapacity(String),
    /// Delete the claim (reason `nodeclass_not_ready`).
    #[error("node class not ready: {0}")]
    NodeClassNotReady(String),
    /// A group with the derived name exists and is not this claim's: touch nothing, report it.
    #[error("NodeGroup {name} already exists and is not this claim's ({why}); nothing was changed")]
    Conflict { name: String, why: String },
}

impl LaunchError {
    /// The reason of the claim's event (and of the launch's warning line).
    pub fn reason(&self) -> &'static str {
        match self {
            LaunchError::InsufficientCapacity(_) => "InsufficientCapacity",
            LaunchError::NodeClassNotReady(_) => "NodeClassNotReady",
            LaunchError::Conflict { .. } => "NodeGroupConflict",
        }
    }
}

/// Whether a single-valued label (absent = `None`) satisfies a requirement. Keys an instance type
/// does not define are not constrained by it (Karpenter's compatibility rule).
fn satisfies(req: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let Some(v) = value else {
        return true;
    };
    let int = |s: &str| s.parse::<i64>().ok();
    let bound = || req.values.first().and_then(|b| int(b));
    match req.operator {
        Operator::In => req.values.iter().any(|x| x == v),
        Operator::NotIn => !req.values.iter().any(|x| x == v),
        Operator::Exists => true,
        Operator::DoesNotExist => false,
        Operator::Gt => matches!((int(v), bound()), (Some(a), Some(b)) if a > b),
        Operator::Lt => matches!((int(v), bound()), (Some(a), Some(b)) if a < b),
        Operator::Gte => matches!((int(v), bound()), (Some(a), Some(b)) if a >= b),
        Operator::Lte => matches!((int(v), bound()), (Some(a), Some(b)) if a <= b),
    }
}

fn offering_fits(o: &Offering, reqs: &[NodeSelectorRequirement]) -> bool {
    reqs.iter().all(|r| match r.key.as_str() {
        labels::ZONE => satisfies(r, Some(&o.zone)),
        labels::CAPACITY_TYPE => satisfies(r, Some(&o.capacity_type)),
        _ => true,
    })
}

/// The chosen flavor and offering of a launch.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice<'a> {
    pub instance_type: &'a InstanceType,
    pub offering: &'a Offering,
}

/// Among instance types compatible with the claim's requirements whose allocatable fits its
/// requests (`extended`: the extended resources among them, which a type must offer) and that have an available offering not in cool-down, the cheapest (ties: catalogue
/// order).
pub fn choose<'a>(
    requirements: &[NodeSelectorRequirement],
    requests: &Resources,
    extended: &BTreeMap<String, i64>,
    types: &'a [InstanceType],
    available: impl Fn(&str) -> bool,
) -> Result<Choice<'a>, LaunchError> {
    let mut best: Option<Choice<'a>> = None;
    let mut cooling = Vec::new();
    for it in types.iter().filter(|t| !t.synthesized) {
        let label_ok = requirements.iter().all(|r| match r.key.as_str() {
            labels::ZONE | labels::CAPACITY_TYPE => true,
            key => satisfies(r, it.labels.get(key).map(String::as_str)),
        });
        if !label_ok || !requests.fits(&it.allocatable) || !crds::quantity::extended_fits(extended, &it.extended) {
            continue;
        }
        if !available(&it.name) {
            cooling.push(it.name.clone());
            continue;
        }
        let Some(offering) = it
            .offerings
            .iter()
            .filter(|o| o.available && offering_fits(o, requirements))
            .min_by(|a, b| a.price_hourly.total_cmp(&b.price_hourly))
        else {
            continue;
        };
        if best.as_ref().is_none_or(|b| offering.price_hourly < b.offering.price_hourly) {
            best = Some(Choice { instance_type: it, offering });
        }
    }
    best.ok_or_else(|| {
        LaunchError::InsufficientCapacity(if cooling.is_empty() {
            "no flavor is compatible with the claim's requirements and fits its requests".to_string()
        } else {
            format!("every compatible flavor is cooling down after a CKE refusal ({})", cooling.join(", "))
        })
    })
}

/// The NodeGroup the hub creates for a claim (clever-cloud.md §3.1).
pub fn desired_nodegroup(
    id: &ClaimIdentity<'_>,
    flavor: &str,
    nodeclass_labels: &BTreeMap<String, String>,
    claim_labels: &BTreeMap<String, String>,
    nodeclass_hash: &str,
) -> NodeGroup {
    let spec_labels = nodegroup_spec_labels(nodeclass_labels, claim_labels);
    NodeGroup {
        metadata: ObjectMeta {
            name: Some(id.nodegroup_name()),
            labels: Some(id.labels()),
            annotations: Some(id.annotations(nodeclass_hash)),
            ..ObjectMeta::default()
        },
        spec: NodeGroupSpec {
            flavor: flavor.to_string(),
            node_count: 1,
            labels: (!spec_labels.is_empty()).then_some(spec_labels),
            taints: Some(vec![NodeGroupTaint {
                key: labels::UNREGISTERED_TAINT.to_string(),
                value: None,
                effect: "NoExecute".to_string(),
            }]),
        },
        status: None,
    }
}

/// An existing group this claim may take as its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adopted {
    /// The flavor to describe the claim with (the group's, not the one just resolved).
    pub flavor: String,
    /// The group came with its claim from the management cluster the registration declares
    /// ([`crate::decisions::handover`]): re-stamp it as ours before going on.
    pub moved: bool,
}

/// After `AlreadyExists`: adopt the existing group only if every ownership proof holds and its UID
/// annotation is this claim's (a group from before management-cluster identities included: the
/// claim's UID proves it; a group moved from the declared source: the claim's name does).
pub fn adopt(
    existing: &NodeGroup,
    owner: Owner<'_>,
    namespace: &str,
    claim: &NodeClaim,
) -> Result<Adopted, LaunchError> {
    let name = existing.metadata.name.clone().unwrap_or_default();
    let claim_uid = claim.metadata.uid.as_deref().unwrap_or_default();
    let claim_name = claim.metadata.name.as_deref().unwrap_or_default();
    let proof = prove(existing, owner, namespace);
    if proof.is_claims(claim_name, claim_uid) {
        let moved = matches!(proof, Ownership::Moved { .. });
        return Ok(Adopted { flavor: existing.spec.flavor.clone(), moved });
    }
    match proof {
        Ownership::Owned { .. } | Ownership::Legacy { .. } | Ownership::Moved { .. } if claim_uid.is_empty() => {
            Err(LaunchError::Conflict { name, why: "this claim has no UID yet".into() })
        }
        Ownership::Owned { uid, .. } | Ownership::Legacy { uid, .. } => Err(LaunchError::Conflict {
            name,
            why: format!("it was made for NodeClaim UID {uid}, this claim's is {claim_uid}"),
        }),
        Ownership::Moved { claim, .. } => Err(LaunchError::Conflict {
            name,
            why: format!("it was moved from another management cluster for NodeClaim {claim}, not this one"),
        }),
        Ownership::Foreign => Err(LaunchError::Conflict {
            name,
            why: "it is not owned by this hub, namespace and management cluster".into(),
        }),
        Ownership::Refused(why) => Err(LaunchError::Conflict { name, why }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crds::catalog::Catalog;

    fn types() -> Vec<InstanceType> {
        Catalog::builtin().instance_types("par")
    }

    fn req(key: &str, op: Operator, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op,
            values: values.iter().map(|v| v.to_string()).collect(),
            min_values: None,
        }
    }

    fn gib(n: i64) -> Resources {
        Resources { memory_bytes: n * 1024 * 1024 * 1024, ..Resources::ZERO }
    }

    #[test]
    fn the_cheapest_fitting_flavor_is_chosen() {
        let t = types();
        assert_eq!(choose(&[], &gib(5), &BTreeMap::new(), &t, |_| true).unwrap().instance_type.name, "XS");
        assert_eq!(choose(&[], &gib(1), &BTreeMap::new(), &t, |_| true).unwrap().instance_type.name, "2XS");
        let only = [req(labels::INSTANCE_TYPE, Operator::In, &["L", "M"])];
        assert_eq!(choose(&only, &gib(1), &BTreeMap::new(), &t, |_| true).unwrap().instance_type.name, "M");
    }

    #[test]
    fn cooling_flavors_are_skipped_and_named_when_nothing_is_left() {
        let t = types();
        assert_eq!(choose(&[], &gib(5), &BTreeMap::new(), &t, |f| f != "XS").unwrap().instance_type.name, "S");
        let only = [req(labels::INSTANCE_TYPE, Operator::In, &["XS"])];
        let e = choose(&only, &gib(5), &BTreeMap::new(), &t, |f| f != "XS").unwrap_err();
        assert!(e.to_string().contains("cooling down") && e.to_string().contains("XS"), "{e}");
        let e = choose(&[], &gib(64), &BTreeMap::new(), &t, |_| true).unwrap_err();
        assert!(matches!(e, LaunchError::InsufficientCapacity(_)));
    }

    #[test]
    fn extended_resources_need_a_flavor_offering_them() {
        let mut t = types();
        for ty in t.iter_mut().filter(|ty| ty.name == "L" || ty.name == "XL") {
            ty.extended.insert("nvidia.com/gpu".into(), if ty.name == "L" { 1 } else { 2 });
        }
        let gpu = |n: i64| BTreeMap::from([("nvidia.com/gpu".to_string(), n)]);
        assert_eq!(choose(&[], &gib(1), &gpu(1), &t, |_| true).unwrap().instance_type.name, "L");
        assert_eq!(choose(&[], &gib(1), &gpu(2), &t, |_| true).unwrap().instance_type.name, "XL");
        assert!(choose(&[], &gib(1), &gpu(3), &t, |_| true).is_err());
    }

    #[test]
    fn zone_requirements_filter_offerings() {
        let t = types();
        assert!(choose(&[req(labels::ZONE, Operator::In, &["par"])], &gib(1), &BTreeMap::new(), &t, |_| true).is_ok());
        assert!(choose(&[req(labels::ZONE, Operator::In, &["rbx"])], &gib(1), &BTreeMap::new(), &t, |_| true).is_err());
    }

    fn id() -> ClaimIdentity<'static> {
        ClaimIdentity {
            hub_id: "default",
            management_cluster: "mgmt-1",
            namespace: "ns",
            claim: "general-abcde",
            claim_uid: "uid-1",
            nodepool: "general",
            nodeclass: "default",
        }
    }

    #[test]
    fn the_nodegroup_carries_identity_filtered_labels_and_the_unregistered_taint() {
        let class = BTreeMap::from([("team".to_string(), "a".to_string())]);
        let claim = BTreeMap::from([
            (labels::NODEPOOL.to_string(), "general".to_string()),
            (labels::INSTANCE_TYPE.to_string(), "M".to_string()),
        ]);
        let g = desired_nodegroup(&id(), "M", &class, &claim, "hash");
        assert_eq!(g.spec.node_count, 1);
        assert_eq!(g.spec.flavor, "M");
        let l = g.spec.labels.as_ref().unwrap();
        assert_eq!(l.len(), 2, "{l:?}");
        assert_eq!(l[labels::NODEPOOL], "general");
        assert_eq!(g.spec.taints.as_ref().unwrap()[0].key, labels::UNREGISTERED_TAINT);
        assert!(!g.metadata.labels.as_ref().unwrap().contains_key(labels::IN_CLUSTER_MANAGED));
        assert_eq!(g.metadata.annotations.as_ref().unwrap()[labels::NODECLAIM_UID], "uid-1");
    }

    #[test]
    fn adoption_requires_every_proof_and_the_same_uid() {
        let g = desired_nodegroup(&id(), "S", &BTreeMap::new(), &BTreeMap::new(), "h");
        let mut claim: NodeClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeClaim",
            "metadata": {"name": "general-abcde", "namespace": "ns", "uid": "uid-1"},
            "spec": {"clusterName": "c", "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"},
                     "requirements": [], "resources": {}}
        }))
        .unwrap();
        let me = Owner { hub_id: "default", management_cluster: "mgmt-1", moved_from: None };
        assert_eq!(adopt(&g, me, "ns", &claim).unwrap(), Adopted { flavor: "S".into(), moved: false });
        claim.metadata.uid = Some("uid-2".into());
        assert!(matches!(adopt(&g, me, "ns", &claim), Err(LaunchError::Conflict { .. })));
        claim.metadata.uid = Some("uid-1".into());
        assert!(matches!(adopt(&g, Owner { hub_id: "other", ..me }, "ns", &claim), Err(LaunchError::Conflict { .. })));
        // Another management cluster's hub on the same hub id made a group of this very name.
        let e = adopt(&g, Owner { management_cluster: "mgmt-2", ..me }, "ns", &claim).unwrap_err();
        assert!(e.to_string().contains("management cluster"), "{e}");
        // A group from before identities is this claim's when the UID says so.
        let legacy = desired_nodegroup(
            &ClaimIdentity { management_cluster: "", ..id() },
            "S",
            &BTreeMap::new(),
            &BTreeMap::new(),
            "h",
        );
        assert_eq!(adopt(&legacy, me, "ns", &claim).unwrap().flavor, "S");
        claim.metadata.uid = Some("uid-2".into());
        assert!(adopt(&legacy, me, "ns", &claim).is_err());
        // Moved from the declared source with its claim: the copy (new UID) adopts it, to re-stamp.
        let theirs = Owner { management_cluster: "mgmt-2", ..me };
        assert_eq!(
            adopt(&g, theirs.moved_from(Some("mgmt-1")), "ns", &claim).unwrap(),
            Adopted { flavor: "S".into(), moved: true }
        );
        assert!(adopt(&g, theirs, "ns", &claim).is_err(), "no move declared");
    }
}
