//! `meta.k8s.io/v1` Table rendering for `kubectl get` (`Accept: application/json;as=Table`):
//! kube-apiserver's printer columns of the built-in kinds the hub uses, CRD
//! `additionalPrinterColumns` (a JSONPath subset), and `-o wide` (columns with priority > 0).
//! Must not do: decide which objects are listed.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::resources::{Column, Resource};

fn col(name: &str, ty: &str, priority: i64) -> Column {
    Column {
        name: name.into(),
        ty: ty.into(),
        format: if name == "Name" { "name".into() } else { String::new() },
        description: String::new(),
        priority,
        json_path: None,
    }
}

/// The columns of a resource (Name first).
pub(crate) fn columns(res: &Resource) -> Vec<Column> {
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
        ("", "events") => &[
            ("Last Seen", "string", 0),
            ("Type", "string", 0),
            ("Reason", "string", 0),
            ("Object", "string", 0),
            ("Message", "string", 0),
        ],
        _ => &[("Age", "string", 0)],
    };
    cols.extend(extra.iter().map(|(n, t, p)| col(n, t, *p)));
    cols
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
        ("", "events") => vec![
            name,
            json!(
                obj.pointer("/lastTimestamp")
                    .or_else(|| obj.pointer("/eventTime"))
                    .and_then(Value::as_str)
                    .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                    .map(|t| human_duration(now - t.with_timezone(&Utc)))
                    .unwrap_or_else(|| "<unknown>".into())
            ),
            json!(s(p("/type"))),
            json!(s(p("/reason"))),
            json!(format!("{}/{}", s(p("/involvedObject/kind")).to_lowercase(), s(p("/involvedObject/name")))),
            json!(s(p("/message"))),
        ],
        _ => vec![name, age],
    }
}

/// Evaluates a printer-column JSONPath (`.spec.x`, `.a.b[0]`, `.status.conditions[?(@.type=="Ready")].status`).
pub(crate) fn json_path(obj: &Value, path: &str) -> Option<Value> {
    let mut cur = vec![obj.clone()];
    let p = path.trim().trim_start_matches('{').trim_end_matches('}').trim_start_matches('$');
    let mut rest = p;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let key = &r[..end];
            cur = cur.iter().filter_map(|v| v.get(key).cloned()).collect();
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let inner = &r[..end];
            rest = &r[end + 1..];
            if let Some(filter) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                let (k, want) = filter.split_once("==")?;
                let want = want.trim().trim_matches('"').trim_matches('\'');
                cur = cur
                    .iter()
                    .filter_map(Value::as_array)
                    .flat_map(|a| a.iter())
                    .filter(|x| s(x.get(k.trim())) == want)
                    .cloned()
                    .collect();
            } else if inner == "*" {
                cur = cur.iter().filter_map(Value::as_array).flat_map(|a| a.iter().cloned()).collect();
            } else {
                let i: usize = inner.parse().ok()?;
                cur = cur.iter().filter_map(|v| v.get(i).cloned()).collect();
            }
        } else {
            return None;
        }
    }
    match cur.len() {
        0 => None,
        1 => cur.pop(),
        _ => Some(Value::Array(cur)),
    }
}

fn crd_cell(c: &Column, obj: &Value, now: DateTime<Utc>) -> Value {
    let v = c.json_path.as_deref().and_then(|p| json_path(obj, p));
    match (c.ty.as_str(), v) {
        (_, None) => Value::Null,
        ("date", Some(Value::String(t))) => match DateTime::parse_from_rfc3339(&t) {
            Ok(t) => json!(human_duration(now - t.with_timezone(&Utc))),
            Err(_) => json!(t),
        },
        (_, Some(Value::Array(a))) => {
            json!(a.iter().map(|x| s(Some(x))).collect::<Vec<_>>().join(","))
        }
        (_, Some(v)) => v,
    }
}

/// One row's cells.
pub(crate) fn cells(res: &Resource, obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    if res.schema.is_some() {
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
    fn json_path_subset() {
        let o = json!({"status": {"conditions": [{"type": "A", "status": "False"}, {"type": "Ready", "status": "True"}]}, "spec": {"l": [1, 2]}});
        assert_eq!(json_path(&o, ".status.conditions[?(@.type==\"Ready\")].status"), Some(json!("True")));
        assert_eq!(json_path(&o, ".spec.l[1]"), Some(json!(2)));
        assert_eq!(json_path(&o, ".spec.missing"), None);
    }

    #[test]
    fn human_durations() {
        assert_eq!(human_duration(chrono::Duration::seconds(5)), "5s");
        assert_eq!(human_duration(chrono::Duration::seconds(150)), "2m30s");
        assert_eq!(human_duration(chrono::Duration::hours(30)), "30h");
        assert_eq!(human_duration(chrono::Duration::days(3)), "3d");
    }
}
