//! `sim::apiserver::behaviour::garbage`: the garbage collector. When an owner is deleted, each
//! object naming it in `ownerReferences` is deleted (background propagation) unless another of its
//! owners still exists, in which case (as with `propagationPolicy: Orphan`) it only loses the
//! reference to the deleted owner.
//!
//! Owns: cascading deletion through ownerReferences. Must not: touch objects that do not name the
//! deleted owner. (`Foreground` propagation is treated as background: dependents go right after
//! their owner, in the same write.)

use serde_json::Value;

use crate::apiserver::store::{DeleteOptions, State, meta_mut};

impl State {
    /// The garbage collector: dependents of a deleted owner are deleted (background) when none of
    /// their other owners exists, or lose the ownerReference (orphan).
    pub(super) fn collect_dependents(&mut self, uid: &str, orphan: bool) {
        if uid.is_empty() {
            return;
        }
        let dependents: Vec<(_, String, String)> = self
            .all_objects()
            .filter(|(_, _, obj)| obj.sum.owners.iter().any(|o| o == uid))
            .map(|(key, (ns, name), _)| (key.clone(), ns.clone(), name.clone()))
            .collect();
        for (key, ns, name) in dependents {
            let Some(res) = self.registry.any_version(&key.0, &key.1) else { continue };
            let Some(obj) = self.lookup(&res, &ns, &name) else { continue };
            let refs: Vec<Value> =
                obj.pointer("/metadata/ownerReferences").and_then(Value::as_array).cloned().unwrap_or_default();
            let others: Vec<Value> =
                refs.iter().filter(|o| o.get("uid").and_then(Value::as_str) != Some(uid)).cloned().collect();
            let other_alive = others.iter().any(|o| {
                let u = o.get("uid").and_then(Value::as_str).unwrap_or("");
                self.uid_exists(u)
            });
            if orphan || other_alive {
                let mut next = (*obj).clone();
                if others.is_empty() {
                    meta_mut(&mut next).remove("ownerReferences");
                } else {
                    meta_mut(&mut next).insert("ownerReferences".into(), Value::Array(others));
                }
                self.put(&key, &ns, &name, next);
            } else {
                let _ = self.delete(&res, Some(&ns), &name, &DeleteOptions::default());
            }
        }
    }

    fn uid_exists(&self, uid: &str) -> bool {
        !uid.is_empty() && self.all_objects().any(|(_, _, o)| o.sum.uid == uid)
    }
}
