//! `sim::apiserver::behaviour::disruption`: the disruption controller, which keeps each
//! PodDisruptionBudget's status current (expected pods, healthy ones, desired healthy ones from
//! `minAvailable` or `maxUnavailable`, disruptions allowed, the `DisruptionAllowed` condition)
//! after every write of a pod or a budget of its namespace.
//!
//! Owns: a budget's status and which pods it selects. Must not: admit or refuse an eviction
//! (`eviction` does, from the status computed here).

use std::sync::Arc;

use serde_json::{Value, json};

use crate::apiserver::disruptions::PdbState;
use crate::apiserver::store::{State, meta, meta_str};

/// The status a budget has before the controller first computes it.
pub(super) fn initial_status() -> Value {
    json!({"currentHealthy": 0, "desiredHealthy": 0, "disruptionsAllowed": 0, "expectedPods": 0})
}

impl State {
    /// What the disruption controller computes for a PDB (pods matched by its selector in its namespace).
    pub(super) fn pdb_status(&self, pdb: &Value) -> Value {
        let ns = meta_str(pdb, "namespace").unwrap_or("");
        let pods_key = ("".to_string(), "pods".to_string());
        let mut expected = 0i64;
        let mut healthy = 0i64;
        for p in self.objects_of(&pods_key, Some(ns)) {
            if !pdb_selects(pdb, |k| p.label(k)) {
                continue;
            }
            let phase = p.field("status.phase");
            if phase == "Succeeded" || phase == "Failed" {
                continue;
            }
            expected += 1;
            if p.sum.ready && !p.sum.deleting {
                healthy += 1;
            }
        }
        let resolve = |v: &Value, round_up: bool| -> i64 {
            match v {
                Value::Number(n) => n.as_i64().unwrap_or(0),
                Value::String(s) => match s.strip_suffix('%').and_then(|p| p.parse::<f64>().ok()) {
                    Some(p) => {
                        let x = p * expected as f64 / 100.0;
                        if round_up { x.ceil() as i64 } else { x.floor() as i64 }
                    }
                    None => s.parse().unwrap_or(0),
                },
                _ => 0,
            }
        };
        let desired = if let Some(min) = pdb.pointer("/spec/minAvailable") {
            resolve(min, true)
        } else if let Some(max) = pdb.pointer("/spec/maxUnavailable") {
            (expected - resolve(max, true)).max(0)
        } else {
            0
        };
        let allowed = (healthy - desired).max(0);
        let generation = meta(pdb).and_then(|m| m.get("generation")).cloned().unwrap_or(json!(1));
        let mut status = json!({
            "observedGeneration": generation,
            "disruptionsAllowed": allowed,
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
        });
        let now = self.now();
        let prev_cond = pdb.pointer("/status/conditions/0").cloned();
        let (st, reason) = if allowed > 0 { ("True", "SufficientPods") } else { ("False", "InsufficientPods") };
        let ltt = match &prev_cond {
            Some(c) if c.get("status").and_then(Value::as_str) == Some(st) => {
                c.get("lastTransitionTime").cloned().unwrap_or(json!(now))
            }
            _ => json!(now),
        };
        status["conditions"] = json!([{"type": "DisruptionAllowed", "status": st, "reason": reason, "message": "", "observedGeneration": generation, "lastTransitionTime": ltt}]);
        status
    }

    /// Keeps PDB statuses current (the disruption controller), writing only when they change.
    pub(super) fn refresh_pdbs(&mut self, ns: &str) {
        let key = ("policy".to_string(), "poddisruptionbudgets".to_string());
        let pdbs: Vec<Arc<Value>> = self.objects_of(&key, Some(ns)).map(|s| Arc::new(s.value())).collect();
        for pdb in pdbs {
            let status = self.pdb_status(&pdb);
            if pdb.get("status") != Some(&status) {
                let mut next = (*pdb).clone();
                if let Some(o) = next.as_object_mut() {
                    o.insert("status".into(), status);
                }
                let name = meta_str(&pdb, "name").unwrap_or("").to_string();
                self.put(&key, ns, &name, next);
            }
        }
    }
}

/// A budget's computed status, for the disruption log.
pub(super) fn pdb_state(pdb: &Value, status: &Value) -> PdbState {
    let n = |k: &str| status.get(k).and_then(Value::as_i64).unwrap_or(0);
    PdbState {
        name: meta_str(pdb, "name").unwrap_or("").to_string(),
        disruptions_allowed: n("disruptionsAllowed"),
        current_healthy: n("currentHealthy"),
        desired_healthy: n("desiredHealthy"),
        expected_pods: n("expectedPods"),
    }
}

pub(super) fn pod_ready(p: &Value) -> bool {
    p.pointer("/status/conditions").and_then(Value::as_array).is_some_and(|cs| {
        cs.iter().any(|c| {
            c.get("type").and_then(Value::as_str) == Some("Ready")
                && c.get("status").and_then(Value::as_str) == Some("True")
        })
    })
}

/// Whether a PDB's `spec.selector` (matchLabels + matchExpressions) selects the pod. An empty
/// selector selects every pod of the namespace (policy/v1).
pub(super) fn pdb_selects<'a>(pdb: &Value, get: impl Fn(&str) -> Option<&'a str>) -> bool {
    let Some(sel) = pdb.pointer("/spec/selector") else { return false };
    let ml_ok =
        sel.get("matchLabels").and_then(Value::as_object).is_none_or(|m| m.iter().all(|(k, v)| get(k) == v.as_str()));
    let me_ok = sel.get("matchExpressions").and_then(Value::as_array).is_none_or(|es| {
        es.iter().all(|e| {
            let k = e.get("key").and_then(Value::as_str).unwrap_or("");
            let vals: Vec<&str> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|v| v.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            match e.get("operator").and_then(Value::as_str).unwrap_or("") {
                "In" => get(k).is_some_and(|x| vals.contains(&x)),
                "NotIn" => get(k).is_none_or(|x| !vals.contains(&x)),
                "Exists" => get(k).is_some(),
                "DoesNotExist" => get(k).is_none(),
                _ => false,
            }
        })
    });
    ml_ok && me_ok
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use crate::apiserver::store::Sub;
    use crate::apiserver::store::tests::{res, state};

    #[test]
    fn pdb_status_counts_ready_matching_pods() {
        let mut st = state(1);
        let pods = res(&st, "", "pods");
        let pdbs = res(&st, "policy", "poddisruptionbudgets");
        for (n, ready) in [("a", true), ("b", true), ("c", false)] {
            let mut p =
                json!({"metadata": {"name": n, "labels": {"app": "x"}}, "spec": {"containers": [{"name": "c"}]}});
            if ready {
                p["status"] = json!({"conditions": [{"type": "Ready", "status": "True"}]});
            }
            st.create(&pods, Some("default"), p.clone()).unwrap();
            if ready {
                st.update(&pods, Some("default"), n, p, Sub::Status).unwrap();
            }
        }
        st.create(
            &pdbs,
            Some("default"),
            json!({"metadata": {"name": "p"}, "spec": {"maxUnavailable": "50%", "selector": {"matchLabels": {"app": "x"}}}}),
        )
        .unwrap();
        let pdb = st.get(&pdbs, "default", "p").unwrap();
        // 3 expected, 50% of 3 rounded up = 2 may be unavailable: 1 desired healthy; 2 healthy.
        assert_eq!(pdb["status"]["expectedPods"], 3);
        assert_eq!(pdb["status"]["currentHealthy"], 2);
        assert_eq!(pdb["status"]["desiredHealthy"], 1);
        assert_eq!(pdb["status"]["disruptionsAllowed"], 1);
        st.evict("default", "a", &json!({})).unwrap();
        let err = st.evict("default", "b", &json!({})).unwrap_err();
        assert_eq!(err.code, 429);
        // The unready pod may go: the budget is met without it.
        st.evict("default", "c", &json!({})).unwrap();
    }
}
