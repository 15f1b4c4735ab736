//! One store for Events, two APIs: kube-apiserver keeps `events.k8s.io/v1` Events and core/v1
//! Events as the same objects (one etcd key), converting field by field. The emulator stores the
//! core/v1 form and converts at the edges, so an Event the hub writes through `events.k8s.io`
//! shows in `kubectl get events` and `kubectl describe`, and one written through core/v1 is read
//! back through `events.k8s.io`.
//! Owns: the field mapping (kube's `Convert_v1_Event_To_core_Event` and back) and the field
//! selector names of `events.k8s.io`. Must not do: storage or validation.

use serde_json::{Map, Value, json};

use super::resources::Resource;

/// (events.k8s.io/v1 field, core/v1 field): the fields that change name.
const RENAMED: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

/// Whether `res` is `events.k8s.io/v1` Events (stored as core/v1 Events).
pub(crate) fn is_events_v1(res: &Resource) -> bool {
    res.group == "events.k8s.io" && res.plural == "events"
}

fn rename(obj: Value, to_core: bool, api_version: &str) -> Value {
    let Value::Object(m) = obj else { return obj };
    let mut out = Map::new();
    for (k, v) in m {
        let name = RENAMED
            .iter()
            .find_map(|(new, core)| if to_core { (k == *new).then_some(*core) } else { (k == *core).then_some(*new) })
            .map_or(k, String::from);
        out.insert(name, v);
    }
    out.insert("apiVersion".into(), json!(api_version));
    out.insert("kind".into(), json!("Event"));
    Value::Object(out)
}

/// An `events.k8s.io/v1` Event as the core/v1 Event it is stored as. The fields Go always
/// writes for core/v1 (structs and strings without `omitempty`) are filled as kube-apiserver
/// shows them: `source: {}`, `firstTimestamp: null`, `reportingComponent: ""`, …
pub(crate) fn to_core(obj: Value) -> Value {
    let mut v = rename(obj, true, "v1");
    if let Some(m) = v.as_object_mut() {
        for (k, zero) in [
            ("involvedObject", json!({})),
            ("source", json!({})),
            ("firstTimestamp", Value::Null),
            ("lastTimestamp", Value::Null),
            ("eventTime", Value::Null),
            ("reportingComponent", json!("")),
            ("reportingInstance", json!("")),
        ] {
            m.entry(k).or_insert(zero);
        }
    }
    v
}

/// A stored core/v1 Event as `events.k8s.io/v1` shows it: `regarding`, `note`,
/// `deprecated*`; the empty strings of core/v1 (omitted in events.k8s.io/v1) left out.
pub(crate) fn from_core(obj: &Value) -> Value {
    let mut v = rename(obj.clone(), false, "events.k8s.io/v1");
    if let Some(m) = v.as_object_mut() {
        for k in ["reportingController", "reportingInstance", "action", "reason", "note", "type"] {
            if m.get(k).is_some_and(|x| x.as_str() == Some("")) {
                m.remove(k);
            }
        }
        if m.get("deprecatedCount").and_then(Value::as_i64) == Some(0) {
            m.remove("deprecatedCount");
        }
        for (k, zero) in [
            ("eventTime", Value::Null),
            ("regarding", json!({})),
            ("deprecatedSource", json!({})),
            ("deprecatedFirstTimestamp", Value::Null),
            ("deprecatedLastTimestamp", Value::Null),
        ] {
            m.entry(k).or_insert(zero);
        }
    }
    v
}

/// The core/v1 field selector an `events.k8s.io/v1` one stands for (`regarding.name` →
/// `involvedObject.name`, `reportingController` → `reportingComponent`), or `None` if it is
/// not one of the group's selectable fields.
pub(crate) fn core_field(field: &str) -> Option<String> {
    if let Some(rest) = field.strip_prefix("regarding.") {
        return matches!(rest, "kind" | "namespace" | "name" | "uid" | "apiVersion" | "resourceVersion" | "fieldPath")
            .then(|| format!("involvedObject.{rest}"));
    }
    match field {
        "reportingController" => Some("reportingComponent".into()),
        "reason" | "type" | "metadata.name" | "metadata.namespace" => Some(field.into()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_events_v1_event_reads_as_core_and_back() {
        let new = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "ns"},
            "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "hub", "reportingInstance": "hub-0",
            "action": "Launch", "reason": "Launched", "note": "launched ng-1", "type": "Normal",
            "regarding": {"kind": "NodeClaim", "name": "c", "namespace": "ns", "uid": "u"},
            "series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"},
        });
        let core = to_core(new.clone());
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "c");
        assert_eq!(core["message"], "launched ng-1");
        assert_eq!(core["reportingComponent"], "hub");
        assert_eq!(core["source"], json!({}));
        assert_eq!(core["series"]["count"], 2);
        let back = from_core(&core);
        for k in
            ["eventTime", "reportingController", "reportingInstance", "action", "reason", "note", "regarding", "series"]
        {
            assert_eq!(back[k], new[k], "{k}");
        }
        assert_eq!(back["deprecatedSource"], json!({}));
    }

    #[test]
    fn a_core_event_reads_as_events_v1() {
        let core = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"},
            "involvedObject": {"kind": "Pod", "name": "p"}, "message": "m", "source": {"component": "c", "host": "h"},
            "count": 3, "reportingComponent": "", "reportingInstance": ""});
        let new = from_core(&core);
        assert_eq!(new["regarding"]["name"], "p");
        assert_eq!(new["deprecatedSource"]["host"], "h");
        assert_eq!(new["deprecatedCount"], 3);
        assert!(new.get("reportingController").is_none() && new.get("reportingInstance").is_none());
        assert_eq!(core_field("regarding.name").as_deref(), Some("involvedObject.name"));
        assert_eq!(core_field("involvedObject.name"), None);
    }
}
