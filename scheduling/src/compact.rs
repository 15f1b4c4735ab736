//! A pod as the decisions read it: the hub's watch caches hold pods in this shape, and
//! [`crate::convert`], the disruption scope and the drain read it directly (hub.md, B4 memory).
//!
//! Owns which fields of a pod any decision reads (requests, host ports, scheduling constraints,
//! claimed volumes, owner, the hub's annotations, phase, `PodScheduled` and `Ready`). Must not
//! drop a field a decision reads: `the_projection_keeps_every_field_a_decision_reads` converts a
//! pod before and after projection and compares.
//!
//! Why not a `k8s_openapi` `Pod`: every optional field of `Pod` and `Container` is inline
//! (`size_of::<Pod>()` is over 2 KiB, `Container` as much again), so even an emptied pod costs
//! kilobytes; and the pods of one ReplicaSet on one node have the same spec, which a `Pod` cannot
//! share. Here the spec is behind an [`Arc`], so a cache can hold one copy per distinct spec.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod as K8sPod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The annotation the kubelet puts on the API mirror of a static pod.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// A pod projected onto what the decisions read.
///
/// `spec` keeps `nodeName`, so pods that share it are pods of one template on one node (or all
/// pending): a cache interns it by value (see the operator's pod cache) without a reader ever
/// seeing another pod's node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CompactPod {
    pub metadata: ObjectMeta,
    pub spec: Option<Arc<PodSpec>>,
    pub status: Option<PodStatus>,
}

/// Whether a decision reads the pod annotation `key`; every other annotation is dropped.
pub fn read_annotation(key: &str) -> bool {
    key.starts_with("karpenter.sh/")
        || key.starts_with("karpenter.clever-cloud.com/")
        || key == "controller.kubernetes.io/pod-deletion-cost"
        || key == MIRROR_ANNOTATION
}

impl CompactPod {
    /// The node the pod is bound to, if any.
    pub fn node_name(&self) -> Option<&str> {
        self.spec.as_ref().and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty())
    }

    /// `namespace/name`, for messages.
    pub fn key(&self) -> String {
        format!(
            "{}/{}",
            self.metadata.namespace.as_deref().unwrap_or("default"),
            self.metadata.name.as_deref().unwrap_or_default()
        )
    }
}

// Served as `v1/pods`: the watch caches list and watch pods straight into this shape.
impl k8s_openapi::Resource for CompactPod {
    const API_VERSION: &'static str = <K8sPod as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <K8sPod as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <K8sPod as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <K8sPod as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <K8sPod as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <K8sPod as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for CompactPod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl<'de> serde::Deserialize<'de> for CompactPod {
    /// Decodes only the fields the projection keeps (the rest is skipped unread, so a cache never
    /// holds, even briefly, a pod's environment, probes, mounts or managed fields); each kept field
    /// with its `k8s_openapi` type, so it reads as a whole `Pod` would.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let wire = wire::Pod::deserialize(d)?;
        Ok(CompactPod {
            metadata: wire.metadata.into(),
            spec: wire.spec.map(|s| Arc::new(s.into())),
            status: wire.status.map(Into::into),
        })
    }
}

/// The wire shape of the fields [`CompactPod`] keeps; serde skips every other field.
mod wire {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1 as core;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
    use serde::Deserialize;
    use serde::de::{IgnoredAny, MapAccess, Visitor};

    #[derive(Deserialize)]
    pub(super) struct Pod {
        #[serde(default)]
        pub metadata: Meta,
        pub spec: Option<Spec>,
        pub status: Option<Status>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct Meta {
        name: Option<String>,
        namespace: Option<String>,
        uid: Option<String>,
        resource_version: Option<String>,
        creation_timestamp: Option<Time>,
        deletion_timestamp: Option<Time>,
        deletion_grace_period_seconds: Option<i64>,
        labels: Option<BTreeMap<String, String>>,
        #[serde(default, deserialize_with = "read_annotations")]
        annotations: Option<BTreeMap<String, String>>,
        owner_references: Option<Vec<OwnerReference>>,
    }

    impl From<Meta> for ObjectMeta {
        fn from(m: Meta) -> Self {
            ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                uid: m.uid,
                resource_version: m.resource_version,
                creation_timestamp: m.creation_timestamp,
                deletion_timestamp: m.deletion_timestamp,
                deletion_grace_period_seconds: m.deletion_grace_period_seconds,
                labels: m.labels,
                annotations: m.annotations,
                owner_references: m.owner_references,
                ..ObjectMeta::default()
            }
        }
    }

    type Annotations = BTreeMap<String, String>;

    /// Annotations a decision reads (`None` when there is none); the others' values are skipped.
    fn read_annotations<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Annotations>, D::Error> {
        struct Read;
        impl<'de> Visitor<'de> for Read {
            type Value = Option<Annotations>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of annotations")
            }

            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(None)
            }

            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(None)
            }

            fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_map(Read)
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut kept = BTreeMap::new();
                while let Some(key) = map.next_key::<String>()? {
                    if super::read_annotation(&key) {
                        kept.insert(key, map.next_value::<String>()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Some(kept).filter(|k| !k.is_empty()))
            }
        }
        d.deserialize_option(Read)
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct Spec {
        node_name: Option<String>,
        containers: Option<Vec<Container>>,
        init_containers: Option<Vec<Container>>,
        overhead: Option<BTreeMap<String, Quantity>>,
        resources: Option<core::ResourceRequirements>,
        node_selector: Option<BTreeMap<String, String>>,
        affinity: Option<core::Affinity>,
        tolerations: Option<Vec<core::Toleration>>,
        topology_spread_constraints: Option<Vec<core::TopologySpreadConstraint>>,
        priority: Option<i32>,
        priority_class_name: Option<String>,
        termination_grace_period_seconds: Option<i64>,
        volumes: Option<Vec<Volume>>,
    }

    impl From<Spec> for core::PodSpec {
        fn from(s: Spec) -> Self {
            core::PodSpec {
                node_name: s.node_name,
                containers: s.containers.unwrap_or_default().into_iter().map(Into::into).collect(),
                init_containers: s.init_containers.map(|cs| cs.into_iter().map(Into::into).collect()),
                overhead: s.overhead,
                resources: s.resources,
                node_selector: s.node_selector,
                affinity: s.affinity,
                tolerations: s.tolerations,
                topology_spread_constraints: s.topology_spread_constraints,
                priority: s.priority,
                // The drain's critical tier.
                priority_class_name: s.priority_class_name,
                termination_grace_period_seconds: s.termination_grace_period_seconds,
                // Only claimed volumes matter (zones, attach limits); service-account tokens,
                // config maps and secrets do not.
                volumes: s
                    .volumes
                    .map(|vs| {
                        vs.into_iter()
                            .filter(|v| v.persistent_volume_claim.is_some())
                            .map(|v| core::Volume {
                                name: v.name,
                                persistent_volume_claim: v.persistent_volume_claim,
                                ..core::Volume::default()
                            })
                            .collect::<Vec<_>>()
                    })
                    .filter(|vs| !vs.is_empty()),
                ..core::PodSpec::default()
            }
        }
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Container {
        name: String,
        resources: Option<core::ResourceRequirements>,
        restart_policy: Option<String>,
        ports: Option<Vec<core::ContainerPort>>,
    }

    impl From<Container> for core::Container {
        fn from(c: Container) -> Self {
            core::Container {
                name: c.name,
                resources: c.resources,
                restart_policy: c.restart_policy,
                // Only host ports constrain placement.
                ports: c
                    .ports
                    .map(|ps| ps.into_iter().filter(|p| p.host_port.is_some_and(|h| h > 0)).collect::<Vec<_>>())
                    .filter(|ps| !ps.is_empty()),
                ..core::Container::default()
            }
        }
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Volume {
        name: String,
        persistent_volume_claim: Option<core::PersistentVolumeClaimVolumeSource>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct Status {
        phase: Option<String>,
        nominated_node_name: Option<String>,
        start_time: Option<Time>,
        conditions: Option<Vec<core::PodCondition>>,
    }

    impl From<Status> for core::PodStatus {
        fn from(s: Status) -> Self {
            core::PodStatus {
                phase: s.phase,
                nominated_node_name: s.nominated_node_name,
                start_time: s.start_time,
                conditions: s.conditions.map(|cs| {
                    cs.into_iter()
                        .filter(|c| c.type_ == "PodScheduled" || c.type_ == "Ready")
                        .map(|c| core::PodCondition { message: None, ..c })
                        .collect()
                }),
                ..core::PodStatus::default()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_projection_keeps_every_field_a_decision_reads() {
        let full: K8sPod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "shop", "uid": "u1", "resourceVersion": "7",
                "creationTimestamp": "2026-01-01T00:00:00Z", "deletionTimestamp": "2026-01-01T00:01:00Z",
                "labels": {"app": "web"},
                "annotations": {"karpenter.sh/do-not-disrupt": "true", "controller.kubernetes.io/pod-deletion-cost": "5",
                    "kubectl.kubernetes.io/last-applied-configuration": "{...}", "prometheus.io/scrape": "true",
                    "kubernetes.io/config.mirror": "abc"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs", "controller": true}]},
            "spec": {"nodeName": "n1", "priority": 10, "priorityClassName": "system-node-critical", "terminationGracePeriodSeconds": 30,
                "nodeSelector": {"zone": "a"}, "tolerations": [{"key": "k", "operator": "Exists"}],
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}]}},
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}],
                "overhead": {"cpu": "10m"},
                "containers": [{"name": "app", "image": "nginx", "env": [{"name": "X", "value": "y"}],
                    "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}},
                    "ports": [{"containerPort": 80}, {"containerPort": 9100, "hostPort": 9100}]}],
                "initContainers": [{"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                    {"name": "token", "projected": {"sources": []}}]},
            "status": {"phase": "Running", "nominatedNodeName": "n2", "startTime": "2026-01-01T00:00:05Z", "podIP": "10.0.0.1",
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"},
                    {"type": "Initialized", "status": "True"}],
                "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "image": "nginx", "imageID": ""}]}
        }))
        .unwrap();
        let p: CompactPod = serde_json::from_value(serde_json::to_value(&full).unwrap()).unwrap();
        let (m, s, st) = (&p.metadata, p.spec.as_ref().unwrap(), p.status.as_ref().unwrap());
        let fs = full.spec.as_ref().unwrap();
        assert_eq!(
            (m.name.as_deref(), m.namespace.as_deref(), m.uid.as_deref()),
            (Some("web-1"), Some("shop"), Some("u1"))
        );
        assert_eq!(m.labels, full.metadata.labels);
        assert_eq!(m.owner_references, full.metadata.owner_references);
        assert!(m.creation_timestamp.is_some() && m.deletion_timestamp.is_some());
        let kept: Vec<&String> = m.annotations.as_ref().unwrap().keys().collect();
        assert_eq!(
            kept,
            [
                "controller.kubernetes.io/pod-deletion-cost",
                "karpenter.sh/do-not-disrupt",
                "kubernetes.io/config.mirror"
            ]
        );
        assert_eq!((p.node_name(), s.priority, s.termination_grace_period_seconds), (Some("n1"), Some(10), Some(30)));
        assert_eq!(s.node_selector, fs.node_selector);
        assert_eq!(s.tolerations, fs.tolerations);
        assert_eq!(s.affinity, fs.affinity);
        assert_eq!(s.topology_spread_constraints, fs.topology_spread_constraints);
        assert_eq!(s.overhead, fs.overhead);
        assert_eq!(s.containers[0].resources, fs.containers[0].resources);
        assert!(s.containers[0].env.is_none() && s.containers[0].image.is_none());
        let ports = s.containers[0].ports.as_ref().unwrap();
        assert_eq!((ports.len(), ports[0].host_port), (1, Some(9100)), "only host ports");
        let init = &s.init_containers.as_ref().unwrap()[0];
        assert_eq!((init.restart_policy.as_deref(), init.resources.is_some()), (Some("Always"), true));
        let volumes = s.volumes.as_ref().unwrap();
        assert_eq!((volumes.len(), volumes[0].name.as_str()), (1, "data"), "only claimed volumes");
        assert_eq!((st.phase.as_deref(), st.nominated_node_name.as_deref()), (Some("Running"), Some("n2")));
        assert!(st.start_time.is_some() && st.container_statuses.is_none() && st.pod_ip.is_none());
        let conds: Vec<&str> = st.conditions.iter().flatten().map(|c| c.type_.as_str()).collect();
        assert_eq!(conds, ["PodScheduled", "Ready"]);
        // What the scheduling core makes of the pod is the same as of the full pod's projection of
        // every field: compared through the conversion of each.
        let whole = crate::convert::pod_from(
            &CompactPod {
                metadata: full.metadata.clone(),
                spec: full.spec.clone().map(Arc::new),
                status: full.status.clone(),
            },
            "Pod shop/web-1",
        )
        .unwrap();
        let projected = crate::convert::pod_from(&p, "Pod shop/web-1").unwrap();
        assert_eq!(format!("{whole:?}"), format!("{projected:?}"));
    }

    #[test]
    fn decoding_skips_what_is_not_kept_and_reads_nulls_and_absences() {
        let decode = |doc: serde_json::Value| serde_json::from_value::<CompactPod>(doc).unwrap();
        let p = decode(serde_json::json!({
            "metadata": {"name": "a", "annotations": null, "managedFields": [{"manager": "x"}]},
            "spec": {"containers": [{"name": "c", "env": [{"name": "X"}], "livenessProbe": {"exec": {}}}], "volumes": null},
            "status": {"containerStatuses": [], "conditions": null}
        }));
        let spec = p.spec.as_deref().unwrap();
        assert_eq!((p.metadata.annotations, p.metadata.managed_fields), (None, None));
        assert_eq!((spec.containers[0].env.as_ref(), spec.volumes.as_ref()), (None, None));
        assert_eq!(p.status.unwrap().conditions, None);
        let p = decode(serde_json::json!({"kind": "Pod", "apiVersion": "v1"}));
        assert_eq!((p.metadata, p.spec, p.status), (ObjectMeta::default(), None, None));
        let p = decode(
            serde_json::json!({"metadata": {"name": "c"}, "spec": {"containers": [], "nodeName": ""}, "status": null}),
        );
        assert_eq!((p.node_name(), p.status.as_ref()), (None, None), "an empty nodeName is no node");
        // A field that is kept is read as strictly as a whole pod reads it.
        let bad = serde_json::json!({"spec": {"containers": [], "priority": "high"}});
        assert!(serde_json::from_value::<K8sPod>(bad.clone()).is_err());
        assert!(serde_json::from_value::<CompactPod>(bad).is_err());
    }

    #[test]
    fn annotations_the_decisions_do_not_read_are_dropped_and_none_left_is_none() {
        let pod: CompactPod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "annotations": {"prometheus.io/scrape": "true"}}
        }))
        .unwrap();
        assert_eq!(pod.metadata.annotations, None);
        let pod: CompactPod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "b", "annotations": {"a": "1", "karpenter.sh/do-not-disrupt": "true"}}
        }))
        .unwrap();
        let kept: Vec<&String> = pod.metadata.annotations.iter().flatten().map(|(k, _)| k).collect();
        assert_eq!(kept, ["karpenter.sh/do-not-disrupt"]);
    }
}
