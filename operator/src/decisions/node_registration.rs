//! Registration and initialization of a claim's Node (karpenter-semantics §6.2–6.3, clever-cloud.md
//! §1.6): which Node belongs to a claim, the provider ID stamp CKE leaves to us, what the hub syncs
//! onto the Node, and whether the Node is initialized.
//!
//! Owns: pure functions from (Node, NodeClaim) to the Node the hub wants and to condition verdicts.
//! Must not: write anything — the controller turns the desired Node into one optimistic-concurrency
//! update — and must never remove a taint it did not add (startup taints belong to their owner once
//! synced).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Taint as K8sTaint};

use crate::decisions::ownership::provider_id;
use crds::{NodeClaim, labels};

/// Taints Kubernetes or the hub put on every new node and remove by themselves; a node carrying
/// one is not initialized yet.
pub const KNOWN_EPHEMERAL_TAINTS: &[(&str, &str)] = &[
    ("node.kubernetes.io/not-ready", "NoSchedule"),
    ("node.kubernetes.io/unreachable", "NoSchedule"),
    ("node.cloudprovider.kubernetes.io/uninitialized", "NoSchedule"),
    (labels::UNREGISTERED_TAINT, "NoExecute"),
];

/// The provider ID to stamp on a CKE node that has none: `clevercloud://<nodegroup>` when its
/// `clever-cloud.com/nodegroup` label names a group of this scope (`owned`). Write-once: a Node
/// with a provider ID is never restamped.
pub fn provider_id_to_stamp(node: &Node, owned: impl Fn(&str) -> bool) -> Option<String> {
    if node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).is_some_and(|p| !p.is_empty()) {
        return None;
    }
    let group = node.metadata.labels.as_ref()?.get(labels::CLEVER_NODEGROUP)?;
    owned(group).then(|| provider_id(group))
}

/// Nodes carrying a claim's provider ID.
#[derive(Debug, PartialEq)]
pub enum NodeMatch<'a> {
    NotFound,
    One(&'a Node),
    Many(usize),
}

pub fn find_node<'a>(nodes: impl IntoIterator<Item = &'a Node>, claim_provider_id: &str) -> NodeMatch<'a> {
    let mut found =
        nodes.into_iter().filter(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(claim_provider_id));
    match (found.next(), found.next()) {
        (None, _) => NodeMatch::NotFound,
        (Some(n), None) => NodeMatch::One(n),
        (Some(_), Some(_)) => NodeMatch::Many(2 + found.count()),
    }
}

/// The Node after registration: termination finalizer, the claim's taints and startup taints added
/// (unless `karpenter.sh/do-not-sync-taints=true`), the claim's labels and annotations merged (the
/// claim wins), the unregistered taint removed and `karpenter.sh/registered=true`.
pub fn registered_node(node: &Node, claim: &NodeClaim) -> Node {
    let mut out = node.clone();
    let meta = &mut out.metadata;
    let finalizers = meta.finalizers.get_or_insert_with(Vec::new);
    if !finalizers.iter().any(|f| f == labels::TERMINATION_FINALIZER) {
        finalizers.push(labels::TERMINATION_FINALIZER.to_string());
    }
    let node_labels = meta.labels.get_or_insert_with(BTreeMap::new);
    let sync_taints = node_labels.get(labels::DO_NOT_SYNC_TAINTS).map(String::as_str) != Some("true");
    for (k, v) in claim.metadata.labels.iter().flatten() {
        node_labels.insert(k.clone(), v.clone());
    }
    node_labels.insert(labels::REGISTERED.to_string(), "true".to_string());
    if let Some(annotations) = &claim.metadata.annotations {
        let node_annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
        for (k, v) in annotations {
            node_annotations.insert(k.clone(), v.clone());
        }
    }
    let spec = out.spec.get_or_insert_with(Default::default);
    let taints = spec.taints.get_or_insert_with(Vec::new);
    if sync_taints {
        for t in claim.spec.taints.iter().chain(&claim.spec.startup_taints) {
            let t = t.to_k8s();
            if !taints.iter().any(|have| same_taint(have, &t)) {
                taints.push(t);
            }
        }
    }
    taints.retain(|t| !(t.key == labels::UNREGISTERED_TAINT && t.effect == "NoExecute"));
    if taints.is_empty() {
        spec.taints = None;
    }
    out
}

/// Whether a Node already went through registration (label set, unregistered taint gone).
pub fn is_registered(node: &Node) -> bool {
    node.metadata.labels.as_ref().and_then(|l| l.get(labels::REGISTERED)).map(String::as_str) == Some("true")
        && !taints(node).iter().any(|t| t.key == labels::UNREGISTERED_TAINT)
}

/// Why a registered Node is not initialized yet: `(reason, message)` for `Initialized=Unknown`.
pub fn initialization_blocker(node: &Node, claim: &NodeClaim) -> Option<(&'static str, String)> {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    if !ready {
        return Some(("NodeNotReady", "node is not ready".to_string()));
    }
    let node_taints = taints(node);
    if let Some(t) = claim
        .spec
        .startup_taints
        .iter()
        .map(crds::common::Taint::to_k8s)
        .find(|st| node_taints.iter().any(|t| same_taint(t, st)))
    {
        return Some(("StartupTaintsExist", format!("startup taint {} still on the node", taint_str(&t))));
    }
    if let Some(t) =
        node_taints.iter().find(|t| KNOWN_EPHEMERAL_TAINTS.iter().any(|(k, e)| t.key == *k && t.effect == *e))
    {
        return Some(("KnownEphemeralTaintsExist", format!("ephemeral taint {} still on the node", taint_str(t))));
    }
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    for (resource, quantity) in claim.spec.resources.requests.iter().flatten() {
        let requested = crds::quantity::parse_quantity(&quantity.0).map(|q| !q.is_zero()).unwrap_or(false);
        let present = allocatable
            .and_then(|a| a.get(resource))
            .and_then(|q| crds::quantity::parse_quantity(&q.0).ok())
            .is_some_and(|q| !q.is_zero());
        if requested && !present {
            return Some(("ResourceNotRegistered", format!("resource {resource} not registered on the node")));
        }
    }
    None
}

fn taints(node: &Node) -> &[K8sTaint] {
    node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default()
}

fn same_taint(a: &K8sTaint, b: &K8sTaint) -> bool {
    a.key == b.key
        && a.effect == b.effect
        && a.value.as_deref().unwrap_or_default() == b.value.as_deref().unwrap_or_default()
}

fn taint_str(t: &K8sTaint) -> String {
    match t.value.as_deref() {
        Some(v) if !v.is_empty() => format!("{}={}:{}", t.key, v, t.effect),
        _ => format!("{}:{}", t.key, t.effect),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn claim() -> NodeClaim {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeClaim",
            "metadata": {"name": "general-abcde", "namespace": "team-a",
                "labels": {"karpenter.sh/nodepool": "general", "node.kubernetes.io/instance-type": "M", "team": "a"},
                "annotations": {"karpenter.sh/nodepool-hash": "123"}},
            "spec": {"clusterName": "prod",
                "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"},
                "taints": [{"key": "team", "value": "a", "effect": "NoSchedule"}],
                "startupTaints": [{"key": "cni", "effect": "NoSchedule"}],
                "requirements": [], "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}
        }))
        .unwrap()
    }

    fn cke_node(group: &str) -> Node {
        Node {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("{group}-node0")),
                labels: Some(BTreeMap::from([
                    (labels::CLEVER_NODEGROUP.to_string(), group.to_string()),
                    ("team".to_string(), "cke-label".to_string()),
                ])),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(vec![K8sTaint {
                    key: labels::UNREGISTERED_TAINT.into(),
                    effect: "NoExecute".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                allocatable: Some(BTreeMap::from([
                    ("cpu".to_string(), Quantity("10".into())),
                    ("memory".to_string(), Quantity("15Gi".into())),
                ])),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn only_unstamped_nodes_of_owned_groups_get_a_provider_id() {
        let n = cke_node("ng-1");
        assert_eq!(provider_id_to_stamp(&n, |g| g == "ng-1").as_deref(), Some("clevercloud://ng-1"));
        assert_eq!(provider_id_to_stamp(&n, |_| false), None, "a foreign group's node is left alone");
        let mut stamped = n.clone();
        stamped.spec.as_mut().unwrap().provider_id = Some("clevercloud://other".into());
        assert_eq!(provider_id_to_stamp(&stamped, |_| true), None, "write-once");
    }

    #[test]
    fn nodes_are_matched_by_provider_id() {
        let mut a = cke_node("a");
        a.spec.as_mut().unwrap().provider_id = Some("clevercloud://a".into());
        let mut b = a.clone();
        b.metadata.name = Some("dup".into());
        assert_eq!(find_node([&a], "clevercloud://a"), NodeMatch::One(&a));
        assert_eq!(find_node([&a], "clevercloud://x"), NodeMatch::NotFound);
        assert_eq!(find_node([&a, &b], "clevercloud://a"), NodeMatch::Many(2));
    }

    #[test]
    fn registration_syncs_the_claim_onto_the_node() {
        let out = registered_node(&cke_node("g"), &claim());
        let l = out.metadata.labels.as_ref().unwrap();
        assert_eq!(l["team"], "a", "the claim's value wins");
        assert_eq!(l[labels::INSTANCE_TYPE], "M");
        assert_eq!(l[labels::REGISTERED], "true");
        assert_eq!(out.metadata.annotations.as_ref().unwrap()["karpenter.sh/nodepool-hash"], "123");
        assert_eq!(out.metadata.finalizers.as_deref().unwrap(), [labels::TERMINATION_FINALIZER]);
        let t: Vec<_> = taints(&out).iter().map(taint_str).collect();
        assert_eq!(t, ["team=a:NoSchedule", "cni:NoSchedule"]);
        assert!(is_registered(&out));
        assert!(!is_registered(&cke_node("g")));
        // Idempotent: registering twice changes nothing.
        assert_eq!(registered_node(&out, &claim()), out);
    }

    #[test]
    fn do_not_sync_taints_is_honoured() {
        let mut n = cke_node("g");
        n.metadata.labels.as_mut().unwrap().insert(labels::DO_NOT_SYNC_TAINTS.into(), "true".into());
        let out = registered_node(&n, &claim());
        assert!(out.spec.unwrap().taints.is_none(), "only the unregistered taint was there, and it is removed");
    }

    #[test]
    fn initialization_waits_for_ready_taints_and_resources() {
        let c = claim();
        let registered = registered_node(&cke_node("g"), &c);
        assert_eq!(initialization_blocker(&registered, &c).unwrap().0, "StartupTaintsExist");
        let mut n = registered.clone();
        n.spec.as_mut().unwrap().taints = Some(vec![K8sTaint {
            key: "node.kubernetes.io/not-ready".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]);
        assert_eq!(initialization_blocker(&n, &c).unwrap().0, "KnownEphemeralTaintsExist");
        n.spec.as_mut().unwrap().taints = None;
        assert_eq!(initialization_blocker(&n, &c), None);
        n.status.as_mut().unwrap().allocatable.as_mut().unwrap().insert("memory".into(), Quantity("0".into()));
        assert_eq!(initialization_blocker(&n, &c).unwrap().0, "ResourceNotRegistered");
        n.status.as_mut().unwrap().conditions = None;
        assert_eq!(initialization_blocker(&n, &c).unwrap().0, "NodeNotReady");
    }
}

/// Registration health of one NodePool (karpenter-semantics §6.4): the last [`HEALTH_WINDOW`]
/// launch outcomes. Informational only; it never blocks provisioning.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistrationHealth {
    outcomes: std::collections::VecDeque<bool>,
    /// (pool generation, node class generation) the outcomes were recorded under.
    generations: (Option<i64>, Option<i64>),
}

/// Outcomes kept per pool.
pub const HEALTH_WINDOW: usize = 4;

impl RegistrationHealth {
    /// Record a registration (`true`) or a launch/registration timeout (`false`).
    pub fn record(&mut self, registered: bool, generations: (Option<i64>, Option<i64>)) {
        self.reset_if_changed(generations);
        if self.outcomes.len() == HEALTH_WINDOW {
            self.outcomes.pop_front();
        }
        self.outcomes.push_back(registered);
    }

    /// `None` (Unknown) with no outcome since the pool or its class last changed; `Some(false)`
    /// when at least half of the recent outcomes failed; else `Some(true)`.
    pub fn healthy(&mut self, generations: (Option<i64>, Option<i64>)) -> Option<bool> {
        self.reset_if_changed(generations);
        if self.outcomes.is_empty() {
            return None;
        }
        let failures = self.outcomes.iter().filter(|ok| !**ok).count();
        Some(failures * 2 < self.outcomes.len())
    }

    fn reset_if_changed(&mut self, generations: (Option<i64>, Option<i64>)) {
        if self.generations != generations {
            self.outcomes.clear();
            self.generations = generations;
        }
    }
}

#[cfg(test)]
mod health_tests {
    use super::*;

    const G: (Option<i64>, Option<i64>) = (Some(1), Some(1));

    #[test]
    fn half_or_more_failures_of_the_last_four_is_unhealthy() {
        let mut h = RegistrationHealth::default();
        assert_eq!(h.healthy(G), None);
        h.record(false, G);
        assert_eq!(h.healthy(G), Some(false));
        h.record(true, G);
        assert_eq!(h.healthy(G), Some(false), "1 of 2 failed: 50 %");
        h.record(true, G);
        assert_eq!(h.healthy(G), Some(true));
        for _ in 0..2 {
            h.record(false, G);
        }
        assert_eq!(h.healthy(G), Some(false), "2 of the last 4 failed");
        for _ in 0..3 {
            h.record(true, G);
        }
        assert_eq!(h.healthy(G), Some(true), "the old failures left the window");
    }

    #[test]
    fn a_changed_pool_or_class_starts_over_unknown() {
        let mut h = RegistrationHealth::default();
        h.record(false, G);
        assert_eq!(h.healthy((Some(2), Some(1))), None);
        h.record(false, (Some(2), Some(1)));
        assert_eq!(h.healthy((Some(2), Some(2))), None);
    }
}

/// A resource of the Node below 90 % of what the claim's flavor states: the first one found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node {resource} capacity {got} is below 90 % of the {want} expected for its flavor")]
pub struct Shortfall {
    pub resource: &'static str,
    pub want: i64,
    pub got: i64,
}

/// The consistency check of an initialized claim (karpenter-semantics §6.6): the Node's capacity
/// must be at least 90 % of the claim's for every resource the claim states. `Err` names the first
/// short resource.
pub fn consistency(node: &Node, claim: &NodeClaim) -> Result<(), Shortfall> {
    let Some(expected) = claim.status.as_ref().and_then(|s| s.capacity.as_ref()) else { return Ok(()) };
    let Some(actual) = node.status.as_ref().and_then(|s| s.capacity.as_ref()) else { return Ok(()) };
    let (Ok(expected), Ok(actual)) = (
        crds::quantity::Resources::from_resource_list(expected),
        crds::quantity::Resources::from_resource_list(actual),
    ) else {
        return Ok(());
    };
    let short = |resource: &'static str, want: i64, got: i64| -> Result<(), Shortfall> {
        // got < 90 % of want, in integers.
        if want > 0 && got.saturating_mul(10) < want.saturating_mul(9) {
            Err(Shortfall { resource, want, got })
        } else {
            Ok(())
        }
    };
    short("cpu (millicores)", expected.cpu_millis, actual.cpu_millis)?;
    short("memory (bytes)", expected.memory_bytes, actual.memory_bytes)?;
    short("pods", expected.pods, actual.pods)
}

#[cfg(test)]
mod consistency_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn node(cpu: &str, memory: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "status": {"capacity": {"cpu": cpu, "memory": memory, "pods": "110"}}
        }))
        .unwrap()
    }

    fn claim() -> NodeClaim {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "c", "namespace": "a"},
            "spec": {"clusterName": "x", "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "d"}, "requirements": []},
            "status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"}}
        }))
        .unwrap()
    }

    #[test]
    fn a_node_within_ten_percent_is_consistent_and_a_smaller_one_is_not() {
        assert!(consistency(&node("4", "7.5Gi"), &claim()).is_ok());
        let e = consistency(&node("4", "6Gi"), &claim()).unwrap_err();
        assert!(e.to_string().contains("memory"), "{e}");
        assert!(consistency(&node("3", "8Gi"), &claim()).unwrap_err().to_string().contains("cpu"));
    }
}
