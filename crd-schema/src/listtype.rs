//! The `x-kubernetes-list-type: set|map` uniqueness invariants (`schema/listtype/validation.go`).
//!
//! Owns: duplicate detection for sets (whole items) and map lists (key fields), with the apiserver's
//! error values (`Duplicate value: {"name":"a"}`). Must not check anything else.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::errors::{self, FPath, FieldError};
use super::gofmt;
use super::node::Node;

/// `ValidateListSetsAndMaps` from the object root.
pub(crate) fn validate(node: &Node, obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Value::Object(map) = obj {
        validate_map(&None, node, map, &mut errs);
    }
    errs
}

fn validate_map(p: &FPath, node: &Node, obj: &Map<String, Value>, errs: &mut Vec<FieldError>) {
    if let Some(add) = node.additional_schema() {
        for (k, v) in obj {
            validate_value(&errors::key(p, k), add, v, errs);
        }
    }
    for (k, v) in obj {
        if let Some(sub) = node.properties.get(k) {
            validate_value(&errors::child(p, k), sub, v, errs);
        }
    }
}

fn validate_value(p: &FPath, node: &Node, v: &Value, errs: &mut Vec<FieldError>) {
    match v {
        Value::Array(items) => validate_array(p, node, items, errs),
        Value::Object(map) => validate_map(p, node, map, errs),
        _ => {}
    }
}

fn validate_array(p: &FPath, node: &Node, items: &[Value], errs: &mut Vec<FieldError>) {
    match node.list_type.as_deref() {
        Some("set") => {
            for i in non_unique(items.iter()) {
                errs.push(FieldError::duplicate(&errors::index(p, i), &items[i]));
            }
        }
        Some("map") => validate_list_map(p, node, items, errs),
        _ => {}
    }
    if let Some(item_node) = node.items.as_deref() {
        for (i, item) in items.iter().enumerate() {
            validate_value(&errors::index(p, i), item_node, item, errs);
        }
    }
}

/// A hashable identity for a set element: scalars compare as Go values (int64 1 differs from float64
/// 1), compounds compare by their JSON encoding.
#[derive(Hash, PartialEq, Eq)]
enum Ident {
    Scalar(String),
    Compound(String),
    Unspecified,
}

fn ident(v: Option<&Value>) -> Ident {
    match v {
        None => Ident::Unspecified,
        Some(v @ (Value::Array(_) | Value::Object(_))) => Ident::Compound(gofmt::go_json(v)),
        Some(Value::Number(n)) => match gofmt::go_num(n) {
            gofmt::GoNum::Int(i) => Ident::Scalar(format!("i{i}")),
            gofmt::GoNum::Float(f) => Ident::Scalar(format!("f{f:?}")),
        },
        Some(other) => Ident::Scalar(format!("{other}")),
    }
}

/// `validateListSet`: the index of the second occurrence of each repeated element.
fn non_unique<'a>(items: impl Iterator<Item = &'a Value>) -> Vec<usize> {
    non_unique_idents(items.map(|v| ident(Some(v))))
}

fn non_unique_idents(items: impl Iterator<Item = Ident>) -> Vec<usize> {
    let mut seen: HashMap<Ident, usize> = HashMap::new();
    let mut out = Vec::new();
    for (i, id) in items.enumerate() {
        let times = seen.entry(id).or_insert(0);
        *times += 1;
        if *times == 2 {
            out.push(i);
        }
    }
    out
}

fn validate_list_map(p: &FPath, node: &Node, items: &[Value], errs: &mut Vec<FieldError>) {
    for (i, x) in items.iter().enumerate() {
        if !x.is_null() && !x.is_object() {
            errs.push(FieldError::invalid_json(
                &errors::index(p, i),
                x,
                "must be an object for an array of list-type map",
            ));
            return;
        }
    }
    if items.len() <= 1 {
        return;
    }
    if node.list_map_keys.len() == 1 {
        let key = &node.list_map_keys[0];
        let keys: Vec<Option<&Value>> = items.iter().map(|x| x.get(key)).collect();
        for i in non_unique_idents(keys.iter().map(|k| ident(*k))) {
            let mut m = Map::new();
            if let Some(k) = keys[i] {
                m.insert(key.clone(), k.clone());
            }
            errs.push(FieldError::duplicate(&errors::index(p, i), &Value::Object(m)));
        }
        return;
    }
    let keys: Vec<Value> = items
        .iter()
        .map(|x| {
            let mut m = Map::new();
            for k in &node.list_map_keys {
                if let Some(v) = x.get(k) {
                    m.insert(k.clone(), v.clone());
                }
            }
            Value::Object(m)
        })
        .collect();
    for i in non_unique(keys.iter()) {
        errs.push(FieldError::duplicate(&errors::index(p, i), &keys[i]));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sets_and_maps_report_the_second_occurrence() {
        let node = Node::parse(&json!({"type": "object", "properties": {
            "s": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
            "m": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                  "items": {"type": "object", "properties": {"name": {"type": "string"}}}}
        }}));
        let errs: Vec<String> = validate(
            &node,
            &json!({
                "s": ["a", "b", "a", "a"],
                "m": [{"name": "x"}, {"name": "y"}, {"name": "x", "v": 1}]
            }),
        )
        .iter()
        .map(|e| e.to_string())
        .collect();
        assert_eq!(errs, vec![r#"m[2]: Duplicate value: {"name":"x"}"#, r#"s[2]: Duplicate value: "a""#]);
    }
}
