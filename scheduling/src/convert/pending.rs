//! Which pods need capacity (karpenter-semantics §3.2): the trigger of a round, the pods a leaving
//! node keeps (`do-not-disrupt`, a PodDisruptionBudget allowing no eviction), and the pods ignored or
//! opting out for their node selectors and affinity.
//!
//! Owns the tests a pod passes to be provisioned for, except its volumes' (that is `volumes`). Must
//! not read a pod's requests or constraints (that is `spec`).

use std::sync::Arc;

use crds::labels;
use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::spec::{operator, selector_from};
use crate::affinity::selector_matches;
use crate::compact::CompactPod;

/// Owned by a DaemonSet (of any API group).
pub fn is_daemonset_pod(meta: &ObjectMeta) -> bool {
    meta.owner_references.iter().flatten().any(|o| o.kind == "DaemonSet")
}

/// A static pod's mirror (owned by its Node).
pub fn is_static_pod(meta: &ObjectMeta) -> bool {
    meta.owner_references.iter().flatten().any(|o| o.kind == "Node")
}

/// Finished: `Succeeded` or `Failed`.
pub fn is_terminal(p: &CompactPod) -> bool {
    matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

pub(super) fn unschedulable_by_scheduler(p: &CompactPod) -> bool {
    p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
        cs.iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
    })
}

/// Whether an unbound pod is one the operator's round would take as pending (§3.2 under
/// [`PendingRule::Unschedulable`](super::PendingRule::Unschedulable)): the trigger of the batch window, with the same tests as
/// [`build_input`](super::build_input) so a trigger never opens a round that has nothing to place.
pub fn triggers_provisioning(p: &CompactPod) -> bool {
    let bound = p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
    let nominated = p.status.as_ref().and_then(|s| s.nominated_node_name.as_deref()).is_some_and(|n| !n.is_empty());
    !bound
        && !is_daemonset_pod(&p.metadata)
        && !is_static_pod(&p.metadata)
        && !is_terminal(p)
        && p.metadata.deletion_timestamp.is_none()
        && !nominated
        && unschedulable_by_scheduler(p)
}

/// Whether a pod on a leaving node stays: `do-not-disrupt`, or a PDB that allows no eviction.
/// Whether a PodDisruptionBudget's spec forbids every eviction, whatever its pods' health
/// (`maxUnavailable: 0`, `"0"` or `"0%"`, `minAvailable: "100%"`): upstream's "fully blocking"
/// PDB. Disruption and provisioning give no capacity to a pod under one, on a node that leaves.
pub fn forbids_every_eviction(spec: &k8s_openapi::api::policy::v1::PodDisruptionBudgetSpec) -> bool {
    let zero = |v: &IntOrString| match v {
        IntOrString::Int(0) => true,
        IntOrString::String(s) => s == "0" || s == "0%",
        IntOrString::Int(_) => false,
    };
    spec.max_unavailable.as_ref().is_some_and(zero)
        || spec.min_available.as_ref().is_some_and(|v| matches!(v, IntOrString::String(s) if s == "100%"))
}

/// The pod's `karpenter.sh/do-not-disrupt` value when it holds at `now`: `true`, or a duration
/// not yet over since the pod started (its creation if it has not; unknown `now`: not over).
pub fn do_not_disrupt_active(p: &CompactPod, now: Option<k8s_openapi::jiff::Timestamp>) -> Option<&str> {
    let value = p.metadata.annotations.as_ref()?.get(labels::DO_NOT_DISRUPT)?;
    let started = p.status.as_ref().and_then(|s| s.start_time.as_ref()).or(p.metadata.creation_timestamp.as_ref());
    let running_for = now.zip(started).map(|(now, started)| now.duration_since(started.0).as_secs());
    (crds::admission::schedule::do_not_disrupt_holds(value, running_for) == Some(true)).then_some(value.as_str())
}

/// Why a pod on a leaving node stays there for good (upstream's "not currently reschedulable"): an
/// active `karpenter.sh/do-not-disrupt` (`true`, or a duration not yet over at `now` since the pod
/// started; unknown `now`: not over), a PodDisruptionBudget whose spec forbids every eviction, or
/// several PodDisruptionBudgets selecting it (the eviction API refuses such a pod).
pub(super) fn blocks_eviction(
    p: &CompactPod,
    pdbs: &[Arc<PodDisruptionBudget>],
    now: Option<k8s_openapi::jiff::Timestamp>,
) -> Option<String> {
    if let Some(value) = do_not_disrupt_active(p, now) {
        let why = if value == "true" { String::new() } else { ", not over yet".to_string() };
        return Some(format!("{}={value}{why}", labels::DO_NOT_DISRUPT));
    }
    let ns = p.metadata.namespace.as_deref().unwrap_or("default");
    let pod_labels = p.metadata.labels.clone().unwrap_or_default();
    let mut selecting = Vec::new();
    for pdb in pdbs {
        if pdb.metadata.namespace.as_deref().unwrap_or("default") != ns {
            continue;
        }
        let Some(spec) = &pdb.spec else { continue };
        let Some(sel) = spec.selector.as_ref().and_then(|s| selector_from(s).ok()) else { continue };
        if !selector_matches(&sel, &pod_labels) {
            continue;
        }
        let name = pdb.metadata.name.as_deref().unwrap_or("");
        if forbids_every_eviction(spec) {
            return Some(format!("PodDisruptionBudget {name} allows no eviction"));
        }
        selecting.push(name);
    }
    (selecting.len() > 1).then(|| format!("PodDisruptionBudgets {} all select it", selecting.join(", ")))
}

pub(super) enum Provisionable {
    Yes,
    OptOut,
    Ignored(String),
}

impl Provisionable {
    pub(super) fn and_volumes(self, check: impl FnOnce() -> Option<String>) -> Provisionable {
        match self {
            Provisionable::Yes => check().map_or(Provisionable::Yes, Provisionable::Ignored),
            other => other,
        }
    }
}

fn is_restricted_for_pods(key: &str) -> bool {
    let key = crate::requirements::normalize_key(key);
    if key == labels::HOSTNAME {
        return true;
    }
    let domain = key.split_once('/').map_or("", |(d, _)| d);
    let in_domain = |d: &str| domain == d || domain.ends_with(&format!(".{d}"));
    (in_domain("karpenter.sh") && key != labels::CAPACITY_TYPE && key != labels::NODEPOOL)
        || (in_domain("karpenter.clever-cloud.com") && key != labels::INSTANCE_CPU && key != labels::INSTANCE_MEMORY)
}

/// §3.2: `karpenter.sh/nodepool DoesNotExist` opts out silently; restricted keys, unsupported
/// operators and `matchFields` are ignored with a reason.
pub(super) fn provisionable(spec: &PodSpec) -> Provisionable {
    for k in spec.node_selector.iter().flat_map(|m| m.keys()) {
        if is_restricted_for_pods(k) {
            return Provisionable::Ignored(format!("nodeSelector uses the restricted label {k}"));
        }
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref());
    for term in required.iter().flat_map(|r| r.node_selector_terms.iter()) {
        if term.match_fields.as_ref().is_some_and(|f| !f.is_empty()) {
            return Provisionable::Ignored(
                "required node affinity uses matchFields, which the hub does not support".into(),
            );
        }
        for e in term.match_expressions.iter().flatten() {
            if e.key == labels::NODEPOOL && e.operator == "DoesNotExist" {
                return Provisionable::OptOut;
            }
            if is_restricted_for_pods(&e.key) {
                return Provisionable::Ignored(format!("required node affinity uses the restricted label {}", e.key));
            }
            if operator(&e.operator).is_none() {
                return Provisionable::Ignored(format!(
                    "required node affinity uses the unsupported operator {}",
                    e.operator
                ));
            }
        }
    }
    Provisionable::Yes
}
