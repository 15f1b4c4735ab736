//! Test support, for unit tests only: the hub's watch caches (the management cluster's
//! [`MgmtCache`], a workload cluster's [`WorkloadCache`]) over `kube::runtime::reflector::store()`
//! stores that the test fills by applying `watcher::Event`s to their writers, as the hub's
//! reflectors do. The fact gathering of the per-cluster loops then runs over them synchronously:
//! no API server, no task, no sleep.
//!
//! Also the objects those tests put in them ([`objects`]): a namespace's node class and NodePool,
//! a workload cluster's pods, Nodes and the NodeClaims behind them, as the API would serve them.
//!
//! Owns: the stores, their writers and the listing order of a watch (Init, InitApply…, InitDone).
//! Must not: put an object in a store other than through a watcher event, or be built outside tests.

use futures::FutureExt;
use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{Node, PersistentVolume, PersistentVolumeClaim, PodTemplate},
    policy::v1::PodDisruptionBudget,
    storage::v1::{CSINode, StorageClass},
};
use kube::runtime::{
    reflector::{self, Lookup, Store, store::Writer},
    watcher::Event,
};

use crate::infra::{
    changes::Changes,
    hub::MgmtCache,
    registry::{OptionalStore, VolumeCaches, WorkloadCache},
};
use crds::{CapacityBuffer, CleverNodeClass, FlavorCatalog, NodeClaim, NodeGroup, NodeOverlay, NodePool};
use scheduling::CompactPod;

/// One store and its writer.
pub(crate) struct Cache<K: Lookup<DynamicType = ()> + Clone + 'static> {
    store: Store<K>,
    writer: Writer<K>,
}

impl<K: Lookup<DynamicType = ()> + Clone + 'static> Cache<K> {
    fn new() -> Self {
        let (store, writer) = reflector::store();
        Self { store, writer }
    }

    /// The store as an optional cache the server let the hub read.
    fn optional(&self) -> OptionalStore<K> {
        OptionalStore { store: self.store.clone(), refused: tokio::sync::watch::channel(false).1 }
    }

    /// Listed at least once (the store released `wait_until_ready`), as the hub waits for it.
    fn listed(&self) -> bool {
        self.store.wait_until_ready().now_or_never().is_some_and(|r| r.is_ok())
    }
}

/// The kinds the hub caches, each with its store in [`Caches`] and the side it is counted on.
pub(crate) trait Cached: Lookup<DynamicType = ()> + Clone + Sized + 'static {
    fn cache(caches: &mut Caches) -> &mut Cache<Self>;
    fn changes(caches: &Caches) -> &Changes;
}

macro_rules! cached {
    ($($kind:ty => $field:ident in $side:ident),* $(,)?) => {
        /// Every store the hub keeps for one management cluster and one workload cluster, empty and
        /// not yet listed until the test says so, and their change counters.
        pub(crate) struct Caches {
            $($field: Cache<$kind>,)*
            mgmt_changes: Changes,
            workload_changes: Changes,
        }

        impl Default for Caches {
            fn default() -> Self {
                Self {
                    $($field: Cache::new(),)*
                    mgmt_changes: Changes::per_namespace(),
                    workload_changes: Changes::new(),
                }
            }
        }

        $(impl Cached for $kind {
            fn cache(caches: &mut Caches) -> &mut Cache<Self> {
                &mut caches.$field
            }
            fn changes(caches: &Caches) -> &Changes {
                &caches.$side
            }
        })*

        impl Caches {
            /// Every store listed, with nothing in it (a new watch's Init, InitDone).
            pub(crate) fn listed() -> Self {
                let mut c = Self::default();
                $(c.list::<$kind>([]);)*
                c
            }
        }
    };
}

cached! {
    NodeClaim => claims in mgmt_changes,
    NodePool => pools in mgmt_changes,
    CleverNodeClass => classes in mgmt_changes,
    FlavorCatalog => catalogs in mgmt_changes,
    CapacityBuffer => buffers in mgmt_changes,
    PodTemplate => pod_templates in mgmt_changes,
    NodeOverlay => overlays in mgmt_changes,
    CompactPod => pods in workload_changes,
    Node => nodes in workload_changes,
    NodeGroup => nodegroups in workload_changes,
    DaemonSet => daemonsets in workload_changes,
    PodDisruptionBudget => pdbs in workload_changes,
    PersistentVolumeClaim => pvcs in workload_changes,
    PersistentVolume => pvs in workload_changes,
    StorageClass => storage_classes in workload_changes,
    CSINode => csinodes in workload_changes,
}

impl Caches {
    /// Feeds one watcher event to the store of its kind.
    pub(crate) fn event<K: Cached>(&mut self, event: &Event<K>) {
        K::cache(self).writer.apply_watcher_event(event);
        // Counted after the store holds it, as the hub's watches do.
        K::changes(self).observe(event);
    }

    /// A (re)list of kind `K` holding `objects`: Init, one InitApply each, InitDone.
    pub(crate) fn list<K: Cached>(&mut self, objects: impl IntoIterator<Item = K>) {
        self.event::<K>(&Event::Init);
        for o in objects {
            self.event(&Event::InitApply(o));
        }
        self.event::<K>(&Event::InitDone);
    }

    /// An object added or changed (a watch's Apply).
    pub(crate) fn apply<K: Cached>(&mut self, object: K) {
        self.event(&Event::Apply(object));
    }

    /// An object deleted (a watch's Delete).
    pub(crate) fn delete<K: Cached>(&mut self, object: K) {
        self.event(&Event::Delete(object));
    }

    /// The management cluster's cache, ready once its four stores have listed (as
    /// [`MgmtCache::start`] reports it).
    pub(crate) fn mgmt(&self) -> MgmtCache {
        let ready = self.claims.listed() && self.pools.listed() && self.classes.listed() && self.catalogs.listed();
        MgmtCache::from_stores(
            self.claims.store.clone(),
            self.pools.store.clone(),
            self.classes.store.clone(),
            self.catalogs.store.clone(),
            (self.buffers.store.clone(), self.pod_templates.store.clone(), self.overlays.store.clone()),
            self.mgmt_changes.clone(),
            ready,
        )
    }

    /// The workload cluster's cache.
    pub(crate) fn workload(&self) -> WorkloadCache {
        WorkloadCache {
            pods: self.pods.store.clone(),
            nodes: self.nodes.store.clone(),
            nodegroups: self.nodegroups.store.clone(),
            daemonsets: self.daemonsets.store.clone(),
            pdbs: self.pdbs.store.clone(),
            volumes: VolumeCaches {
                pvcs: self.pvcs.optional(),
                pvs: self.pvs.optional(),
                storage_classes: self.storage_classes.optional(),
                csinodes: self.csinodes.optional(),
            },
            changes: self.workload_changes.clone(),
        }
    }
}

/// Objects as the API serves them, for one workload cluster [`CLUSTER`] registered in namespace
/// [`NS`]. Each builder takes a JSON `extra` merged over what it builds (objects merge, the rest
/// replaces).
#[allow(clippy::unwrap_used)]
pub(crate) mod objects {
    use serde_json::{Value, json};

    use super::*;
    use crate::infra::registry::ClusterKey;

    /// The management namespace the cluster is registered in.
    pub(crate) const NS: &str = "team";
    /// The workload cluster's name.
    pub(crate) const CLUSTER: &str = "alpha";
    /// When every object of a fixture was created.
    pub(crate) const CREATED: &str = "2026-11-24T12:00:00Z";

    pub(crate) fn key() -> ClusterKey {
        ClusterKey::new(NS, CLUSTER)
    }

    /// `extra` merged over `v`.
    pub(crate) fn merge(v: &mut Value, extra: Value) {
        match (v, extra) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, e) in b {
                    merge(a.entry(k).or_insert(Value::Null), e);
                }
            }
            (v, e) => *v = e,
        }
    }

    fn build<T: serde::de::DeserializeOwned>(mut v: Value, extra: Value) -> T {
        merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn condition(type_: &str, status: &str, reason: &str) -> Value {
        json!({"type": type_, "status": status, "reason": reason, "message": "", "lastTransitionTime": CREATED})
    }

    /// A node class, its `Ready` condition `True` or `False` (as the node class controller sets it).
    pub(crate) fn class(name: &str, ready: bool) -> CleverNodeClass {
        let status = if ready { "True" } else { "False" };
        build(
            json!({
                "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "CleverNodeClass",
                "metadata": {"name": name, "namespace": NS, "uid": format!("uid-class-{name}"), "generation": 1},
                "spec": {},
                "status": {"conditions": [condition("Ready", status, if ready { "Ready" } else { "NotReady" })]},
            }),
            json!({}),
        )
    }

    /// A NodePool of [`CLUSTER`] on node class `class` offering 2XS to M (general-purpose.yaml
    /// without limits), removing empty and under-used nodes 30 s after their pods last changed.
    pub(crate) fn pool(name: &str, class: &str, extra: Value) -> NodePool {
        build(
            json!({
                "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodePool",
                "metadata": {"name": name, "namespace": NS, "uid": format!("uid-pool-{name}"), "generation": 1},
                "spec": {
                    "clusterName": CLUSTER,
                    "template": {"spec": {
                        "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": class},
                        "requirements": [{"key": "clever-cloud.com/flavor", "operator": "In", "values": ["2XS", "XS", "S", "M"]}],
                        "expireAfter": "720h",
                    }},
                    "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "30s"},
                },
            }),
            extra,
        )
    }

    fn pod(name: &str, cpu: &str, memory: &str, extra: Value) -> CompactPod {
        build(
            json!({
                "metadata": {
                    "name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": {"app": "web"},
                    "creationTimestamp": CREATED,
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "uid-rs-web", "controller": true}],
                },
                "spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
            }),
            extra,
        )
    }

    /// A pod kube-scheduler found no node for (`PodScheduled=False`, `Unschedulable`).
    pub(crate) fn pending_pod(name: &str, cpu: &str, memory: &str) -> CompactPod {
        pod(
            name,
            cpu,
            memory,
            json!({"status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
            ]}}),
        )
    }

    /// A pod running and Ready on `node`.
    pub(crate) fn running_pod(name: &str, node: &str, cpu: &str, memory: &str, extra: Value) -> CompactPod {
        let mut running = json!({
            "spec": {"nodeName": node},
            "status": {"phase": "Running", "startTime": CREATED, "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": CREATED},
                {"type": "Ready", "status": "True", "lastTransitionTime": CREATED},
            ]},
        });
        merge(&mut running, extra);
        pod(name, cpu, memory, running)
    }

    /// A built-in flavor's CPUs and allocatable memory (what CKE's kubelet reports).
    fn allocatable(flavor: &str) -> (&'static str, &'static str) {
        match flavor {
            "2XS" => ("4", "3809484Ki"),
            "XS" => ("6", "7835180Ki"),
            "S" => ("8", "11854748Ki"),
            _ => ("10", "15886592Ki"),
        }
    }

    /// The Ready, initialized Node of a claim of pool `pool` of flavor `flavor`.
    pub(crate) fn node(name: &str, pool: &str, flavor: &str) -> Node {
        let (cpu, memory) = allocatable(flavor);
        build(
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "uid": format!("uid-node-{name}"), "creationTimestamp": CREATED, "labels": {
                    "kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": flavor,
                    "clever-cloud.com/flavor": flavor, "topology.kubernetes.io/zone": "par",
                    "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
                    "karpenter.sh/capacity-type": "on-demand", "karpenter.sh/nodepool": pool,
                    "karpenter.sh/registered": "true", "karpenter.sh/initialized": "true",
                }},
                "spec": {"providerID": format!("clevercloud://{name}")},
                "status": {
                    "capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
                    "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }),
            json!({}),
        )
    }

    /// A NodeClaim of pool `pool` for one `flavor`: launched, registered as Node `name` and
    /// initialized, with the extra conditions `conditions` (type, reason) `True`; with `node` false,
    /// a claim still in flight (created, no Node yet).
    pub(crate) fn claim(name: &str, pool: &str, flavor: &str, node: bool, conditions: &[(&str, &str)]) -> NodeClaim {
        let mut status = json!({});
        if node {
            let mut all: Vec<Value> =
                ["Launched", "Registered", "Initialized", "Ready"].iter().map(|t| condition(t, "True", t)).collect();
            all.extend(conditions.iter().map(|(t, r)| condition(t, "True", r)));
            status = json!({"providerID": format!("clevercloud://{name}"), "nodeName": name, "conditions": all});
        }
        build(
            json!({
                "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeClaim",
                "metadata": {
                    "name": name, "namespace": NS, "uid": format!("uid-claim-{name}"), "creationTimestamp": CREATED,
                    "labels": {"karpenter.sh/nodepool": pool, "node.kubernetes.io/instance-type": flavor},
                },
                "spec": {
                    "clusterName": CLUSTER,
                    "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"},
                    "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [flavor]}],
                },
                "status": status,
            }),
            json!({}),
        )
    }
}
