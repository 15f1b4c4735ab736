//! `sim::apiserver::behaviour::binding`: the `pods/binding` subresource, how a scheduler assigns a
//! pod to a node: `spec.nodeName` set and the `PodScheduled` condition True, refused for a pod
//! being deleted (409) or already assigned (409, worded like kube-apiserver).
//!
//! Owns: binding. Must not: choose a node (the binder of `sim::cke` does, as a client).

use serde_json::{Value, json};

use crate::apiserver::status::ApiError;
use crate::apiserver::store::{State, being_deleted};

impl State {
    /// The `pods/binding` subresource: assigns the pod `ns/name` to the binding's target node.
    pub(in crate::apiserver) fn bind(&mut self, ns: &str, name: &str, binding: &Value) -> Result<(), ApiError> {
        let pods = self.registry.get("", "v1", "pods").ok_or_else(ApiError::not_found_path)?;
        let pod = self.get(&pods, ns, name)?;
        let node = binding.pointer("/target/name").and_then(Value::as_str).unwrap_or("");
        if node.is_empty() {
            return Err(ApiError::invalid_fields(&pods, name, &["target.name: Required value".to_string()]));
        }
        if being_deleted(&pod) {
            return Err(ApiError::conflict(&pods, name, "pod is being deleted, cannot be assigned to a host"));
        }
        if let Some(cur) = pod.pointer("/spec/nodeName").and_then(Value::as_str).filter(|n| !n.is_empty()) {
            return Err(ApiError {
                details: Some(json!({"name": name, "kind": "pods/binding"})),
                ..ApiError::new(
                    409,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} is already assigned to node \"{cur}\""
                    ),
                )
            });
        }
        let mut next = (*pod).clone();
        let now = self.now();
        if let Some(o) = next.as_object_mut() {
            if let Some(spec) = o.get_mut("spec").and_then(Value::as_object_mut) {
                spec.insert("nodeName".into(), json!(node));
            }
            let status = o.entry("status").or_insert_with(|| json!({}));
            set_condition(
                status,
                json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now}),
            );
        }
        let stored = self.put(&pods.key(), ns, name, next);
        self.after_write(&pods, ns, &stored);
        Ok(())
    }
}

fn set_condition(status: &mut Value, cond: Value) {
    let Some(s) = status.as_object_mut() else { return };
    let conds = s.entry("conditions").or_insert_with(|| json!([]));
    if let Some(a) = conds.as_array_mut() {
        let ty = cond.get("type").cloned();
        match a.iter_mut().find(|c| c.get("type") == ty.as_ref()) {
            Some(c) => *c = cond,
            None => a.push(cond),
        }
    }
}
