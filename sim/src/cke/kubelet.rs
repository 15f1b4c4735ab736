//! `sim::cke::kubelet`: the kubelet stand-in's decisions (plus the bits of the node lifecycle and
//! pod garbage collectors a cluster without real kubelets needs), as a pure planner.
//!
//! Owns, for the Nodes the simulator made (annotated [`SIMULATED_ANNOTATION`]) only: the node
//! turns `Ready` after `node_ready_delay` and loses its `node.kubernetes.io/not-ready` taint; pods
//! bound to a Ready node become `Running` after `pod_start_delay`; pods being deleted there are
//! removed (grace period 0) after `pod_termination_delay`, as a kubelet confirms a graceful
//! deletion; pods bound to a simulated node that no longer exists are removed (pod GC).
//!
//! Must not: touch Nodes or pods of real kubelets, do I/O, or read a clock.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use serde_json::Value;

use super::config::SimCkeConfig;
use super::fit::is_terminal;
use super::objects::{self, NOT_READY_TAINT, SIMULATED_ANNOTATION};

/// A write the kubelet stand-in wants made.
#[derive(Debug, Clone, PartialEq)]
pub enum KubeletAction {
    /// Replace `status.conditions` of a Node (now Ready), and add what its flavor's device plugin
    /// reports to its capacity and allocatable.
    NodeReady {
        /// Node name.
        name: String,
        /// The conditions.
        conditions: Value,
        /// Extended resources (the flavor's [`super::quota::SimFlavor::devices`]).
        devices: BTreeMap<String, i64>,
    },
    /// Set `spec.taints` of a Node (the not-ready taint removed), guarded by `resource_version`.
    SetNodeTaints {
        /// Node name.
        name: String,
        /// Resource version the list was computed from.
        resource_version: Option<String>,
        /// The full new list.
        taints: Vec<Taint>,
    },
    /// Merge this status into the pod's (Running).
    PodRunning {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Status to merge.
        status: Value,
    },
    /// Delete the pod now (grace period 0), with a UID precondition.
    DeletePod {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// UID.
        uid: String,
    },
}

impl KubeletAction {
    /// Key for de-duplication: one outstanding write per object and purpose.
    pub fn key(&self) -> String {
        match self {
            KubeletAction::NodeReady { name, .. } => format!("node-ready/{name}"),
            KubeletAction::SetNodeTaints { name, .. } => format!("node-taints/{name}"),
            KubeletAction::PodRunning { namespace, name, .. } => format!("pod-running/{namespace}/{name}"),
            KubeletAction::DeletePod { namespace, name, .. } => format!("pod-delete/{namespace}/{name}"),
        }
    }
}

/// What the kubelet stand-in remembers between passes.
#[derive(Debug, Default)]
pub struct KubeletTracker {
    /// Node UID → when first seen not Ready.
    node_seen: HashMap<String, DateTime<Utc>>,
    /// Pod UID → when first seen bound to a simulated node and not running.
    pod_bound: HashMap<String, DateTime<Utc>>,
    /// Pod UID → when first seen being deleted (or orphaned).
    pod_leaving: HashMap<String, DateTime<Utc>>,
    /// Names of every simulated node ever seen (for pod GC after the node is gone).
    simulated: HashSet<String>,
    /// Action key → resource version of the object when the write was requested.
    requested: HashMap<String, String>,
}

impl KubeletTracker {
    /// Forgets a request (it failed): the next pass asks again.
    pub fn failed(&mut self, key: &str) {
        self.requested.remove(key);
    }
}

/// The outcome of a pass.
#[derive(Debug, Default)]
pub struct KubeletPlan {
    /// Writes.
    pub actions: Vec<KubeletAction>,
    /// The earliest time a pending delay expires.
    pub wake_at: Option<DateTime<Utc>>,
}

impl KubeletPlan {
    fn wake(&mut self, at: DateTime<Utc>) {
        if self.wake_at.is_none_or(|w| at < w) {
            self.wake_at = Some(at);
        }
    }

    /// Adds `action` unless the same write was already requested for this version of the object.
    fn push(&mut self, tracker: &mut KubeletTracker, rv: Option<&str>, action: KubeletAction) {
        let key = action.key();
        let rv = rv.unwrap_or_default().to_string();
        if tracker.requested.get(&key) == Some(&rv) {
            return;
        }
        tracker.requested.insert(key, rv);
        self.actions.push(action);
    }
}

fn after(t: DateTime<Utc>, d: std::time::Duration) -> DateTime<Utc> {
    t + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// Whether a Node was made by the simulator.
pub fn is_simulated(node: &Node) -> bool {
    node.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(SIMULATED_ANNOTATION))
}

/// Whether a Node's `Ready` condition is `True`.
pub fn is_ready(node: &Node) -> bool {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
    conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The InternalIP of a node.
fn internal_ip(node: &Node) -> Option<String> {
    let addresses = node.status.as_ref().and_then(|s| s.addresses.as_deref()).unwrap_or(&[]);
    addresses.iter().find(|a| a.type_ == "InternalIP").map(|a| a.address.clone())
}

/// One pass of the kubelet stand-in.
pub fn plan(
    cfg: &SimCkeConfig,
    now: DateTime<Utc>,
    nodes: &[Node],
    pods: &[Pod],
    tracker: &mut KubeletTracker,
) -> KubeletPlan {
    let mut out = KubeletPlan::default();
    let mut simulated: HashMap<&str, &Node> = HashMap::new();
    let mut seen_nodes = HashSet::new();
    for node in nodes.iter().filter(|n| is_simulated(n)) {
        let (Some(name), Some(uid)) = (node.metadata.name.as_deref(), node.metadata.uid.as_deref()) else { continue };
        simulated.insert(name, node);
        tracker.simulated.insert(name.to_string());
        seen_nodes.insert(uid.to_string());
        let rv = node.metadata.resource_version.as_deref();
        if !is_ready(node) {
            let seen = *tracker.node_seen.entry(uid.to_string()).or_insert(now);
            let due = after(seen, cfg.node_ready_delay.draw(cfg.seed, &format!("{name}/ready")));
            if now < due {
                out.wake(due);
            } else {
                out.push(
                    tracker,
                    rv,
                    KubeletAction::NodeReady {
                        name: name.to_string(),
                        conditions: objects::node_conditions(true, now),
                        devices: node
                            .metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get(crds::labels::CLEVER_FLAVOR))
                            .and_then(|f| cfg.flavor(f))
                            .map(|f| f.devices.clone())
                            .unwrap_or_default(),
                    },
                );
            }
            continue;
        }
        let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or(&[]);
        if taints.iter().any(|t| t.key == NOT_READY_TAINT) {
            let kept: Vec<Taint> = taints.iter().filter(|t| t.key != NOT_READY_TAINT).cloned().collect();
            out.push(
                tracker,
                rv,
                KubeletAction::SetNodeTaints {
                    name: name.to_string(),
                    resource_version: node.metadata.resource_version.clone(),
                    taints: kept,
                },
            );
        }
    }
    tracker.node_seen.retain(|uid, _| seen_nodes.contains(uid));

    let mut bound_now = HashSet::new();
    let mut leaving_now = HashSet::new();
    for pod in pods {
        let Some(node_name) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else { continue };
        let (Some(uid), Some(namespace), Some(name)) =
            (pod.metadata.uid.as_deref(), pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref())
        else {
            continue;
        };
        let rv = pod.metadata.resource_version.as_deref();
        let node = simulated.get(node_name);
        let orphan = node.is_none() && tracker.simulated.contains(node_name);
        if node.is_none() && !orphan {
            continue; // a real kubelet's pod
        }
        if pod.metadata.deletion_timestamp.is_some() || orphan {
            leaving_now.insert(uid.to_string());
            let seen = *tracker.pod_leaving.entry(uid.to_string()).or_insert(now);
            let due = after(seen, cfg.pod_termination_delay.draw(cfg.seed, &format!("{namespace}/{name}/terminate")));
            if now < due {
                out.wake(due);
            } else {
                let action = KubeletAction::DeletePod {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    uid: uid.to_string(),
                };
                out.push(tracker, rv, action);
            }
            continue;
        }
        let Some(node) = node else { continue };
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        if running || is_terminal(pod) || !is_ready(node) {
            continue;
        }
        bound_now.insert(uid.to_string());
        let seen = *tracker.pod_bound.entry(uid.to_string()).or_insert(now);
        let due = after(seen, cfg.pod_start_delay.draw(cfg.seed, &format!("{namespace}/{name}/start")));
        if now < due {
            out.wake(due);
            continue;
        }
        let host_ip = internal_ip(node).unwrap_or_default();
        let pod_ip = objects::ip(cfg.seed, &format!("pod/{namespace}/{name}"), 100);
        let status = objects::pod_running_status(pod, &host_ip, &pod_ip, now);
        out.push(
            tracker,
            rv,
            KubeletAction::PodRunning { namespace: namespace.to_string(), name: name.to_string(), status },
        );
    }
    tracker.pod_bound.retain(|uid, _| bound_now.contains(uid));
    tracker.pod_leaving.retain(|uid, _| leaving_now.contains(uid));
    // Records of requests about objects that no longer exist are dropped.
    let node_names: HashSet<&str> = nodes.iter().filter_map(|n| n.metadata.name.as_deref()).collect();
    let pod_keys: HashSet<String> = pods
        .iter()
        .map(|p| {
            let ns = p.metadata.namespace.as_deref().unwrap_or_default();
            format!("{ns}/{}", p.metadata.name.as_deref().unwrap_or_default())
        })
        .collect();
    tracker.requested.retain(|key, _| match key.split_once('/') {
        Some(("node-ready" | "node-taints", name)) => node_names.contains(name),
        Some((_, pod)) => pod_keys.contains(pod),
        None => false,
    });
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::cke::objects::NodeSpecInput;
    use crate::cke::quota::SimFlavor;
    use serde_json::json;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_767_225_600 + s, 0).unwrap()
    }

    fn sim_node(name: &str, ready: bool) -> Node {
        let flavor = SimFlavor::builtins().remove(0);
        let input = NodeSpecInput {
            name,
            flavor: &flavor,
            group: Some("ng"),
            extra_labels: None,
            taints: vec![],
            ready,
            kubelet_version: "v1.36.0",
            seed: 0,
        };
        let mut v = objects::node_object(&input, t(0));
        v["metadata"]["uid"] = json!(format!("uid-{name}"));
        v["metadata"]["resourceVersion"] = json!("1");
        serde_json::from_value(v).unwrap()
    }

    fn pod(name: &str, node: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "resourceVersion": "1"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": "Pending"},
        }))
        .unwrap()
    }

    #[test]
    fn node_becomes_ready_then_loses_the_not_ready_taint() {
        let cfg = SimCkeConfig::default();
        let mut tr = KubeletTracker::default();
        let mut node = sim_node("ng-node0", false);
        let p = plan(&cfg, t(0), std::slice::from_ref(&node), &[], &mut tr);
        assert!(p.actions.is_empty());
        assert_eq!(p.wake_at, Some(t(5)));
        let p = plan(&cfg, t(5), std::slice::from_ref(&node), &[], &mut tr);
        assert!(matches!(&p.actions[..], [KubeletAction::NodeReady { name, .. }] if name == "ng-node0"));
        // Not repeated for the same version of the object.
        assert!(plan(&cfg, t(6), std::slice::from_ref(&node), &[], &mut tr).actions.is_empty());
        let KubeletAction::NodeReady { conditions, .. } = &p.actions[0] else { unreachable!() };
        node.status.as_mut().unwrap().conditions = serde_json::from_value(conditions.clone()).unwrap();
        node.metadata.resource_version = Some("2".into());
        let p = plan(&cfg, t(6), std::slice::from_ref(&node), &[], &mut tr);
        assert!(matches!(&p.actions[..], [KubeletAction::SetNodeTaints { taints, .. }] if taints.is_empty()));
    }

    #[test]
    fn bound_pods_start_on_ready_simulated_nodes_only() {
        let cfg = SimCkeConfig::default();
        let mut tr = KubeletTracker::default();
        let nodes = vec![sim_node("ready", true), sim_node("booting", false)];
        let mut real = sim_node("real", true);
        real.metadata.annotations = None;
        let nodes = [nodes, vec![real]].concat();
        let pods = vec![pod("a", Some("ready")), pod("b", Some("booting")), pod("c", Some("real")), pod("d", None)];
        let p = plan(&cfg, t(0), &nodes, &pods, &mut tr);
        assert!(p.actions.iter().all(|a| !matches!(a, KubeletAction::PodRunning { .. })));
        let p = plan(&cfg, t(1), &nodes, &pods, &mut tr);
        let running: Vec<&str> = p
            .actions
            .iter()
            .filter_map(|a| if let KubeletAction::PodRunning { name, .. } = a { Some(name.as_str()) } else { None })
            .collect();
        assert_eq!(running, ["a"]);
        let KubeletAction::PodRunning { status, .. } =
            p.actions.iter().find(|a| matches!(a, KubeletAction::PodRunning { .. })).unwrap()
        else {
            unreachable!()
        };
        assert_eq!(status["phase"], "Running");
        assert!(status["hostIP"].as_str().unwrap().starts_with("10."));
        assert_eq!(status["containerStatuses"][0]["ready"], true);
    }

    #[test]
    fn deleting_pods_are_confirmed_and_orphans_collected() {
        let cfg = SimCkeConfig::default();
        let mut tr = KubeletTracker::default();
        let nodes = vec![sim_node("n", true)];
        let mut leaving = pod("x", Some("n"));
        leaving.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        plan(&cfg, t(0), &nodes, std::slice::from_ref(&leaving), &mut tr);
        let p = plan(&cfg, t(1), &nodes, std::slice::from_ref(&leaving), &mut tr);
        assert!(matches!(&p.actions[..], [KubeletAction::DeletePod { name, .. }] if name == "x"));
        // The node goes; its remaining pod is collected.
        let stranded = pod("y", Some("n"));
        plan(&cfg, t(2), &[], std::slice::from_ref(&stranded), &mut tr);
        let p = plan(&cfg, t(3), &[], std::slice::from_ref(&stranded), &mut tr);
        assert!(matches!(&p.actions[..], [KubeletAction::DeletePod { name, .. }] if name == "y"));
        // A failed request is retried.
        let key = p.actions[0].key();
        assert!(plan(&cfg, t(4), &[], std::slice::from_ref(&stranded), &mut tr).actions.is_empty());
        tr.failed(&key);
        assert_eq!(plan(&cfg, t(4), &[], std::slice::from_ref(&stranded), &mut tr).actions.len(), 1);
    }
}
