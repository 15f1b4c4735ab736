//! `crd_schema`: what kube-apiserver (1.33+) does to a custom resource object on create and update,
//! given its `CustomResourceDefinition` and version. The schema layer of the in-process API emulator
//! (re-exported there as `sim::schema`), and what `karpenter-hub plan` checks manifests with before
//! its webhook rules: a crate of its own, so the hub's production code uses it without the emulator.
//!
//! Owns: compiling a CRD version ([`CrdSchema::compile`], with the apiserver's CRD-creation checks),
//! and admitting objects: metadata round trip, pruning, defaulting, the strategy's status/generation
//! handling, then validation (ObjectMeta, OpenAPI schema with ratcheting, scale paths, embedded
//! resources, list types, CEL rules) and the 422 it yields ([`Invalid`]).
//! Must not: depend on a crate of this workspace, or do storage concerns: names from
//! `generateName`, uid, resourceVersion, timestamps, namespace presence, conflict detection,
//! admission webhooks and field managers are the caller's.
//!
//! The pipeline follows apiextensions-apiserver: the decoder (`unstructuredSchemaCoercer.apply`,
//! then `unstructuredDefaulter`), `rest.BeforeCreate`/`BeforeUpdate`, and
//! `customResourceStrategy.Validate`/`ValidateUpdate`.

mod cel;
mod cost;
mod crd;
mod errors;
mod formats;
mod gofmt;
mod listtype;
mod meta;
mod mutate;
mod node;
mod openapi;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Map, Value};

use errors::{BadValue, ErrorType, FPath, FieldError};
pub use errors::{Cause, Invalid};
pub use formats::parse_go_duration;
use node::Node;

/// The scale subresource's paths (`.spec.replicas` style).
#[derive(Clone, Debug)]
struct Scale {
    spec_replicas_path: String,
    status_replicas_path: String,
    label_selector_path: Option<String>,
}

/// One version of a CRD, compiled for admitting objects: regexes and CEL programs are built once.
#[derive(Debug)]
pub struct CrdSchema {
    group: String,
    version: String,
    kind: String,
    namespaced: bool,
    status_subresource: bool,
    scale: Option<Scale>,
    root: Node,
}

/// An admitted object and the warnings the apiserver would return with it.
#[derive(Clone, Debug, PartialEq)]
pub struct Admission {
    /// The object as it would be stored.
    pub object: Value,
    /// `Warning` headers: dropped unknown fields (`unknown field "spec.foo"`, as with the default
    /// `fieldValidation=Warn`) and errors ratcheted on unchanged fields during an update.
    pub warnings: Vec<String>,
}

impl CrdSchema {
    /// Checks the CRD the way the apiserver does on CRD create: structural schema rules (every node
    /// typed unless x-kubernetes-int-or-string / x-kubernetes-preserve-unknown-fields, no
    /// `additionalProperties` together with `properties`, list-map keys required or defaulted and
    /// scalar, x-kubernetes-list-type values valid, defaults valid against their schema), every
    /// x-kubernetes-validations rule compiles, and no rule's estimated CEL cost exceeds the
    /// apiserver's limits. Errors are rendered like the apiserver's field errors.
    pub fn compile(crd: &CustomResourceDefinition, version: &str) -> Result<CrdSchema, Vec<String>> {
        let spec = &crd.spec;
        let Some((i, v)) = spec.versions.iter().enumerate().find(|(_, v)| v.name == version) else {
            return Err(vec![format!("spec.versions: Not found: {}", gofmt::quote(version))]);
        };
        let vpath: FPath = Some(format!("spec.versions[{i}]"));
        // The apiserver validates the internal CRD, where a schema shared by every version is hoisted
        // to `spec.validation` (always so with a single version): errors are reported there.
        let base = if spec.versions.iter().all(|x| x.schema == v.schema) {
            Some("spec.validation.openAPIV3Schema".to_string())
        } else {
            errors::child(&errors::child(&vpath, "schema"), "openAPIV3Schema")
        };
        let Some(schema) = v.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref()) else {
            return Err(vec![FieldError::required(&base, "schemas are required").to_string()]);
        };
        let raw = serde_json::to_value(schema).map_err(|e| vec![format!("{}: {e}", errors::path_str(&base))])?;
        let root = Node::parse(&raw);
        let errs = crd::check(&raw, &root, &base);
        if !errs.is_empty() {
            return Err(errs.iter().map(ToString::to_string).collect());
        }
        let subresources = v.subresources.as_ref();
        let scale = subresources.and_then(|s| s.scale.as_ref()).map(|s| Scale {
            spec_replicas_path: s.spec_replicas_path.clone(),
            status_replicas_path: s.status_replicas_path.clone(),
            label_selector_path: s.label_selector_path.clone(),
        });
        Ok(CrdSchema {
            group: spec.group.clone(),
            version: version.to_string(),
            kind: spec.names.kind.clone(),
            namespaced: spec.scope == "Namespaced",
            status_subresource: subresources.is_some_and(|s| s.status.is_some()),
            scale,
            root,
        })
    }

    /// `group/version` (or `version` for the core group).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }

    /// The resource's kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// Whether the resource is namespaced.
    pub fn namespaced(&self) -> bool {
        self.namespaced
    }

    /// The paths pruning would drop from `obj` (`spec.foo`, `metadata.bar`): what `fieldValidation=Strict`
    /// rejects as `strict decoding error: unknown field "spec.foo"` and `Warn` reports as warnings.
    pub fn unknown_fields(&self, obj: &Value) -> Vec<String> {
        let mut warnings = Vec::new();
        match self.decode(obj, &mut warnings) {
            Ok(_) => warnings.into_iter().filter_map(|w| unknown_field_path(&w)).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Create: defaulting (kube-apiserver applies `default` on read and on request), pruning of
    /// unknown fields (where x-kubernetes-preserve-unknown-fields is not set; metadata/apiVersion/kind
    /// kept), then validation. Returns the object as it would be stored.
    pub fn admit_create(&self, obj: &Value) -> Result<Value, Invalid> {
        self.create(obj).map(|a| a.object)
    }

    /// Update: same, plus transition rules (rules using `oldSelf`) evaluated against `old`, and
    /// validation ratcheting (errors on unchanged fields are not reported).
    pub fn admit_update(&self, obj: &Value, old: &Value) -> Result<Value, Invalid> {
        self.update(obj, old).map(|a| a.object)
    }

    /// [`CrdSchema::admit_create`] with the warnings.
    pub fn create(&self, obj: &Value) -> Result<Admission, Invalid> {
        let mut warnings = Vec::new();
        let mut obj = self.decode(obj, &mut warnings).map_err(|e| self.invalid(obj, vec![e]))?;
        self.ensure_namespace(&mut obj);
        // PrepareForCreate: status is the status subresource's; a new object is generation 1.
        if let Some(m) = obj.as_object_mut()
            && self.status_subresource
        {
            m.remove("status");
        }
        set_meta(&mut obj, "generation", Value::from(1));

        let mut errs = Vec::new();
        let type_errs = self.validate_type_meta(&obj);
        if type_errs.is_empty() {
            errs.extend(meta::validate_object_meta(
                &meta_map(&obj),
                self.namespaced,
                meta::NameRule::DnsSubdomain,
                &Some("metadata".into()),
            ));
            errs.extend(openapi::validate(&self.root, &obj, None));
            errs.extend(self.validate_scale(&obj, true));
        } else {
            errs.extend(type_errs);
        }
        meta::validate_embedded(&obj, &self.root, &None, &mut errs);
        errs.extend(listtype::validate(&self.root, &obj));
        self.validate_cel(&obj, None, &mut errs, &mut warnings);
        if !errs.is_empty() {
            return Err(self.invalid(&obj, errs));
        }
        Ok(Admission { object: obj, warnings })
    }

    /// [`CrdSchema::admit_update`] with the warnings.
    pub fn update(&self, obj: &Value, old: &Value) -> Result<Admission, Invalid> {
        let mut warnings = Vec::new();
        let mut obj = self.decode(obj, &mut warnings).map_err(|e| self.invalid(obj, vec![e]))?;
        // The old object is read from storage, which prunes and defaults it with the current schema too.
        let old = self.decode(old, &mut Vec::new()).unwrap_or_else(|_| old.clone());
        self.ensure_namespace(&mut obj);
        self.before_update(&mut obj, &old);

        let new_meta = meta_map(&obj);
        let old_meta = meta_map(&old);
        let mp: FPath = Some("metadata".into());
        // rest.BeforeUpdate's validateCommonFields.
        let mut errs = meta::validate_object_meta(&new_meta, self.namespaced, meta::NameRule::PathSegment, &mp);
        errs.extend(meta::validate_object_meta_update(&new_meta, &old_meta, &mp));
        // customResourceStrategy.ValidateUpdate.
        let type_errs = self.validate_type_meta(&obj);
        if type_errs.is_empty() {
            errs.extend(meta::validate_object_meta_update(&new_meta, &old_meta, &mp));
            errs.extend(openapi::validate(&self.root, &obj, Some(&old)));
            errs.extend(self.validate_scale(&obj, true));
        } else {
            errs.extend(type_errs);
        }
        meta::validate_embedded(&obj, &self.root, &None, &mut errs);
        // List-type invariants ratchet as a whole: they are only enforced if the old object met them.
        if listtype::validate(&self.root, &old).is_empty() {
            errs.extend(listtype::validate(&self.root, &obj));
        }
        self.validate_cel(&obj, Some(&old), &mut errs, &mut warnings);
        if !errs.is_empty() {
            return Err(self.invalid(&obj, errs));
        }
        Ok(Admission { object: obj, warnings })
    }

    /// The decoder: ObjectMeta round trip, pruning, non-nullable nulls, embedded TypeMeta/ObjectMeta
    /// coercion, then defaulting. Unknown fields become warnings.
    fn decode(&self, obj: &Value, warnings: &mut Vec<String>) -> Result<Value, FieldError> {
        let Value::Object(_) = obj else {
            return Err(FieldError::invalid_json(&None, obj, "object must be a JSON object"));
        };
        let mut obj = obj.clone();
        let mut unknown = Vec::new();
        let root_meta = match obj.get("metadata") {
            Some(m) => Some(meta::coerce_meta(m, &Some("metadata".into()), true)?),
            None => None,
        };
        unknown.extend(mutate::prune(&mut obj, &self.root, true));
        mutate::prune_nulls(&mut obj, Some(&self.root));
        if let Some(map) = obj.as_object_mut() {
            for k in ["apiVersion", "kind"] {
                if let Some(v) = map.get(k).filter(|v| !v.is_string()) {
                    return Err(FieldError::invalid_json(&Some(k.into()), v, "must be a string"));
                }
            }
            if let Some((m, u)) = root_meta {
                unknown.extend(u);
                map.insert("metadata".into(), m);
            }
        }
        // Embedded resources below the root (the root's metadata was handled above).
        let mut embedded_unknown = Vec::new();
        if let Value::Object(map) = &mut obj {
            for (k, v) in map.iter_mut() {
                if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                let (child, p) = match self.root.properties.get(k) {
                    Some(n) => (Some(n), errors::child(&None, k)),
                    None => (self.root.additional_schema(), errors::key(&None, k)),
                };
                if let Some(n) = child {
                    meta::coerce_embedded(v, n, &p, &mut embedded_unknown)?;
                }
            }
        }
        unknown.extend(embedded_unknown);
        mutate::default(&mut obj, &self.root);
        unknown.sort();
        warnings.extend(unknown.into_iter().map(|p| format!("unknown field {}", gofmt::quote(&p))));
        Ok(obj)
    }

    /// `EnsureObjectNamespaceMatchesRequestNamespace` for cluster-scoped resources: the namespace is cleared.
    fn ensure_namespace(&self, obj: &mut Value) {
        if !self.namespaced
            && let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut)
        {
            m.remove("namespace");
        }
    }

    /// `rest.BeforeUpdate` and `customResourceStrategy.PrepareForUpdate`.
    fn before_update(&self, obj: &mut Value, old: &Value) {
        let old_meta = meta_map(old);
        match old_meta.get("generation") {
            Some(g) => set_meta(obj, "generation", g.clone()),
            None => remove_meta(obj, "generation"),
        }
        let new_meta = meta_map(obj);
        if new_meta.get("uid").is_none_or(|u| u.as_str() == Some(""))
            && let Some(u) = old_meta.get("uid")
        {
            set_meta(obj, "uid", u.clone());
        }
        for k in ["creationTimestamp", "deletionTimestamp"] {
            if let Some(t) = old_meta.get(k).filter(|t| !t.is_null()) {
                set_meta(obj, k, t.clone());
            }
        }
        if new_meta.get("deletionGracePeriodSeconds").is_none()
            && let Some(g) = old_meta.get("deletionGracePeriodSeconds")
        {
            set_meta(obj, "deletionGracePeriodSeconds", g.clone());
        }
        if self.status_subresource
            && let Some(m) = obj.as_object_mut()
        {
            match old.get("status") {
                Some(s) => {
                    m.insert("status".into(), s.clone());
                }
                None => {
                    m.remove("status");
                }
            }
        }
        // Any change outside metadata bumps the generation.
        let strip = |v: &Value| -> Value {
            let mut m = v.as_object().cloned().unwrap_or_default();
            m.remove("metadata");
            Value::Object(m)
        };
        if strip(obj) != strip(old) {
            let g = old_meta.get("generation").and_then(Value::as_i64).unwrap_or(0);
            set_meta(obj, "generation", Value::from(g + 1));
        }
    }

    /// `customResourceValidator.ValidateTypeMeta`.
    fn validate_type_meta(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
        if kind != self.kind {
            errs.push(FieldError::invalid_str(&Some("kind".into()), kind, format!("must be {}", self.kind)));
        }
        let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        if api_version != self.api_version() {
            errs.push(FieldError::invalid_str(
                &Some("apiVersion".into()),
                api_version,
                format!("must be {}/{}", self.group, self.version),
            ));
        }
        errs
    }

    /// `ValidateScaleSpec` and `ValidateScaleStatus`.
    fn validate_scale(&self, obj: &Value, with_spec: bool) -> Vec<FieldError> {
        let Some(scale) = &self.scale else { return Vec::new() };
        let mut errs = Vec::new();
        let mut replicas = |path: &str| {
            let p: FPath = Some(path.to_string());
            match nested(obj, path) {
                None => {}
                Some(Value::Number(n)) if n.as_i64().is_some() => {
                    let r = n.as_i64().unwrap_or(0);
                    if r < 0 {
                        errs.push(FieldError::invalid_json(&p, &Value::from(r), "should be a non-negative integer"));
                    } else if r > i64::from(i32::MAX) {
                        errs.push(FieldError::invalid_json(
                            &p,
                            &Value::from(r),
                            format!("should be less than or equal to {}", i32::MAX),
                        ));
                    }
                }
                Some(v) => errs.push(FieldError::invalid_json(
                    &p,
                    &Value::from(0),
                    format!(
                        "{} accessor error: {} is of the type {}, expected int64",
                        path.trim_start_matches('.'),
                        gofmt::sharp_v(v),
                        go_type(v)
                    ),
                )),
            }
        };
        if with_spec {
            replicas(&scale.spec_replicas_path);
        }
        replicas(&scale.status_replicas_path);
        if let Some(sel) = &scale.label_selector_path
            && let Some(v) = nested(obj, sel).filter(|v| !v.is_string())
        {
            errs.push(FieldError::invalid_json(
                &Some(sel.clone()),
                &Value::String(String::new()),
                format!(
                    "{} accessor error: {} is of the type {}, expected string",
                    sel.trim_start_matches('.'),
                    gofmt::sharp_v(v),
                    go_type(v)
                ),
            ));
        }
        errs
    }

    /// `x-kubernetes-validations`, unless an error that makes rules meaningless was already found.
    fn validate_cel(&self, obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>, warnings: &mut Vec<String>) {
        if !self.root.has_rules() {
            return;
        }
        let blocking = errs.iter().any(|e| {
            matches!(
                e.ty,
                ErrorType::NotSupported
                    | ErrorType::Required
                    | ErrorType::TooLong
                    | ErrorType::TooMany
                    | ErrorType::TypeInvalid
            )
        });
        if blocking {
            errs.push(FieldError::invalid(
                &None,
                BadValue::Json(Value::Null),
                "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
            ));
            return;
        }
        let ratchet = match old {
            Some(o) => cel::Ratchet { current: Some((o, obj)), parent: None },
            None => cel::Ratchet::NONE,
        };
        let mut walk = cel::Walk { errors: errs, warnings };
        cel::validate(&mut walk, &self.root, &None, obj, old, ratchet, true, true);
    }

    fn invalid(&self, obj: &Value, errs: Vec<FieldError>) -> Invalid {
        // The Status names the kind the request's body declares (which may be the wrong one).
        let kind = obj.get("kind").and_then(Value::as_str).filter(|k| !k.is_empty()).unwrap_or(&self.kind);
        let qualified_kind = if self.group.is_empty() { kind.to_string() } else { format!("{kind}.{}", self.group) };
        let name =
            obj.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or_default().to_string();
        Invalid { qualified_kind, name, causes: errs.iter().map(FieldError::cause).collect() }
    }
}

fn unknown_field_path(warning: &str) -> Option<String> {
    let quoted = warning.strip_prefix("unknown field ")?;
    serde_json::from_str::<String>(quoted).ok()
}

fn meta_map(obj: &Value) -> Map<String, Value> {
    obj.get("metadata").and_then(Value::as_object).cloned().unwrap_or_default()
}

fn set_meta(obj: &mut Value, k: &str, v: Value) {
    if let Some(m) = obj.as_object_mut() {
        let meta = m.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
        if let Some(meta) = meta.as_object_mut() {
            meta.insert(k.to_string(), v);
        }
    }
}

fn remove_meta(obj: &mut Value, k: &str) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove(k);
    }
}

/// `unstructured.NestedFieldNoCopy` on a `.a.b` path.
fn nested<'v>(obj: &'v Value, path: &str) -> Option<&'v Value> {
    path.trim_start_matches('.').split('.').try_fold(obj, |v, k| v.get(k))
}

fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.as_i64().is_some() => "int64",
        Value::Number(_) => "float64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

#[cfg(test)]
mod tests;
