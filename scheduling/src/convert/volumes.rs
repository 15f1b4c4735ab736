//! What a pod's volumes mean for its placement: the node requirements of its bound
//! PersistentVolumes and of its unbound claims' StorageClasses (§3.12), the CSI volumes counted
//! against a node's attach limits, and the first invalid volume that keeps the pod from being
//! provisioned (§3.2).
//!
//! Owns the reading of PVCs, PVs and StorageClasses for one pod. Must not read nodes' attach limits
//! (that is `build_input`, from CSINodes).

use crds::labels;
use k8s_openapi::api::core::v1::PodSpec;

use super::Volumes;
use super::spec::operator;
use crate::model::{NodeSelectorRequirement, Operator};

/// Node requirements from a pod's volumes (§3.12): a bound PV's node affinity (hostname terms
/// ignored), an unbound PVC's StorageClass `allowedTopologies`; several volumes combine as the cross
/// product of their alternatives (at most 16). Empty: unconstrained.
pub(super) fn volume_topology(spec: &PodSpec, namespace: &str, volumes: &Volumes) -> Vec<Vec<NodeSelectorRequirement>> {
    const MAX_ALTERNATIVES: usize = 16;
    let mut combos: Vec<Vec<NodeSelectorRequirement>> = vec![Vec::new()];
    let in_req = |key: &str, values: Vec<String>| NodeSelectorRequirement {
        key: key.to_string(),
        operator: Operator::In,
        values,
        min_values: None,
    };
    for v in spec.volumes.iter().flatten() {
        let Some(claim) = v.persistent_volume_claim.as_ref().map(|c| c.claim_name.as_str()) else { continue };
        let Some(pvc) = volumes.pvcs.iter().flatten().find(|c| {
            c.metadata.name.as_deref() == Some(claim)
                && c.metadata.namespace.as_deref().unwrap_or("default") == namespace
        }) else {
            continue;
        };
        let alts: Vec<Vec<NodeSelectorRequirement>> = match pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()) {
            Some(pv_name) if !pv_name.is_empty() => {
                let pv = volumes.pvs.iter().flatten().find(|p| p.metadata.name.as_deref() == Some(pv_name));
                let terms = pv
                    .and_then(|p| p.spec.as_ref())
                    .and_then(|s| s.node_affinity.as_ref())
                    .and_then(|a| a.required.as_ref())
                    .map(|r| r.node_selector_terms.clone())
                    .unwrap_or_default();
                terms
                    .iter()
                    .filter_map(|t| {
                        let reqs: Vec<NodeSelectorRequirement> = t
                            .match_expressions
                            .iter()
                            .flatten()
                            .filter(|e| e.key != labels::HOSTNAME)
                            .filter_map(|e| {
                                Some(NodeSelectorRequirement {
                                    key: e.key.clone(),
                                    operator: operator(&e.operator)?,
                                    values: e.values.clone().unwrap_or_default(),
                                    min_values: None,
                                })
                            })
                            .collect();
                        (!reqs.is_empty()).then_some(reqs)
                    })
                    .collect()
            }
            _ => {
                let class_name = pvc.spec.as_ref().and_then(|s| s.storage_class_name.as_deref());
                let class = volumes.storage_classes.iter().flatten().find(|c| c.metadata.name.as_deref() == class_name);
                class
                    .and_then(|c| c.allowed_topologies.as_ref())
                    .into_iter()
                    .flatten()
                    .map(|t| {
                        t.match_label_expressions
                            .iter()
                            .flatten()
                            .map(|e| in_req(&e.key, e.values.clone()))
                            .collect::<Vec<_>>()
                    })
                    .filter(|r| !r.is_empty())
                    .collect()
            }
        };
        if alts.is_empty() {
            continue;
        }
        let mut next = Vec::new();
        for c in &combos {
            for a in &alts {
                if next.len() < MAX_ALTERNATIVES {
                    let mut both = c.clone();
                    both.extend(a.iter().cloned());
                    next.push(both);
                }
            }
        }
        combos = next;
    }
    if combos.iter().all(Vec::is_empty) { Vec::new() } else { combos }
}

/// The CSI volumes of a pod: `(driver, namespace/claim)` for each PVC whose bound PV is a CSI volume,
/// or, unbound, whose StorageClass names the provisioner.
pub(super) fn csi_volumes(spec: &PodSpec, namespace: &str, volumes: &Volumes) -> Vec<(String, String)> {
    if volumes.csinodes.is_none() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for v in spec.volumes.iter().flatten() {
        let Some(claim) = v.persistent_volume_claim.as_ref().map(|c| c.claim_name.as_str()) else { continue };
        let Some(pvc) = volumes.pvcs.iter().flatten().find(|c| {
            c.metadata.name.as_deref() == Some(claim)
                && c.metadata.namespace.as_deref().unwrap_or("default") == namespace
        }) else {
            continue;
        };
        let driver = match pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()).filter(|n| !n.is_empty()) {
            Some(pv_name) => volumes
                .pvs
                .iter()
                .flatten()
                .find(|p| p.metadata.name.as_deref() == Some(pv_name))
                .and_then(|p| p.spec.as_ref())
                .and_then(|s| s.csi.as_ref())
                .map(|c| c.driver.clone()),
            None => {
                let class_name = pvc.spec.as_ref().and_then(|s| s.storage_class_name.as_deref());
                volumes
                    .storage_classes
                    .iter()
                    .flatten()
                    .find(|c| c.metadata.name.as_deref() == class_name)
                    .map(|c| c.provisioner.clone())
            }
        };
        if let Some(d) = driver {
            out.push((d, format!("{namespace}/{claim}")));
        }
    }
    out
}

/// The first invalid volume of a pod (§3.2 3): missing PVC, PVC deleting or `Lost`, unbound PVC
/// without a storage class or with one that does not exist, or whose class binds `Immediate`.
pub(super) fn invalid_volume(spec: &PodSpec, namespace: &str, volumes: &Volumes) -> Option<String> {
    let pvcs = volumes.pvcs.as_ref()?;
    for v in spec.volumes.iter().flatten() {
        let Some(claim) = v.persistent_volume_claim.as_ref().map(|c| c.claim_name.as_str()) else { continue };
        let pvc = pvcs.iter().find(|c| {
            c.metadata.name.as_deref() == Some(claim)
                && c.metadata.namespace.as_deref().unwrap_or("default") == namespace
        });
        let Some(pvc) = pvc else {
            return Some(format!("volume {}: PersistentVolumeClaim {claim} not found", v.name));
        };
        if pvc.metadata.deletion_timestamp.is_some() {
            return Some(format!("volume {}: PersistentVolumeClaim {claim} is being deleted", v.name));
        }
        if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Lost") {
            return Some(format!("volume {}: PersistentVolumeClaim {claim} is Lost", v.name));
        }
        let bound = pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_some_and(|n| !n.is_empty());
        if bound {
            continue;
        }
        let Some(classes) = &volumes.storage_classes else { continue };
        let class_name = pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone()).or_else(|| {
            classes
                .iter()
                .find(|c| {
                    c.metadata.annotations.as_ref().and_then(|a| a.get("storageclass.kubernetes.io/is-default-class"))
                        == Some(&"true".to_string())
                })
                .and_then(|c| c.metadata.name.clone())
        });
        let Some(class_name) = class_name.filter(|c| !c.is_empty()) else {
            return Some(format!("volume {}: unbound PersistentVolumeClaim {claim} has no storage class", v.name));
        };
        match classes.iter().find(|c| c.metadata.name.as_deref() == Some(class_name.as_str())) {
            None => return Some(format!("volume {}: StorageClass {class_name} of {claim} not found", v.name)),
            Some(c) if c.volume_binding_mode.as_deref() != Some("WaitForFirstConsumer") => {
                return Some(format!(
                    "volume {}: unbound PersistentVolumeClaim {claim} uses the Immediate StorageClass {class_name}",
                    v.name
                ));
            }
            Some(_) => {}
        }
    }
    None
}
