//! `plan` and the live hub decide alike over the same objects (issue 28 item 4): the same
//! manifests are read by `plan` and put in the hub's watch caches (as its reflectors fill them),
//! then a provisioning round and a disruption pass decide over those caches. Storage is the case:
//! a pod whose PersistentVolume pins it to another zone, and a node at its CSI attach limit.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::{disruption_plan::plan_disruption, plan, read_snapshot};
use crate::{
    controllers::{disruption, provisioning},
    decisions::{capacity::CapacityState, nomination},
    infra::{
        cache_fixture::{
            Caches,
            objects::{CLUSTER, CREATED, claim, class, key, node, pool},
        },
        facts,
    },
};

const DRIVER: &str = "csi.example.com";

fn now() -> k8s_openapi::jiff::Timestamp {
    "2026-11-25T12:00:00Z".parse().unwrap()
}

/// A pod in `default` asking for 500m and 512Mi, with the claim `pvc` mounted if given; bound to
/// `node` (running), or pending as kube-scheduler marks it.
fn pod(name: &str, pvc: Option<&str>, node: Option<&str>) -> Value {
    let mut spec = json!({"containers": [{"name": "app", "image": "registry.example/app:1",
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}]});
    if let Some(claim) = pvc {
        spec["volumes"] = json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]);
    }
    let status = match node {
        Some(n) => {
            spec["nodeName"] = json!(n);
            json!({"phase": "Running", "startTime": CREATED, "conditions": [
                {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]})
        }
        None => json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}),
    };
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "creationTimestamp": CREATED,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "uid-sts", "controller": true}]},
        "spec": spec, "status": status})
}

/// A claim bound to a CSI volume `pv` of [`DRIVER`], its node affinity `zone` if given.
fn volume(pvc: &str, pv: &str, zone: Option<&str>) -> [Value; 2] {
    let mut spec = json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
        "csi": {"driver": DRIVER, "volumeHandle": format!("handle-{pv}")},
        "claimRef": {"name": pvc, "namespace": "default"}});
    if let Some(z) = zone {
        spec["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [z]}]}]}});
    }
    [
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": pvc, "namespace": "default"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "volumeName": pv},
            "status": {"phase": "Bound"}}),
        json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv}, "spec": spec,
            "status": {"phase": "Bound"}}),
    ]
}

/// Node `node` attaches at most `count` volumes of [`DRIVER`].
fn csinode(node: &str, count: i32) -> Value {
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": node},
        "spec": {"drivers": [{"name": DRIVER, "nodeID": node, "allocatable": {"count": count}}]}})
}

/// The namespace's Ready `default` class and `default` pool, and node `name` (XS) of that pool
/// with its claim (`conditions` True on it).
fn base(nodes: &[(&str, &[(&str, &str)])]) -> Vec<Value> {
    let mut objects = vec![
        serde_json::to_value(class("default", true)).unwrap(),
        serde_json::to_value(pool("default", "default", json!({}))).unwrap(),
    ];
    for (name, conditions) in nodes {
        objects.push(serde_json::to_value(claim(name, "default", "XS", true, conditions)).unwrap());
        objects.push(serde_json::to_value(node(name, "default", "XS")).unwrap());
    }
    objects
}

/// `objects` as `plan` reads them (one multi-document file).
fn manifests(objects: &[Value]) -> (super::Manifests, Vec<String>) {
    let text: Vec<String> = objects.iter().map(|o| serde_json::to_string(o).unwrap()).collect();
    read_snapshot(&[("agreement.yaml".to_string(), text.join("\n---\n"))]).unwrap()
}

/// `objects` in the hub's caches, each kind listed once.
fn caches(objects: &[Value]) -> Caches {
    let of = |kind: &'static str| objects.iter().filter(move |o| o["kind"] == kind).cloned();
    fn typed<T: serde::de::DeserializeOwned>(v: impl Iterator<Item = Value>) -> Vec<T> {
        v.map(|o| serde_json::from_value(o).unwrap()).collect()
    }
    let mut c = Caches::listed();
    c.list(typed::<crds::CleverNodeClass>(of("CleverNodeClass")));
    c.list(typed::<crds::NodePool>(of("NodePool")));
    c.list(typed::<crds::NodeClaim>(of("NodeClaim")));
    c.list(typed::<k8s_openapi::api::core::v1::Node>(of("Node")));
    c.list(typed::<scheduling::CompactPod>(of("Pod")));
    c.list(typed::<k8s_openapi::api::core::v1::PersistentVolumeClaim>(of("PersistentVolumeClaim")));
    c.list(typed::<k8s_openapi::api::core::v1::PersistentVolume>(of("PersistentVolume")));
    c.list(typed::<k8s_openapi::api::storage::v1::CSINode>(of("CSINode")));
    c
}

/// Where each pod goes: `(new claims' pods, existing node ← pods, unschedulable pods)`, pods as
/// `namespace/name`.
type Placement = (Vec<Vec<String>>, Vec<(String, Vec<String>)>, BTreeSet<String>);

#[test]
fn plan_and_the_hub_place_a_pod_pinned_by_its_volume_and_one_kept_off_a_node_at_its_attach_limit() {
    let mut objects = base(&[("default-a1", &[])]);
    // default-a1 attaches one volume of the driver, and has one: db-0's.
    objects.push(csinode("default-a1", 1));
    objects.extend(volume("data-0", "pv-0", None));
    objects.push(pod("db-0", Some("data-0"), Some("default-a1")));
    // db-1's volume would fit default-a1's CPU, not its attach limit: a new node.
    objects.extend(volume("data-1", "pv-1", None));
    objects.push(pod("db-1", Some("data-1"), None));
    // pinned's volume lives in rbx; the hub launches in par: no node can take it.
    objects.extend(volume("data-2", "pv-2", Some("rbx")));
    objects.push(pod("pinned", Some("data-2"), None));
    // web has no volume: default-a1's room.
    objects.push(pod("web", None, None));

    let (m, notes) = manifests(&objects);
    let planned = plan(&m, Some(CLUSTER), notes).unwrap();
    let by_plan: Placement = (
        planned.node_claims.iter().map(|c| c.pods.clone()).collect(),
        planned.existing_nodes.iter().map(|n| (n.name.clone(), n.pods.clone())).collect(),
        planned.unschedulable.iter().map(|u| u.pod.clone()).collect(),
    );

    let c = caches(&objects);
    let gathered =
        provisioning::gather(&c.mgmt(), &c.workload(), &key(), &Default::default(), &Default::default(), now())
            .unwrap();
    let provisioning::Gathered::Round(mut round) = gathered else { panic!("pods to place: {gathered:?}") };
    let provisioning::Decided::Solved(solved) =
        provisioning::decide(&mut round, &key(), &CapacityState::default(), &[], now())
    else {
        panic!("no back-off here")
    };
    let input = &round.input;
    let name = |i: &usize| input.pods[*i].key();
    let by_hub: Placement = (
        solved.decision.new_claims.iter().map(|c| c.pods.iter().map(name).collect()).collect(),
        solved
            .decision
            .existing
            .iter()
            .map(|a| (input.nodes[a.node].name.clone(), a.pods.iter().map(name).collect()))
            .collect(),
        solved.decision.unschedulable.iter().map(|u| name(&u.pod)).collect(),
    );

    let expected: Placement = (
        vec![vec!["default/db-1".to_string()]],
        vec![("default-a1".to_string(), vec!["default/web".to_string()])],
        ["default/pinned".to_string()].into(),
    );
    assert_eq!(by_plan, expected, "plan");
    assert_eq!(by_hub, by_plan, "the hub decides as plan does");
}

#[test]
fn plan_and_the_hub_keep_a_volume_off_a_destination_at_its_attach_limit_when_consolidating() {
    // Both nodes Consolidatable (a destination must be, §3.7); default-a1 kept by its pod.
    let consolidatable: &[(&str, &str)] = &[("Consolidatable", "Consolidatable")];
    let mut objects = base(&[("default-a1", consolidatable), ("default-b2", consolidatable)]);
    objects.push(csinode("default-a1", 1));
    objects.extend(volume("data-0", "pv-0", None));
    let mut kept = pod("db-0", Some("data-0"), Some("default-a1"));
    kept["metadata"]["annotations"] = json!({"karpenter.sh/do-not-disrupt": "true"});
    objects.push(kept);
    // default-b2's pod has CPU enough on default-a1 but no attach slot: deleting default-b2 alone
    // would strand it, so the move is a smaller node for it.
    objects.extend(volume("data-1", "pv-1", None));
    objects.push(pod("db-1", Some("data-1"), Some("default-b2")));

    let (m, notes) = manifests(&objects);
    let planned = plan_disruption(&m, Some(CLUSTER), Default::default(), now(), notes).unwrap();
    let by_plan = planned.decision.as_ref().map(|d| {
        (
            d.candidates.iter().map(|c| c.node_claim.clone()).collect::<Vec<_>>(),
            d.replacements.iter().map(|r| r.flavor.clone()).collect::<Vec<_>>(),
        )
    });

    let c = caches(&objects);
    let mgmt = c.mgmt();
    let claims = facts::claims(&mgmt, &key());
    let (snapshot, mut view) =
        disruption::gather(&mgmt, &c.workload(), &key(), &Default::default(), &Default::default(), &claims, now())
            .unwrap();
    disruption::corrected(&mut view, &snapshot, &CapacityState::default(), &nomination::Nominations::default(), now());
    let pass = disruption::methods(&view, false, now(), |_, _| {});
    let by_hub = pass.command().map(|cmd| {
        (
            cmd.claims().into_iter().map(str::to_string).collect::<Vec<_>>(),
            cmd.replacements
                .iter()
                .map(|r| r.instance_types.first().map(|o| o.name.clone()).unwrap_or_default())
                .collect::<Vec<_>>(),
        )
    });

    assert_eq!(by_plan, Some((vec!["default-b2".to_string()], vec!["2XS".to_string()])), "plan");
    assert_eq!(by_hub, by_plan, "the hub decides as plan does");
}
