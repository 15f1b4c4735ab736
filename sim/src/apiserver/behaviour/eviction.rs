//! `sim::apiserver::behaviour::eviction`: the `pods/eviction` subresource (a pod is deleted unless
//! the PodDisruptionBudget selecting it forbids it: 429, or 500 when several select it; an
//! unhealthy pod may go as `unhealthyPodEvictionPolicy` says), and the disruption log's record of
//! every pod whose termination begins, by eviction or by DELETE, with its budget's state.
//!
//! Owns: the eviction decision and the log records. Must not: compute budgets' statuses (the
//! disruption controller, `disruption`, does) or delete other than through the store's delete.

use std::sync::Arc;

use serde_json::{Value, json};

use super::disruption::{pdb_selects, pdb_state, pod_ready};
use crate::apiserver::disruptions::{PdbState, PodDisruption, Via};
use crate::apiserver::status::ApiError;
use crate::apiserver::store::{DeleteOptions, State, being_deleted, meta_str};

impl State {
    /// The eviction subresource: deletes the pod unless a PodDisruptionBudget forbids it (429).
    pub(in crate::apiserver) fn evict(&mut self, ns: &str, name: &str, eviction: &Value) -> Result<(), ApiError> {
        let pods = self.registry.get("", "v1", "pods").ok_or_else(ApiError::not_found_path)?;
        let pod = self.get(&pods, ns, name)?;
        let opts = eviction.get("deleteOptions").map(DeleteOptions::from_value).unwrap_or_default();
        let phase = pod.pointer("/status/phase").and_then(Value::as_str).unwrap_or("");
        if being_deleted(&pod) || phase == "Succeeded" || phase == "Failed" {
            self.delete(&pods, Some(ns), name, &opts)?;
            return Ok(());
        }
        let pdb_key = ("policy".to_string(), "poddisruptionbudgets".to_string());
        let labels = pod.pointer("/metadata/labels");
        let matching: Vec<Arc<Value>> = self
            .objects_of(&pdb_key, Some(ns))
            .map(|s| Arc::new(s.value()))
            .filter(|pdb| pdb_selects(pdb, |k| labels.and_then(|l| l.get(k)).and_then(Value::as_str)))
            .collect();
        if matching.len() > 1 {
            return Err(ApiError::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
        let mut admitted_by = None;
        if let Some(pdb) = matching.first() {
            let status = self.pdb_status(pdb);
            admitted_by = Some(pdb_state(pdb, &status));
            let allowed = status.get("disruptionsAllowed").and_then(Value::as_i64).unwrap_or(0);
            let healthy = status.get("currentHealthy").and_then(Value::as_i64).unwrap_or(0);
            let desired = status.get("desiredHealthy").and_then(Value::as_i64).unwrap_or(0);
            let policy =
                pdb.pointer("/spec/unhealthyPodEvictionPolicy").and_then(Value::as_str).unwrap_or("IfHealthyBudget");
            let unhealthy_ok = !pod_ready(&pod) && (policy == "AlwaysAllow" || healthy >= desired);
            if allowed <= 0 && !unhealthy_ok {
                let pdb_name = meta_str(pdb, "name").unwrap_or("");
                return Err(ApiError {
                    details: Some(
                        json!({"causes": [{"reason": "DisruptionBudget", "message": format!("The disruption budget {pdb_name} needs {desired} healthy pods and has {healthy} currently")}]}),
                    ),
                    ..ApiError::new(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                    )
                });
            }
        }
        self.delete_as(&pods, Some(ns), name, &opts, Some(admitted_by))?;
        Ok(())
    }

    /// Logs a pod whose termination begins now (not one already terminating or terminal, not a
    /// dry run): how, on which node, and its budget's state before this write.
    pub(in crate::apiserver) fn record_disruption(&self, pod: &Value, grace: i64, eviction: Option<Option<PdbState>>) {
        let phase = pod.pointer("/status/phase").and_then(Value::as_str).unwrap_or("");
        if self.dry_run || being_deleted(pod) || phase == "Succeeded" || phase == "Failed" {
            return;
        }
        let ns = meta_str(pod, "namespace").unwrap_or("");
        let (via, pdb) = match eviction {
            Some(pdb) => (Via::Eviction, pdb),
            None => {
                let pdb_key = ("policy".to_string(), "poddisruptionbudgets".to_string());
                let labels = pod.pointer("/metadata/labels");
                let mut matching = self
                    .objects_of(&pdb_key, Some(ns))
                    .map(|s| s.value())
                    .filter(|pdb| pdb_selects(pdb, |k| labels.and_then(|l| l.get(k)).and_then(Value::as_str)));
                let pdb = match (matching.next(), matching.next()) {
                    (Some(one), None) => Some(pdb_state(&one, &self.pdb_status(&one))),
                    _ => None,
                };
                (Via::Delete { grace_seconds: grace }, pdb)
            }
        };
        self.disruptions.record(PodDisruption {
            seq: 0,
            at: self.now_utc(),
            resource_version: self.rv,
            namespace: ns.to_string(),
            name: meta_str(pod, "name").unwrap_or("").to_string(),
            uid: meta_str(pod, "uid").unwrap_or("").to_string(),
            node: pod.pointer("/spec/nodeName").and_then(Value::as_str).filter(|n| !n.is_empty()).map(String::from),
            ready: pod_ready(pod),
            via,
            pdb,
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use crate::apiserver::disruptions::Via;
    use crate::apiserver::store::tests::{res, state};
    use crate::apiserver::store::{DeleteOptions, Sub};

    #[test]
    fn the_disruption_log_says_how_each_pod_began_to_leave_and_under_which_budget() {
        let mut st = state(1);
        let pods = res(&st, "", "pods");
        let pdbs = res(&st, "policy", "poddisruptionbudgets");
        for n in ["a", "b", "c"] {
            let p = json!({"metadata": {"name": n, "labels": {"app": "x"}},
                           "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
                           "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
            st.create(&pods, Some("default"), p.clone()).unwrap();
            st.update(&pods, Some("default"), n, p, Sub::Status).unwrap();
        }
        st.create(
            &pdbs,
            Some("default"),
            json!({"metadata": {"name": "p"}, "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "x"}}}}),
        )
        .unwrap();
        st.evict("default", "a", &json!({})).unwrap();
        assert_eq!(st.evict("default", "b", &json!({})).unwrap_err().code, 429, "refusals are not logged");
        // A DELETE ignores the budget: logged with the budget's state, which forbade it.
        st.delete(&pods, Some("default"), "b", &DeleteOptions::default()).unwrap();
        // The kubelet confirming a graceful deletion is not a new disruption.
        let confirm = DeleteOptions { grace_period: Some(0), ..DeleteOptions::default() };
        st.delete(&pods, Some("default"), "a", &confirm).unwrap();
        let log = st.disruptions.entries();
        let seen: Vec<(u64, &str, Via, Option<i64>)> = log
            .iter()
            .map(|d| (d.seq, d.name.as_str(), d.via.clone(), d.pdb.as_ref().map(|p| p.disruptions_allowed)))
            .collect();
        assert_eq!(
            seen,
            [(0, "a", Via::Eviction, Some(1)), (1, "b", Via::Delete { grace_seconds: 30 }, Some(0))],
            "{log:#?}"
        );
        assert!(log.iter().all(|d| d.ready && d.node.as_deref() == Some("n1")));
    }
}
