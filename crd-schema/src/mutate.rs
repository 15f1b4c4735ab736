//! What the apiserver's decoder does to a custom resource before validation: pruning of unknown
//! fields, dropping non-nullable nulls, and structural defaulting.
//!
//! Owns: ports of `schema/pruning/algorithm.go`, `schema/defaulting/prunenulls.go` and
//! `schema/defaulting/algorithm.go`. Must not validate; the order of the steps is the caller's.

use serde_json::Value;

use super::errors::{self, FPath};
use super::node::Node;

/// `PruneWithOptions(obj, schema, isResourceRoot, TrackUnknownFieldPaths)`: removes fields the schema
/// does not specify, except where `x-kubernetes-preserve-unknown-fields` is set and except
/// `apiVersion`/`kind`/`metadata` of (embedded) resources. Returns the removed paths.
pub(crate) fn prune(obj: &mut Value, node: &Node, root: bool) -> Vec<String> {
    let mut unknown = Vec::new();
    prune_node(obj, Some(node), root || node.embedded, &None, &mut unknown);
    unknown
}

fn is_meta(k: &str) -> bool {
    matches!(k, "apiVersion" | "kind" | "metadata")
}

fn prune_node(x: &mut Value, node: Option<&Node>, embedded: bool, p: &FPath, unknown: &mut Vec<String>) {
    if let Some(n) = node
        && n.preserve_unknown
    {
        skip_prune(x, n, embedded, p, unknown);
        return;
    }
    match x {
        Value::Object(map) => {
            let Some(n) = node else {
                for k in map.keys() {
                    unknown.push(errors::path_str(&errors::child(p, k)));
                }
                map.clear();
                return;
            };
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                if embedded && is_meta(&k) {
                    continue;
                }
                if let Some(prop) = n.properties.get(&k) {
                    if let Some(v) = map.get_mut(&k) {
                        prune_node(v, Some(prop), prop.embedded, &errors::child(p, &k), unknown);
                    }
                } else if let Some(add) = &n.additional {
                    let add = match add {
                        super::node::Additional::Schema(s) => Some(s.as_ref()),
                        super::node::Additional::Bool(_) => None,
                    };
                    if let Some(v) = map.get_mut(&k) {
                        prune_node(v, add, add.is_some_and(|a| a.embedded), &errors::key(p, &k), unknown);
                    }
                } else {
                    map.remove(&k);
                    unknown.push(errors::path_str(&errors::child(p, &k)));
                }
            }
        }
        Value::Array(items) => {
            let item_node = node.and_then(|n| n.items.as_deref());
            for (i, v) in items.iter_mut().enumerate() {
                prune_node(v, item_node, item_node.is_some_and(|n| n.embedded), &errors::index(p, i), unknown);
            }
        }
        _ => {}
    }
}

fn skip_prune(x: &mut Value, node: &Node, embedded: bool, p: &FPath, unknown: &mut Vec<String>) {
    match x {
        Value::Object(map) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                if embedded && is_meta(&k) {
                    continue;
                }
                let Some(v) = map.get_mut(&k) else { continue };
                if let Some(prop) = node.properties.get(&k) {
                    prune_node(v, Some(prop), prop.embedded, &errors::child(p, &k), unknown);
                } else if let Some(add) = node.additional_schema() {
                    prune_node(v, Some(add), add.embedded, &errors::key(p, &k), unknown);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_node) = node.items.as_deref() {
                for (i, v) in items.iter_mut().enumerate() {
                    skip_prune(v, item_node, item_node.embedded, &errors::index(p, i), unknown);
                }
            }
        }
        _ => {}
    }
}

/// `PruneNonNullableNullsWithoutDefaults`: nulls where the schema is neither nullable nor defaulted
/// are removed (they would otherwise fail validation as "must be of type").
pub(crate) fn prune_nulls(x: &mut Value, node: Option<&Node>) {
    match x {
        Value::Object(map) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                let child = node.and_then(|n| n.field(&k));
                let drop = matches!(map.get(&k), Some(Value::Null))
                    && child.is_some_and(|c| !c.nullable && c.default.is_none());
                if drop {
                    map.remove(&k);
                } else if let Some(v) = map.get_mut(&k) {
                    prune_nulls(v, child);
                }
            }
        }
        Value::Array(items) => {
            let item_node = node.and_then(|n| n.items.as_deref());
            for v in items {
                prune_nulls(v, item_node);
            }
        }
        _ => {}
    }
}

/// `structuraldefaulting.Default`: missing fields (and non-nullable nulls) of objects get their
/// property's `default`; list items and map values that are non-nullable nulls get the item default.
/// Defaults are applied top-down, so a default object is itself defaulted inside.
pub(crate) fn default(x: &mut Value, node: &Node) {
    let non_nullable_null = |v: &Value, s: &Node| v.is_null() && !s.nullable;
    match x {
        Value::Object(map) => {
            for (k, prop) in &node.properties {
                let Some(d) = &prop.default else { continue };
                match map.get(k) {
                    None => {
                        map.insert(k.clone(), d.clone());
                    }
                    Some(v) if non_nullable_null(v, prop) => {
                        map.insert(k.clone(), d.clone());
                    }
                    _ => {}
                }
            }
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                if let Some(prop) = node.properties.get(&k) {
                    if let Some(v) = map.get_mut(&k) {
                        default(v, prop);
                    }
                } else if let Some(add) = node.additional_schema() {
                    let Some(v) = map.get_mut(&k) else { continue };
                    if non_nullable_null(v, add)
                        && let Some(d) = &add.default
                    {
                        // The apiserver recurses into the replaced (null) value, so the new default
                        // is not defaulted inside.
                        *v = d.clone();
                        continue;
                    }
                    default(v, add);
                }
            }
        }
        Value::Array(items) => {
            let Some(item_node) = node.items.as_deref() else { return };
            for v in items {
                if non_nullable_null(v, item_node)
                    && let Some(d) = &item_node.default
                {
                    *v = d.clone();
                    continue;
                }
                default(v, item_node);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Node {
        Node::parse(&json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "a": {"type": "string", "default": "x"},
                        "o": {"type": "object", "default": {}, "properties": {"n": {"type": "integer", "default": 3}}},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "m": {"type": "object", "additionalProperties": {"type": "string"}},
                        "s": {"type": "string"}
                    }
                }
            }
        }))
    }

    #[test]
    fn prunes_unknown_fields_but_keeps_meta_and_preserved() {
        let mut obj = json!({
            "apiVersion": "v1", "kind": "K", "metadata": {"name": "n"}, "extra": 1,
            "spec": {"zzz": true, "free": {"anything": [1]}, "m": {"k": "v"}}
        });
        let unknown = prune(&mut obj, &schema(), true);
        assert_eq!(unknown, vec!["extra".to_string(), "spec.zzz".to_string()]);
        assert_eq!(
            obj,
            json!({"apiVersion": "v1", "kind": "K", "metadata": {"name": "n"},
                   "spec": {"free": {"anything": [1]}, "m": {"k": "v"}}})
        );
    }

    #[test]
    fn defaults_apply_recursively_and_replace_non_nullable_nulls() {
        let mut obj = json!({"spec": {"a": null, "s": null}});
        let node = schema();
        prune_nulls(&mut obj, Some(&node));
        default(&mut obj, &node);
        assert_eq!(obj, json!({"spec": {"a": "x", "o": {"n": 3}}}));
    }
}
