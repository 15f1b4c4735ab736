//! Patches: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch for the
//! built-in kinds (the list merge keys and directives of the fields clients touch), and the
//! emulator's simplified server-side apply.
//! Must not do: decide what happens to the patched object (the update path does).

use serde_json::{Map, Value};

/// The patch types of the `Content-Type` header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<PatchType> {
        let ct = ct.split(';').next().unwrap_or("").trim();
        match ct {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Some(PatchType::Apply),
            _ => None,
        }
    }
}

/// RFC 7386.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Why a JSON patch was not applied (the caller answers as kube-apiserver does).
#[derive(Debug, thiserror::Error)]
pub(crate) enum JsonPatchError {
    /// The body is not a list of RFC 6902 operations.
    #[error("{0}")]
    Malformed(#[from] serde_json::Error),
    /// An operation failed (a `test` did not match, a path is missing...).
    #[error("{0}")]
    Failed(#[from] json_patch::PatchError),
}

/// RFC 6902.
pub(crate) fn json_patch(target: &mut Value, patch: &Value) -> Result<(), JsonPatchError> {
    let p: json_patch::Patch = serde_json::from_value(patch.clone())?;
    Ok(json_patch::patch(target, &p)?)
}

/// The `patchMergeKey` of a list field of the built-in kinds, by field name.
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "volumeMounts"
        | "imagePullSecrets"
        | "resourceClaims"
        | "volumeDevices" => "name",
        "ports" => "containerPort",
        "conditions" | "addresses" => "type",
        "ownerReferences" => "uid",
        "topologySpreadConstraints" => "topologyKey",
        "hostAliases" => "ip",
        _ => return None,
    })
}

/// Lists of scalars merged as sets (`patchStrategy:"merge"` on a primitive list).
fn is_primitive_merge(field: &str) -> bool {
    matches!(field, "finalizers")
}

/// Strategic merge patch for the built-in kinds (`$patch`, `$retainKeys`,
/// `$deleteFromPrimitiveList/…` and `$setElementOrder/…` honoured). Merged lists come out in
/// kube-apiserver's order (see [`normalize_order`]).
pub(crate) fn strategic_merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => merge_map(t, p),
        _ => *target = strip_directives(patch),
    }
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter().filter(|(k, _)| !k.starts_with('$')).map(|(k, v)| (k.clone(), strip_directives(v))).collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

fn merge_map(t: &mut Map<String, Value>, p: &Map<String, Value>) {
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        *t = match strip_directives(&Value::Object(p.clone())) {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        return;
    }
    if let Some(keep) = p.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        t.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (k, v) in p {
        if k.starts_with('$') {
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        if let Some(vo) = v.as_object()
            && vo.get("$patch").and_then(Value::as_str) == Some("delete")
        {
            t.remove(k);
            continue;
        }
        let order = p.get(&format!("$setElementOrder/{k}")).and_then(Value::as_array).map(Vec::as_slice);
        match (t.get_mut(k), v) {
            (Some(Value::Object(to)), Value::Object(po)) => merge_map(to, po),
            (Some(Value::Array(ta)), Value::Array(pa)) if merge_key(k).is_some() => {
                let key = merge_key(k).unwrap_or("name");
                let live = ta.clone();
                merge_list(ta, pa, key);
                *ta = normalize_order(std::mem::take(ta), order.unwrap_or(pa), &live, Some(key));
            }
            (Some(Value::Array(ta)), Value::Array(pa)) if is_primitive_merge(k) => {
                let live = ta.clone();
                for x in pa {
                    if !ta.contains(x) {
                        ta.push(x.clone());
                    }
                }
                *ta = normalize_order(std::mem::take(ta), order.unwrap_or(pa), &live, None);
            }
            _ => {
                t.insert(k.clone(), strip_directives(v));
            }
        }
    }
    for (k, v) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/")
            && let (Some(Value::Array(ta)), Some(del)) = (t.get_mut(field), v.as_array())
        {
            ta.retain(|x| !del.contains(x));
        }
    }
}

/// Orders a merged list as kube-apiserver's strategic merge does (apimachinery's
/// `normalizeElementOrder`): the items named by the patch (or its `$setElementOrder`) in the
/// patch's order, the others in their live order, and the two interleaved so that two live items
/// keep their live order; an item new to the list goes before the live-only items that follow it.
/// So a patch adding finalizer `b` to `[a]` gives `[b, a]`. Items are identified by `key` (maps)
/// or by value (scalars).
fn normalize_order(merged: Vec<Value>, order: &[Value], live: &[Value], key: Option<&str>) -> Vec<Value> {
    let id = |v: &Value| -> Option<Value> {
        match key {
            Some(k) => v.get(k).cloned(),
            None => Some(v.clone()),
        }
    };
    let position = |list: &[Value], v: &Value| -> Option<usize> {
        let want = id(v)?;
        list.iter().position(|x| id(x).as_ref() == Some(&want))
    };
    let (mut patched, mut live_only): (Vec<Value>, Vec<Value>) =
        merged.into_iter().partition(|v| position(order, v).is_some());
    patched.sort_by_key(|v| position(order, v));
    // Stable: items unknown to the live list (none expected) keep their place at the end.
    live_only.sort_by_key(|v| position(live, v).unwrap_or(usize::MAX));
    let mut out = Vec::with_capacity(patched.len() + live_only.len());
    let (mut left, mut right) = (live_only.into_iter().peekable(), patched.into_iter().peekable());
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (Some(l), Some(r)) => matches!((position(live, l), position(live, r)), (Some(li), Some(ri)) if li < ri),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        out.extend(if take_left { left.next() } else { right.next() });
    }
    out
}

fn merge_list(t: &mut Vec<Value>, p: &[Value], key: &str) {
    if p.iter().any(|x| x.get("$patch").and_then(Value::as_str) == Some("replace")) {
        *t = p.iter().filter(|x| x.get("$patch").is_none()).map(strip_directives).collect();
        return;
    }
    for item in p {
        let k = item.get(key);
        let pos = k.and_then(|k| t.iter().position(|x| x.get(key) == Some(k)));
        if item.get("$patch").and_then(Value::as_str) == Some("delete") {
            if let Some(i) = pos {
                t.remove(i);
            }
            continue;
        }
        match (pos, item.as_object()) {
            (Some(i), Some(po)) => {
                if let Some(to) = t[i].as_object_mut() {
                    merge_map(to, po);
                }
            }
            _ => t.push(strip_directives(item)),
        }
    }
}

/// The emulator's server-side apply: the applied configuration is merged into the live object
/// like a merge patch (maps merged, lists replaced; strategic list keys for built-in kinds). It does
/// not track field managers, so fields dropped from a later apply are not removed.
pub(crate) fn apply(target: &mut Value, applied: &Value, builtin: bool) {
    if builtin { strategic_merge(target, applied) } else { merge_patch(target, applied) }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_removes_nulls_and_replaces_lists() {
        let mut t = json!({"a": {"b": 1, "c": 2}, "l": [1, 2]});
        merge_patch(&mut t, &json!({"a": {"b": null, "d": 3}, "l": [3]}));
        assert_eq!(t, json!({"a": {"c": 2, "d": 3}, "l": [3]}));
    }

    #[test]
    fn strategic_merge_merges_conditions_by_type_and_finalizers_as_a_set() {
        let mut t = json!({
            "metadata": {"finalizers": ["a"]},
            "spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "X", "status": "True"}]}
        });
        strategic_merge(
            &mut t,
            &json!({
                "metadata": {"finalizers": ["b"], "$deleteFromPrimitiveList/finalizers": ["a"]},
                "spec": {"taints": [{"key": "y", "effect": "NoExecute"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "X", "$patch": "delete"}]}
            }),
        );
        assert_eq!(t["metadata"]["finalizers"], json!(["b"]));
        assert_eq!(t["spec"]["taints"], json!([{"key": "y", "effect": "NoExecute"}]));
        assert_eq!(t["status"]["conditions"], json!([{"type": "Ready", "status": "True"}]));
    }

    #[test]
    fn strategic_merge_orders_lists_like_kube_apiserver() {
        // New entries of the patch come before the live-only ones.
        let mut t = json!({"metadata": {"finalizers": ["a"]}});
        strategic_merge(&mut t, &json!({"metadata": {"finalizers": ["b"]}}));
        assert_eq!(t["metadata"]["finalizers"], json!(["b", "a"]));
        // Live entries named again keep their live order relative to the live-only ones.
        let mut t = json!({"metadata": {"finalizers": ["a", "b", "c"]}});
        strategic_merge(&mut t, &json!({"metadata": {"finalizers": ["c", "d"]}}));
        assert_eq!(t["metadata"]["finalizers"], json!(["a", "b", "c", "d"]));
        // Merge-key lists too; `$setElementOrder` gives the patched items' order.
        let mut t = json!({"status": {"conditions": [{"type": "A", "status": "1"}, {"type": "B", "status": "1"}]}});
        strategic_merge(&mut t, &json!({"status": {"conditions": [{"type": "C", "status": "1"}]}}));
        let types: Vec<&str> =
            t["status"]["conditions"].as_array().unwrap().iter().map(|c| c["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["C", "A", "B"]);
        let mut t = json!({"spec": {"containers": [{"name": "x"}, {"name": "y"}]}});
        strategic_merge(
            &mut t,
            &json!({"spec": {"$setElementOrder/containers": [{"name": "y"}, {"name": "x"}], "containers": [{"name": "y", "image": "i"}]}}),
        );
        assert_eq!(t["spec"]["containers"], json!([{"name": "y", "image": "i"}, {"name": "x"}]));
    }

    #[test]
    fn json_patch_reports_failed_tests() {
        let mut t = json!({"metadata": {"resourceVersion": "5"}});
        assert!(
            json_patch(&mut t, &json!([{"op": "test", "path": "/metadata/resourceVersion", "value": "4"}])).is_err()
        );
        json_patch(&mut t, &json!([{"op": "add", "path": "/spec", "value": {"x": 1}}])).unwrap();
        assert_eq!(t["spec"]["x"], 1);
    }
}
