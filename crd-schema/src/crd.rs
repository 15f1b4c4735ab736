//! What kube-apiserver checks about a version's schema when a CRD is created: the OpenAPI subset CRDs
//! accept, structural-schema invariants, list/map type extensions, defaults, and
//! `x-kubernetes-validations` (compilation, `oldSelf` correlatability, estimated cost).
//!
//! Owns: ports of `ValidateCustomResourceDefinitionOpenAPISchema`, `ValidateStructural`,
//! `ValidateDefaults` and the CEL cost limits, reporting field errors under
//! `spec.versions[i].schema.openAPIV3Schema`. Must not touch custom resource objects except defaults.

use serde_json::Value;

use super::cel;
use super::cost;
use super::errors::{self, BadValue, FPath, FieldError};
use super::meta;
use super::mutate;
use super::node::Node;
use super::openapi;

/// `StaticEstimatedCostLimit`: the largest estimated cost of one rule times its cardinality.
pub(crate) const STATIC_ESTIMATED_COST_LIMIT: u64 = 10_000_000;
/// `StaticEstimatedCRDCostLimit`: the largest total estimated cost of a schema's rules.
pub(crate) const STATIC_ESTIMATED_CRD_COST_LIMIT: u64 = 100_000_000;

const OPENAPI_V3_TYPES: &[&str] = &["array", "boolean", "integer", "number", "object", "string"];
const REASONS: &[&str] = &["FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired"];

/// Checks one version's `openAPIV3Schema` (raw JSON and its parsed form).
pub(crate) fn check(raw: &Value, root: &Node, base: &FPath) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if root.nullable {
        errs.push(FieldError::forbidden(&errors::child(base, "nullable"), "nullable cannot be true at the root"));
    }
    let mut structural = Vec::new();
    structural_invariants(raw, Level::Root, base, &mut structural);
    structural.sort_by_key(|e| e.to_string());
    let cel_enabled = if !structural.is_empty() {
        errs.extend(structural);
        false
    } else {
        let defaults = validate_defaults(root, base);
        let ok = defaults.is_empty();
        errs.extend(defaults);
        ok
    };
    let mut ctx = Ctx { cel_enabled, total: 0, most_expensive: Vec::new() };
    let mut schema_errs = Vec::new();
    let mut cel_errs = Vec::new();
    openapi_schema(
        raw,
        Some(root),
        base,
        &Opts {
            is_root: true,
            allow_defaults: true,
            disallow_reason: String::new(),
            inside_meta: false,
            forbid_old_self: None,
        },
        Some(1),
        &mut ctx,
        &mut schema_errs,
        &mut cel_errs,
    );
    errs.extend(schema_errs);
    errs.extend(cel_errs);
    if ctx.cel_enabled && ctx.total > STATIC_ESTIMATED_CRD_COST_LIMIT {
        for (p, _) in &ctx.most_expensive {
            errs.push(FieldError::forbidden(
                p,
                "contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema",
            ));
        }
        errs.push(FieldError::forbidden(
            base,
            cost_error_message(
                "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema",
                ctx.total,
                STATIC_ESTIMATED_CRD_COST_LIMIT,
            ),
        ));
    }
    errs
}

/// `getCostErrorMessage`.
pub(crate) fn cost_error_message(name: &str, cost: u64, limit: u64) -> String {
    let f = cost as f64 / limit as f64;
    let factor = if f > 100.0 {
        "more than 100x".to_string()
    } else if f < 1.5 {
        format!("{f:.6}x")
    } else {
        format!("{f:.1}x")
    };
    format!(
        "{name} exceeds budget by factor of {factor} (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"
    )
}

#[derive(Clone, Copy, PartialEq)]
enum Level {
    Root,
    Item,
    Field,
}

fn get<'a>(v: &'a Value, k: &str) -> Option<&'a Value> {
    v.get(k).filter(|x| !x.is_null())
}

fn str_of<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

fn flag(v: &Value, k: &str) -> bool {
    v.get(k).and_then(Value::as_bool).unwrap_or(false)
}

fn props(v: &Value) -> Vec<(&String, &Value)> {
    v.get("properties").and_then(Value::as_object).map(|m| m.iter().collect()).unwrap_or_default()
}

/// `validateStructuralInvariants` (plus the nested value-validation rules).
fn structural_invariants(s: &Value, lvl: Level, p: &FPath, errs: &mut Vec<FieldError>) {
    let ty = str_of(s, "type");
    let items = get(s, "items");
    if ty == "array" && items.is_none() {
        errs.push(FieldError::required(&errors::child(p, "items"), "must be specified"));
    }
    if let Some(i) = items.filter(|i| i.is_object()) {
        structural_invariants(i, Level::Item, &errors::child(p, "items"), errs);
    }
    for (k, v) in props(s) {
        structural_invariants(v, Level::Field, &errors::key(&errors::child(p, "properties"), k), errs);
    }
    if let Some(add) = get(s, "additionalProperties") {
        if lvl == Level::Root {
            errs.push(FieldError::forbidden(&errors::child(p, "additionalProperties"), "must not be used at the root"));
        }
        if add.is_object() {
            structural_invariants(add, Level::Field, &errors::child(p, "additionalProperties"), errs);
        }
    }
    let int_or_string = flag(s, "x-kubernetes-int-or-string");
    let preserve = flag(s, "x-kubernetes-preserve-unknown-fields");
    let embedded = flag(s, "x-kubernetes-embedded-resource");
    if int_or_string && preserve {
        errs.push(FieldError::invalid_json(
            &errors::child(p, "x-kubernetes-preserve-unknown-fields"),
            &Value::Bool(true),
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    if int_or_string && embedded {
        errs.push(FieldError::invalid_json(
            &errors::child(p, "x-kubernetes-embedded-resource"),
            &Value::Bool(true),
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    // The two int-or-string shapes may use `type` under anyOf.
    let int_or_string_any_of = |v: Option<&Value>| {
        v.and_then(Value::as_array).is_some_and(|a| {
            a.len() == 2
                && a[0].as_object().is_some_and(|o| o.len() == 1 && str_of(&a[0], "type") == "integer")
                && a[1].as_object().is_some_and(|o| o.len() == 1 && str_of(&a[1], "type") == "string")
        })
    };
    let skip_any_of = int_or_string_any_of(get(s, "anyOf"));
    let skip_first_all_of_any_of = get(s, "allOf")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .is_some_and(|f| int_or_string_any_of(get(f, "anyOf")));
    value_validation(s, skip_any_of, skip_first_all_of_any_of, p, errs);
    let check_metadata = lvl == Level::Root || embedded;
    if embedded && ty != "object" {
        if ty.is_empty() {
            errs.push(FieldError::required(
                &errors::child(p, "type"),
                "must be object if x-kubernetes-embedded-resource is true",
            ));
        } else {
            errs.push(FieldError::invalid_str(
                &errors::child(p, "type"),
                ty,
                "must be object if x-kubernetes-embedded-resource is true",
            ));
        }
    } else if ty.is_empty() && !int_or_string && !preserve {
        let detail = match lvl {
            Level::Root => "must not be empty at the root",
            Level::Item => "must not be empty for specified array items",
            Level::Field => "must not be empty for specified object fields",
        };
        errs.push(FieldError::required(&errors::child(p, "type"), detail));
    }
    if embedded && get(s, "additionalProperties").is_some() {
        errs.push(FieldError::forbidden(
            &errors::child(p, "additionalProperties"),
            "must not be used if x-kubernetes-embedded-resource is set",
        ));
    }
    if lvl == Level::Root && !ty.is_empty() && ty != "object" {
        errs.push(FieldError::invalid_str(&errors::child(p, "type"), ty, "must be object at the root"));
    }
    let pp = errors::child(p, "properties");
    for k in ["kind", "apiVersion"] {
        if let Some(x) = s.get("properties").and_then(|m| m.get(k))
            && check_metadata
            && str_of(x, "type") != "string"
        {
            errs.push(FieldError::invalid_str(
                &errors::child(&errors::key(&pp, k), "type"),
                str_of(x, "type"),
                "must be string",
            ));
        }
    }
    if let Some(m) = s.get("properties").and_then(|m| m.get("metadata")) {
        let mp = errors::key(&pp, "metadata");
        if check_metadata && str_of(m, "type") != "object" {
            errs.push(FieldError::invalid_str(&errors::child(&mp, "type"), str_of(m, "type"), "must be object"));
        }
        if lvl == Level::Root {
            let mut rest = m.as_object().cloned().unwrap_or_default();
            let names: Vec<String> = rest
                .get("properties")
                .and_then(Value::as_object)
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default();
            if !names.is_empty() && names.iter().all(|n| n == "name" || n == "generateName") {
                rest.remove("properties");
            }
            for k in ["type", "default", "description"] {
                rest.remove(k);
            }
            rest.retain(|_, v| !v.is_null());
            if !rest.is_empty() {
                errs.push(FieldError::forbidden(
                    &mp,
                    "must not specify anything other than name and generateName, but metadata is implicitly specified",
                ));
            }
        }
    }
    if embedded && !preserve && props(s).is_empty() {
        errs.push(FieldError::required(
            &errors::child(p, "properties"),
            "must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
        ));
    }
}

/// `validateValueValidation`: junctors may only restrict values, never add structure.
fn value_validation(
    s: &Value,
    skip_any_of: bool,
    skip_first_all_of_any_of: bool,
    p: &FPath,
    errs: &mut Vec<FieldError>,
) {
    let list = |k: &str| get(s, k).and_then(Value::as_array).cloned().unwrap_or_default();
    if !skip_any_of {
        for (i, x) in list("anyOf").iter().enumerate() {
            nested_value_validation(x, false, &errors::index(&errors::child(p, "anyOf"), i), errs);
        }
    }
    for (i, x) in list("allOf").iter().enumerate() {
        nested_value_validation(
            x,
            skip_first_all_of_any_of && i == 0,
            &errors::index(&errors::child(p, "allOf"), i),
            errs,
        );
    }
    for (i, x) in list("oneOf").iter().enumerate() {
        nested_value_validation(x, false, &errors::index(&errors::child(p, "oneOf"), i), errs);
    }
    if let Some(n) = get(s, "not") {
        nested_value_validation(n, false, &errors::child(p, "not"), errs);
    }
    if let Some(pat) = get(s, "pattern").and_then(Value::as_str).filter(|x| !x.is_empty())
        && let Err(e) = super::node::compile_go_regex(pat)
    {
        errs.push(FieldError::invalid_str(
            &errors::child(p, "pattern"),
            pat,
            format!("must be a valid regular expression, but isn't: {e}"),
        ));
    }
}

fn nested_value_validation(v: &Value, skip_any_of: bool, p: &FPath, errs: &mut Vec<FieldError>) {
    value_validation(v, skip_any_of, false, p, errs);
    if let Some(i) = get(v, "items") {
        nested_value_validation(i, false, &errors::child(p, "items"), errs);
    }
    for (k, x) in props(v) {
        nested_value_validation(x, false, &errors::key(&errors::child(p, "properties"), k), errs);
    }
    let forbid = |k: &str, detail: &str, errs: &mut Vec<FieldError>| {
        errs.push(FieldError::forbidden(&errors::child(p, k), detail))
    };
    if !str_of(v, "type").is_empty() {
        forbid("type", "must be empty to be structural", errs);
    }
    if get(v, "additionalProperties").is_some() {
        forbid("additionalProperties", "must be undefined to be structural", errs);
    }
    if get(v, "default").is_some() {
        forbid("default", "must be undefined to be structural", errs);
    }
    if !str_of(v, "title").is_empty() {
        forbid("title", "must be empty to be structural", errs);
    }
    if !str_of(v, "description").is_empty() {
        forbid("description", "must be empty to be structural", errs);
    }
    if flag(v, "nullable") {
        forbid("nullable", "must be false to be structural", errs);
    }
    if get(v, "externalDocs").is_some() {
        forbid("externalDocs", "must be undefined to be structural", errs);
    }
    for (k, d) in [
        ("x-kubernetes-preserve-unknown-fields", "must be false to be structural"),
        ("x-kubernetes-embedded-resource", "must be false to be structural"),
        ("x-kubernetes-int-or-string", "must be false to be structural"),
    ] {
        if flag(v, k) {
            forbid(k, d, errs);
        }
    }
    if get(v, "x-kubernetes-list-map-keys").and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
        forbid("x-kubernetes-list-map-keys", "must be empty to be structural", errs);
    }
    if get(v, "x-kubernetes-list-type").is_some() {
        forbid("x-kubernetes-list-type", "must be undefined to be structural", errs);
    }
    if get(v, "x-kubernetes-map-type").is_some() {
        forbid("x-kubernetes-map-type", "must be undefined to be structural", errs);
    }
    if get(v, "x-kubernetes-validations").and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
        forbid("x-kubernetes-validations", "must be empty to be structural", errs);
    }
    if v.get("properties").and_then(|m| m.get("metadata")).is_some() {
        errs.push(FieldError::forbidden(
            &errors::key(&errors::child(p, "properties"), "metadata"),
            "must not be specified in a nested context",
        ));
    }
}

/// `structuraldefaulting.ValidateDefaults`: each default must be pruned and valid against its schema
/// (OpenAPI, embedded metadata and rules). Defaults under `additionalProperties` are not followed.
fn validate_defaults(root: &Node, base: &FPath) -> Vec<FieldError> {
    let mut errs = Vec::new();
    defaults_at(root, base, true, &mut errs);
    errs
}

fn defaults_at(node: &Node, p: &FPath, resource_root: bool, errs: &mut Vec<FieldError>) {
    if let Some(d) = &node.default {
        let dp = errors::child(p, "default");
        let mut pruned = d.clone();
        mutate::prune(&mut pruned, node, node.embedded);
        if pruned != *d {
            errs.push(FieldError::invalid_json(&dp, d, "must not have unknown fields"));
        }
        let mut embedded_errs = Vec::new();
        meta::validate_embedded(d, node, &dp, &mut embedded_errs);
        if !embedded_errs.is_empty() {
            errs.extend(embedded_errs);
        } else {
            let oa = openapi::validate_at(node, d, &dp, None);
            if !oa.is_empty() {
                errs.extend(oa);
            } else {
                let mut warnings = Vec::new();
                let mut walk = cel::Walk { errors: errs, warnings: &mut warnings };
                cel::validate(
                    &mut walk,
                    node,
                    &dp,
                    d,
                    Some(d),
                    cel::Ratchet::NONE,
                    resource_root || node.embedded,
                    false,
                );
            }
        }
    }
    if let Some(i) = node.items.as_deref() {
        defaults_at(i, &errors::child(p, "items"), i.embedded, errs);
    }
    for (k, prop) in &node.properties {
        defaults_at(prop, &errors::key(&errors::child(p, "properties"), k), prop.embedded, errs);
    }
}

struct Opts {
    is_root: bool,
    allow_defaults: bool,
    disallow_reason: String,
    inside_meta: bool,
    /// The first ancestor under which `oldSelf` cannot be correlated.
    forbid_old_self: Option<String>,
}

impl Opts {
    fn sub(&self) -> Opts {
        Opts {
            is_root: false,
            allow_defaults: self.allow_defaults,
            disallow_reason: self.disallow_reason.clone(),
            inside_meta: self.inside_meta,
            forbid_old_self: self.forbid_old_self.clone(),
        }
    }

    fn forbid_defaults(mut self, reason: &str) -> Opts {
        self.allow_defaults = false;
        self.disallow_reason = reason.to_string();
        self
    }

    fn forbid_old_self(mut self, p: &FPath) -> Opts {
        if self.forbid_old_self.is_none() {
            self.forbid_old_self = Some(errors::path_str(p));
        }
        self
    }
}

struct Ctx {
    cel_enabled: bool,
    total: u64,
    most_expensive: Vec<(FPath, u64)>,
}

impl Ctx {
    fn observe(&mut self, p: FPath, cost: u64) {
        self.total = self.total.saturating_add(cost);
        if cost < STATIC_ESTIMATED_CRD_COST_LIMIT / 100 {
            return;
        }
        self.most_expensive.push((p, cost));
        self.most_expensive.sort_by_key(|e| std::cmp::Reverse(e.1));
        self.most_expensive.truncate(4);
    }
}

fn mul_card(card: Option<u64>, max: Option<i64>) -> Option<u64> {
    match (card, max) {
        (Some(c), Some(m)) => Some(c.saturating_mul(m.max(0) as u64)),
        _ => None,
    }
}

/// `ValidateCustomResourceDefinitionOpenAPISchema`: errors split into schema errors and CEL errors,
/// CEL being checked only where no schema error was found at or below the node.
#[allow(clippy::too_many_arguments)]
fn openapi_schema(
    s: &Value,
    node: Option<&Node>,
    p: &FPath,
    opts: &Opts,
    cardinality: Option<u64>,
    ctx: &mut Ctx,
    schema_errs: &mut Vec<FieldError>,
    cel_errs: &mut Vec<FieldError>,
) {
    let start = schema_errs.len();
    let ty = str_of(s, "type");
    // specStandardValidatorV3.validate
    if !ty.is_empty() && !OPENAPI_V3_TYPES.contains(&ty) {
        schema_errs.push(FieldError::not_supported(
            &errors::child(p, "type"),
            &Value::String(ty.into()),
            OPENAPI_V3_TYPES,
        ));
    }
    if get(s, "default").is_some() && !opts.allow_defaults {
        let mut detail = "must not be set".to_string();
        if !opts.disallow_reason.is_empty() {
            detail = format!("{detail} {}", opts.disallow_reason);
        }
        schema_errs.push(FieldError::forbidden(&errors::child(p, "default"), detail));
    }
    for (k, d) in [
        ("id", "id is not supported"),
        ("additionalItems", "additionalItems is not supported"),
        ("patternProperties", "patternProperties is not supported"),
        ("definitions", "definitions is not supported"),
        ("dependencies", "dependencies is not supported"),
        ("$ref", "$ref is not supported"),
    ] {
        let present = match get(s, k) {
            Some(Value::String(x)) => !x.is_empty(),
            Some(Value::Object(o)) => !o.is_empty(),
            Some(_) => true,
            None => false,
        };
        if present {
            schema_errs.push(FieldError::forbidden(&errors::child(p, k), d));
        }
    }
    if ty == "null" {
        schema_errs.push(FieldError::forbidden(
            &errors::child(p, "type"),
            "type cannot be set to null, use nullable as an alternative",
        ));
    }
    if get(s, "items").is_some_and(Value::is_array) {
        schema_errs
            .push(FieldError::forbidden(&errors::child(p, "items"), "items must be a schema object and not an array"));
    }
    if opts.inside_meta && flag(s, "x-kubernetes-embedded-resource") {
        schema_errs.push(FieldError::forbidden(
            &errors::child(p, "x-kubernetes-embedded-resource"),
            "must not be used inside of resource meta",
        ));
    }
    if flag(s, "uniqueItems") {
        schema_errs.push(FieldError::forbidden(
            &errors::child(p, "uniqueItems"),
            "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        ));
    }
    let has_props = !props(s).is_empty();
    if let Some(add) = get(s, "additionalProperties") {
        if has_props && (add.is_object() || add == &Value::Bool(false)) {
            schema_errs.push(FieldError::forbidden(
                &errors::child(p, "additionalProperties"),
                "additionalProperties and properties are mutual exclusive",
            ));
        }
        if add.is_object() {
            let mut sub = opts.sub();
            if opts.inside_meta {
                sub = sub.forbid_defaults("inside additionalProperties applying to object metadata");
            }
            let child = node.and_then(Node::additional_schema);
            let card = mul_card(cardinality, node.and_then(|n| n.max_properties));
            openapi_schema(
                add,
                child,
                &errors::child(p, "additionalProperties"),
                &sub,
                card,
                ctx,
                schema_errs,
                cel_errs,
            );
        }
    }
    let map_correlatable = matches!(str_of(s, "x-kubernetes-map-type"), "" | "granular" | "atomic");
    for (k, v) in props(s) {
        let mut sub = opts.sub();
        if !map_correlatable {
            sub = sub.forbid_old_self(p);
        }
        if (opts.is_root || flag(s, "x-kubernetes-embedded-resource"))
            && matches!(k.as_str(), "metadata" | "kind" | "apiVersion")
        {
            sub.inside_meta = true;
            if opts.is_root {
                sub = sub.forbid_defaults(&format!("in top-level {k}"));
            }
        }
        let child = node.and_then(|n| n.properties.get(k.as_str()));
        openapi_schema(
            v,
            child,
            &errors::key(&errors::child(p, "properties"), k),
            &sub,
            cardinality,
            ctx,
            schema_errs,
            cel_errs,
        );
    }
    let no_cel =
        |ctx: &mut Ctx| Ctx { cel_enabled: false, total: 0, most_expensive: std::mem::take(&mut ctx.most_expensive) };
    if let Some(n) = get(s, "not") {
        let mut c = no_cel(ctx);
        openapi_schema(n, None, &errors::child(p, "not"), &opts.sub(), None, &mut c, schema_errs, cel_errs);
        ctx.most_expensive = c.most_expensive;
    }
    for key in ["allOf", "oneOf", "anyOf"] {
        if let Some(list) = get(s, key).and_then(Value::as_array) {
            for (i, x) in list.iter().enumerate() {
                let mut c = no_cel(ctx);
                openapi_schema(
                    x,
                    None,
                    &errors::index(&errors::child(p, key), i),
                    &opts.sub(),
                    None,
                    &mut c,
                    schema_errs,
                    cel_errs,
                );
                ctx.most_expensive = c.most_expensive;
            }
        }
    }
    let list_type = get(s, "x-kubernetes-list-type").and_then(Value::as_str);
    if let Some(items) = get(s, "items").filter(|i| i.is_object()) {
        let mut sub = opts.sub();
        if list_type != Some("map") {
            sub = sub.forbid_old_self(p);
        }
        let child = node.and_then(|n| n.items.as_deref());
        let card = mul_card(cardinality, node.and_then(|n| n.max_items));
        openapi_schema(items, child, &errors::child(p, "items"), &sub, card, ctx, schema_errs, cel_errs);
    }
    if s.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(false)) {
        schema_errs.push(FieldError::invalid_json(
            &errors::child(p, "x-kubernetes-preserve-unknown-fields"),
            &Value::Bool(false),
            "must be true or undefined",
        ));
    }
    if let Some(mt) = get(s, "x-kubernetes-map-type").and_then(Value::as_str) {
        if ty != "object" {
            if ty.is_empty() {
                schema_errs.push(FieldError::required(
                    &errors::child(p, "type"),
                    "must be object if x-kubernetes-map-type is specified",
                ));
            } else {
                schema_errs.push(FieldError::invalid_str(
                    &errors::child(p, "type"),
                    ty,
                    "must be object if x-kubernetes-map-type is specified",
                ));
            }
        }
        if mt != "atomic" && mt != "granular" {
            schema_errs.push(FieldError::not_supported(
                &errors::child(p, "x-kubernetes-map-type"),
                &Value::String(mt.into()),
                &["atomic", "granular"],
            ));
        }
    }
    let items = get(s, "items").filter(|i| i.is_object());
    if let Some(lt) = list_type {
        if ty != "array" {
            if ty.is_empty() {
                schema_errs.push(FieldError::required(
                    &errors::child(p, "type"),
                    "must be array if x-kubernetes-list-type is specified",
                ));
            } else {
                schema_errs.push(FieldError::invalid_str(
                    &errors::child(p, "type"),
                    ty,
                    "must be array if x-kubernetes-list-type is specified",
                ));
            }
        } else if lt == "set"
            && let Some(is) = items
        {
            let ip = errors::child(p, "items");
            match str_of(is, "type") {
                "array" => {
                    let ilt = str_of(is, "x-kubernetes-list-type");
                    if !ilt.is_empty() && ilt != "atomic" {
                        schema_errs.push(FieldError::invalid_str(
                            &errors::child(&ip, "x-kubernetes-list-type"),
                            ilt,
                            "must be atomic as item of a list with x-kubernetes-list-type=set",
                        ));
                    }
                }
                "object" if str_of(is, "x-kubernetes-map-type") != "atomic" => {
                    schema_errs.push(FieldError::invalid(
                        &errors::child(&ip, "x-kubernetes-map-type"),
                        BadValue::Json(Value::Null),
                        "must be atomic as item of a list with x-kubernetes-list-type=set",
                    ));
                }
                _ => {}
            }
        }
        if !matches!(lt, "atomic" | "set" | "map") {
            schema_errs.push(FieldError::not_supported(
                &errors::child(p, "x-kubernetes-list-type"),
                &Value::String(lt.into()),
                &["atomic", "set", "map"],
            ));
        }
    }
    let map_keys: Vec<&str> = get(s, "x-kubernetes-list-map-keys")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let keys_value = || BadValue::Json(Value::Array(map_keys.iter().map(|k| Value::String(k.to_string())).collect()));
    if !map_keys.is_empty() {
        match list_type {
            None => schema_errs.push(FieldError::required(
                &errors::child(p, "x-kubernetes-list-type"),
                "must be map if x-kubernetes-list-map-keys is non-empty",
            )),
            Some(lt) if lt != "map" => schema_errs.push(FieldError::invalid_str(
                &errors::child(p, "x-kubernetes-list-type"),
                lt,
                "must be map if x-kubernetes-list-map-keys is non-empty",
            )),
            _ => {}
        }
    }
    if list_type == Some("map") {
        if map_keys.is_empty() {
            schema_errs.push(FieldError::required(
                &errors::child(p, "x-kubernetes-list-map-keys"),
                "must not be empty if x-kubernetes-list-type is map",
            ));
        }
        match items {
            None => schema_errs.push(FieldError::required(
                &errors::child(p, "items"),
                "must have a schema if x-kubernetes-list-type is map",
            )),
            Some(is) if str_of(is, "type") != "object" => schema_errs.push(FieldError::invalid_str(
                &errors::child(&errors::child(p, "items"), "type"),
                str_of(is, "type"),
                "must be object if parent array's x-kubernetes-list-type is map",
            )),
            Some(is) => {
                let mut seen = std::collections::BTreeSet::new();
                for k in &map_keys {
                    match is.get("properties").and_then(|m| m.get(*k)) {
                        Some(kp) => {
                            if matches!(str_of(kp, "type"), "array" | "object") {
                                let kpath = errors::child(
                                    &errors::key(&errors::child(&errors::child(p, "items"), "properties"), k),
                                    "type",
                                );
                                schema_errs.push(FieldError::invalid_str(
                                    &kpath,
                                    "object",
                                    "must be a scalar type if parent array's x-kubernetes-list-type is map",
                                ));
                            }
                        }
                        None => schema_errs.push(FieldError::invalid(
                            &errors::child(p, "x-kubernetes-list-map-keys"),
                            keys_value(),
                            "entries must all be names of item properties",
                        )),
                    }
                    if !seen.insert(*k) {
                        schema_errs.push(FieldError::invalid(
                            &errors::child(p, "x-kubernetes-list-map-keys"),
                            keys_value(),
                            "must not contain duplicate entries",
                        ));
                    }
                }
            }
        }
    }
    // validateMapListKeysMapSet
    if let (Some(lt @ ("set" | "map")), Some(is)) = (list_type, items) {
        let ip = errors::child(p, "items");
        if flag(is, "nullable") {
            schema_errs.push(FieldError::forbidden(
                &errors::child(&ip, "nullable"),
                format!("cannot be nullable when x-kubernetes-list-type is {lt}"),
            ));
        }
        if lt == "map" {
            let required: Vec<&str> = is
                .get("required")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for k in &map_keys {
                let Some(kp) = is.get("properties").and_then(|m| m.get(*k)) else { continue };
                let kpath = errors::key(&errors::child(&ip, "properties"), k);
                if !required.contains(k) && get(kp, "default").is_none() {
                    schema_errs.push(FieldError::required(&errors::child(&kpath, "default"), "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property"));
                }
                if flag(kp, "nullable") {
                    schema_errs.push(FieldError::forbidden(
                        &errors::child(&kpath, "nullable"),
                        "this property is in x-kubernetes-list-map-keys, so it cannot be nullable",
                    ));
                }
            }
        }
    }
    let rules = get(s, "x-kubernetes-validations").and_then(Value::as_array).cloned().unwrap_or_default();
    if rules.is_empty() {
        return;
    }
    let vp = errors::child(p, "x-kubernetes-validations");
    for (i, r) in rules.iter().enumerate() {
        let rp = errors::index(&vp, i);
        let rule = str_of(r, "rule");
        let msg = str_of(r, "message");
        let has_newline = |x: &str| x.contains('\n') || x.contains('\r');
        if rule.trim().is_empty() {
            schema_errs.push(FieldError::required(&errors::child(&rp, "rule"), "rule is not specified"));
        } else if !msg.is_empty() && msg.trim().is_empty() {
            schema_errs.push(FieldError::invalid_str(
                &errors::child(&rp, "message"),
                msg,
                "message must be non-empty if specified",
            ));
        } else if has_newline(msg.trim()) {
            schema_errs.push(FieldError::invalid_str(
                &errors::child(&rp, "message"),
                msg,
                "message must not contain line breaks",
            ));
        } else if has_newline(rule.trim()) && msg.trim().is_empty() {
            schema_errs.push(FieldError::required(
                &errors::child(&rp, "message"),
                "message must be specified if rule contains line breaks",
            ));
        }
        let me = str_of(r, "messageExpression");
        if !me.is_empty() && me.trim().is_empty() {
            schema_errs.push(FieldError::required(
                &errors::child(&rp, "messageExpression"),
                "messageExpression must be non-empty if specified",
            ));
        }
        if let Some(reason) = get(r, "reason").and_then(Value::as_str)
            && !REASONS.contains(&reason)
        {
            schema_errs.push(FieldError::not_supported(
                &errors::child(&rp, "reason"),
                &Value::String(reason.into()),
                REASONS,
            ));
        }
        let fp = str_of(r, "fieldPath");
        if !fp.is_empty() && fp.trim().is_empty() {
            schema_errs.push(FieldError::invalid_str(
                &errors::child(&rp, "fieldPath"),
                fp,
                "fieldPath must be non-empty if specified",
            ));
        }
        if has_newline(fp) {
            schema_errs.push(FieldError::invalid_str(
                &errors::child(&rp, "fieldPath"),
                fp,
                "fieldPath must not contain line breaks",
            ));
        }
        if !fp.is_empty() && node.is_some_and(|n| cel::normalize_field_path(fp, n).is_none()) {
            schema_errs.push(FieldError::invalid_str(&errors::child(&rp, "fieldPath"), fp, "must be a valid path"));
        }
    }
    // CEL compilation and cost, only for a clean subtree.
    let Some(node) = node else { return };
    if schema_errs.len() != start || !ctx.cel_enabled {
        return;
    }
    let resource = opts.is_root || node.embedded;
    let decl = cost::decl(node, resource);
    for (i, rule) in node.rules.iter().enumerate() {
        let rp = errors::index(&vp, i);
        let rule_path = errors::child(&rp, "rule");
        let expression_cost = |c: u64| match cardinality {
            Some(card) => c.saturating_mul(card),
            None => c.saturating_mul(decl.as_ref().map(|d| cost::max_cardinality(d.min_size)).unwrap_or(1)),
        };
        let undefined = match (&rule.program, &decl) {
            (Ok(p), Some(d)) => cost::undefined_field(p.expression(), d)
                .map(|f| format!("compilation failed: ERROR: <input>: {f}"))
                .or_else(|| {
                    cost::not_bool(p.expression(), d).then(|| "cel expression must evaluate to a bool".to_string())
                }),
            _ => None,
        };
        let rule_cost = match (&rule.program, &decl) {
            (Ok(p), Some(d)) if undefined.is_none() => cost::estimate(p.expression(), d).max,
            _ => 0,
        };
        let c = if rule_cost == 0 { 0 } else { expression_cost(rule_cost) };
        if c > STATIC_ESTIMATED_COST_LIMIT {
            cel_errs.push(FieldError::forbidden(
                &rule_path,
                cost_error_message("estimated rule cost", c, STATIC_ESTIMATED_COST_LIMIT),
            ));
        }
        ctx.observe(rule_path.clone(), c);
        match &rule.program {
            Err(detail) if rule.rule.trim().is_empty() => {
                cel_errs.push(FieldError::required(&rule_path, detail.to_string()));
            }
            Err(detail) => {
                cel_errs.push(FieldError::invalid(&rule_path, BadValue::Raw(rule.go_struct()), detail.to_string()));
            }
            Ok(_) => {
                if let Some(detail) = &undefined {
                    cel_errs.push(FieldError::invalid(&rule_path, BadValue::Raw(rule.go_struct()), detail.clone()));
                }
            }
        }
        match &rule.message_program {
            Some(Err(detail)) => {
                cel_errs.push(FieldError::invalid(
                    &errors::child(&rp, "messageExpression"),
                    BadValue::Raw(rule.go_struct()),
                    detail.to_string(),
                ));
            }
            Some(Ok(mp)) => {
                let mc = decl.as_ref().map(|d| cost::estimate(mp.expression(), d).max).unwrap_or(0);
                let mc = if mc == 0 { 0 } else { expression_cost(mc) };
                if mc > STATIC_ESTIMATED_COST_LIMIT {
                    cel_errs.push(FieldError::forbidden(
                        &errors::child(&rp, "messageExpression"),
                        cost_error_message("estimated messageExpression cost", mc, STATIC_ESTIMATED_COST_LIMIT),
                    ));
                }
                ctx.observe(errors::child(&rp, "messageExpression"), mc);
            }
            None => {}
        }
        if rule.uses_old_self {
            if let Some(up) = &opts.forbid_old_self {
                cel_errs.push(FieldError::invalid_str(
                    &rule_path,
                    &rule.rule,
                    format!("oldSelf cannot be used on the uncorrelatable portion of the schema within {up}"),
                ));
            }
        } else if let Some(b) = rule.optional_old_self
            && rule.program.is_ok()
        {
            cel_errs.push(FieldError::invalid_json(
                &errors::child(&rp, "optionalOldSelf"),
                &Value::Bool(b),
                "may not be set if oldSelf is not used in rule",
            ));
        }
    }
}
