//! Cluster API's pause (hub.md, "Cluster API pause"): whether the hub must take no action on a
//! workload cluster, and why, from its registration Secret's annotations and the Cluster API
//! `Cluster` object of the same name.
//!
//! Owns: reading the pause, as Cluster API does: the annotation `cluster.x-k8s.io/paused` counts
//! by its presence (any value), `spec.paused` only when it is the boolean `true`. Must not: read
//! anything else of the objects, nor copy their text anywhere (the reason is one of three fixed
//! values, told in the hub's own words).

use std::collections::BTreeMap;

/// Cluster API's pause annotation (on a Cluster, and honoured here on the registration Secret too).
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";

/// Why a cluster is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PausedBy {
    /// The registration Secret carries the pause annotation.
    SecretAnnotation,
    /// The Cluster API `Cluster` has `spec.paused: true`.
    ClusterSpec,
    /// The Cluster API `Cluster` carries the pause annotation.
    ClusterAnnotation,
}

impl PausedBy {
    /// The hub's own words for the condition message.
    pub fn describe(self, secret: &str, cluster: &str) -> String {
        match self {
            PausedBy::SecretAnnotation => {
                format!(
                    "paused: the Secret {secret} carries the annotation {PAUSED_ANNOTATION}; no action is taken on this cluster until it is removed"
                )
            }
            PausedBy::ClusterSpec => format!(
                "paused: the Cluster API Cluster {cluster} has spec.paused: true; no action is taken on this cluster until it is false"
            ),
            PausedBy::ClusterAnnotation => format!(
                "paused: the Cluster API Cluster {cluster} carries the annotation {PAUSED_ANNOTATION}; no action is taken on this cluster until it is removed"
            ),
        }
    }
}

/// Whether the annotations of a registration Secret pause its cluster.
pub fn secret_pauses(annotations: Option<&BTreeMap<String, String>>) -> bool {
    annotations.is_some_and(|a| a.contains_key(PAUSED_ANNOTATION))
}

/// Whether a Cluster API `Cluster` (as JSON, v1beta1 or v1beta2: both keep `spec.paused` and the
/// annotation) pauses its cluster, and how. The annotation is named first when both pause it.
pub fn cluster_pauses(cluster: &serde_json::Value) -> Option<PausedBy> {
    let annotated = cluster
        .pointer("/metadata/annotations")
        .and_then(serde_json::Value::as_object)
        .is_some_and(|a| a.contains_key(PAUSED_ANNOTATION));
    if annotated {
        return Some(PausedBy::ClusterAnnotation);
    }
    (cluster.pointer("/spec/paused").and_then(serde_json::Value::as_bool) == Some(true))
        .then_some(PausedBy::ClusterSpec)
}

/// What is known of a cluster's pause: its Secret's annotation, and its Cluster API `Cluster`
/// (`None`: no such Cluster, not paused, or Cluster API not watched).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pause {
    pub secret: bool,
    pub cluster: Option<PausedBy>,
}

impl Pause {
    /// Why the cluster is paused, if it is: the Secret first (the registration is the hub's own
    /// input), then the Cluster.
    pub fn paused_by(self) -> Option<PausedBy> {
        if self.secret { Some(PausedBy::SecretAnnotation) } else { self.cluster }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_secret_annotation_pauses_by_its_presence_whatever_its_value() {
        let with = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        for (annotations, paused) in [
            (None, false),
            (Some(BTreeMap::new()), false),
            (Some(with(PAUSED_ANNOTATION, "")), true),
            (Some(with(PAUSED_ANNOTATION, "true")), true),
            (Some(with(PAUSED_ANNOTATION, "false")), true),
            (Some(with("cluster.x-k8s.io/paused-not", "true")), false),
            (Some(with("example.com/paused", "true")), false),
        ] {
            assert_eq!(secret_pauses(annotations.as_ref()), paused, "{annotations:?}");
        }
    }

    #[test]
    fn a_cluster_pauses_by_spec_paused_true_or_the_annotation() {
        for (cluster, paused) in [
            (json!({}), None),
            (json!({"spec": {}}), None),
            (json!({"spec": {"paused": false}}), None),
            (json!({"spec": {"paused": true}}), Some(PausedBy::ClusterSpec)),
            // Only the boolean: a string is not what Cluster API's schema allows.
            (json!({"spec": {"paused": "true"}}), None),
            (json!({"spec": null}), None),
            (json!({"metadata": {"annotations": {PAUSED_ANNOTATION: ""}}}), Some(PausedBy::ClusterAnnotation)),
            (
                json!({"metadata": {"annotations": {PAUSED_ANNOTATION: "x"}}, "spec": {"paused": false}}),
                Some(PausedBy::ClusterAnnotation),
            ),
            (
                json!({"metadata": {"annotations": {PAUSED_ANNOTATION: "x"}}, "spec": {"paused": true}}),
                Some(PausedBy::ClusterAnnotation),
            ),
            (
                json!({"metadata": {"annotations": {"other": "x"}}, "spec": {"paused": true}}),
                Some(PausedBy::ClusterSpec),
            ),
            (json!({"metadata": {"annotations": null}}), None),
        ] {
            assert_eq!(cluster_pauses(&cluster), paused, "{cluster}");
        }
    }

    #[test]
    fn the_secret_is_named_before_the_cluster() {
        assert_eq!(Pause::default().paused_by(), None);
        assert_eq!(Pause { secret: true, cluster: None }.paused_by(), Some(PausedBy::SecretAnnotation));
        assert_eq!(
            Pause { secret: true, cluster: Some(PausedBy::ClusterSpec) }.paused_by(),
            Some(PausedBy::SecretAnnotation)
        );
        assert_eq!(
            Pause { secret: false, cluster: Some(PausedBy::ClusterSpec) }.paused_by(),
            Some(PausedBy::ClusterSpec)
        );
    }

    #[test]
    fn the_message_names_the_source_in_the_hubs_words() {
        let m = PausedBy::SecretAnnotation.describe("team-a/prod-kubeconfig", "team-a/prod");
        assert!(m.contains("Secret team-a/prod-kubeconfig") && m.contains(PAUSED_ANNOTATION), "{m}");
        let m = PausedBy::ClusterSpec.describe("team-a/prod-kubeconfig", "team-a/prod");
        assert!(m.contains("Cluster team-a/prod") && m.contains("spec.paused"), "{m}");
        let m = PausedBy::ClusterAnnotation.describe("team-a/prod-kubeconfig", "team-a/prod");
        assert!(m.contains("Cluster team-a/prod") && m.contains(PAUSED_ANNOTATION), "{m}");
    }
}
