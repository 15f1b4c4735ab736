//! `sim::apiserver::behaviour::pods`: what kube-apiserver and the controller manager do to pods
//! beyond storing them: the defaults of a created pod (policies, grace period, service account,
//! the default tolerations, image pull policy, requests from limits) and its initial status with
//! its QoS class; the grace period a deletion gets (a bound, running pod waits for its kubelet);
//! the pod garbage collector's deletion of pods bound to a deleted Node.
//!
//! Owns: those rules. Must not: play the kubelet or the scheduler (clients, `sim::cke`); binding
//! and eviction live in `binding` and `eviction`.

use serde_json::{Map, Value, json};

use crate::apiserver::resources::Resource;
use crate::apiserver::status::ApiError;
use crate::apiserver::store::{DeleteOptions, State, finalizers, meta};
use crate::qos::qos_class;

/// Defaults and initial status of a created pod named `name` (422 without containers).
pub(super) fn default_pod(res: &Resource, name: &str, o: &mut Map<String, Value>) -> Result<(), ApiError> {
    let spec = o.entry("spec").or_insert_with(|| json!({}));
    let containers_missing = spec.get("containers").and_then(Value::as_array).is_none_or(|c| c.is_empty());
    if containers_missing {
        return Err(ApiError::invalid_fields(res, name, &["spec.containers: Required value".to_string()]));
    }
    if let Some(s) = spec.as_object_mut() {
        for (k, v) in [
            ("restartPolicy", json!("Always")),
            ("terminationGracePeriodSeconds", json!(30)),
            ("dnsPolicy", json!("ClusterFirst")),
            ("schedulerName", json!("default-scheduler")),
            ("serviceAccountName", json!("default")),
            ("serviceAccount", json!("default")),
            ("securityContext", json!({})),
            ("enableServiceLinks", json!(true)),
            ("preemptionPolicy", json!("PreemptLowerPriority")),
            ("priority", json!(0)),
        ] {
            s.entry(k).or_insert(v);
        }
        // DefaultTolerationSeconds admission.
        let tolerations = s.entry("tolerations").or_insert_with(|| json!([]));
        if let Some(t) = tolerations.as_array_mut() {
            for key in ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"] {
                if !t.iter().any(|x| x.get("key").and_then(Value::as_str) == Some(key)) {
                    t.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
                }
            }
        }
        for list in ["initContainers", "containers"] {
            let Some(cs) = s.get_mut(list).and_then(Value::as_array_mut) else { continue };
            for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                c.entry("terminationMessagePath").or_insert(json!("/dev/termination-log"));
                c.entry("terminationMessagePolicy").or_insert(json!("File"));
                let policy = default_pull_policy(c.get("image").and_then(Value::as_str).unwrap_or(""));
                c.entry("imagePullPolicy").or_insert(json!(policy));
                default_requests_from_limits(c.entry("resources").or_insert(json!({})));
            }
        }
    }
    let qos = qos_class(spec);
    let node_bound = spec.get("nodeName").and_then(Value::as_str).is_some_and(|n| !n.is_empty());
    let mut status = json!({"phase": "Pending", "qosClass": qos});
    if node_bound {
        status["conditions"] = json!([]);
    }
    o.insert("status".into(), status);
    Ok(())
}

/// The grace period a deletion of `pod` gets. Pods bound to a node terminate gracefully (the
/// kubelet deletes them with grace 0); an unbound or finished pod goes at once.
pub(in crate::apiserver) fn deletion_grace(pod: &Value, opts: &DeleteOptions) -> i64 {
    let bound = pod.pointer("/spec/nodeName").and_then(Value::as_str).is_some_and(|n| !n.is_empty());
    let phase = pod.pointer("/status/phase").and_then(Value::as_str).unwrap_or("");
    if !bound || phase == "Succeeded" || phase == "Failed" {
        0
    } else {
        opts.grace_period
            .or_else(|| pod.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_i64))
            .unwrap_or(30)
            .max(0)
    }
}

impl State {
    /// A pod in graceful deletion waits for its kubelet even with no finalizers left.
    pub(in crate::apiserver) fn graceful_pending(&self, res: &Resource, obj: &Value) -> bool {
        res.group.is_empty()
            && res.plural == "pods"
            && meta(obj).and_then(|m| m.get("deletionGracePeriodSeconds")).and_then(Value::as_i64).unwrap_or(0) > 0
    }

    /// The pod garbage collector: pods bound to the deleted node `node` are deleted (at once, or
    /// marked with grace 0 while finalizers hold them).
    pub(super) fn delete_pods_of_node(&mut self, node: &str) {
        let key = ("".to_string(), "pods".to_string());
        let bound: Vec<(String, String)> =
            self.entries_of(&key).filter(|(_, p)| p.field("spec.nodeName") == node).map(|(k, _)| k.clone()).collect();
        if let Some(pods) = self.registry.get("", "v1", "pods") {
            for (ns, name) in bound {
                if let Some(p) = self.lookup(&pods, &ns, &name) {
                    if finalizers(&p).is_empty() {
                        self.finish_delete(&pods, &ns, &name);
                    } else {
                        let _ = self.delete(
                            &pods,
                            Some(&ns),
                            &name,
                            &DeleteOptions { grace_period: Some(0), ..Default::default() },
                        );
                    }
                }
            }
        }
    }
}

/// kube-apiserver's default pull policy: `Always` for an untagged or `:latest` image, else
/// `IfNotPresent`.
fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, tag)) if tag != "latest" => "IfNotPresent",
        _ => "Always",
    }
}

/// A container's requests default to its limits, resource by resource (so a pod with limits only
/// is scheduled, and classed Guaranteed, by them).
fn default_requests_from_limits(resources: &mut Value) {
    let Some(limits) = resources.get("limits").and_then(Value::as_object).cloned() else { return };
    let Some(r) = resources.as_object_mut() else { return };
    let requests = r.entry("requests").or_insert_with(|| json!({}));
    if let Some(req) = requests.as_object_mut() {
        for (k, v) in limits {
            req.entry(k).or_insert(v);
        }
    }
}
