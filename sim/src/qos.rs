//! `sim::qos`: a pod's Quality of Service class (Guaranteed, Burstable or BestEffort), the rule
//! kube-apiserver applies when a pod is created (`status.qosClass`) and a kubelet reports again in
//! the pod's status. The emulator (`sim::apiserver`) and the simulated kubelet (`sim::cke`) both
//! use this one implementation, over the pod spec as JSON (the emulator's form; the kubelet
//! converts its typed pod at the call).
//!
//! Owns: the rule. Must not: read anything but the spec it is given (no I/O, no state), or refuse
//! a spec: whatever does not read as requests and limits counts as none.

use serde_json::Value;

/// The QoS class of a pod with this `spec` (a `PodSpec` as JSON): BestEffort when no container
/// has requests or limits, Guaranteed when every container's cpu and memory requests equal their
/// limits (a missing request counts as its limit), Burstable otherwise.
pub fn qos_class(spec: &Value) -> &'static str {
    let containers = spec.get("containers").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut any = false;
    let mut guaranteed = true;
    for c in &containers {
        let req = c.pointer("/resources/requests").and_then(Value::as_object);
        let lim = c.pointer("/resources/limits").and_then(Value::as_object);
        if req.is_some_and(|r| !r.is_empty()) || lim.is_some_and(|l| !l.is_empty()) {
            any = true;
        }
        for r in ["cpu", "memory"] {
            let l = lim.and_then(|l| l.get(r));
            let q = req.and_then(|q| q.get(r)).or(l);
            if l.is_none() || q != l {
                guaranteed = false;
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn qos_classes() {
        assert_eq!(qos_class(&json!({"containers": [{"name": "c"}]})), "BestEffort");
        let g = json!({"containers": [{"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]});
        assert_eq!(qos_class(&g), "Guaranteed");
        let b = json!({"containers": [{"resources": {"requests": {"cpu": "1"}}}]});
        assert_eq!(qos_class(&b), "Burstable");
    }

    #[test]
    fn a_missing_request_counts_as_its_limit_and_every_container_must_be_guaranteed() {
        let limits_only = json!({"containers": [
            {"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
            {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}},
        ]});
        assert_eq!(qos_class(&limits_only), "Guaranteed");
        let one_short = json!({"containers": [
            {"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
            {"resources": {"limits": {"cpu": "1"}}},
        ]});
        assert_eq!(qos_class(&one_short), "Burstable");
        assert_eq!(qos_class(&json!({"containers": []})), "BestEffort");
        assert_eq!(qos_class(&Value::Null), "BestEffort");
    }
}
