//! `sim::cke::binder`: the binder's pass over what the API shows, on top of [`super::fit`].
//!
//! Owns: remembering the bindings made but not yet seen through the watch (so a pod is never bound
//! twice and the node's resources are counted at once), and writing the `Unschedulable` condition
//! only when it changes. Must not do I/O or read a clock.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Node, Pod};

use super::fit::{self, Decision};

/// A write the binder wants made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BinderAction {
    /// `POST pods/binding` of the pod to `node`.
    Bind {
        /// Namespace.
        namespace: String,
        /// Pod name.
        name: String,
        /// Pod UID.
        uid: String,
        /// Target node.
        node: String,
    },
    /// Set `PodScheduled=False, reason=Unschedulable, message`.
    Unschedulable {
        /// Namespace.
        namespace: String,
        /// Pod name.
        name: String,
        /// Pod UID.
        uid: String,
        /// Message.
        message: String,
        /// `lastTransitionTime` to keep (RFC 3339) when the pod was already `PodScheduled=False`:
        /// kube-scheduler moves it only when the status changes.
        since: Option<String>,
    },
}

/// What the binder remembers.
#[derive(Debug, Default)]
pub struct BinderTracker {
    /// Pod UID → node, for bindings the watch has not shown yet.
    bound: HashMap<String, String>,
    /// Pod UID → (resource version, message) of the last Unschedulable write.
    marked: HashMap<String, (String, String)>,
}

impl BinderTracker {
    /// A write failed: forget it so the next pass decides again.
    pub fn failed(&mut self, action: &BinderAction) {
        match action {
            BinderAction::Bind { uid, .. } => self.bound.remove(uid),
            BinderAction::Unschedulable { uid, .. } => self.marked.remove(uid).map(|(_, m)| m),
        };
    }
}

fn scheduled_condition(pod: &Pod) -> Option<(&str, Option<&str>, Option<&str>)> {
    let conditions = pod.status.as_ref()?.conditions.as_deref()?;
    let c = conditions.iter().find(|c| c.type_ == "PodScheduled")?;
    Some((c.status.as_str(), c.reason.as_deref(), c.message.as_deref()))
}

/// When the pod became `PodScheduled=False`, if it is.
fn unscheduled_since(pod: &Pod) -> Option<String> {
    let conditions = pod.status.as_ref()?.conditions.as_deref()?;
    let c = conditions.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
    Some(c.last_transition_time.as_ref()?.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

/// One binder pass: binds what fits, marks the rest.
pub fn plan(_now: DateTime<Utc>, nodes: &[Node], pods: &[Pod], tracker: &mut BinderTracker) -> Vec<BinderAction> {
    // Bindings the watch has shown (or pods gone) are settled.
    let by_uid: HashMap<&str, &Pod> = pods.iter().filter_map(|p| Some((p.metadata.uid.as_deref()?, p))).collect();
    tracker.bound.retain(|uid, _| by_uid.get(uid.as_str()).is_some_and(|p| fit::is_pending_for_binder(p)));
    tracker.marked.retain(|uid, _| by_uid.get(uid.as_str()).is_some_and(|p| fit::is_pending_for_binder(p)));

    // Pods whose binding is in flight count as bound.
    let view: Vec<Pod> = pods
        .iter()
        .map(|p| match p.metadata.uid.as_ref().and_then(|u| tracker.bound.get(u)) {
            Some(node) => {
                let mut p = p.clone();
                if let Some(spec) = p.spec.as_mut() {
                    spec.node_name = Some(node.clone());
                }
                p
            }
            None => p.clone(),
        })
        .collect();

    let by_name: HashMap<(&str, &str), &Pod> = pods
        .iter()
        .filter_map(|p| Some(((p.metadata.namespace.as_deref()?, p.metadata.name.as_deref()?), p)))
        .collect();
    let find = |namespace: &str, name: &str| by_name.get(&(namespace, name)).copied();
    let mut actions = Vec::new();
    for decision in fit::decide(nodes, &view) {
        match decision {
            Decision::Bind { namespace, name, node } => {
                let Some(pod) = find(&namespace, &name) else { continue };
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                tracker.bound.insert(uid.clone(), node.clone());
                tracker.marked.remove(&uid);
                actions.push(BinderAction::Bind { namespace, name, uid, node });
            }
            Decision::Unschedulable { namespace, name, message } => {
                let Some(pod) = find(&namespace, &name) else { continue };
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                let rv = pod.metadata.resource_version.clone().unwrap_or_default();
                if scheduled_condition(pod) == Some(("False", Some("Unschedulable"), Some(message.as_str()))) {
                    continue;
                }
                if tracker.marked.get(&uid).is_some_and(|(r, m)| *r == rv && *m == message) {
                    continue;
                }
                tracker.marked.insert(uid.clone(), (rv, message.clone()));
                let since = unscheduled_since(pod);
                actions.push(BinderAction::Unschedulable { namespace, name, uid, message, since });
            }
        }
    }
    actions
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t() -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_767_225_600, 0).unwrap()
    }

    fn node(name: &str) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"}}}))
        .unwrap()
    }

    fn pod(name: &str, cpu: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "resourceVersion": "1"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        }))
        .unwrap()
    }

    #[test]
    fn in_flight_bindings_count_and_are_not_repeated() {
        let mut tr = BinderTracker::default();
        let nodes = vec![node("a")];
        let pods = vec![pod("p1", "1500m")];
        let a = plan(t(), &nodes, &pods, &mut tr);
        assert!(matches!(&a[..], [BinderAction::Bind { node, .. }] if node == "a"));
        // The watch has not shown the binding yet; a new pod arrives.
        let pods = vec![pod("p1", "1500m"), pod("p2", "1")];
        let a = plan(t(), &nodes, &pods, &mut tr);
        assert!(
            matches!(&a[..], [BinderAction::Unschedulable { name, message, .. }]
            if name == "p2" && message.contains("1 Insufficient cpu")),
            "{a:?}"
        );
        // Same pod version, same message: not written twice.
        assert!(plan(t(), &nodes, &pods, &mut tr).is_empty());
        // A failed binding is forgotten and retried.
        tr.failed(&BinderAction::Bind {
            namespace: "default".into(),
            name: "p1".into(),
            uid: "uid-p1".into(),
            node: "a".into(),
        });
        let a = plan(t(), &nodes, &pods, &mut tr);
        assert!(a.iter().any(|x| matches!(x, BinderAction::Bind { name, .. } if name == "p1")));
    }

    #[test]
    fn a_new_message_keeps_the_transition_time() {
        let mut tr = BinderTracker::default();
        let mut p = pod("p", "1");
        p.status = Some(
            serde_json::from_value(json!({"conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": "old", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}))
            .unwrap(),
        );
        let a = plan(
            t(),
            &[node("a")],
            &[pod("big", "3"), p.clone()].map(|mut x| {
                x.spec.as_mut().unwrap().containers[0].resources =
                    serde_json::from_value(json!({"requests": {"cpu": "3"}})).unwrap();
                x
            }),
            &mut tr,
        );
        assert!(
            a.iter().any(|x| matches!(x, BinderAction::Unschedulable { name, since: Some(s), .. }
            if name == "p" && s == "2026-01-01T00:00:00Z")),
            "{a:?}"
        );
        assert!(a.iter().any(|x| matches!(x, BinderAction::Unschedulable { name, since: None, .. } if name == "big")));
    }

    #[test]
    fn existing_condition_is_not_rewritten() {
        let mut tr = BinderTracker::default();
        let mut p = pod("p", "1");
        let msg = "no nodes available to schedule pods";
        p.status = Some(
            serde_json::from_value(json!({"conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": msg}]}))
            .unwrap(),
        );
        assert!(plan(t(), &[], &[p], &mut tr).is_empty());
    }
}
