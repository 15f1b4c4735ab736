//! A workload cluster's storage objects as provisioning and disruption read them (issue 28 item
//! 4): PersistentVolumeClaims, PersistentVolumes, StorageClasses and CSINodes, in trimmed watch
//! caches, handed to the scheduling core as `plan` hands it a snapshot's ([`Volumes`]): a pod's
//! bound volume pins it to a zone or node, an unbound claim's class restricts where it can be
//! made, a node's CSI attach limit caps the volumes it takes.
//!
//! Each cache is optional: the cluster's identity may have been granted by an earlier release's
//! `workload-rbac.yaml`, which did not list these kinds. A refused list or watch (HTTP 403) stops
//! that one watch, its kind reads as unknown (`None`, so not checked, as in a `plan` snapshot
//! without it), and the cluster's status says so and how to grant it — instead of the whole
//! cluster turning Unauthorized at an upgrade until it is registered again.
//!
//! Owns: those caches, their trimming and the refused state. Must not: decide, write, or publish
//! anything the server sent.

use std::sync::Arc;

use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim},
    storage::v1::{CSINode, StorageClass},
};
use kube::{
    Api, Client, Resource,
    runtime::reflector::{Lookup, Store},
};
use scheduling::convert::Volumes;
use tokio::sync::watch;

/// The annotation marking a cluster's default StorageClass (read for unbound claims naming none).
const DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";

/// One optional cache: its store, and whether the server refused to list it.
#[derive(Clone)]
pub struct OptionalStore<K: Lookup<DynamicType = ()> + Clone + 'static> {
    pub(crate) store: Store<K>,
    pub(crate) refused: watch::Receiver<bool>,
}

impl<K: Lookup<DynamicType = ()> + Clone + 'static> std::fmt::Debug for OptionalStore<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OptionalStore").field("len", &self.store.len()).field("refused", &self.is_refused()).finish()
    }
}

impl<K: Lookup<DynamicType = ()> + Clone + 'static> OptionalStore<K> {
    /// What the cache holds, or `None` when the server refused it (unknown: not checked).
    pub fn state(&self) -> Option<Vec<Arc<K>>> {
        (!self.is_refused()).then(|| self.store.state())
    }

    /// Whether the server refused to list or watch the kind.
    pub fn is_refused(&self) -> bool {
        *self.refused.borrow()
    }

    /// Listed, or refused (both settle it); false if the watch ended otherwise. A refused watch
    /// ends, and its store's wait then fails too: the refusal is what counts.
    pub async fn settled(&self) -> bool {
        let mut refused = self.refused.clone();
        let listed = tokio::select! {
            r = self.store.wait_until_ready() => r.is_ok(),
            r = refused.wait_for(|r| *r) => r.is_ok(),
        };
        listed || self.is_refused()
    }
}

/// The storage caches of one workload cluster.
#[derive(Clone)]
pub struct VolumeCaches {
    pub pvcs: OptionalStore<PersistentVolumeClaim>,
    pub pvs: OptionalStore<PersistentVolume>,
    pub storage_classes: OptionalStore<StorageClass>,
    pub csinodes: OptionalStore<CSINode>,
}

impl std::fmt::Debug for VolumeCaches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeCaches")
            .field("pvcs", &self.pvcs)
            .field("pvs", &self.pvs)
            .field("storage_classes", &self.storage_classes)
            .field("csinodes", &self.csinodes)
            .finish()
    }
}

impl VolumeCaches {
    /// Start the four watches under `cancel`; errors other than a refusal go to `failures`.
    pub(super) fn start(client: &Client, w: &super::connection::Watching<'_>) -> Self {
        VolumeCaches {
            pvcs: optional(Api::all(client.clone()), trim_pvc, w),
            pvs: optional(Api::all(client.clone()), trim_pv, w),
            storage_classes: optional(Api::all(client.clone()), trim_storage_class, w),
            csinodes: optional(Api::all(client.clone()), trim_csinode, w),
        }
    }

    /// What the decisions read: each kind's objects, `None` for a refused one.
    pub fn volumes(&self) -> Volumes {
        Volumes {
            pvcs: self.pvcs.state(),
            storage_classes: self.storage_classes.state(),
            pvs: self.pvs.state(),
            csinodes: self.csinodes.state(),
        }
    }

    /// Every cache listed or refused.
    pub async fn settled(&self) -> bool {
        let (a, b, c, d) = tokio::join!(
            self.pvcs.settled(),
            self.pvs.settled(),
            self.storage_classes.settled(),
            self.csinodes.settled()
        );
        a && b && c && d
    }

    /// The kinds the server refused, by their plural (for the cluster's status).
    pub fn refused(&self) -> Vec<&'static str> {
        [
            (self.pvcs.is_refused(), "persistentvolumeclaims"),
            (self.pvs.is_refused(), "persistentvolumes"),
            (self.storage_classes.is_refused(), "storageclasses"),
            (self.csinodes.is_refused(), "csinodes"),
        ]
        .into_iter()
        .filter_map(|(refused, kind)| refused.then_some(kind))
        .collect()
    }
}

fn optional<K>(api: Api<K>, trim: fn(&mut K), w: &super::connection::Watching<'_>) -> OptionalStore<K>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (tx, refused) = watch::channel(false);
    let store = super::connection::spawn_cache(api, trim, w, |_| {}, Some(tx));
    OptionalStore { store, refused }
}

/// Claims: where they stand (bound volume, class, phase, deletion); not their size or source.
fn trim_pvc(pvc: &mut PersistentVolumeClaim) {
    trim_meta(pvc);
    if let Some(spec) = pvc.spec.as_mut() {
        *spec = k8s_openapi::api::core::v1::PersistentVolumeClaimSpec {
            volume_name: spec.volume_name.take(),
            storage_class_name: spec.storage_class_name.take(),
            ..Default::default()
        };
    }
    if let Some(status) = pvc.status.as_mut() {
        *status = k8s_openapi::api::core::v1::PersistentVolumeClaimStatus {
            phase: status.phase.take(),
            ..Default::default()
        };
    }
}

/// Volumes: where they can be used (node affinity) and their CSI driver; not the driver's
/// attributes or secrets references, nor the claim they are bound to.
fn trim_pv(pv: &mut PersistentVolume) {
    trim_meta(pv);
    if let Some(spec) = pv.spec.as_mut() {
        let csi = spec
            .csi
            .take()
            .map(|c| k8s_openapi::api::core::v1::CSIPersistentVolumeSource { driver: c.driver, ..Default::default() });
        *spec = k8s_openapi::api::core::v1::PersistentVolumeSpec {
            node_affinity: spec.node_affinity.take(),
            csi,
            ..Default::default()
        };
    }
    pv.status = None;
}

/// Classes: provisioner, binding mode, allowed topologies and the default-class mark; not their
/// parameters (which may name secrets).
fn trim_storage_class(class: &mut StorageClass) {
    let default = class.metadata.annotations.as_ref().and_then(|a| a.get(DEFAULT_CLASS)).cloned();
    trim_meta(class);
    class.metadata.annotations = default.map(|d| [(DEFAULT_CLASS.to_string(), d)].into());
    class.parameters = None;
    class.mount_options = None;
}

/// CSINodes: each driver's name and attach limit.
fn trim_csinode(node: &mut CSINode) {
    trim_meta(node);
    for d in &mut node.spec.drivers {
        d.node_id = String::new();
        d.topology_keys = None;
    }
}

/// What none of these kinds' readers look at in their metadata.
fn trim_meta<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    meta.annotations = None;
    meta.labels = None;
    meta.owner_references = None;
    meta.finalizers = None;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn trimmed_objects_keep_what_the_volume_checks_read() {
        let mut pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "data", "namespace": "db", "annotations": {"a": "b"}, "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"volumeName": "pv-1", "storageClassName": "fast", "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}
        }))
        .unwrap();
        trim_pvc(&mut pvc);
        let spec = pvc.spec.as_ref().unwrap();
        assert_eq!((spec.volume_name.as_deref(), spec.storage_class_name.as_deref()), (Some("pv-1"), Some("fast")));
        assert!(spec.access_modes.is_none() && spec.resources.is_none());
        assert_eq!(pvc.status.as_ref().unwrap().phase.as_deref(), Some("Bound"));
        assert!(pvc.metadata.deletion_timestamp.is_some() && pvc.metadata.annotations.is_none());

        let mut pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-1"},
            "spec": {"csi": {"driver": "csi.example", "volumeHandle": "vol-123", "volumeAttributes": {"k": "v"},
                    "nodePublishSecretRef": {"name": "s", "namespace": "x"}},
                "claimRef": {"name": "data", "namespace": "db"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["par"]}]}]}}},
            "status": {"phase": "Bound"}
        }))
        .unwrap();
        trim_pv(&mut pv);
        let spec = pv.spec.as_ref().unwrap();
        let csi = spec.csi.as_ref().unwrap();
        assert_eq!(csi.driver, "csi.example");
        assert!(
            csi.volume_handle.is_empty() && csi.volume_attributes.is_none() && csi.node_publish_secret_ref.is_none()
        );
        assert!(spec.node_affinity.is_some() && spec.claim_ref.is_none() && pv.status.is_none());

        let mut class: StorageClass = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "fast", "annotations": {DEFAULT_CLASS: "true", "other": "x"}},
            "provisioner": "csi.example", "parameters": {"csi.storage.k8s.io/provisioner-secret-name": "s"},
            "volumeBindingMode": "WaitForFirstConsumer",
            "allowedTopologies": [{"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": ["par"]}]}]
        }))
        .unwrap();
        trim_storage_class(&mut class);
        assert_eq!(class.metadata.annotations.as_ref().unwrap().len(), 1, "only the default-class mark");
        assert!(class.parameters.is_none());
        assert!(class.allowed_topologies.is_some() && class.volume_binding_mode.is_some());

        let mut node: CSINode = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1"},
            "spec": {"drivers": [{"name": "csi.example", "nodeID": "i-123", "topologyKeys": ["zone"], "allocatable": {"count": 2}}]}
        }))
        .unwrap();
        trim_csinode(&mut node);
        let d = &node.spec.drivers[0];
        assert_eq!((d.name.as_str(), d.allocatable.as_ref().and_then(|a| a.count)), ("csi.example", Some(2)));
        assert!(d.node_id.is_empty() && d.topology_keys.is_none());
    }
}
