//! `meta.k8s.io/v1` Table rendering for `kubectl get` (`Accept: application/json;as=Table`):
//! kube-apiserver's printer columns of the built-in kinds the hub uses, CRD
//! `additionalPrinterColumns` (a JSONPath subset), and `-o wide` (columns with priority > 0).
//! Must not do: decide which objects are listed.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::jsonpath::{JsonPath, go_text};
use super::resources::{Column, Resource};

/// The Name column's description (kube-apiserver uses ObjectMeta's documentation of `name`).
const NAME_DESCRIPTION: &str = "Name must be unique within a namespace.";

fn col(name: &str, ty: &str, priority: i64) -> Column {
    Column {
        name: name.into(),
        ty: ty.into(),
        format: if name == "Name" { "name".into() } else { String::new() },
        description: if name == "Name" { NAME_DESCRIPTION.into() } else { String::new() },
        priority,
        json_path: None,
    }
}

/// The columns of a resource (Name first).
pub(crate) fn columns(res: &Resource) -> Vec<Column> {
    if is_event(res) {
        return EVENT_COLUMNS.iter().map(|(n, p)| col(n, "string", *p)).collect();
    }
    let mut cols = vec![col("Name", "string", 0)];
    if res.schema.is_some() {
        cols.extend(res.columns.iter().cloned());
        return cols;
    }
    let extra: &[(&str, &str, i64)] = match (res.group.as_str(), res.plural.as_str()) {
        ("", "pods") => &[
            ("Ready", "string", 0),
            ("Status", "string", 0),
            ("Restarts", "string", 0),
            ("Age", "string", 0),
            ("IP", "string", 1),
            ("Node", "string", 1),
            ("Nominated Node", "string", 1),
            ("Readiness Gates", "string", 1),
        ],
        ("", "nodes") => &[
            ("Status", "string", 0),
            ("Roles", "string", 0),
            ("Age", "string", 0),
            ("Version", "string", 0),
            ("Internal-IP", "string", 1),
            ("External-IP", "string", 1),
            ("OS-Image", "string", 1),
            ("Kernel-Version", "string", 1),
            ("Container-Runtime", "string", 1),
        ],
        ("", "namespaces") => &[("Status", "string", 0), ("Age", "string", 0)],
        ("", "secrets") => &[("Type", "string", 0), ("Data", "string", 0), ("Age", "string", 0)],
        ("", "configmaps") => &[("Data", "string", 0), ("Age", "string", 0)],
        ("", "serviceaccounts") => &[("Secrets", "string", 0), ("Age", "string", 0)],
        ("apps", "daemonsets") => &[
            ("Desired", "integer", 0),
            ("Current", "integer", 0),
            ("Ready", "integer", 0),
            ("Up-to-date", "integer", 0),
            ("Available", "integer", 0),
            ("Node Selector", "string", 0),
            ("Age", "string", 0),
        ],
        ("policy", "poddisruptionbudgets") => &[
            ("Min Available", "string", 0),
            ("Max Unavailable", "string", 0),
            ("Allowed Disruptions", "integer", 0),
            ("Age", "string", 0),
        ],
        ("coordination.k8s.io", "leases") => &[("Holder", "string", 0), ("Age", "string", 0)],
        ("apiextensions.k8s.io", "customresourcedefinitions") => &[("Created At", "date", 0)],
        _ => &[("Age", "string", 0)],
    };
    cols.extend(extra.iter().map(|(n, t, p)| col(n, t, *p)));
    cols
}

/// kube-apiserver's Event columns (core/v1 and events.k8s.io/v1 alike): no leading Name column.
const EVENT_COLUMNS: &[(&str, i64)] = &[
    ("Last Seen", 0),
    ("Type", 0),
    ("Reason", 0),
    ("Object", 0),
    ("Subobject", 1),
    ("Source", 1),
    ("Message", 0),
    ("First Seen", 1),
    ("Count", 1),
    ("Name", 1),
];

fn is_event(res: &Resource) -> bool {
    res.plural == "events" && (res.group.is_empty() || res.group == "events.k8s.io")
}

/// kube's `duration.HumanDuration`.
pub(crate) fn human_duration(d: chrono::Duration) -> String {
    let s = d.num_seconds();
    if s < -1 {
        return "<invalid>".into();
    }
    let s = s.max(0);
    if s < 120 {
        return format!("{s}s");
    }
    let m = s / 60;
    if m < 10 {
        let rs = s % 60;
        return if rs == 0 { format!("{m}m") } else { format!("{m}m{rs}s") };
    }
    if m < 180 {
        return format!("{m}m");
    }
    let h = m / 60;
    if h < 8 {
        let rm = m % 60;
        return if rm == 0 { format!("{h}h") } else { format!("{h}h{rm}m") };
    }
    if h < 48 {
        return format!("{h}h");
    }
    if h < 24 * 8 {
        let rh = h % 24;
        return if rh == 0 { format!("{}d", h / 24) } else { format!("{}d{rh}h", h / 24) };
    }
    if h < 24 * 365 * 2 {
        return format!("{}d", h / 24);
    }
    format!("{}y", h / 24 / 365)
}

fn age(obj: &Value, now: DateTime<Utc>) -> String {
    obj.pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| human_duration(now - t.with_timezone(&Utc)))
        .unwrap_or_else(|| "<unknown>".into())
}

fn s(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

fn none(s: String) -> Value {
    if s.is_empty() { json!("<none>") } else { json!(s) }
}

/// A node-info cell, `<unknown>` when the kubelet has not reported it (kubectl's printer).
fn unknown(v: String) -> Value {
    if v.is_empty() { json!("<unknown>") } else { json!(v) }
}

fn cond_status(obj: &Value, path: &str, ty: &str) -> Option<String> {
    obj.pointer(path)?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(ty))
        .and_then(|c| c.get("status").and_then(Value::as_str))
        .map(String::from)
}

fn builtin_cells(res: &Resource, obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or(""));
    let age = json!(age(obj, now));
    let p = |path: &str| obj.pointer(path);
    match (res.group.as_str(), res.plural.as_str()) {
        ("", "pods") => {
            let total = p("/spec/containers").and_then(Value::as_array).map_or(0, Vec::len);
            let statuses = p("/status/containerStatuses").and_then(Value::as_array).cloned().unwrap_or_default();
            let ready = statuses.iter().filter(|c| c.get("ready").and_then(Value::as_bool) == Some(true)).count();
            let restarts: i64 = statuses.iter().filter_map(|c| c.get("restartCount").and_then(Value::as_i64)).sum();
            let mut status = s(p("/status/reason"));
            if status.is_empty() {
                status = s(p("/status/phase"));
            }
            if p("/metadata/deletionTimestamp").is_some_and(|v| !v.is_null()) {
                status = "Terminating".into();
            }
            vec![
                name,
                json!(format!("{ready}/{total}")),
                json!(status),
                json!(restarts.to_string()),
                age,
                none(s(p("/status/podIP"))),
                none(s(p("/spec/nodeName"))),
                none(s(p("/status/nominatedNodeName"))),
                json!("<none>"),
            ]
        }
        ("", "nodes") => {
            let mut status = match cond_status(obj, "/status/conditions", "Ready").as_deref() {
                Some("True") => "Ready".to_string(),
                Some(_) => "NotReady".to_string(),
                None => "Unknown".to_string(),
            };
            if p("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
                status.push_str(",SchedulingDisabled");
            }
            let roles: Vec<String> = p("/metadata/labels")
                .and_then(Value::as_object)
                .map(|l| {
                    l.keys().filter_map(|k| k.strip_prefix("node-role.kubernetes.io/").map(String::from)).collect()
                })
                .unwrap_or_default();
            let addr = |ty: &str| {
                p("/status/addresses")
                    .and_then(Value::as_array)
                    .and_then(|a| a.iter().find(|x| x.get("type").and_then(Value::as_str) == Some(ty)))
                    .and_then(|x| x.get("address").and_then(Value::as_str))
                    .unwrap_or("")
                    .to_string()
            };
            vec![
                name,
                json!(status),
                none(roles.join(",")),
                age,
                json!(s(p("/status/nodeInfo/kubeletVersion"))),
                none(addr("InternalIP")),
                none(addr("ExternalIP")),
                unknown(s(p("/status/nodeInfo/osImage"))),
                unknown(s(p("/status/nodeInfo/kernelVersion"))),
                unknown(s(p("/status/nodeInfo/containerRuntimeVersion"))),
            ]
        }
        ("", "namespaces") => vec![name, json!(s(p("/status/phase"))), age],
        ("", "secrets") => {
            vec![name, json!(s(p("/type"))), json!(p("/data").and_then(Value::as_object).map_or(0, |d| d.len())), age]
        }
        ("", "configmaps") => {
            let n = p("/data").and_then(Value::as_object).map_or(0, |d| d.len())
                + p("/binaryData").and_then(Value::as_object).map_or(0, |d| d.len());
            vec![name, json!(n), age]
        }
        ("", "serviceaccounts") => {
            vec![name, json!(p("/secrets").and_then(Value::as_array).map_or(0, Vec::len)), age]
        }
        ("apps", "daemonsets") => {
            let n = |f: &str| json!(p(&format!("/status/{f}")).and_then(Value::as_i64).unwrap_or(0));
            let sel = p("/spec/template/spec/nodeSelector")
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect::<Vec<_>>().join(",")
                })
                .unwrap_or_default();
            vec![
                name,
                n("desiredNumberScheduled"),
                n("currentNumberScheduled"),
                n("numberReady"),
                n("updatedNumberScheduled"),
                n("numberAvailable"),
                none(sel),
                age,
            ]
        }
        ("policy", "poddisruptionbudgets") => {
            let or_na = |v: Option<&Value>| if v.is_none() { json!("N/A") } else { json!(s(v)) };
            vec![
                name,
                or_na(p("/spec/minAvailable")),
                or_na(p("/spec/maxUnavailable")),
                json!(p("/status/disruptionsAllowed").and_then(Value::as_i64).unwrap_or(0)),
                age,
            ]
        }
        ("coordination.k8s.io", "leases") => vec![name, json!(s(p("/spec/holderIdentity"))), age],
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            vec![name, json!(s(p("/metadata/creationTimestamp")))]
        }
        _ => vec![name, age],
    }
}

/// A CRD column's cell as kube-apiserver's table convertor computes it: the first value the
/// JSONPath selects; a `string` column prints any value as Go would, other types keep only a
/// value of their own type (`integer` also takes a float, truncated), `date` shows the age.
fn crd_cell(c: &Column, obj: &Value, now: DateTime<Utc>) -> Value {
    let Some(path) = c.json_path.as_deref().and_then(|p| JsonPath::parse(p).ok()) else { return Value::Null };
    let found = path.find(obj);
    let Some(v) = found.first().filter(|v| !v.is_null()) else { return Value::Null };
    match (c.ty.as_str(), v) {
        ("string", v) => json!(go_text(v)),
        ("integer", Value::Number(n)) => n.as_i64().map_or_else(|| json!(n.as_f64().map(|f| f as i64)), |i| json!(i)),
        ("number", Value::Number(n)) => json!(n.as_f64()),
        ("boolean", Value::Bool(b)) => json!(b),
        ("date", Value::String(t)) => match DateTime::parse_from_rfc3339(t) {
            Ok(t) => json!(human_duration(now - t.with_timezone(&Utc))),
            Err(_) => json!("<invalid>"),
        },
        _ => Value::Null,
    }
}

/// The cells of an Event (kube's `printEvent`): last seen from the series, lastTimestamp or
/// the first time; count 1 for a singleton of the new API; source falls back to the reporter.
fn event_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    // Either version's field names: the core/v1 one, else the events.k8s.io/v1 one.
    let f = |core: &str, new: &str| {
        obj.get(core).filter(|v| !v.is_null()).or_else(|| obj.get(new)).filter(|v| !v.is_null())
    };
    let since = |v: Option<&Value>| {
        v.and_then(Value::as_str)
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map_or_else(|| "<unknown>".to_string(), |t| human_duration(now - t.with_timezone(&Utc)))
    };
    let first = match f("firstTimestamp", "deprecatedFirstTimestamp") {
        Some(t) => since(Some(t)),
        None => since(obj.get("eventTime")),
    };
    let mut last = match f("lastTimestamp", "deprecatedLastTimestamp") {
        Some(t) => since(Some(t)),
        None => first.clone(),
    };
    let mut count = f("count", "deprecatedCount").and_then(Value::as_i64).unwrap_or(0);
    if let Some(series) = obj.get("series").filter(|s| s.is_object()) {
        last = since(series.get("lastObservedTime"));
        count = series.get("count").and_then(Value::as_i64).unwrap_or(0);
    } else if count == 0 {
        count = 1;
    }
    let involved = f("involvedObject", "regarding").cloned().unwrap_or(Value::Null);
    let kind = s(involved.get("kind")).to_lowercase();
    let iname = s(involved.get("name"));
    let target = if iname.is_empty() { kind } else { format!("{kind}/{iname}") };
    let source = f("source", "deprecatedSource").cloned().unwrap_or(Value::Null);
    let mut component = s(source.get("component"));
    if component.is_empty() {
        component = s(f("reportingComponent", "reportingController"));
    }
    let mut host = s(source.get("host"));
    if host.is_empty() {
        host = s(obj.get("reportingInstance"));
    }
    let source = if host.is_empty() { component } else { format!("{component}, {host}") };
    vec![
        json!(last),
        json!(s(obj.get("type"))),
        json!(s(obj.get("reason"))),
        json!(target),
        json!(s(involved.get("fieldPath"))),
        json!(source),
        json!(s(f("message", "note")).trim()),
        json!(first),
        json!(count),
        json!(s(obj.pointer("/metadata/name"))),
    ]
}

/// One row's cells.
pub(crate) fn cells(res: &Resource, obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    if is_event(res) {
        event_cells(obj, now)
    } else if res.schema.is_some() {
        let mut cells = vec![json!(obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or(""))];
        cells.extend(res.columns.iter().map(|c| crd_cell(c, obj, now)));
        cells
    } else {
        builtin_cells(res, obj, now)
    }
}

/// The Table for objects; `headers` false leaves the column definitions out (watch events after
/// the first). `include_object`: `None`, `Object` or `Metadata` (default).
pub(crate) fn table(
    res: &Resource,
    objs: &[Arc<Value>],
    meta: Value,
    headers: bool,
    include_object: &str,
    now: DateTime<Utc>,
) -> Value {
    let defs: Vec<Value> = if headers {
        columns(res)
            .iter()
            .map(|c| {
                json!({"name": c.name, "type": c.ty, "format": c.format, "description": c.description, "priority": c.priority})
            })
            .collect()
    } else {
        Vec::new()
    };
    let rows: Vec<Value> = objs
        .iter()
        .map(|o| {
            let object = match include_object {
                "None" => Value::Null,
                "Object" => (**o).clone(),
                _ => json!({
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": o.get("metadata").cloned().unwrap_or(json!({})),
                }),
            };
            json!({"cells": cells(res, o, now), "object": object})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": defs,
        "rows": rows,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn human_durations() {
        assert_eq!(human_duration(chrono::Duration::seconds(5)), "5s");
        assert_eq!(human_duration(chrono::Duration::seconds(150)), "2m30s");
        assert_eq!(human_duration(chrono::Duration::hours(30)), "30h");
        assert_eq!(human_duration(chrono::Duration::days(3)), "3d");
    }
}
