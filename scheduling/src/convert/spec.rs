//! A pod spec read into the model: its requests (with `pod_requests`), its node selector and
//! affinity, tolerations, pod (anti-)affinity, topology spread and host ports, as a pending
//! [`Pod`] or a [`RunningPod`] on a node; also taints and label selectors, which nodes and
//! PodDisruptionBudgets share.
//!
//! Owns the reading of scheduling constraints, with errors naming the field. Must not decide whether
//! a pod is provisioned (that is `pending`).

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement as K8sNodeReq, PodSpec, Taint as K8sTaint, Toleration as K8sToleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector as K8sSelector, ObjectMeta};

use super::pending::is_terminal;
use super::{ConvertError, err};
use crate::compact::CompactPod;
use crate::model::{
    Constraints, HostPort, LabelSelector, NodeInclusionPolicy, NodeSelectorRequirement, Operator, Pod, PodAffinityTerm,
    RunningPod, SelectorOperator, SelectorRequirement, SpreadConstraint, Taint, TaintEffect, Toleration,
    TolerationOperator, WeightedNodeTerm, WeightedPodAffinityTerm, WhenUnsatisfiable,
};
use crate::resources::pod_requests;

pub(super) fn operator(op: &str) -> Option<Operator> {
    Some(match op {
        "In" => Operator::In,
        "NotIn" => Operator::NotIn,
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        "Gt" => Operator::Gt,
        "Lt" => Operator::Lt,
        _ => return None,
    })
}

fn node_reqs(list: &[K8sNodeReq], obj: &str, field: &str) -> Result<Vec<NodeSelectorRequirement>, ConvertError> {
    list.iter()
        .enumerate()
        .map(|(i, e)| {
            let op = operator(&e.operator).ok_or_else(|| {
                err(obj, format!("{field}[{i}].operator"), format!("unsupported operator {}", e.operator))
            })?;
            Ok(NodeSelectorRequirement {
                key: e.key.clone(),
                operator: op,
                values: e.values.clone().unwrap_or_default(),
                min_values: None,
            })
        })
        .collect()
}

/// A label selector's operator that selectors do not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported selector operator {operator}")]
pub struct UnsupportedSelectorOperator {
    /// The operator as written.
    pub operator: String,
}

/// A label selector; unsupported operators are errors (a missing selector is `None` upstream of this).
pub fn selector_from(s: &K8sSelector) -> Result<LabelSelector, UnsupportedSelectorOperator> {
    let mut out =
        LabelSelector { match_labels: s.match_labels.clone().unwrap_or_default(), match_expressions: Vec::new() };
    for e in s.match_expressions.iter().flatten() {
        let operator = match e.operator.as_str() {
            "In" => SelectorOperator::In,
            "NotIn" => SelectorOperator::NotIn,
            "Exists" => SelectorOperator::Exists,
            "DoesNotExist" => SelectorOperator::DoesNotExist,
            other => return Err(UnsupportedSelectorOperator { operator: other.to_string() }),
        };
        out.match_expressions.push(SelectorRequirement {
            key: e.key.clone(),
            operator,
            values: e.values.clone().unwrap_or_default(),
        });
    }
    Ok(out)
}

fn effect(s: &str) -> Option<TaintEffect> {
    match s {
        "NoSchedule" => Some(TaintEffect::NoSchedule),
        "PreferNoSchedule" => Some(TaintEffect::PreferNoSchedule),
        "NoExecute" => Some(TaintEffect::NoExecute),
        _ => None,
    }
}

pub(super) fn taint_from(t: &K8sTaint, obj: &str, field: &str) -> Result<Taint, ConvertError> {
    let effect = effect(&t.effect)
        .ok_or_else(|| err(obj, format!("{field}.effect"), format!("unknown effect {:?}", t.effect)))?;
    Ok(Taint { key: t.key.clone(), value: t.value.clone().filter(|v| !v.is_empty()), effect })
}

fn toleration_from(t: &K8sToleration, obj: &str, field: &str) -> Result<Toleration, ConvertError> {
    let operator = match t.operator.as_deref() {
        None | Some("Equal") => TolerationOperator::Equal,
        Some("Exists") => TolerationOperator::Exists,
        Some(other) => return Err(err(obj, format!("{field}.operator"), format!("unknown operator {other}"))),
    };
    let effect = match t.effect.as_deref() {
        None | Some("") => None,
        Some(e) => Some(effect(e).ok_or_else(|| err(obj, format!("{field}.effect"), format!("unknown effect {e}")))?),
    };
    Ok(Toleration {
        key: t.key.clone().unwrap_or_default(),
        operator,
        value: t.value.clone().unwrap_or_default(),
        effect,
    })
}

fn term_from(
    t: &k8s_openapi::api::core::v1::PodAffinityTerm,
    obj: &str,
    field: &str,
) -> Result<PodAffinityTerm, ConvertError> {
    let selector = match &t.label_selector {
        None => None,
        Some(s) => Some(selector_from(s).map_err(|m| err(obj, format!("{field}.labelSelector"), m.to_string()))?),
    };
    let namespace_selector = match &t.namespace_selector {
        None => None,
        Some(s) => Some(selector_from(s).map_err(|m| err(obj, format!("{field}.namespaceSelector"), m.to_string()))?),
    };
    Ok(PodAffinityTerm {
        selector,
        namespaces: t.namespaces.clone().unwrap_or_default(),
        namespace_selector,
        topology_key: t.topology_key.clone(),
        match_label_keys: t.match_label_keys.clone().unwrap_or_default(),
    })
}

fn policy(
    v: Option<&str>,
    default: NodeInclusionPolicy,
    obj: &str,
    field: &str,
) -> Result<NodeInclusionPolicy, ConvertError> {
    match v {
        None => Ok(default),
        Some("Honor") => Ok(NodeInclusionPolicy::Honor),
        Some("Ignore") => Ok(NodeInclusionPolicy::Ignore),
        Some(other) => Err(err(obj, field, format!("unknown policy {other}"))),
    }
}

/// The scheduling constraints of a pod spec.
pub fn constraints_from(spec: &PodSpec, obj: &str, base: &str) -> Result<Constraints, ConvertError> {
    let mut c = Constraints { node_selector: spec.node_selector.clone().unwrap_or_default(), ..Constraints::default() };
    if let Some(na) = spec.affinity.as_ref().and_then(|a| a.node_affinity.as_ref()) {
        if let Some(r) = &na.required_during_scheduling_ignored_during_execution {
            for (i, t) in r.node_selector_terms.iter().enumerate() {
                let f = format!(
                    "{base}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}].matchExpressions"
                );
                c.required_terms.push(node_reqs(t.match_expressions.as_deref().unwrap_or_default(), obj, &f)?);
            }
        }
        for (i, p) in na.preferred_during_scheduling_ignored_during_execution.iter().flatten().enumerate() {
            let f = format!(
                "{base}.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[{i}].preference.matchExpressions"
            );
            c.preferred_terms.push(WeightedNodeTerm {
                weight: p.weight,
                requirements: node_reqs(p.preference.match_expressions.as_deref().unwrap_or_default(), obj, &f)?,
            });
        }
    }
    for (i, t) in spec.tolerations.iter().flatten().enumerate() {
        c.tolerations.push(toleration_from(t, obj, &format!("{base}.tolerations[{i}]"))?);
    }
    if let Some(pa) = spec.affinity.as_ref().and_then(|a| a.pod_affinity.as_ref()) {
        for (i, t) in pa.required_during_scheduling_ignored_during_execution.iter().flatten().enumerate() {
            c.pod_affinity.push(term_from(t, obj, &format!("{base}.affinity.podAffinity.required[{i}]"))?);
        }
        for (i, t) in pa.preferred_during_scheduling_ignored_during_execution.iter().flatten().enumerate() {
            let term = term_from(&t.pod_affinity_term, obj, &format!("{base}.affinity.podAffinity.preferred[{i}]"))?;
            c.preferred_pod_affinity.push(WeightedPodAffinityTerm { weight: t.weight, term });
        }
    }
    if let Some(pa) = spec.affinity.as_ref().and_then(|a| a.pod_anti_affinity.as_ref()) {
        for (i, t) in pa.required_during_scheduling_ignored_during_execution.iter().flatten().enumerate() {
            c.pod_anti_affinity.push(term_from(t, obj, &format!("{base}.affinity.podAntiAffinity.required[{i}]"))?);
        }
        for (i, t) in pa.preferred_during_scheduling_ignored_during_execution.iter().flatten().enumerate() {
            let term =
                term_from(&t.pod_affinity_term, obj, &format!("{base}.affinity.podAntiAffinity.preferred[{i}]"))?;
            c.preferred_pod_anti_affinity.push(WeightedPodAffinityTerm { weight: t.weight, term });
        }
    }
    for (i, t) in spec.topology_spread_constraints.iter().flatten().enumerate() {
        let f = format!("{base}.topologySpreadConstraints[{i}]");
        let when = match t.when_unsatisfiable.as_str() {
            "DoNotSchedule" => WhenUnsatisfiable::DoNotSchedule,
            "ScheduleAnyway" => WhenUnsatisfiable::ScheduleAnyway,
            other => return Err(err(obj, format!("{f}.whenUnsatisfiable"), format!("unknown value {other}"))),
        };
        // A missing or unparsable selector selects nothing: the constraint never restricts (§3.11).
        let selector = t.label_selector.as_ref().and_then(|s| selector_from(s).ok());
        c.topology_spread.push(SpreadConstraint {
            max_skew: t.max_skew,
            topology_key: t.topology_key.clone(),
            when_unsatisfiable: when,
            selector,
            min_domains: t.min_domains,
            node_affinity_policy: policy(
                t.node_affinity_policy.as_deref(),
                NodeInclusionPolicy::Honor,
                obj,
                &format!("{f}.nodeAffinityPolicy"),
            )?,
            node_taints_policy: policy(
                t.node_taints_policy.as_deref(),
                NodeInclusionPolicy::Ignore,
                obj,
                &format!("{f}.nodeTaintsPolicy"),
            )?,
            match_label_keys: t.match_label_keys.clone().unwrap_or_default(),
        });
    }
    c.host_ports = host_ports(spec);
    Ok(c)
}

fn host_ports(spec: &PodSpec) -> Vec<HostPort> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten().filter(|c| c.restart_policy.as_deref() == Some("Always")))
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|&h| h > 0)?;
            Some(HostPort {
                ip: p.host_ip.clone().unwrap_or_default(),
                port,
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_string()),
            })
        })
        .collect()
}

pub(super) fn pod_from_spec(
    namespace: &str,
    name: &str,
    meta: &ObjectMeta,
    spec: &PodSpec,
    status: Option<&k8s_openapi::api::core::v1::PodStatus>,
    obj: &str,
    base: &str,
) -> Result<Pod, ConvertError> {
    let (requests, extended) = pod_requests(spec, status).map_err(|e| {
        let field = match e.container.as_str() {
            "overhead" => format!("{base}.overhead.{}", e.resource),
            "resources" => format!("{base}.resources.{}.{}", e.field, e.resource),
            c if e.field == "allocatedResources" => format!(
                "status.containerStatuses[{}].allocatedResources.{}",
                c.trim_start_matches("containers["),
                e.resource
            )
            .replace("]].", "]."),
            c => format!("{base}.{c}.resources.{}.{}", e.field, e.resource),
        };
        err(obj, field, e.source.to_string())
    })?;
    Ok(Pod {
        namespace: namespace.to_string(),
        name: name.to_string(),
        uid: meta.uid.clone().unwrap_or_else(|| format!("{namespace}/{name}")),
        created: meta.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second()),
        labels: meta.labels.clone().unwrap_or_default(),
        requests,
        extended,
        constraints: constraints_from(spec, obj, base)?,
        csi_volumes: Vec::new(),
        buffer: None,
    })
}

/// A pending pod.
pub fn pod_from(p: &CompactPod, obj: &str) -> Result<Pod, ConvertError> {
    let spec = p.spec.as_ref().ok_or_else(|| err(obj, "spec", "missing"))?;
    let ns = p.metadata.namespace.as_deref().unwrap_or("default");
    let name = p.metadata.name.as_deref().ok_or_else(|| err(obj, "metadata.name", "missing"))?;
    pod_from_spec(ns, name, &p.metadata, spec, p.status.as_ref(), obj, "spec")
}

pub(super) fn running_from(p: &CompactPod, obj: &str) -> Result<RunningPod, ConvertError> {
    let pod = pod_from(p, obj)?;
    let daemonset = p
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "DaemonSet")
        .map(|o| format!("{}/{}", pod.namespace, o.name));
    Ok(RunningPod {
        counted: !is_terminal(p) && p.metadata.deletion_timestamp.is_none(),
        daemonset,
        ..RunningPod::from(pod)
    })
}
