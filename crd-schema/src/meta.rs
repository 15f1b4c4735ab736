//! `metadata`, `apiVersion` and `kind` of the object and of its embedded resources.
//!
//! Owns: the ObjectMeta round trip the apiserver's decoder does (unknown metadata fields dropped,
//! empty ones omitted, wrong types rejected), `ValidateObjectMetaAccessor(Update)` for custom resources
//! (name as DNS-1123 subdomain, labels, annotations, finalizers, owner references, immutable fields),
//! `ValidateTypeMeta`, and the embedded-resource checks of `schema/objectmeta/validation.go`.
//! Must not look at anything outside metadata/TypeMeta; namespace presence is the caller's business.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value};

use super::errors::{self, BadValue, FPath, FieldError};
use super::gofmt;
use super::node::Node;

static DNS1123_LABEL: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$").ok());
static DNS1123_SUBDOMAIN: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$").ok());
static DNS1035_LABEL: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new("^[a-z]([-a-z0-9]*[a-z0-9])?$").ok());
static QUALIFIED_NAME: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new("^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$").ok());
static LABEL_VALUE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new("^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$").ok());

fn is(r: &LazyLock<Option<Regex>>, s: &str) -> bool {
    r.as_ref().is_some_and(|r| r.is_match(s))
}

fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{msg} (regex used for validation is '{fmt}')");
    }
    // Kubernetes 1.36 joins the examples with ",  or " (sic).
    let ex: Vec<String> = examples.iter().map(|e| format!("'{e}'")).collect();
    format!("{msg} (e.g. {}, regex used for validation is '{fmt}')", ex.join(",  or "))
}

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_ERR: &str =
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

pub(crate) fn is_dns1123_subdomain(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if v.len() > 253 {
        errs.push(max_len_error(253));
    }
    if !is(&DNS1123_SUBDOMAIN, v) {
        errs.push(regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            &format!("{DNS1123_LABEL_FMT}(\\.{DNS1123_LABEL_FMT})*"),
            &["example.com"],
        ));
    }
    errs
}

fn is_dns1123_label(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if v.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !is(&DNS1123_LABEL, v) {
        errs.push(regex_error(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
            DNS1123_LABEL_FMT,
            &["my-name", "123-abc"],
        ));
    }
    errs
}

fn is_dns1035_label(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if v.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !is(&DNS1035_LABEL, v) {
        errs.push(regex_error(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character",
            "[a-z]([-a-z0-9]*[a-z0-9])?",
            &["my-name", "abc-123"],
        ));
    }
    errs
}

/// Label keys: kube-apiserver 1.36 words these like qualified names, but names them "a valid label
/// key" (as it answers; see the differential corpus).
fn is_label_key(v: &str) -> Vec<String> {
    is_qualified_name(v).into_iter().map(|m| m.replace("a qualified name must", "a valid label key must")).collect()
}

pub(crate) fn is_qualified_name(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = v.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(is_dns1123_subdomain(prefix).into_iter().map(|m| format!("prefix part {m}")));
            }
            *name
        }
        _ => {
            return vec![format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(QUALIFIED_NAME_ERR, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
            )];
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push(format!("name part {}", max_len_error(63)));
    }
    if !is(&QUALIFIED_NAME, name) {
        errs.push(format!(
            "name part {}",
            regex_error(QUALIFIED_NAME_ERR, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
        ));
    }
    errs
}

fn is_valid_label_value(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if v.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !is(&LABEL_VALUE, v) {
        errs.push(regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            &format!("({QUALIFIED_NAME_FMT})?"),
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// How a resource's `metadata.name` is checked.
#[derive(Clone, Copy)]
pub(crate) enum NameRule {
    /// `NameIsDNSSubdomain` (custom resources on create).
    DnsSubdomain,
    /// `path.ValidatePathSegmentName` (embedded resources, generic update checks).
    PathSegment,
}

fn name_errors(rule: NameRule, name: &str, prefix: bool) -> Vec<String> {
    match rule {
        NameRule::DnsSubdomain => {
            // A generateName prefix may end with a dash.
            let n = if prefix {
                name.strip_suffix('-').map(|s| format!("{s}a")).unwrap_or_else(|| name.to_string())
            } else {
                name.to_string()
            };
            is_dns1123_subdomain(&n)
        }
        NameRule::PathSegment => {
            if !prefix && (name == "." || name == "..") {
                return vec![format!("may not be '{name}'")];
            }
            ["/", "%"].iter().filter(|c| name.contains(**c)).map(|c| format!("may not contain '{c}'")).collect()
        }
    }
}

fn str_field<'a>(meta: &'a Map<String, Value>, k: &str) -> &'a str {
    meta.get(k).and_then(Value::as_str).unwrap_or("")
}

fn string_map(meta: &Map<String, Value>, k: &str) -> Vec<(String, String)> {
    meta.get(k)
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect())
        .unwrap_or_default()
}

/// `ValidateObjectMetaAccessor`, without the namespace-required check (the caller owns namespaces).
pub(crate) fn validate_object_meta(
    meta: &Map<String, Value>,
    namespaced: bool,
    rule: NameRule,
    p: &FPath,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let generate_name = str_field(meta, "generateName");
    if !generate_name.is_empty() {
        for m in name_errors(rule, generate_name, true) {
            errs.push(FieldError::invalid_str(&errors::child(p, "generateName"), generate_name, m));
        }
    }
    let name = str_field(meta, "name");
    if name.is_empty() {
        errs.push(FieldError::required(&errors::child(p, "name"), "name or generateName is required"));
    } else {
        for m in name_errors(rule, name, false) {
            errs.push(FieldError::invalid_str(&errors::child(p, "name"), name, m));
        }
    }
    let namespace = str_field(meta, "namespace");
    if namespaced {
        if !namespace.is_empty() {
            for m in is_dns1123_label(namespace) {
                errs.push(FieldError::invalid_str(&errors::child(p, "namespace"), namespace, m));
            }
        }
    } else if !namespace.is_empty() {
        errs.push(FieldError::forbidden(&errors::child(p, "namespace"), "not allowed on this type"));
    }
    if let Some(g) = meta.get("generation").and_then(Value::as_i64)
        && g < 0
    {
        errs.push(FieldError::invalid_json(
            &errors::child(p, "generation"),
            &Value::from(g),
            "must be greater than or equal to 0",
        ));
    }
    errs.extend(validate_labels(meta, &errors::child(p, "labels")));
    errs.extend(validate_annotations(meta, &errors::child(p, "annotations")));
    errs.extend(validate_owner_references(meta, &errors::child(p, "ownerReferences")));
    errs.extend(validate_finalizers(meta, &errors::child(p, "finalizers")));
    errs
}

fn validate_labels(meta: &Map<String, Value>, p: &FPath) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (k, v) in string_map(meta, "labels") {
        for m in is_label_key(&k) {
            errs.push(FieldError::invalid_str(p, &k, m));
        }
        for m in is_valid_label_value(&v) {
            errs.push(FieldError::invalid_str(p, &v, m));
        }
    }
    errs
}

fn validate_annotations(meta: &Map<String, Value>, p: &FPath) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let annotations = string_map(meta, "annotations");
    let mut total = 0usize;
    for (k, v) in &annotations {
        for m in is_qualified_name(&k.to_lowercase()) {
            errs.push(FieldError::invalid_str(p, k, m));
        }
        total += k.len() + v.len();
    }
    if total > 256 * 1024 {
        errs.push(FieldError::too_long(p, 256 * 1024));
    }
    errs
}

fn validate_finalizers(meta: &Map<String, Value>, p: &FPath) -> Vec<FieldError> {
    let finalizers: Vec<&str> = meta
        .get("finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut errs = Vec::new();
    for f in &finalizers {
        for m in is_qualified_name(f) {
            errs.push(FieldError::invalid_str(p, f, m));
        }
    }
    if finalizers.contains(&"orphan") && finalizers.contains(&"foregroundDeletion") {
        let list = finalizers.iter().map(|f| Value::String(f.to_string())).collect();
        errs.push(FieldError::invalid(
            p,
            BadValue::Json(Value::Array(list)),
            "finalizer orphan and foregroundDeletion cannot be both set",
        ));
    }
    errs
}

fn validate_owner_references(meta: &Map<String, Value>, p: &FPath) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let refs = meta.get("ownerReferences").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut controllers = 0;
    for r in &refs {
        let Some(r) = r.as_object() else { continue };
        let api_version = str_field(r, "apiVersion");
        let version = api_version.rsplit('/').next().unwrap_or("");
        if version.is_empty() {
            errs.push(FieldError::invalid_str(
                &errors::child(p, "apiVersion"),
                api_version,
                "version must not be empty",
            ));
        }
        for k in ["kind", "name", "uid"] {
            if str_field(r, k).is_empty() {
                errs.push(FieldError::invalid_str(&errors::child(p, k), "", "must not be empty"));
            }
        }
        if r.get("controller").and_then(Value::as_bool) == Some(true) {
            controllers += 1;
        }
    }
    if controllers > 1 {
        errs.push(FieldError::invalid(p, BadValue::Omit, "Only one reference can have Controller set to true"));
    }
    errs
}

/// `ValidateObjectMetaAccessorUpdate` (resourceVersion presence is the storage layer's business).
pub(crate) fn validate_object_meta_update(
    meta: &Map<String, Value>,
    old: &Map<String, Value>,
    p: &FPath,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let new_gen = meta.get("generation").and_then(Value::as_i64).unwrap_or(0);
    let old_gen = old.get("generation").and_then(Value::as_i64).unwrap_or(0);
    if new_gen < old_gen {
        errs.push(FieldError::invalid_json(
            &errors::child(p, "generation"),
            &Value::from(new_gen),
            "must not be decremented",
        ));
    }
    for k in ["name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"] {
        let n = meta.get(k).filter(|v| !v.is_null());
        let o = old.get(k).filter(|v| !v.is_null());
        if n != o {
            let bad = match n {
                Some(v) => BadValue::Json(v.clone()),
                None if matches!(k, "deletionTimestamp" | "deletionGracePeriodSeconds") => BadValue::Json(Value::Null),
                None if k == "creationTimestamp" => {
                    BadValue::Raw("v1.Time{Time:time.Date(1, time.January, 1, 0, 0, 0, 0, time.UTC)}".into())
                }
                None => BadValue::Json(Value::String(String::new())),
            };
            errs.push(FieldError::invalid(&errors::child(p, k), bad, "field is immutable"));
        }
    }
    if old.get("deletionTimestamp").is_some_and(|v| !v.is_null()) {
        let old_f: Vec<&Value> =
            old.get("finalizers").and_then(Value::as_array).map(|a| a.iter().collect()).unwrap_or_default();
        if let Some(new_f) = meta.get("finalizers").and_then(Value::as_array) {
            let added: Vec<String> =
                new_f.iter().filter(|f| !old_f.contains(f)).filter_map(|f| f.as_str().map(gofmt::quote)).collect();
            if !added.is_empty() {
                errs.push(FieldError::forbidden(
                    &errors::child(p, "finalizers"),
                    format!("no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}", added.join(", ")),
                ));
            }
        }
    }
    errs.extend(validate_labels(meta, &errors::child(p, "labels")));
    errs.extend(validate_annotations(meta, &errors::child(p, "annotations")));
    errs.extend(validate_owner_references(meta, &errors::child(p, "ownerReferences")));
    errs
}

/// The fields of ObjectMeta and their JSON kinds.
fn field_kind(k: &str) -> Option<&'static str> {
    Some(match k {
        "name" | "generateName" | "namespace" | "selfLink" | "uid" | "resourceVersion" => "string",
        "creationTimestamp" | "deletionTimestamp" => "time",
        "generation" | "deletionGracePeriodSeconds" => "int",
        "labels" | "annotations" => "stringmap",
        "finalizers" => "stringlist",
        "ownerReferences" | "managedFields" => "objectlist",
        _ => return None,
    })
}

/// Decodes `metadata` into ObjectMeta and back (`GetObjectMeta` + `SetObjectMeta`): unknown fields are
/// dropped (their paths returned), empty ones omitted, wrongly typed ones are an error.
pub(crate) fn coerce_meta(
    meta: &Value,
    p: &FPath,
    keep_null_creation: bool,
) -> Result<(Value, Vec<String>), FieldError> {
    let Some(m) = meta.as_object() else {
        return Err(FieldError::invalid_json(p, meta, "metadata must be an object"));
    };
    let mut out = Map::new();
    let mut unknown = Vec::new();
    for (k, v) in m {
        let Some(kind) = field_kind(k) else {
            unknown.push(errors::path_str(&errors::child(p, k)));
            continue;
        };
        let ok = match (kind, v) {
            (_, Value::Null) => true,
            ("string", Value::String(_)) => true,
            ("time", Value::String(s)) => chrono::DateTime::parse_from_rfc3339(s).is_ok(),
            ("int", Value::Number(n)) => n.as_i64().is_some() || n.as_f64().is_some_and(|f| f.fract() == 0.0),
            ("stringmap", Value::Object(o)) => o.values().all(|x| x.is_string() || x.is_null()),
            ("stringlist", Value::Array(a)) => a.iter().all(|x| x.is_string() || x.is_null()),
            ("objectlist", Value::Array(a)) => a.iter().all(|x| x.is_object() || x.is_null()),
            _ => false,
        };
        if !ok {
            let go_type = match kind {
                "string" => "string",
                "time" => "v1.Time",
                "int" => "int64",
                "stringmap" => "map[string]string",
                "stringlist" => "[]string",
                _ => "[]object",
            };
            return Err(FieldError::invalid_json(
                p,
                meta,
                format!(
                    "json: cannot unmarshal {} into Go struct field ObjectMeta.{k} of type {go_type}",
                    json_kind(v)
                ),
            ));
        }
        // omitempty: zero values vanish in the round trip.
        let empty = match v {
            Value::Null => true,
            Value::String(s) => s.is_empty(),
            Value::Number(n) => n.as_f64() == Some(0.0) && kind == "int" && k == "generation",
            Value::Object(o) => o.is_empty(),
            Value::Array(a) => a.is_empty(),
            Value::Bool(_) => false,
        };
        if !empty {
            let v = match (kind, v) {
                ("stringmap", Value::Object(o)) => Value::Object(
                    o.iter()
                        .map(|(k, x)| (k.clone(), Value::String(x.as_str().unwrap_or_default().to_string())))
                        .collect(),
                ),
                ("stringlist", Value::Array(a)) => {
                    Value::Array(a.iter().map(|x| Value::String(x.as_str().unwrap_or_default().to_string())).collect())
                }
                _ => v.clone(),
            };
            out.insert(k.clone(), v);
        }
    }
    if keep_null_creation && !out.contains_key("creationTimestamp") {
        out.insert("creationTimestamp".into(), Value::Null);
    }
    Ok((Value::Object(out), unknown))
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `schemaobjectmeta.Coerce` below the root: TypeMeta and ObjectMeta of embedded resources.
pub(crate) fn coerce_embedded(
    v: &mut Value,
    node: &Node,
    p: &FPath,
    unknown: &mut Vec<String>,
) -> Result<(), FieldError> {
    match v {
        Value::Object(map) => {
            if node.embedded {
                for k in ["apiVersion", "kind"] {
                    if let Some(x) = map.get(k)
                        && !x.is_string()
                    {
                        return Err(FieldError::invalid_json(&errors::child(p, k), x, "must be a string"));
                    }
                }
                if let Some(m) = map.get("metadata") {
                    let (coerced, u) = coerce_meta(m, &errors::child(p, "metadata"), false)?;
                    unknown.extend(u);
                    map.insert("metadata".into(), coerced);
                }
            }
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                let (child_node, child_path) = match node.properties.get(&k) {
                    Some(n) => (Some(n), errors::child(p, &k)),
                    None => (node.additional_schema(), errors::key(p, &k)),
                };
                if let (Some(n), Some(x)) = (child_node, map.get_mut(&k)) {
                    if node.embedded && k == "metadata" {
                        continue;
                    }
                    coerce_embedded(x, n, &child_path, unknown)?;
                }
            }
        }
        Value::Array(items) => {
            if let Some(n) = node.items.as_deref() {
                for (i, x) in items.iter_mut().enumerate() {
                    coerce_embedded(x, n, &errors::index(p, i), unknown)?;
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// `schemaobjectmeta.Validate(nil, obj, schema, false)`: checks embedded resources below the root.
pub(crate) fn validate_embedded(v: &Value, node: &Node, p: &FPath, errs: &mut Vec<FieldError>) {
    match v {
        Value::Object(map) => {
            if node.embedded {
                validate_embedded_resource(map, p, errs);
            }
            for (k, x) in map {
                if let Some(n) = node.properties.get(k) {
                    validate_embedded(x, n, &errors::child(p, k), errs);
                } else if let Some(n) = node.additional_schema() {
                    validate_embedded(x, n, &errors::key(p, k), errs);
                }
            }
        }
        Value::Array(items) => {
            if let Some(n) = node.items.as_deref() {
                for (i, x) in items.iter().enumerate() {
                    validate_embedded(x, n, &errors::index(p, i), errs);
                }
            }
        }
        _ => {}
    }
}

fn validate_embedded_resource(x: &Map<String, Value>, p: &FPath, errs: &mut Vec<FieldError>) {
    if !x.contains_key("apiVersion") {
        errs.push(FieldError::required(&errors::child(p, "apiVersion"), ""));
    }
    if !x.contains_key("kind") {
        errs.push(FieldError::required(&errors::child(p, "kind"), ""));
    }
    for (k, v) in x {
        match k.as_str() {
            "apiVersion" => match v.as_str() {
                None => errs.push(FieldError::invalid_json(&errors::child(p, "apiVersion"), v, "must be a string")),
                Some("") => errs.push(FieldError::required(&errors::child(p, "apiVersion"), "")),
                Some(av) if av != "/" && av.matches('/').count() > 1 => errs.push(FieldError::invalid_str(
                    &errors::child(p, "apiVersion"),
                    av,
                    format!("unexpected GroupVersion string: {av}"),
                )),
                Some(_) => {}
            },
            "kind" => match v.as_str() {
                None => errs.push(FieldError::invalid_json(&errors::child(p, "kind"), v, "must be a string")),
                Some("") => errs.push(FieldError::required(&errors::child(p, "kind"), "")),
                Some(kind) => {
                    let e = is_dns1035_label(&kind.to_lowercase());
                    if !e.is_empty() {
                        errs.push(FieldError::invalid_str(
                            &errors::child(p, "kind"),
                            kind,
                            format!("may have mixed case, but should otherwise match: {}", e.join(",")),
                        ));
                    }
                }
            },
            "metadata" => match v.as_object() {
                None => {
                    errs.push(FieldError::invalid_json(&errors::child(p, "metadata"), v, "metadata must be an object"))
                }
                Some(m) => {
                    let mut m = m.clone();
                    if str_field(&m, "name").is_empty() {
                        m.insert("name".into(), Value::String("fakename".into()));
                    }
                    let namespaced = !str_field(&m, "namespace").is_empty();
                    errs.extend(validate_object_meta(
                        &m,
                        namespaced,
                        NameRule::PathSegment,
                        &errors::child(p, "metadata"),
                    ));
                }
            },
            _ => {}
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_follow_dns_subdomain_rules() {
        let meta = json!({"name": "Bad_Name"});
        let errs =
            validate_object_meta(meta.as_object().unwrap(), true, NameRule::DnsSubdomain, &Some("metadata".into()));
        assert_eq!(
            errs[0].to_string(),
            r#"metadata.name: Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"#
        );
        let errs = validate_object_meta(&Map::new(), true, NameRule::DnsSubdomain, &Some("metadata".into()));
        assert_eq!(errs[0].to_string(), "metadata.name: Required value: name or generateName is required");
        let ok = json!({"generateName": "web-"});
        assert_eq!(
            validate_object_meta(ok.as_object().unwrap(), true, NameRule::DnsSubdomain, &Some("metadata".into())).len(),
            1,
            "generateName alone is fine for the prefix, the name is still required here"
        );
    }

    #[test]
    fn labels_are_checked() {
        let meta = json!({"name": "a", "labels": {"ok": "fine", "bad key!": "v", "k": "bad value"}});
        let errs =
            validate_object_meta(meta.as_object().unwrap(), true, NameRule::DnsSubdomain, &Some("metadata".into()));
        assert_eq!(errs.len(), 2);
        assert!(errs.iter().all(|e| e.field == "metadata.labels"));
    }

    #[test]
    fn metadata_round_trip_drops_unknown_and_empty_fields() {
        let (m, unknown) = coerce_meta(
            &json!({"name": "a", "labels": {}, "bogus": 1, "finalizers": []}),
            &Some("metadata".into()),
            true,
        )
        .unwrap();
        assert_eq!(m, json!({"name": "a", "creationTimestamp": null}));
        assert_eq!(unknown, vec!["metadata.bogus".to_string()]);
        assert!(coerce_meta(&json!({"labels": {"a": 1}}), &Some("metadata".into()), true).is_err());
    }
}
