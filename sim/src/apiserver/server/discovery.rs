//! `server::discovery`: the documents clients discover the API with: `/version`, `/apis` (groups
//! and their preferred versions, kube-apiserver's version priority), and each group version's
//! APIResourceList (verbs, short names, categories, subresources with their kinds).
//!
//! Owns: those documents, built from the registry. Must not: serve OpenAPI (`openapi`) or
//! anything of objects.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::apiserver::resources::Resource;
use crate::apiserver::{Shared, lock};

pub(super) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-sim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

pub(super) fn api_groups(shared: &Shared) -> Value {
    let st = lock(&shared.store);
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in st.registry.by_gvr.values().filter(|r| !r.group.is_empty()) {
        let vs = groups.entry(r.group.clone()).or_default();
        if !vs.contains(&r.version) {
            vs.push(r.version.clone());
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(g, mut vs)| {
            vs.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
            let versions: Vec<Value> =
                vs.iter().map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v})).collect();
            let preferred = versions.first().cloned().unwrap_or(json!({}));
            json!({"name": g, "versions": versions, "preferredVersion": preferred})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// Kubernetes version priority: GA > beta > alpha, higher numbers first.
fn version_priority(v: &str) -> (u8, u32, u32) {
    let Some(rest) = v.strip_prefix('v') else { return (0, 0, 0) };
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let major = digits.parse().unwrap_or(0);
    let tail = &rest[digits.len()..];
    if tail.is_empty() {
        (3, major, 0)
    } else if let Some(n) = tail.strip_prefix("beta") {
        (2, major, n.parse().unwrap_or(0))
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (1, major, n.parse().unwrap_or(0))
    } else {
        (0, major, 0)
    }
}

pub(super) fn resource_list(shared: &Shared, group: &str, version: &str) -> Option<Value> {
    let st = lock(&shared.store);
    let rs: Vec<Arc<Resource>> =
        st.registry.by_gvr.values().filter(|r| r.group == group && r.version == version).cloned().collect();
    if rs.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    for r in &rs {
        let mut main = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": r.verbs(),
        });
        if !r.short_names.is_empty() {
            main["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            main["categories"] = json!(r.categories);
        }
        out.push(main);
        for s in &r.subresources {
            let (kind, verbs, grp, ver): (String, Vec<&str>, Option<&str>, Option<&str>) = match s.as_str() {
                "status" => (r.kind.clone(), vec!["get", "patch", "update"], None, None),
                "scale" => ("Scale".into(), vec!["get", "patch", "update"], Some("autoscaling"), Some("v1")),
                "binding" => ("Binding".into(), vec!["create"], None, None),
                "eviction" => ("Eviction".into(), vec!["create"], Some("policy"), Some("v1")),
                "token" => ("TokenRequest".into(), vec!["create"], Some("authentication.k8s.io"), Some("v1")),
                "finalize" => (r.kind.clone(), vec!["update"], None, None),
                _ => continue,
            };
            let mut sr = json!({"name": format!("{}/{s}", r.plural), "singularName": "", "namespaced": r.namespaced, "kind": kind, "verbs": verbs});
            if let Some(g) = grp {
                sr["group"] = json!(g);
                sr["version"] = json!(ver);
            }
            out.push(sr);
        }
    }
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out}))
}
