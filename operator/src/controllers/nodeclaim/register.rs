//! The Node registration write (karpenter-semantics §6.2): the registered Node the lifecycle decided
//! ([`Write::RegisterNode`](crate::decisions::lifecycle::Write::RegisterNode)) sent as a JSON patch
//! of only what the hub changes on the Node as read.
//!
//! Owns: building that patch and sending it. Must not: decide what a registered Node carries
//! ([`crate::decisions::node_registration`]'s) or when to register it ([`crate::decisions::lifecycle`]'s),
//! or retry by itself (a taints test that fails ends the pass; the next one registers on the list it
//! reads then).

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};

use super::Error;
use crate::infra::errors::Step;

/// Send the registration of `read` into `desired`. `false`: the Node's taints changed since they
/// were read (the patch's `test` failed, 422), nothing written.
pub(super) async fn register(nodes: &Api<Node>, read: &Node, desired: &Node) -> Result<bool, Error> {
    let Some(ops) = registration_patch(read, desired) else { return Ok(true) };
    let patch = Patch::Json::<()>(serde_json::from_value(ops).map_err(Error::Patch)?);
    match nodes.patch(&desired.name_any(), &PatchParams::default(), &patch).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 422 => Ok(false),
        Err(e) => Err(Step::RegisterNode.failed(e).into()),
    }
}

/// The registration of `read` (the Node as cached) into `desired` ([`Write::RegisterNode`]) as a
/// JSON patch (RFC 6902) of only what the hub changes: the labels and annotations it sets, its
/// finalizer added, and the taints replaced, each list after a `test` that it is still as read.
/// The taints are the list others change too (the kubelet and the node lifecycle controller remove
/// `node.kubernetes.io/not-ready`): a concurrent change there fails the test (422) and the next
/// pass retries on the new list, while a change anywhere else (the Node's status, heartbeats, labels
/// of others) no longer conflicts as the whole-object `replace` did. `None` when nothing differs.
fn registration_patch(read: &Node, desired: &Node) -> Option<serde_json::Value> {
    use serde_json::json;
    // JSON pointer escaping of a map key (RFC 6901).
    let key = |k: &str| k.replace('~', "~0").replace('/', "~1");
    let mut ops = Vec::new();
    let maps = [
        ("labels", read.metadata.labels.as_ref(), desired.metadata.labels.as_ref()),
        ("annotations", read.metadata.annotations.as_ref(), desired.metadata.annotations.as_ref()),
    ];
    for (field, have, want) in maps {
        let Some(want) = want else { continue };
        match have {
            None => ops.push(json!({"op": "add", "path": format!("/metadata/{field}"), "value": want})),
            Some(have) => {
                for (k, v) in want.iter().filter(|(k, v)| have.get(*k) != Some(*v)) {
                    ops.push(json!({"op": "add", "path": format!("/metadata/{field}/{}", key(k)), "value": v}));
                }
            }
        }
    }
    // The finalizer appended to the list as read (tested, so a stale read never adds it twice), or
    // the list created when the Node has none (a Node joins without finalizers; registration
    // follows within seconds, before any other controller finalizes it).
    let have = read.metadata.finalizers.as_deref().unwrap_or_default();
    let missing: Vec<&String> = desired.metadata.finalizers.iter().flatten().filter(|f| !have.contains(f)).collect();
    if !missing.is_empty() {
        match &read.metadata.finalizers {
            None => ops.push(json!({"op": "add", "path": "/metadata/finalizers", "value": missing})),
            Some(list) => {
                ops.push(json!({"op": "test", "path": "/metadata/finalizers", "value": list}));
                for f in missing {
                    ops.push(json!({"op": "add", "path": "/metadata/finalizers/-", "value": f}));
                }
            }
        }
    }
    let taints = |n: &Node| n.spec.as_ref().and_then(|s| s.taints.clone());
    let (have, want) = (taints(read), taints(desired));
    if have != want {
        match (&have, &want) {
            (None, Some(w)) => ops.push(json!({"op": "add", "path": "/spec/taints", "value": w})),
            (Some(h), None) => {
                ops.push(json!({"op": "test", "path": "/spec/taints", "value": h}));
                ops.push(json!({"op": "remove", "path": "/spec/taints"}));
            }
            (Some(h), Some(w)) => {
                ops.push(json!({"op": "test", "path": "/spec/taints", "value": h}));
                ops.push(json!({"op": "replace", "path": "/spec/taints", "value": w}));
            }
            (None, None) => {}
        }
    }
    (!ops.is_empty()).then_some(serde_json::Value::Array(ops))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::decisions::{
        lifecycle::fixtures::{claim, node, t},
        node_registration,
    };
    use crds::labels;

    /// The RFC 6902 operations `registration_patch` uses, as the API server applies them (a failed
    /// `test` panics here).
    fn apply_ops(v: &mut serde_json::Value, ops: &[serde_json::Value]) {
        for op in ops {
            let path = op["path"].as_str().unwrap();
            let (parent, last) = path.rsplit_once('/').unwrap();
            let last = last.replace("~1", "/").replace("~0", "~");
            let value = op.get("value").cloned();
            match op["op"].as_str().unwrap() {
                "test" => assert_eq!(v.pointer(path), value.as_ref(), "test of {path} failed"),
                "remove" => {
                    v.pointer_mut(parent).unwrap().as_object_mut().unwrap().remove(&last);
                }
                "add" | "replace" => match v.pointer_mut(parent).unwrap() {
                    serde_json::Value::Array(a) if last == "-" => a.push(value.unwrap()),
                    serde_json::Value::Object(m) => {
                        m.insert(last, value.unwrap());
                    }
                    other => panic!("{path}: cannot add to {other}"),
                },
                other => panic!("unexpected op {other}"),
            }
        }
    }

    fn taint(key: &str, effect: &str) -> k8s_openapi::api::core::v1::Taint {
        k8s_openapi::api::core::v1::Taint { key: key.into(), effect: effect.into(), ..Default::default() }
    }

    #[test]
    fn registration_patches_only_what_the_hub_owns_and_tests_the_taints() {
        let mut read = node("False", t(0));
        read.metadata.labels = Some([("a/b".to_string(), "1".to_string())].into());
        read.metadata.finalizers = None;
        read.spec.as_mut().unwrap().taints = Some(vec![
            taint(labels::UNREGISTERED_TAINT, "NoExecute"),
            taint("node.kubernetes.io/not-ready", "NoSchedule"),
        ]);
        let desired = node_registration::registered_node(&read, &claim());
        let ops = registration_patch(&read, &desired).unwrap();
        let ops = ops.as_array().unwrap();
        let has_op = |op: &str, path: &str| ops.iter().any(|o| o["op"] == op && o["path"] == path);
        // Labels one by one (JSON pointer escaping), the label already there untouched.
        assert!(has_op("add", "/metadata/labels/karpenter.sh~1registered"), "{ops:?}");
        assert!(!ops.iter().any(|o| o["path"] == "/metadata/labels/a~1b"), "{ops:?}");
        assert!(has_op("add", "/metadata/finalizers"), "{ops:?}");
        // The taints replaced only if they are still the ones read: the unregistered taint goes,
        // the kubelet's not-ready taint stays.
        let test = ops.iter().position(|o| o["op"] == "test" && o["path"] == "/spec/taints").expect("a test");
        let replace = ops.iter().position(|o| o["op"] == "replace" && o["path"] == "/spec/taints").expect("a replace");
        assert!(test < replace);
        assert_eq!(ops[test]["value"].as_array().unwrap().len(), 2);
        assert_eq!(
            ops[replace]["value"],
            serde_json::json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}])
        );
        assert!(!ops.iter().any(|o| o["path"].as_str().is_some_and(|p| p.starts_with("/status"))), "{ops:?}");
        // Applied, it gives the registered Node.
        let mut v = serde_json::to_value(&read).unwrap();
        apply_ops(&mut v, ops);
        assert_eq!(serde_json::from_value::<Node>(v).unwrap(), desired);
        // A Node already registered: no patch at all.
        assert_eq!(registration_patch(&desired, &desired), None);
        // A Node with a finalizer of someone else's: ours appended to the list as read, tested.
        read.metadata.finalizers = Some(vec!["example.com/other".into()]);
        let desired = node_registration::registered_node(&read, &claim());
        let ops = registration_patch(&read, &desired).unwrap();
        let ops = ops.as_array().unwrap();
        assert!(ops.iter().any(|o| o["op"] == "test" && o["path"] == "/metadata/finalizers"), "{ops:?}");
        let mut v = serde_json::to_value(&read).unwrap();
        apply_ops(&mut v, ops);
        assert_eq!(serde_json::from_value::<Node>(v).unwrap(), desired);
    }
}
