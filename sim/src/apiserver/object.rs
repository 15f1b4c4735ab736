//! How the emulator keeps an object: its JSON bytes (compact; parsed again only when the object is
//! read for a write or rendered differently) and a summary of the few fields lists, watches and the
//! built-in controllers filter on (labels, selectable fields, owners, deletion, pod readiness).
//! Must not do: write semantics (the store) or rendering (the server).

use serde_json::Value;

/// The summary of a stored object.
#[derive(Debug, Default)]
pub(crate) struct Summary {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub api_version: String,
    /// Sorted by key.
    pub labels: Vec<(String, String)>,
    /// UIDs of the ownerReferences.
    pub owners: Vec<String>,
    /// Values of the resource's selectable fields (`spec.nodeName`, `status.phase`, …).
    pub fields: Vec<(String, String)>,
    pub deleting: bool,
    /// Pods: the Ready condition is True.
    pub ready: bool,
}

/// A stored object.
#[derive(Debug)]
pub(crate) struct Stored {
    pub raw: Box<[u8]>,
    pub sum: Summary,
}

impl Stored {
    pub fn new(v: &Value, selectable: &[String]) -> Stored {
        let m = v.get("metadata");
        let s = |k: &str| m.and_then(|m| m.get(k)).and_then(Value::as_str).unwrap_or("").to_string();
        let mut labels: Vec<(String, String)> = m
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object)
            .map(|l| l.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect())
            .unwrap_or_default();
        labels.sort();
        let owners = m
            .and_then(|m| m.get("ownerReferences"))
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|o| o.get("uid").and_then(Value::as_str).map(String::from)).collect())
            .unwrap_or_default();
        let fields = selectable.iter().map(|f| (f.clone(), super::resources::field_string(v, f))).collect();
        let ready = v.pointer("/status/conditions").and_then(Value::as_array).is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        });
        Stored {
            raw: serde_json::to_vec(v).unwrap_or_default().into_boxed_slice(),
            sum: Summary {
                name: s("name"),
                namespace: s("namespace"),
                uid: s("uid"),
                api_version: v.get("apiVersion").and_then(Value::as_str).unwrap_or("").to_string(),
                labels,
                owners,
                fields,
                deleting: m.and_then(|m| m.get("deletionTimestamp")).is_some_and(|d| !d.is_null()),
                ready,
            },
        }
    }

    /// The object (parsed from the stored bytes).
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.raw).unwrap_or(Value::Null)
    }

    pub fn label(&self, k: &str) -> Option<&str> {
        self.sum.labels.binary_search_by(|(x, _)| x.as_str().cmp(k)).ok().map(|i| self.sum.labels[i].1.as_str())
    }

    /// A field as field selectors see it.
    pub fn field(&self, path: &str) -> String {
        match path {
            "metadata.name" => self.sum.name.clone(),
            "metadata.namespace" => self.sum.namespace.clone(),
            _ => self.sum.fields.iter().find(|(f, _)| f == path).map(|(_, v)| v.clone()).unwrap_or_default(),
        }
    }
}
