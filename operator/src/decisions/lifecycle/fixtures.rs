//! Test fixtures of the lifecycle's table tests (and of the controller's registration patch test):
//! a claim at each stage (new, launched, registered), its Node, the facts of a pass, and readers of
//! a decision's writes.
//!
//! Owns: test data only (compiled for tests). Must not: hold a test, or hide a fact a test relies on
//! (each fixture is a plain value a test then changes in sight).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::{
    api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};

use super::{
    Decision, DeleteReason, Facts, Group, INITIALIZED, LaunchOutcome, PoolHealth, REGISTERED, Write, launched,
};
use crate::decisions::{
    conditions::{self, TRUE},
    node_registration::NodeMatch,
};
use crds::{NodeClaim, NodeClaimStatus, labels};

pub(crate) fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

pub(crate) fn claim() -> NodeClaim {
    let mut c: NodeClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1",
        "kind": "NodeClaim",
        "metadata": {"name": "c1", "namespace": "team-a", "uid": "u1", "generation": 1,
            "creationTimestamp": t(0).to_string(),
            "finalizers": [labels::TERMINATION_FINALIZER],
            "labels": {labels::NODEPOOL: "general", labels::INSTANCE_TYPE: "M"}},
        "spec": {"clusterName": "prod", "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}, "requirements": []},
    }))
    .unwrap();
    c.spec.expire_after = String::new();
    c
}

pub(crate) fn launched_claim() -> NodeClaim {
    let mut c = claim();
    let outcome = LaunchOutcome::Launched {
        provider_id: "clevercloud://ng-1".into(),
        capacity: Default::default(),
        allocatable: Default::default(),
    };
    c.status = Some(launched(&c, &outcome, t(10)));
    c
}

pub(crate) fn registered_claim() -> NodeClaim {
    let mut c = launched_claim();
    let s = c.status.as_mut().unwrap();
    conditions::set(&mut s.conditions, REGISTERED, TRUE, "Registered", "", Some(1), t(20));
    conditions::set(&mut s.conditions, INITIALIZED, TRUE, "Initialized", "", Some(1), t(20));
    s.node_name = Some("n1".into());
    c
}

pub(crate) fn node(ready: &str, since: Timestamp) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            labels: Some(
                [
                    (labels::REGISTERED.to_string(), "true".to_string()),
                    (labels::INITIALIZED.to_string(), "true".to_string()),
                ]
                .into(),
            ),
            finalizers: Some(vec![labels::TERMINATION_FINALIZER.into()]),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec { provider_id: Some("clevercloud://ng-1".into()), ..NodeSpec::default() }),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                last_transition_time: Some(Time(since)),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }),
    }
}

pub(crate) fn facts<'a>(claim: &'a NodeClaim, node: NodeMatch<'a>, group: Group, now: Timestamp) -> Facts<'a> {
    Facts {
        claim,
        node,
        group,
        pods: &[],
        attachments: Some(&[]),
        pool: PoolHealth { nodes: 1, unhealthy: 0 },
        nodepool: None,
        departed: false,
        nodeclass: None,
        offered: None,
        node_pods: &[],
        now,
    }
}

pub(crate) fn deletes(d: &Decision) -> Option<DeleteReason> {
    d.writes.iter().find_map(|w| match w {
        Write::DeleteClaim(r) => Some(*r),
        _ => None,
    })
}

pub(crate) fn has(d: &Decision, pred: impl Fn(&Write) -> bool) -> bool {
    d.writes.iter().any(pred)
}

pub(crate) fn status_of(d: &Decision) -> Option<&NodeClaimStatus> {
    d.writes.iter().rev().find_map(|w| match w {
        Write::Status(s) => Some(s.as_ref()),
        _ => None,
    })
}

pub(crate) fn deleting(mut c: NodeClaim, at: Timestamp) -> NodeClaim {
    c.metadata.deletion_timestamp = Some(Time(at));
    c
}
