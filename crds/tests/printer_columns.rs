//! Every `kubectl get` column of every CRD reads a field that can be written: its JSONPath leads
//! through the CRD's own schema (a path outside the schema is pruned by the API server, so nothing
//! can ever fill that column), and where it reads a key of a map, that key is one the hub writes
//! into that map. A column that stays empty forever is a bug a person sees on their first
//! `kubectl get`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use crds::{crd, labels, quantity::Resources};
use serde_json::Value;

/// One step of a column's JSONPath: a field, optionally followed by a filter on its items
/// (`conditions[?(@.type=="Ready")]`).
#[derive(Debug)]
struct Step {
    field: String,
    filter: bool,
}

/// `.a.b\.c[?(...)].d` → steps; `\.` is a dot inside a key (label keys).
fn steps(path: &str) -> Vec<Step> {
    let path = path.strip_prefix('.').unwrap_or_else(|| panic!("{path}: a column's path starts with '.'"));
    let mut out = Vec::new();
    let mut field = String::new();
    let mut chars = path.chars().peekable();
    let mut filter = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' => field.push(chars.next().unwrap_or_else(|| panic!("{path}: dangling escape"))),
            '[' => {
                for c in chars.by_ref() {
                    if c == ']' {
                        break;
                    }
                }
                filter = true;
            }
            '.' => {
                out.push(Step { field: std::mem::take(&mut field), filter });
                filter = false;
            }
            c => field.push(c),
        }
    }
    out.push(Step { field, filter });
    out
}

/// The keys the hub writes into the maps columns may read, per map (`kind` and the map's path).
fn written_keys(kind: &str, map: &str) -> Option<BTreeSet<String>> {
    match (kind, map) {
        // The pool's usage: exactly the keys of the resource list the hub computes it with.
        ("NodePool", ".status.resources") => Some(Resources::ZERO.to_resource_list().into_keys().collect()),
        // The labels the hub puts on every NodeClaim it creates (Karpenter's well-known ones).
        ("NodeClaim", ".metadata.labels") => Some(
            [labels::NODEPOOL, labels::INSTANCE_TYPE, labels::CAPACITY_TYPE, labels::ZONE]
                .into_iter()
                .map(String::from)
                .collect(),
        ),
        _ => None,
    }
}

/// Why the column cannot show anything, or `None` when its path can be filled.
fn unreadable(kind: &str, schema: &Value, path: &str) -> Option<String> {
    let steps = steps(path);
    let mut node = schema;
    let mut walked = String::new();
    for (i, step) in steps.iter().enumerate() {
        if i == 0 && step.field == "metadata" {
            walked = ".metadata".to_string();
            continue;
        }
        if walked == ".metadata" {
            // ObjectMeta is not in a CRD's schema; the API server owns it.
            return match step.field.as_str() {
                "name" | "namespace" | "uid" | "creationTimestamp" | "generation" | "resourceVersion" => None,
                "labels" | "annotations" => {
                    let key = steps.get(i + 1).map(|s| s.field.clone()).unwrap_or_default();
                    let map = format!(".metadata.{}", step.field);
                    match written_keys(kind, &map) {
                        Some(keys) if keys.contains(&key) => None,
                        Some(keys) => Some(format!("the hub writes no key {key:?} in {map} (it writes {keys:?})")),
                        None => Some(format!("nothing declares which keys of {map} the hub writes on a {kind}")),
                    }
                }
                other => Some(format!("metadata.{other} is not a field of ObjectMeta a column can show")),
            };
        }
        let properties = node.get("properties").and_then(Value::as_object);
        let next = match properties.and_then(|p| p.get(&step.field)) {
            Some(next) => next,
            None if node.get("additionalProperties").is_some() => {
                // A map: the schema allows any key, so what matters is what the hub writes.
                return match written_keys(kind, &walked) {
                    Some(keys) if keys.contains(&step.field) => None,
                    Some(keys) => Some(format!(
                        "{walked} is a map and the hub writes no key {:?} in it (it writes {keys:?})",
                        step.field
                    )),
                    None => Some(format!("nothing declares which keys of the map {walked} the hub writes")),
                };
            }
            None => {
                let known: Vec<&String> = properties.map(|p| p.keys().collect()).unwrap_or_default();
                return Some(format!(
                    "{walked} has no field {:?} in the schema (the API server would prune it; fields: {known:?})",
                    step.field
                ));
            }
        };
        walked = format!("{walked}.{}", step.field);
        node = next;
        if step.filter {
            match node.get("items") {
                Some(items) if node.get("type").and_then(Value::as_str) == Some("array") => node = items,
                _ => return Some(format!("{walked} is filtered but is not a list")),
            }
        }
    }
    None
}

#[test]
fn every_printer_column_reads_a_path_the_hub_can_write() {
    let mut columns = 0;
    let mut wrong = Vec::new();
    for file in crd::hub_crds().into_iter().chain(crd::testing_crds()) {
        let kind = file.crd.spec.names.kind.clone();
        for version in &file.crd.spec.versions {
            let schema = serde_json::to_value(
                version.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref()).expect("a structural schema"),
            )
            .unwrap();
            for column in version.additional_printer_columns.iter().flatten() {
                columns += 1;
                if let Some(why) = unreadable(&kind, &schema, &column.json_path) {
                    wrong.push(format!(
                        "{kind} {} column {:?} ({}): {why}",
                        version.name, column.name, column.json_path
                    ));
                }
            }
        }
    }
    assert!(columns >= 20, "only {columns} columns found");
    assert!(wrong.is_empty(), "columns that can never show anything:\n{}", wrong.join("\n"));
}

/// The check itself refuses what it must: a misspelt field, a map key nobody writes, a label the
/// hub does not set.
#[test]
fn the_check_refuses_paths_nothing_writes() {
    let pool = crd::hub_crds().into_iter().find(|f| f.crd.spec.names.kind == "NodePool").unwrap();
    let schema =
        serde_json::to_value(pool.crd.spec.versions[0].schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap())
            .unwrap();
    assert_eq!(unreadable("NodePool", &schema, ".status.nodes"), None);
    assert_eq!(unreadable("NodePool", &schema, ".status.resources.cpu"), None);
    assert_eq!(unreadable("NodePool", &schema, ".status.conditions[?(@.type==\"Ready\")].status"), None);
    assert!(unreadable("NodePool", &schema, ".status.resources.nodes").unwrap().contains("no key \"nodes\""));
    assert!(unreadable("NodePool", &schema, ".status.node").unwrap().contains("no field \"node\""));
    assert!(unreadable("NodePool", &schema, ".spec.template.spec.nodeClassRef.nam").is_some());
    assert!(unreadable("NodePool", &schema, ".metadata.labels.team").is_some());
    assert!(unreadable("NodePool", &schema, ".status.conditions.status").is_some(), "a list is not an object");
    let claim = crd::hub_crds().into_iter().find(|f| f.crd.spec.names.kind == "NodeClaim").unwrap();
    let schema =
        serde_json::to_value(claim.crd.spec.versions[0].schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap())
            .unwrap();
    assert_eq!(unreadable("NodeClaim", &schema, ".metadata.labels.topology\\.kubernetes\\.io/zone"), None);
    assert!(unreadable("NodeClaim", &schema, ".metadata.labels.topology\\.kubernetes\\.io/region").is_some());
}
