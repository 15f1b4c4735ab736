//! DaemonSet overhead (karpenter-semantics §3.9): which DaemonSets would run on a node of a pool's
//! instance type or on an existing node, grouped so each group of types shares one overhead.
//!
//! Owns compatibility of DaemonSet pods with templates, types and nodes. Must not place pods.

use crds::quantity::Resources;

use crate::instance_types::{TypeInfo, type_meets};
use crate::intern::{Interner, Key, Val};
use crate::model::{DaemonSet, HostPort, Taint, Toleration};
use crate::requirements::Requirements;
use crate::taints;

/// A DaemonSet's pod, prepared.
#[derive(Debug, Clone)]
pub struct DsPod {
    /// `namespace/name`.
    pub key: String,
    /// Strict requirement alternatives: nodeSelector ∧ each required term (OR'ed).
    pub alternatives: Vec<Requirements>,
    /// Tolerations.
    pub tolerations: Vec<Toleration>,
    /// Requests.
    pub requests: Resources,
    /// Host ports.
    pub host_ports: Vec<HostPort>,
}

/// Types sharing one set of compatible DaemonSets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DsGroup {
    /// DaemonSets (indices into the prepared list).
    pub members: Vec<usize>,
    /// Σ requests.
    pub overhead: Resources,
    /// Their host ports.
    pub ports: Vec<HostPort>,
}

/// Prepares DaemonSet pods.
pub fn prepare(daemonsets: &[DaemonSet], ints: &mut Interner) -> Vec<DsPod> {
    daemonsets
        .iter()
        .map(|ds| {
            let c = &ds.pod.constraints;
            let selector = Requirements::from_labels(&c.node_selector, ints);
            let alternatives = if c.required_terms.is_empty() {
                vec![selector]
            } else {
                c.required_terms.iter().map(|t| selector.intersect(&Requirements::from_api(t, ints), ints)).collect()
            };
            DsPod {
                key: ds.key(),
                alternatives,
                tolerations: c.tolerations.clone(),
                requests: ds.pod.requests,
                host_ports: c.host_ports.clone(),
            }
        })
        .collect()
}

/// Whether a DaemonSet pod would run on a new node of a pool template and an instance type.
pub fn compatible_with_type(
    ds: &DsPod,
    template: &Requirements,
    template_taints: &[Taint],
    t: &TypeInfo,
    ints: &Interner,
    well_known: &impl Fn(Key) -> bool,
) -> bool {
    // Startup taints are not needed, PreferNoSchedule is implicitly tolerated.
    taints::first_untolerated(template_taints, &ds.tolerations, true).is_none()
        && ds
            .alternatives
            .iter()
            .any(|alt| template.compatible(alt, ints, well_known).is_ok() && type_meets(t, alt, ints).is_ok())
}

/// Whether a DaemonSet pod would run on an existing node (strict label matching).
pub fn compatible_with_node(ds: &DsPod, node_taints: &[Taint], labels: &[(Key, Val)], ints: &Interner) -> bool {
    taints::first_untolerated(node_taints, &ds.tolerations, true).is_none()
        && ds.alternatives.iter().any(|alt| alt.matches_labels(labels, ints).is_ok())
}

/// Groups by the exact set of compatible DaemonSets: returns the group index of `members`, adding
/// the group if new.
pub fn group_of(groups: &mut Vec<DsGroup>, members: Vec<usize>, pods: &[DsPod]) -> usize {
    if let Some(i) = groups.iter().position(|g| g.members == members) {
        return i;
    }
    let overhead = members.iter().fold(Resources::ZERO, |acc, &m| acc + pods[m].requests);
    let ports = members.iter().flat_map(|&m| pods[m].host_ports.iter().cloned()).collect();
    groups.push(DsGroup { members, overhead, ports });
    groups.len() - 1
}
