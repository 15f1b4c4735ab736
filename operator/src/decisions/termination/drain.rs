//! One drain pass (karpenter-semantics §5.3–5.5): from the pods bound to a leaving node, the
//! deadline and the clock, which pods to evict now, which to delete by force and with what grace,
//! which the drain waits for, which it leaves alone, whether it is complete and when to look again.
//! Must not: do I/O, read the clock, or decide whether the node drains at all (the lifecycle's).

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use scheduling::CompactPod;

use super::{DEFAULT_POD_GRACE, DRAIN_REQUEUE, MIN_DRAIN, STUCK_TERMINATING};
use crds::labels;

/// Priority classes that make a pod "critical": drained after every ordinary pod (§5.3).
pub const CRITICAL_PRIORITY_CLASSES: [&str; 2] = ["system-cluster-critical", "system-node-critical"];
pub use scheduling::compact::MIRROR_ANNOTATION;

/// Which pod, exactly: writes carry the UID as a precondition so a newer pod of the same name is
/// never hit.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What owns a pod, as far as the drain cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// Anything else (a ReplicaSet, a Job, nothing at all).
    Workload,
    /// A DaemonSet: its pods go after the workload they serve.
    DaemonSet,
    /// The Node itself: a static pod, never drained.
    Node,
}

/// The facts about one pod bound to the node that the drain reads.
#[derive(Debug, Clone, PartialEq)]
pub struct PodFacts {
    pub pod: PodRef,
    pub owner: Owner,
    /// `priorityClassName` is one of [`CRITICAL_PRIORITY_CLASSES`].
    pub critical: bool,
    /// A toleration matches `karpenter.sh/disrupted:NoSchedule`.
    pub tolerates_disrupted: bool,
    /// Carries [`MIRROR_ANNOTATION`].
    pub mirror: bool,
    /// Phase `Succeeded` or `Failed`.
    pub terminal: bool,
    /// `metadata.deletionTimestamp`: the time by which the pod is due to be gone.
    pub deletion: Option<Timestamp>,
    /// `spec.terminationGracePeriodSeconds`.
    pub grace_seconds: Option<i64>,
    /// The raw `karpenter.sh/do-not-disrupt` annotation.
    pub do_not_disrupt: Option<String>,
    /// `status.startTime` (a duration-valued do-not-disrupt counts from it).
    pub started: Option<Timestamp>,
    /// The PersistentVolumeClaims the pod mounts (their volume attachments wait for it).
    pub claims: Vec<String>,
}

impl PodFacts {
    /// Read the facts off a pod (pure).
    pub fn from_pod(pod: &CompactPod) -> PodFacts {
        let spec = pod.spec.as_ref();
        let status = pod.status.as_ref();
        let owner = if pod.owner_references().iter().any(|o| o.kind == "Node") {
            Owner::Node
        } else if pod.owner_references().iter().any(|o| o.kind == "DaemonSet") {
            Owner::DaemonSet
        } else {
            Owner::Workload
        };
        let tolerates_disrupted = spec.and_then(|s| s.tolerations.as_ref()).is_some_and(|ts| {
            ts.iter().any(|t| {
                let key_matches = match t.key.as_deref().unwrap_or_default() {
                    // An empty key with Exists tolerates every taint.
                    "" => t.operator.as_deref() == Some("Exists"),
                    k => {
                        k == labels::DISRUPTED_TAINT
                            && (t.operator.as_deref() == Some("Exists")
                                || t.value.as_deref().unwrap_or_default().is_empty())
                    }
                };
                let effect_matches = matches!(t.effect.as_deref(), None | Some("") | Some("NoSchedule"));
                key_matches && effect_matches
            })
        });
        let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or_default();
        PodFacts {
            pod: PodRef {
                namespace: pod.namespace().unwrap_or_default(),
                name: pod.name_any(),
                uid: pod.metadata.uid.clone().unwrap_or_default(),
            },
            owner,
            critical: spec
                .and_then(|s| s.priority_class_name.as_deref())
                .is_some_and(|p| CRITICAL_PRIORITY_CLASSES.contains(&p)),
            tolerates_disrupted,
            mirror: pod.annotations().contains_key(MIRROR_ANNOTATION),
            terminal: phase == "Succeeded" || phase == "Failed",
            deletion: pod.metadata.deletion_timestamp.as_ref().map(|t| t.0),
            grace_seconds: spec.and_then(|s| s.termination_grace_period_seconds),
            do_not_disrupt: pod.annotations().get(labels::DO_NOT_DISRUPT).cloned(),
            started: status.and_then(|s| s.start_time.as_ref()).map(|t| t.0),
            claims: spec
                .and_then(|s| s.volumes.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|v| v.persistent_volume_claim.as_ref().map(|c| c.claim_name.clone()))
                .collect(),
        }
    }

    /// Whether `karpenter.sh/do-not-disrupt` protects the pod at `now`: `"true"`, or a positive
    /// duration not yet elapsed since the pod started (no start time: protected). Other values are
    /// ignored.
    pub fn do_not_disrupt_active(&self, now: Timestamp) -> bool {
        match self.do_not_disrupt.as_deref() {
            None => false,
            Some("true") => true,
            Some(v) => match crds::admission::schedule::parse_duration(v, false) {
                Ok(Some(secs)) if secs > 0 => self.started.is_none_or(|s| {
                    now.duration_since(s) < SignedDuration::from_secs(i64::try_from(secs).unwrap_or(i64::MAX))
                }),
                _ => false,
            },
        }
    }

    /// The drain tier (§5.3): 0 ordinary workload, 1 ordinary DaemonSet, 2 critical workload,
    /// 3 critical DaemonSet.
    pub fn tier(&self) -> u8 {
        u8::from(self.owner == Owner::DaemonSet) + 2 * u8::from(self.critical)
    }
}

/// Why the drain leaves a pod alone (it neither blocks the drain nor is touched).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Succeeded or Failed.
    Terminal,
    /// Tolerates `karpenter.sh/disrupted`: it chose to stay on a leaving node.
    ToleratesDisrupted,
    /// A static pod or its mirror: the kubelet owns it.
    Static,
    /// Terminating for more than [`STUCK_TERMINATING`]: waiting longer would not help.
    StuckTerminating,
}

/// Why the drain waits for a pod it does not evict this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Already going (evicted or deleted): the kubelet finishes it.
    Terminating,
    /// `karpenter.sh/do-not-disrupt` is active and the deadline (if any) is not near.
    DoNotDisrupt,
    /// An earlier tier still has pods.
    LaterTier,
}

/// What one drain pass does.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decision {
    /// Evict through the Eviction API (honouring PDBs), UID precondition.
    pub evict: Vec<PodRef>,
    /// Delete now with this grace period in seconds (≥ 1), UID precondition, ignoring PDBs and
    /// do-not-disrupt: the deadline is near.
    pub force: Vec<(PodRef, i64)>,
    /// Pods the drain waits for.
    pub waiting: Vec<(PodRef, Wait)>,
    /// Pods the drain leaves alone.
    pub skipped: Vec<(PodRef, Skip)>,
    /// No pod left to wait for, and at least [`MIN_DRAIN`] since draining began.
    pub complete: bool,
    /// When to look again (`None` once complete).
    pub requeue: Option<Duration>,
}

/// One drain pass. `started` is when draining began (`None` on the first pass: it begins `now`),
/// `deadline` the claim's `karpenter.sh/nodeclaim-termination-timestamp`.
pub fn decide(pods: &[PodFacts], deadline: Option<Timestamp>, started: Option<Timestamp>, now: Timestamp) -> Decision {
    let mut d = Decision::default();
    let mut blocking: Vec<&PodFacts> = Vec::new();
    for p in pods {
        let skip = if p.terminal {
            Some(Skip::Terminal)
        } else if p.tolerates_disrupted {
            Some(Skip::ToleratesDisrupted)
        } else if p.mirror || p.owner == Owner::Node {
            Some(Skip::Static)
        } else if p.deletion.is_some_and(|t| now.duration_since(t) > signed(STUCK_TERMINATING)) {
            Some(Skip::StuckTerminating)
        } else {
            None
        };
        match skip {
            Some(s) => d.skipped.push((p.pod.clone(), s)),
            None => blocking.push(p),
        }
    }
    // Forced deletion (§5.4) applies in every tier at once.
    let mut forced = Vec::new();
    if let Some(deadline) = deadline {
        for p in &blocking {
            let due = match p.deletion {
                // Already terminating, but due to finish after the deadline: shorten its grace.
                Some(t) => t > deadline,
                None => {
                    let g = p.grace_seconds.unwrap_or(DEFAULT_POD_GRACE).max(0);
                    // A grace so long it reaches before representable time: due at once.
                    deadline.checked_sub(SignedDuration::from_secs(g)).is_ok_and(|t| now > t)
                        || deadline.checked_sub(SignedDuration::from_secs(g)).is_err()
                }
            };
            if due {
                let left = deadline.duration_since(now).as_secs();
                d.force.push((p.pod.clone(), left.max(1)));
                forced.push(p.pod.clone());
            }
        }
    }
    let tier = blocking.iter().map(|p| p.tier()).min();
    for p in &blocking {
        if forced.contains(&p.pod) {
            continue;
        }
        let wait = if Some(p.tier()) != tier {
            Some(Wait::LaterTier)
        } else if p.deletion.is_some() {
            Some(Wait::Terminating)
        } else if p.do_not_disrupt_active(now) {
            Some(Wait::DoNotDisrupt)
        } else {
            None
        };
        match wait {
            Some(w) => d.waiting.push((p.pod.clone(), w)),
            None => d.evict.push(p.pod.clone()),
        }
    }
    let started = started.unwrap_or(now);
    let min_end = started + signed(MIN_DRAIN);
    if !blocking.is_empty() {
        d.requeue = Some(DRAIN_REQUEUE);
    } else if now >= min_end {
        d.complete = true;
    } else {
        let left = min_end.duration_since(now);
        d.requeue = Some(Duration::try_from(left).unwrap_or(DRAIN_REQUEUE).max(Duration::from_millis(100)));
    }
    d
}

fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }
    const T0: &str = "2026-01-01T00:00:00Z";
    fn at(secs: i64) -> Timestamp {
        t(T0) + SignedDuration::from_secs(secs)
    }

    fn pod(name: &str) -> PodFacts {
        PodFacts {
            pod: PodRef { namespace: "default".into(), name: name.into(), uid: format!("uid-{name}") },
            owner: Owner::Workload,
            critical: false,
            tolerates_disrupted: false,
            mirror: false,
            terminal: false,
            deletion: None,
            grace_seconds: None,
            do_not_disrupt: None,
            started: None,
            claims: Vec::new(),
        }
    }
    fn ds(name: &str) -> PodFacts {
        PodFacts { owner: Owner::DaemonSet, ..pod(name) }
    }
    fn critical(p: PodFacts) -> PodFacts {
        PodFacts { critical: true, ..p }
    }
    fn names(v: &[PodRef]) -> Vec<&str> {
        v.iter().map(|p| p.name.as_str()).collect()
    }

    #[test]
    fn facts_are_read_off_the_pod() {
        let p: CompactPod = serde_json::from_value(json!({
            "metadata": {"name": "x", "namespace": "ns", "uid": "u1",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "d1"}],
                "annotations": {"karpenter.sh/do-not-disrupt": "true", "kubernetes.io/config.mirror": "abc"},
                "deletionTimestamp": "2026-01-01T00:00:30Z"},
            "spec": {"containers": [], "priorityClassName": "system-node-critical", "terminationGracePeriodSeconds": 300,
                "tolerations": [{"key": "karpenter.sh/disrupted", "operator": "Exists", "effect": "NoSchedule"}]},
            "status": {"phase": "Failed", "startTime": "2026-01-01T00:00:00Z"}
        }))
        .unwrap();
        let f = PodFacts::from_pod(&p);
        assert_eq!(f.pod, PodRef { namespace: "ns".into(), name: "x".into(), uid: "u1".into() });
        assert_eq!(f.owner, Owner::DaemonSet);
        assert!(f.critical && f.tolerates_disrupted && f.mirror && f.terminal);
        assert_eq!(f.deletion, Some(at(30)));
        assert_eq!(f.grace_seconds, Some(300));
        assert_eq!(f.do_not_disrupt.as_deref(), Some("true"));
        assert_eq!(f.started, Some(at(0)));
        // And the negative side: a bare pod has none of it.
        let bare: CompactPod = serde_json::from_value(json!({"metadata": {"name": "y"}, "spec": {"containers": [],
            "priorityClassName": "high", "tolerations": [{"key": "other", "operator": "Exists"}]}}))
        .unwrap();
        let f = PodFacts::from_pod(&bare);
        assert_eq!(f.owner, Owner::Workload);
        assert!(!f.critical && !f.tolerates_disrupted && !f.mirror && !f.terminal);
    }

    #[test]
    fn tolerations_of_the_disrupted_taint() {
        let tol = |v: serde_json::Value| {
            let p: CompactPod = serde_json::from_value(
                json!({"metadata": {"name": "p"}, "spec": {"containers": [], "tolerations": [v]}}),
            )
            .unwrap();
            PodFacts::from_pod(&p).tolerates_disrupted
        };
        assert!(tol(json!({"operator": "Exists"})), "an empty key with Exists tolerates everything");
        assert!(tol(json!({"key": "karpenter.sh/disrupted", "operator": "Exists"})));
        assert!(tol(json!({"key": "karpenter.sh/disrupted", "operator": "Equal", "value": ""})));
        assert!(!tol(json!({"key": "karpenter.sh/disrupted", "operator": "Equal", "value": "x"})));
        assert!(!tol(json!({"key": "karpenter.sh/disrupted", "operator": "Exists", "effect": "NoExecute"})));
        assert!(!tol(json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists"})));
    }

    #[test]
    fn do_not_disrupt_true_or_an_unelapsed_duration_protects() {
        let with = |v: &str, started: Option<i64>| PodFacts {
            do_not_disrupt: Some(v.into()),
            started: started.map(at),
            ..pod("p")
        };
        assert!(with("true", Some(0)).do_not_disrupt_active(at(1_000_000)));
        assert!(with("90m", Some(0)).do_not_disrupt_active(at(89 * 60)));
        assert!(!with("90m", Some(0)).do_not_disrupt_active(at(90 * 60)));
        assert!(with("90m", None).do_not_disrupt_active(at(1_000_000)), "no start time: protected");
        for ignored in ["false", "yes", "0s", "-5m", ""] {
            assert!(!with(ignored, Some(0)).do_not_disrupt_active(at(1)), "{ignored:?}");
        }
    }

    /// §10.10 item 136: non-critical, DaemonSet and `system-node-critical` pods are evicted tier by
    /// tier, each tier only once the previous one is gone.
    #[test]
    fn tiers_are_evicted_in_order_only_the_first_non_empty_one_per_pass() {
        let all = vec![critical(ds("crit-ds")), critical(pod("crit-web")), ds("ds"), pod("web-1"), pod("web-2")];
        let mut left = all.clone();
        let mut order = Vec::new();
        for _ in 0..4 {
            let d = decide(&left, None, Some(at(0)), at(10));
            assert!(!d.complete);
            assert!(d.force.is_empty());
            let evicted = names(&d.evict).iter().map(|s| s.to_string()).collect::<Vec<_>>();
            // Everything not evicted waits for a later tier.
            assert!(d.waiting.iter().all(|(_, w)| *w == Wait::LaterTier));
            assert_eq!(d.waiting.len() + d.evict.len(), left.len());
            left.retain(|p| !evicted.contains(&p.pod.name));
            order.push(evicted);
        }
        assert_eq!(order, [vec!["web-1", "web-2"], vec!["ds"], vec!["crit-web"], vec!["crit-ds"]]);
        assert!(left.is_empty());
    }

    #[test]
    fn a_terminating_pod_holds_its_tier_and_the_later_ones() {
        let pods = [PodFacts { deletion: Some(at(20)), ..pod("web") }, ds("ds")];
        let d = decide(&pods, None, Some(at(0)), at(10));
        assert!(d.evict.is_empty(), "{d:?}");
        assert_eq!(d.waiting, [(pods[0].pod.clone(), Wait::Terminating), (pods[1].pod.clone(), Wait::LaterTier)]);
        assert_eq!(d.requeue, Some(DRAIN_REQUEUE));
    }

    /// §10.10 item 137: a pod tolerating `karpenter.sh/disrupted`, a mirror pod, a static pod, a
    /// terminal pod are never evicted and do not hold the drain.
    #[test]
    fn tolerating_mirror_static_and_terminal_pods_are_left_alone() {
        let pods = [
            PodFacts { tolerates_disrupted: true, ..pod("tolerating") },
            PodFacts { mirror: true, ..pod("mirror") },
            PodFacts { owner: Owner::Node, ..pod("static") },
            PodFacts { terminal: true, ..pod("done") },
        ];
        // Even at the deadline, nothing is forced either.
        let d = decide(&pods, Some(at(5)), Some(at(0)), at(10));
        assert!(d.evict.is_empty() && d.force.is_empty() && d.waiting.is_empty(), "{d:?}");
        let skips: Vec<Skip> = d.skipped.iter().map(|(_, s)| *s).collect();
        assert_eq!(skips, [Skip::ToleratesDisrupted, Skip::Static, Skip::Static, Skip::Terminal]);
        assert!(d.complete);
    }

    /// §10.10 item 140: a pod terminating for more than a minute no longer holds the drain.
    #[test]
    fn a_pod_stuck_terminating_over_a_minute_is_ignored() {
        let stuck = [PodFacts { deletion: Some(at(0)), ..pod("stuck") }];
        let d = decide(&stuck, None, Some(at(0)), at(61));
        assert_eq!(d.skipped, [(stuck[0].pod.clone(), Skip::StuckTerminating)]);
        assert!(d.complete);
        // At exactly one minute it still counts.
        let d = decide(&stuck, None, Some(at(0)), at(60));
        assert_eq!(d.waiting, [(stuck[0].pod.clone(), Wait::Terminating)]);
        assert!(!d.complete);
    }

    /// §10.10 item 141: an empty node is drained no sooner than 5 s after draining began.
    #[test]
    fn an_empty_node_is_drained_no_earlier_than_five_seconds_after_the_start() {
        let d = decide(&[], None, Some(at(0)), at(2));
        assert!(!d.complete);
        assert_eq!(d.requeue, Some(Duration::from_secs(3)));
        let d = decide(&[], None, None, at(2));
        assert!(!d.complete, "the first pass starts the drain");
        assert_eq!(d.requeue, Some(Duration::from_secs(5)));
        let d = decide(&[], None, Some(at(0)), at(5));
        assert!(d.complete);
        assert_eq!(d.requeue, None);
    }

    #[test]
    fn do_not_disrupt_waits_and_holds_later_tiers_without_a_deadline() {
        let pods = [PodFacts { do_not_disrupt: Some("true".into()), ..pod("precious") }, pod("web"), ds("ds")];
        let d = decide(&pods, None, Some(at(0)), at(1_000_000));
        assert_eq!(names(&d.evict), ["web"]);
        assert_eq!(d.waiting, [(pods[0].pod.clone(), Wait::DoNotDisrupt), (pods[2].pod.clone(), Wait::LaterTier)]);
        assert!(d.force.is_empty(), "no deadline: never forced");
        assert!(!d.complete);
    }

    /// §10.10 item 139: TGP 1h and a pod with `terminationGracePeriodSeconds: 300`: deleted with
    /// ~300 s of grace at deadline − 300 s; a pod past the deadline gets 1 s.
    #[test]
    fn pods_are_forced_so_they_end_by_the_deadline() {
        let deadline = at(3600);
        let p = [PodFacts { grace_seconds: Some(300), do_not_disrupt: Some("true".into()), ..pod("slow") }];
        let before = decide(&p, Some(deadline), Some(at(0)), at(3300));
        assert!(before.force.is_empty(), "not before deadline − grace: {before:?}");
        assert_eq!(before.waiting, [(p[0].pod.clone(), Wait::DoNotDisrupt)]);
        let due = decide(&p, Some(deadline), Some(at(0)), at(3301));
        assert_eq!(due.force, [(p[0].pod.clone(), 299)]);
        assert!(due.evict.is_empty());
        let past = decide(&p, Some(deadline), Some(at(0)), at(4000));
        assert_eq!(past.force, [(p[0].pod.clone(), 1)], "never a grace of 0");
        // A pod with the default grace (30 s) is forced 30 s before the deadline.
        let q = [pod("default-grace")];
        assert!(decide(&q, Some(deadline), Some(at(0)), at(3570)).force.is_empty());
        assert_eq!(decide(&q, Some(deadline), Some(at(0)), at(3571)).force, [(q[0].pod.clone(), 29)]);
    }

    #[test]
    fn a_pod_terminating_past_the_deadline_is_forced_with_a_shorter_grace() {
        let deadline = at(100);
        let late = [PodFacts { deletion: Some(at(130)), ..pod("late") }];
        assert_eq!(decide(&late, Some(deadline), Some(at(0)), at(90)).force, [(late[0].pod.clone(), 10)]);
        let in_time = [PodFacts { deletion: Some(at(95)), ..pod("in-time") }];
        let d = decide(&in_time, Some(deadline), Some(at(0)), at(90));
        assert!(d.force.is_empty());
        assert_eq!(d.waiting, [(in_time[0].pod.clone(), Wait::Terminating)]);
    }

    #[test]
    fn forced_deletion_reaches_every_tier_at_once() {
        let pods = [pod("web"), critical(ds("crit-ds"))];
        let d = decide(&pods, Some(at(100)), Some(at(0)), at(99));
        assert_eq!(d.force.len(), 2, "{d:?}");
        assert!(d.evict.is_empty() && d.waiting.is_empty());
        assert!(!d.complete, "forced pods are still there until they are gone");
    }

    fn arb_pod() -> impl Strategy<Value = PodFacts> {
        (
            0u8..3,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            proptest::option::of(-200i64..200),
            proptest::option::of(0i64..400),
            proptest::option::of(prop_oneof![Just("true".to_string()), Just("1m".to_string()), Just("no".to_string())]),
        )
            .prop_map(|(owner, critical, tol, mirror, terminal, deletion, grace, dnd)| PodFacts {
                owner: [Owner::Workload, Owner::DaemonSet, Owner::Node][owner as usize],
                critical,
                tolerates_disrupted: tol,
                mirror,
                terminal,
                deletion: deletion.map(at),
                grace_seconds: grace,
                do_not_disrupt: dnd,
                started: Some(at(0)),
                ..pod("p")
            })
    }

    proptest! {
        /// No pod outside the first non-empty tier is ever evicted, nothing left alone is touched,
        /// and no pod is forced before its time or with a grace below 1 s.
        #[test]
        fn evictions_stay_in_the_current_tier_and_force_waits_for_its_time(
            raw in proptest::collection::vec(arb_pod(), 0..12),
            deadline in proptest::option::of(-100i64..400),
            now in 0i64..300,
        ) {
            let pods: Vec<PodFacts> = raw.into_iter().enumerate().map(|(i, mut p)| {
                p.pod.name = format!("p{i}");
                p.pod.uid = format!("u{i}");
                p
            }).collect();
            let deadline = deadline.map(at);
            let now = at(now);
            let d = decide(&pods, deadline, Some(at(0)), now);
            let by_name = |r: &PodRef| pods.iter().find(|p| p.pod == *r).unwrap();
            let skipped: Vec<&PodRef> = d.skipped.iter().map(|(r, _)| r).collect();
            let tiers: Vec<u8> = pods.iter().filter(|p| !skipped.contains(&&p.pod)).map(PodFacts::tier).collect();
            let first = tiers.iter().min().copied();
            for r in &d.evict {
                let p = by_name(r);
                prop_assert_eq!(Some(p.tier()), first, "evicted outside the current tier: {:?}", p);
                prop_assert!(p.deletion.is_none() && !p.do_not_disrupt_active(now));
                prop_assert!(!skipped.contains(&r));
            }
            for (r, grace) in &d.force {
                let p = by_name(r);
                let deadline = deadline.expect("forced without a deadline");
                prop_assert!(*grace >= 1);
                prop_assert!(!skipped.contains(&r));
                let due = match p.deletion {
                    Some(t) => t > deadline,
                    None => now > deadline - SignedDuration::from_secs(p.grace_seconds.unwrap_or(30)),
                };
                prop_assert!(due, "forced before its time: {:?}", p);
                prop_assert!(!d.evict.contains(r));
            }
            // Every pod is accounted for exactly once.
            prop_assert_eq!(d.evict.len() + d.force.len() + d.waiting.len() + d.skipped.len(), pods.len());
            prop_assert_eq!(d.complete, d.evict.is_empty() && d.force.is_empty() && d.waiting.is_empty() && now >= at(5));
        }
    }
}
