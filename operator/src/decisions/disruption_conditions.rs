//! The per-claim conditions the disruption loop reads (karpenter-semantics §4.1, §1.9): `Drifted`
//! (static drift of the NodePool template by hash, requirements no longer met by the claim's
//! labels), `Consolidatable` (`consolidateAfter` elapsed since the last pod event), `Empty` (no pod
//! that would need a new home), and `status.lastPodEventTime`, kept monotonic from the pods' own
//! timestamps so a restart never resets the `consolidateAfter` clock (§9 D2).
//!
//! Owns: those decisions, from plain facts and the time. Must not: do I/O, read the clock, or
//! decide to disrupt anything (the disruption loop's): a condition only says a claim qualifies.

use std::time::Duration;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::ResourceExt;
use scheduling::CompactPod;

use crate::decisions::{
    conditions::{self, TRUE},
    disruption_queue,
};
use crds::{
    CleverNodeClass, NodeClaimStatus, NodePool,
    common::{NodeSelectorRequirement, Operator},
    drift, labels,
};
use disruption::Owner;

pub const DRIFTED: &str = "Drifted";
pub const CONSOLIDATABLE: &str = "Consolidatable";
pub const EMPTY: &str = "Empty";
/// Set while the claim is a candidate of a started disruption command; its reason is the budget
/// reason the command spends (`Empty`, `Drifted`, `Underutilized`).
pub const DISRUPTION_REASON: &str = "DisruptionReason";
pub const NODEPOOL_DRIFTED: &str = "NodePoolDrifted";
pub const REQUIREMENTS_DRIFTED: &str = "RequirementsDrifted";
pub const NODECLASS_DRIFTED: &str = "NodeClassDrifted";
pub const INSTANCE_TYPE_NOT_FOUND: &str = "InstanceTypeNotFound";
/// The claim's cluster left its fleet pool's selection (fleet.md §2).
pub const CLUSTER_NOT_SELECTED: &str = "ClusterNotSelected";

/// Pod events closer than this to the last recorded one are not written (§4.1: at most one write
/// per claim per 10 s, below the 15 s validation delay).
pub const POD_EVENT_DEDUPE: Duration = Duration::from_secs(10);

/// What changed; the caller writes the status (and the annotations) when anything did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Outcome {
    pub changed: bool,
    /// Re-stamp the claim's pool hash and version (the hash algorithm changed; §1.9).
    pub restamp: Option<(String, String)>,
    /// Look again at this time (the end of a `consolidateAfter` window).
    pub recheck_in: Option<Duration>,
    /// `consolidateAfter` or `expireAfter` of the pool could not be read: said once per pass.
    pub warning: Option<String>,
}

impl Outcome {
    /// Look again no later than `after` from now.
    fn recheck(&mut self, after: Duration) {
        self.recheck_in = Some(self.recheck_in.map_or(after, |r| r.min(after)));
    }
}

/// What a claim was made from, as it is now: its pool and its node class (`None`: gone, or not
/// known), the flavors the class's catalogue serves now (`None`: not known), when the claim was
/// created, and whether its cluster has left its fleet pool's selection
/// ([`crate::decisions::fleet::departed`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Origin<'a> {
    pub pool: Option<&'a NodePool>,
    pub class: Option<&'a CleverNodeClass>,
    pub offered: Option<&'a [String]>,
    pub created: Option<Timestamp>,
    pub departed: bool,
}

/// A claim younger than this is never drifted for its flavor (§4.1: the catalogue may lag behind a
/// launch).
pub const INSTANCE_TYPE_DRIFT_MIN_AGE: Duration = Duration::from_secs(3600);

/// Update `status` of a launched, initialized claim from its pool and the pods on its node.
/// `claim_labels` and `claim_annotations` are the claim's own; `pods` those bound to its node.
pub fn update(
    status: &mut NodeClaimStatus,
    claim_labels: &std::collections::BTreeMap<String, String>,
    claim_annotations: &std::collections::BTreeMap<String, String>,
    origin: Origin<'_>,
    pods: &[&CompactPod],
    generation: Option<i64>,
    now: Timestamp,
) -> Outcome {
    let Origin { pool, class, offered, created, departed } = origin;
    let mut out = Outcome::default();
    // lastPodEventTime: the latest pod event on the node, never moving back.
    if let Some(latest) = pods.iter().filter(|p| !daemonset(p)).filter_map(|p| last_event(p)).max() {
        let old = status.last_pod_event_time.as_ref().map(|t| t.0);
        let newer = old.is_none_or(|o| latest > o);
        let since = old.map(|o| Duration::try_from(now.duration_since(o)).unwrap_or_default());
        match since {
            Some(since) if newer && since < POD_EVENT_DEDUPE => {
                // Written once the window is over: nothing else may wake the claim by then.
                out.recheck(POD_EVENT_DEDUPE - since);
            }
            _ if newer => {
                status.last_pod_event_time = Some(Time(latest.min(now)));
                out.changed = true;
            }
            _ => {}
        }
    }
    // Empty: nothing on the node that would need a home elsewhere.
    let empty = !pods.iter().any(|p| reschedulable(p));
    out.changed |= if empty {
        conditions::set(&mut status.conditions, EMPTY, TRUE, EMPTY, "", generation, now)
    } else {
        conditions::remove(&mut status.conditions, EMPTY)
    };
    // DisruptionReason mirrors the command the disruption loop recorded on the claim (one writer of
    // the status: this decision).
    let command = disruption_queue::Recorded::on(claim_annotations);
    out.changed |= match command {
        Some(c) => conditions::set(
            &mut status.conditions,
            DISRUPTION_REASON,
            TRUE,
            &format!("{:?}", c.reason),
            &format!("{} (command {}): this node goes once its replacements are initialized", c.method, c.id),
            generation,
            now,
        ),
        None => conditions::remove(&mut status.conditions, DISRUPTION_REASON),
    };
    let Some(pool) = pool else {
        // A missing pool means no drift and nothing to consolidate for.
        out.changed |= conditions::remove(&mut status.conditions, DRIFTED);
        out.changed |= conditions::remove(&mut status.conditions, CONSOLIDATABLE);
        return out;
    };
    // Drifted (§4.1): static first, then requirements.
    let version = claim_annotations.get(drift::NODEPOOL_HASH_VERSION_ANNOTATION).map(String::as_str);
    let hash = claim_annotations.get(drift::NODEPOOL_HASH_ANNOTATION).map(String::as_str);
    let current = drift::nodepool_hash(&pool.spec);
    let drifted_already = conditions::is_true(&status.conditions, DRIFTED);
    // A cluster that left the fleet pool's selection drifts every node of the pool there first:
    // replaced through the ordinary disruption path, within budgets, never deleted at once.
    let departure = departed.then(|| {
        (
            CLUSTER_NOT_SELECTED,
            "this node's cluster is no longer selected by the NodePool's clusterSelector".to_string(),
        )
    });
    let drift = if departure.is_some() {
        departure
    } else if version == Some(drift::NODEPOOL_HASH_VERSION) {
        (hash != Some(current.as_str()))
            .then(|| (NODEPOOL_DRIFTED, "the NodePool's template changed since this node was launched".to_string()))
    } else {
        // Another algorithm (or none) stamped it: never drift for that; re-stamp unless drifted.
        if !drifted_already {
            out.restamp = Some((current.clone(), drift::NODEPOOL_HASH_VERSION.to_string()));
        }
        None
    };
    let drift = drift.or_else(|| {
        unmet_requirement(&pool.spec.template.spec.requirements, claim_labels).map(|why| (REQUIREMENTS_DRIFTED, why))
    });
    // The provider's drift (§4.1 step 4): the node class changed since launch. A claim stamped by
    // another algorithm version, or not at all (launched before classes were stamped), never drifts
    // for it.
    let drift = drift.or_else(|| {
        let class = class?;
        let judged = drift::judge(
            claim_annotations.get(drift::NODECLASS_HASH_ANNOTATION).map(String::as_str),
            claim_annotations.get(drift::NODECLASS_HASH_VERSION_ANNOTATION).map(String::as_str),
            &drift::nodeclass_hash(&class.spec),
            drift::NODECLASS_HASH_VERSION,
        );
        (judged == drift::Judgement::Drifted).then(|| {
            (NODECLASS_DRIFTED, format!("CleverNodeClass {} changed since this node was launched", class.name_any()))
        })
    });
    // §4.1 step 3: the claim's flavor is no longer served by its class's catalogue (a flavor a
    // FlavorCatalog added, then removed), for claims old enough that the catalogue cannot lag.
    let drift = drift.or_else(|| {
        let flavor = claim_labels.get(labels::INSTANCE_TYPE)?;
        let old_enough = created.is_some_and(|c| {
            Duration::try_from(now.duration_since(c)).unwrap_or_default() >= INSTANCE_TYPE_DRIFT_MIN_AGE
        });
        (old_enough && !offered?.contains(flavor)).then(|| {
            (
                INSTANCE_TYPE_NOT_FOUND,
                format!("flavor {flavor} is no longer in the catalogue of this node's CleverNodeClass"),
            )
        })
    });
    out.changed |= match drift {
        Some((reason, message)) => {
            conditions::set(&mut status.conditions, DRIFTED, TRUE, reason, &message, generation, now)
        }
        None => conditions::remove(&mut status.conditions, DRIFTED),
    };
    // Consolidatable: consolidateAfter elapsed since the last pod event (or initialization).
    let after = match crds::admission::schedule::parse_duration(&pool.spec.disruption.consolidate_after, true) {
        Ok(a) => a,
        Err(why) => {
            out.warning = Some(format!("consolidateAfter of NodePool {}: {why}", pool.name_any()));
            None
        }
    };
    let start = status
        .last_pod_event_time
        .as_ref()
        .map(|t| t.0)
        .or_else(|| conditions::get(&status.conditions, "Initialized").map(|c| c.last_transition_time.0));
    out.changed |= match (after, start) {
        (Some(after), Some(start)) => {
            let window = Duration::from_secs(after);
            let elapsed = Duration::try_from(now.duration_since(start)).unwrap_or_default();
            if elapsed >= window {
                conditions::set(&mut status.conditions, CONSOLIDATABLE, TRUE, CONSOLIDATABLE, "", generation, now)
            } else {
                out.recheck(window - elapsed);
                conditions::remove(&mut status.conditions, CONSOLIDATABLE)
            }
        }
        // `Never`, or nothing to count from.
        _ => conditions::remove(&mut status.conditions, CONSOLIDATABLE),
    };
    out
}

fn daemonset(p: &CompactPod) -> bool {
    Owner::of(p.owner_references()) == Owner::DaemonSet
}

fn terminal(p: &CompactPod) -> bool {
    matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// §5.5, by the disruption core's own rule: the loop and this condition agree on what is empty.
fn reschedulable(p: &CompactPod) -> bool {
    disruption::PodFacts {
        owner: Owner::of(p.owner_references()),
        terminal: terminal(p),
        terminating: p.metadata.deletion_timestamp.is_some(),
        ..disruption::PodFacts::default()
    }
    .reschedulable()
}

/// The latest of a pod's events the `consolidateAfter` clock counts: bound to the node, started
/// terminating, or ended.
fn last_event(p: &CompactPod) -> Option<Timestamp> {
    let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
    let transition = |type_: &str| {
        conditions
            .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0)
    };
    let bound = transition("PodScheduled");
    let ended = terminal(p).then(|| transition("Ready")).flatten();
    let terminating = p.metadata.deletion_timestamp.as_ref().map(|t| t.0);
    [bound, ended, terminating].into_iter().flatten().max()
}

/// The first pool requirement the claim's labels no longer meet (§4.1 `RequirementsDrifted`). A
/// well-known label the claim does not carry is no drift (the claim may never have been narrowed).
fn unmet_requirement(
    requirements: &[NodeSelectorRequirement],
    claim_labels: &std::collections::BTreeMap<String, String>,
) -> Option<String> {
    for r in requirements {
        let value = claim_labels.get(&r.key);
        let well_known = labels::WELL_KNOWN.contains(&r.key.as_str());
        let int = |s: &str| s.parse::<i64>().ok();
        let bound = r.values.first().and_then(|v| int(v));
        let ok = match (&r.operator, value) {
            (Operator::In, Some(v)) => r.values.contains(v),
            (Operator::NotIn, Some(v)) => !r.values.contains(v),
            (Operator::Exists, Some(_)) | (Operator::NotIn | Operator::DoesNotExist, None) => true,
            (Operator::DoesNotExist, Some(_)) => false,
            (Operator::Gt, Some(v)) => int(v).zip(bound).is_some_and(|(v, b)| v > b),
            (Operator::Lt, Some(v)) => int(v).zip(bound).is_some_and(|(v, b)| v < b),
            (Operator::Gte, Some(v)) => int(v).zip(bound).is_some_and(|(v, b)| v >= b),
            (Operator::Lte, Some(v)) => int(v).zip(bound).is_some_and(|(v, b)| v <= b),
            (_, None) => well_known,
        };
        if !ok {
            return Some(match value {
                Some(v) => {
                    format!("the NodePool requires {} {:?} {:?}; this node has {v}", r.key, r.operator, r.values)
                }
                None => format!(
                    "the NodePool requires {} {:?} {:?}; this node has no such label",
                    r.key, r.operator, r.values
                ),
            });
        }
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
        match (into, from) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn pool(extra: serde_json::Value) -> NodePool {
        let mut v = json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodePool",
            "metadata": {"name": "default", "namespace": "team-a"},
            "spec": {"clusterName": "prod", "template": {"spec": {
                "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"},
                "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["XS", "S"]}]}},
                "disruption": {"consolidateAfter": "10m"}}
        });
        merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn stamped(p: &NodePool) -> BTreeMap<String, String> {
        [
            (drift::NODEPOOL_HASH_ANNOTATION.to_string(), drift::nodepool_hash(&p.spec)),
            (drift::NODEPOOL_HASH_VERSION_ANNOTATION.to_string(), drift::NODEPOOL_HASH_VERSION.to_string()),
        ]
        .into()
    }

    /// `update` for an XS claim at generation 1.
    fn up(
        s: &mut NodeClaimStatus,
        annotations: &BTreeMap<String, String>,
        pool: Option<&NodePool>,
        class: Option<&CleverNodeClass>,
        pods: &[&CompactPod],
        at: Timestamp,
    ) -> Outcome {
        update(
            s,
            &claim_labels("XS"),
            annotations,
            Origin { pool, class, offered: None, created: None, departed: false },
            pods,
            Some(1),
            at,
        )
    }

    fn claim_labels(flavor: &str) -> BTreeMap<String, String> {
        [(labels::INSTANCE_TYPE.to_string(), flavor.to_string())].into()
    }

    fn initialized(at: Timestamp) -> NodeClaimStatus {
        let mut s = NodeClaimStatus::default();
        conditions::set(&mut s.conditions, "Initialized", TRUE, "Initialized", "", Some(1), at);
        s
    }

    fn pod(extra: serde_json::Value) -> CompactPod {
        let mut v =
            json!({"metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": [], "nodeName": "n1"}});
        merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn bound_at(at: Timestamp) -> CompactPod {
        pod(
            json!({"status": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": at.to_string()}]}}),
        )
    }

    #[test]
    fn consolidatable_after_the_window_from_the_last_pod_event_not_before() {
        // §10.7 item 93.
        let p = pool(json!({}));
        let mut s = initialized(t(0));
        let web = bound_at(t(100));
        let o = up(&mut s, &stamped(&p), Some(&p), None, &[&web], t(100 + 599));
        assert_eq!(s.last_pod_event_time.as_ref().map(|t| t.0), Some(t(100)));
        assert!(!conditions::is_true(&s.conditions, CONSOLIDATABLE));
        assert_eq!(o.recheck_in, Some(Duration::from_secs(1)));
        up(&mut s, &stamped(&p), Some(&p), None, &[&web], t(100 + 600));
        assert!(conditions::is_true(&s.conditions, CONSOLIDATABLE));
    }

    #[test]
    fn a_pod_event_inside_the_dedupe_window_is_written_when_the_window_ends() {
        let p = pool(json!({}));
        let mut s = initialized(t(0));
        up(&mut s, &stamped(&p), Some(&p), None, &[&bound_at(t(100))], t(100));
        let (first, second) = (bound_at(t(100)), bound_at(t(104)));
        let o = up(&mut s, &stamped(&p), Some(&p), None, &[&first, &second], t(104));
        assert_eq!(s.last_pod_event_time.as_ref().map(|t| t.0), Some(t(100)), "within 10 s of the last write");
        assert_eq!(
            o.recheck_in,
            Some(Duration::from_secs(6)),
            "looked at again when the window ends, not at the 10 min one"
        );
        up(&mut s, &stamped(&p), Some(&p), None, &[&first, &second], t(110));
        assert_eq!(s.last_pod_event_time.as_ref().map(|t| t.0), Some(t(104)));
    }

    #[test]
    fn the_window_survives_a_restart_and_never_moves_back() {
        // §10.7 item 95: the time comes from the pods, not from when the hub saw them.
        let p = pool(json!({}));
        let mut s = initialized(t(0));
        let web = bound_at(t(100));
        up(&mut s, &stamped(&p), Some(&p), None, &[&web], t(400));
        let mut after_restart = s.clone();
        up(&mut after_restart, &stamped(&p), Some(&p), None, &[&web], t(700));
        assert!(conditions::is_true(&after_restart.conditions, CONSOLIDATABLE), "still at t+10m");
        // An older event seen later does not move it back.
        let old = bound_at(t(50));
        up(&mut s, &stamped(&p), Some(&p), None, &[&old], t(800));
        assert_eq!(s.last_pod_event_time.as_ref().map(|t| t.0), Some(t(100)));
    }

    #[test]
    fn never_means_no_consolidatable_condition() {
        // §10.7 item 94.
        let p = pool(json!({"spec": {"disruption": {"consolidateAfter": "Never"}}}));
        let mut s = initialized(t(0));
        up(&mut s, &stamped(&p), Some(&p), None, &[], t(99_999));
        assert!(conditions::get(&s.conditions, CONSOLIDATABLE).is_none());
        assert!(conditions::is_true(&s.conditions, EMPTY));
    }

    #[test]
    fn empty_ignores_daemonset_terminal_and_terminating_pods_but_not_statefulset_ones() {
        // §10.8 items 108 and 109.
        let p = pool(json!({}));
        let owned = |kind: &str| json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "u"}]}});
        let ds = pod(owned("DaemonSet"));
        let done = pod(json!({"status": {"phase": "Succeeded"}}));
        let mut leaving = pod(owned("ReplicaSet"));
        leaving.metadata.deletion_timestamp = Some(Time(t(5)));
        let mut s = initialized(t(0));
        up(&mut s, &stamped(&p), Some(&p), None, &[&ds, &done, &leaving], t(10));
        assert!(conditions::is_true(&s.conditions, EMPTY));
        let mut sts = pod(owned("StatefulSet"));
        sts.metadata.deletion_timestamp = Some(Time(t(5)));
        up(&mut s, &stamped(&p), Some(&p), None, &[&ds, &sts], t(20));
        assert!(conditions::get(&s.conditions, EMPTY).is_none());
    }

    #[test]
    fn a_template_change_drifts_the_claim_and_requirements_too() {
        // §10.7 items 96 and 97.
        let before = pool(json!({}));
        let after = pool(json!({"spec": {"template": {"metadata": {"labels": {"team": "b"}}}}}));
        let mut s = initialized(t(0));
        up(&mut s, &stamped(&before), Some(&after), None, &[], t(10));
        assert_eq!(conditions::get(&s.conditions, DRIFTED).unwrap().reason, NODEPOOL_DRIFTED);
        let narrowed = pool(json!({"spec": {"template": {"spec": {"requirements": [
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["S"]}]}}}}));
        let mut s = initialized(t(0));
        up(&mut s, &stamped(&narrowed), Some(&narrowed), None, &[], t(10));
        let d = conditions::get(&s.conditions, DRIFTED).unwrap();
        assert_eq!(d.reason, REQUIREMENTS_DRIFTED);
        assert!(d.message.contains("XS"), "{}", d.message);
        // Back in line: the condition goes.
        update(
            &mut s,
            &claim_labels("S"),
            &stamped(&narrowed),
            Origin { pool: Some(&narrowed), ..Origin::default() },
            &[],
            Some(1),
            t(20),
        );
        assert!(conditions::get(&s.conditions, DRIFTED).is_none());
    }

    #[test]
    fn budgets_limits_or_a_new_hash_version_never_drift() {
        // §10.7 item 99.
        let before = pool(json!({}));
        let after = pool(json!({"spec": {"limits": {"cpu": "100"}, "weight": 10,
            "disruption": {"budgets": [{"nodes": "0"}]}}}));
        let mut s = initialized(t(0));
        let o = up(&mut s, &stamped(&before), Some(&after), None, &[], t(10));
        assert!(conditions::get(&s.conditions, DRIFTED).is_none());
        assert_eq!(o.restamp, None);
        let mut old = stamped(&before);
        old.insert(drift::NODEPOOL_HASH_VERSION_ANNOTATION.to_string(), "hub-v0".to_string());
        old.insert(drift::NODEPOOL_HASH_ANNOTATION.to_string(), "something-else".to_string());
        let o = up(&mut s, &old, Some(&before), None, &[], t(10));
        assert!(conditions::get(&s.conditions, DRIFTED).is_none());
        assert_eq!(o.restamp, Some((drift::nodepool_hash(&before.spec), drift::NODEPOOL_HASH_VERSION.to_string())));
    }

    #[test]
    fn a_recorded_disruption_command_sets_disruption_reason_and_its_removal_clears_it() {
        let p = pool(json!({}));
        let mut s = initialized(t(0));
        let mut annotations = stamped(&p);
        let record = disruption_queue::Recorded {
            id: "c1".into(),
            method: "emptiness".into(),
            reason: crds::nodepool::DisruptionReason::Empty,
            started: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(5)),
            candidates: vec!["a".into()],
            replacements: vec![],
            savings_per_hour: 0.05,
        };
        annotations.insert(disruption_queue::COMMAND_ANNOTATION.to_string(), record.to_annotation());
        let o = up(&mut s, &annotations, Some(&p), None, &[], t(10));
        let c = conditions::get(&s.conditions, DISRUPTION_REASON).unwrap();
        assert!(o.changed);
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Empty"));
        let o = up(&mut s, &stamped(&p), Some(&p), None, &[], t(20));
        assert!(o.changed && conditions::get(&s.conditions, DISRUPTION_REASON).is_none());
    }

    #[test]
    fn a_node_class_change_drifts_a_stamped_claim_and_never_an_unstamped_one() {
        let p = pool(json!({}));
        let class = |team: &str| -> CleverNodeClass {
            serde_json::from_value(json!({
                "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "CleverNodeClass",
                "metadata": {"name": "default", "namespace": "team-a"},
                "spec": {"labels": {"team": team}}
            }))
            .unwrap()
        };
        let before = class("a");
        let mut annotations = stamped(&p);
        annotations.insert(drift::NODECLASS_HASH_ANNOTATION.to_string(), drift::nodeclass_hash(&before.spec));
        annotations
            .insert(drift::NODECLASS_HASH_VERSION_ANNOTATION.to_string(), drift::NODECLASS_HASH_VERSION.to_string());
        let mut s = initialized(t(0));
        up(&mut s, &annotations, Some(&p), Some(&before), &[], t(10));
        assert!(conditions::get(&s.conditions, DRIFTED).is_none(), "same class: no drift");
        let after = class("b");
        up(&mut s, &annotations, Some(&p), Some(&after), &[], t(20));
        let c = conditions::get(&s.conditions, DRIFTED).unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", NODECLASS_DRIFTED));
        // The pool's own drift comes first.
        let mut s2 = initialized(t(0));
        let changed = pool(json!({"spec": {"template": {"metadata": {"labels": {"x": "y"}}}}}));
        up(&mut s2, &annotations, Some(&changed), Some(&after), &[], t(20));
        assert_eq!(conditions::get(&s2.conditions, DRIFTED).unwrap().reason, NODEPOOL_DRIFTED);
        // A claim launched before classes were stamped never drifts for its class.
        let mut s3 = initialized(t(0));
        up(&mut s3, &stamped(&p), Some(&p), Some(&after), &[], t(20));
        assert!(conditions::get(&s3.conditions, DRIFTED).is_none());
    }

    #[test]
    fn a_flavor_gone_from_the_catalogue_drifts_claims_older_than_an_hour() {
        let p = pool(json!({}));
        let offered = ["2XS".to_string(), "XS".to_string()];
        let gone = ["2XS".to_string()];
        let at = |created: i64, offered: &[String]| {
            let mut s = initialized(t(0));
            let origin = Origin {
                pool: Some(&p),
                class: None,
                offered: Some(offered),
                created: Some(t(created)),
                departed: false,
            };
            update(&mut s, &claim_labels("XS"), &stamped(&p), origin, &[], Some(1), t(4000));
            conditions::get(&s.conditions, DRIFTED).map(|c| c.reason.clone())
        };
        assert_eq!(at(0, &offered), None, "still offered");
        assert_eq!(at(0, &gone).as_deref(), Some(INSTANCE_TYPE_NOT_FOUND), "gone, claim 4000 s old");
        assert_eq!(at(1000, &gone), None, "gone, but the claim is younger than an hour");
        let mut s = initialized(t(0));
        update(
            &mut s,
            &claim_labels("XS"),
            &stamped(&p),
            Origin { pool: Some(&p), ..Origin::default() },
            &[],
            Some(1),
            t(4000),
        );
        assert!(conditions::get(&s.conditions, DRIFTED).is_none(), "catalogue not known: no drift");
    }
}
