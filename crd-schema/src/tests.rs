//! End-to-end tests of `crd_schema` on small hand-written CRDs: each test states an apiserver
//! behaviour and the exact message kube-apiserver gives for it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

/// A namespaced `Widget` CRD (group example.com, version v1) whose root schema is `root`.
fn crd_with(root: Value, subresources: Value) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": root},
                "subresources": subresources
            }]
        }
    }))
    .unwrap()
}

fn spec_schema(spec: Value) -> Value {
    json!({"type": "object", "properties": {"spec": spec, "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}})
}

fn compile(spec: Value) -> CrdSchema {
    CrdSchema::compile(&crd_with(spec_schema(spec), json!({})), "v1").unwrap()
}

fn compile_err(spec: Value) -> Vec<String> {
    CrdSchema::compile(&crd_with(spec_schema(spec), json!({})), "v1").unwrap_err()
}

fn widget(spec: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "namespace": "default"}, "spec": spec})
}

fn rejected(s: &CrdSchema, spec: Value) -> String {
    s.admit_create(&widget(spec)).unwrap_err().to_string()
}

const PREFIX: &str = r#"Widget.example.com "w" is invalid: "#;

#[test]
fn defaults_are_applied_on_create() {
    let s = compile(json!({"type": "object", "properties": {
        "replicas": {"type": "integer", "default": 1},
        "policy": {"type": "object", "default": {}, "properties": {"mode": {"type": "string", "default": "WhenEmpty"}}},
        "items": {"type": "array", "items": {"type": "object", "properties": {"weight": {"type": "integer", "default": 10}}}}
    }}));
    let out = s.admit_create(&widget(json!({"items": [{}, {"weight": 3}]}))).unwrap();
    assert_eq!(
        out["spec"],
        json!({"replicas": 1, "policy": {"mode": "WhenEmpty"}, "items": [{"weight": 10}, {"weight": 3}]})
    );
    assert_eq!(out["metadata"]["generation"], json!(1));
}

#[test]
fn unknown_fields_are_pruned_and_warned() {
    let s = compile(json!({"type": "object", "properties": {"a": {"type": "string"}}}));
    let obj = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "bogus": true},
                     "spec": {"a": "x", "b": 1}, "extra": {}});
    let adm = s.create(&obj).unwrap();
    assert_eq!(adm.object["spec"], json!({"a": "x"}));
    assert!(adm.object.get("extra").is_none());
    assert!(adm.object["metadata"].get("bogus").is_none());
    assert_eq!(
        adm.warnings,
        vec![r#"unknown field "extra""#, r#"unknown field "metadata.bogus""#, r#"unknown field "spec.b""#]
    );
    assert_eq!(s.unknown_fields(&obj), vec!["extra", "metadata.bogus", "spec.b"]);
}

#[test]
fn preserve_unknown_fields_keeps_data() {
    let s = compile(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                           "properties": {"known": {"type": "object", "properties": {"x": {"type": "string"}}}}}));
    let out = s.admit_create(&widget(json!({"free": [1, {"a": 2}], "known": {"x": "y", "z": 1}}))).unwrap();
    assert_eq!(out["spec"], json!({"free": [1, {"a": 2}], "known": {"x": "y"}}), "known subtrees are still pruned");
}

#[test]
fn openapi_messages_match_the_apiserver() {
    let s = compile(json!({"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "maxLength": 5, "pattern": "^[a-z]+$"},
        "weight": {"type": "integer", "minimum": 1, "maximum": 100},
        "mode": {"type": "string", "enum": ["a", "b"]},
        "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}}
    }}));
    assert_eq!(
        rejected(&s, json!({"name": "abc", "weight": 0})),
        format!("{PREFIX}spec.weight: Invalid value: 0: spec.weight in body should be greater than or equal to 1")
    );
    assert_eq!(rejected(&s, json!({})), format!("{PREFIX}spec.name: Required value"));
    assert_eq!(
        rejected(&s, json!({"name": "toolong"})),
        format!("{PREFIX}spec.name: Too long: may not be more than 5 bytes")
    );
    assert_eq!(
        rejected(&s, json!({"name": "A1"})),
        format!("{PREFIX}spec.name: Invalid value: \"A1\": spec.name in body should match '^[a-z]+$'")
    );
    assert_eq!(
        rejected(&s, json!({"name": "a", "mode": "x"})),
        format!("{PREFIX}spec.mode: Unsupported value: \"x\": supported values: \"a\", \"b\"")
    );
    assert_eq!(
        rejected(&s, json!({"name": "a", "tags": ["x", "y", "z"]})),
        format!("{PREFIX}spec.tags: Too many: 3: must have at most 2 items")
    );
    let two = s.admit_create(&widget(json!({"name": "A1", "weight": 101}))).unwrap_err();
    assert_eq!(two.causes.len(), 2);
    assert_eq!(
        two.to_string(),
        format!(
            "{PREFIX}[spec.name: Invalid value: \"A1\": spec.name in body should match '^[a-z]+$', spec.weight: Invalid value: 101: spec.weight in body should be less than or equal to 100]"
        )
    );
    assert_eq!(
        two.causes[1],
        Cause {
            field: "spec.weight".into(),
            reason: "FieldValueInvalid".into(),
            message: "Invalid value: 101: spec.weight in body should be less than or equal to 100".into(),
        }
    );
}

#[test]
fn list_map_and_set_duplicates() {
    let s = compile(json!({"type": "object", "properties": {
        "items": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                  "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}, "v": {"type": "integer"}}}},
        "zones": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}
    }}));
    assert_eq!(
        rejected(&s, json!({"items": [{"name": "a"}, {"name": "b"}, {"name": "a", "v": 1}]})),
        format!("{PREFIX}spec.items[2]: Duplicate value: {{\"name\":\"a\"}}")
    );
    let err = s.admit_create(&widget(json!({"zones": ["x", "x"]}))).unwrap_err();
    assert_eq!(err.causes[0].reason, "FieldValueDuplicate");
    assert_eq!(err.to_string(), format!("{PREFIX}spec.zones[1]: Duplicate value: \"x\""));
}

#[test]
fn cel_message_field_path_reason_and_message_expression() {
    let s = compile(json!({"type": "object",
    "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}, "name": {"type": "string", "maxLength": 10}},
    "x-kubernetes-validations": [
        {"rule": "self.min <= self.max", "message": "min must not exceed max", "fieldPath": ".min"},
        {"rule": "self.max < 100"},
        {"rule": "self.name != 'forbidden'", "messageExpression": "'name ' + self.name + ' is reserved'", "reason": "FieldValueForbidden"}
    ]}));
    assert!(s.admit_create(&widget(json!({"min": 1, "max": 2, "name": "ok"}))).is_ok());
    assert_eq!(
        rejected(&s, json!({"min": 5, "max": 2, "name": "ok"})),
        format!("{PREFIX}spec.min: Invalid value: min must not exceed max")
    );
    assert_eq!(
        rejected(&s, json!({"min": 1, "max": 200, "name": "ok"})),
        format!("{PREFIX}spec: Invalid value: failed rule: self.max < 100")
    );
    let e = s.admit_create(&widget(json!({"min": 1, "max": 2, "name": "forbidden"}))).unwrap_err();
    assert_eq!(e.causes[0].reason, "FieldValueForbidden");
    assert_eq!(e.to_string(), format!("{PREFIX}spec: Forbidden: name forbidden is reserved"));
}

#[test]
fn cel_errors_on_map_entries_and_list_items_use_apiserver_paths() {
    let s = compile(json!({"type": "object", "properties": {
        "labels": {"type": "object", "maxProperties": 10, "additionalProperties": {"type": "string", "maxLength": 10,
            "x-kubernetes-validations": [{"rule": "self != 'bad'", "message": "no bad values"}]}},
        "list": {"type": "array", "maxItems": 10, "items": {"type": "integer", "x-kubernetes-validations": [{"rule": "self >= 0"}]}}
    }}));
    let e = s.admit_create(&widget(json!({"labels": {"k": "bad"}, "list": [1, -1]}))).unwrap_err();
    let fields: Vec<&str> = e.causes.iter().map(|c| c.field.as_str()).collect();
    assert_eq!(fields, vec!["spec.labels[k]", "spec.list[1]"]);
    assert_eq!(e.causes[1].message, "Invalid value: -1: failed rule: self >= 0");
}

#[test]
fn root_rules_report_a_nil_path() {
    let root = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {"a": {"type": "string"}}}},
                      "x-kubernetes-validations": [{"rule": "self.metadata.name.startsWith('w-')", "message": "name must start with w-"}]});
    let s = CrdSchema::compile(&crd_with(root, json!({})), "v1").unwrap();
    assert_eq!(
        s.admit_create(&widget(json!({}))).unwrap_err().to_string(),
        format!("{PREFIX}<nil>: Invalid value: name must start with w-")
    );
}

#[test]
fn transition_rules_enforce_immutability_on_update_only() {
    let s = compile(json!({"type": "object", "properties": {
        "clusterName": {"type": "string", "maxLength": 63, "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "clusterName is immutable"}]},
        "size": {"type": "integer"}
    }}));
    let created = s.admit_create(&widget(json!({"clusterName": "a", "size": 1}))).unwrap();
    assert_eq!(created["metadata"]["generation"], json!(1));
    let mut changed = created.clone();
    changed["spec"]["clusterName"] = json!("b");
    assert_eq!(
        s.admit_update(&changed, &created).unwrap_err().to_string(),
        format!("{PREFIX}spec.clusterName: Invalid value: \"b\": clusterName is immutable")
    );
    let mut resized = created.clone();
    resized["spec"]["size"] = json!(2);
    let updated = s.admit_update(&resized, &created).unwrap();
    assert_eq!(updated["metadata"]["generation"], json!(2), "a spec change bumps the generation");
    let mut relabelled = updated.clone();
    relabelled["metadata"]["labels"] = json!({"a": "b"});
    assert_eq!(s.admit_update(&relabelled, &updated).unwrap()["metadata"]["generation"], json!(2));
}

#[test]
fn optional_old_self_runs_on_create() {
    let s = compile(json!({"type": "object", "properties": {
        "v": {"type": "integer", "x-kubernetes-validations": [
            {"rule": "oldSelf.hasValue() ? self >= oldSelf.value() : self < 10", "optionalOldSelf": true, "message": "v may only grow, from below 10"}
        ]}
    }}));
    assert!(s.admit_create(&widget(json!({"v": 5}))).is_ok());
    assert!(s.admit_create(&widget(json!({"v": 50}))).is_err());
    let old = s.admit_create(&widget(json!({"v": 5}))).unwrap();
    let mut grown = old.clone();
    grown["spec"]["v"] = json!(50);
    assert!(s.admit_update(&grown, &old).is_ok());
    let mut shrunk = old.clone();
    shrunk["spec"]["v"] = json!(1);
    assert!(s.admit_update(&shrunk, &old).is_err());
}

#[test]
fn blocking_schema_errors_skip_cel() {
    let s = compile(
        json!({"type": "object", "required": ["a"], "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
                           "x-kubernetes-validations": [{"rule": "self.b > 0"}]}),
    );
    let e = s.admit_create(&widget(json!({"b": 0}))).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "{PREFIX}[spec.a: Required value, <nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation]"
        )
    );
}

#[test]
fn ratcheting_keeps_unchanged_invalid_fields() {
    let s = compile(json!({"type": "object", "properties": {
        "a": {"type": "string", "maxLength": 3},
        "b": {"type": "string", "maxLength": 3},
        "c": {"type": "integer", "x-kubernetes-validations": [{"rule": "self < 10"}]}
    }}));
    // Stored before the schema tightened.
    let old = json!({"apiVersion": "example.com/v1", "kind": "Widget",
                     "metadata": {"name": "w", "namespace": "default", "generation": 1, "resourceVersion": "1"},
                     "spec": {"a": "toolong", "b": "ok", "c": 50}});
    let mut new = old.clone();
    new["spec"]["b"] = json!("ok2");
    let adm = s.update(&new, &old).unwrap();
    assert_eq!(adm.warnings, vec![r#"spec.c: Invalid value: 50: failed rule: self < 10"#]);
    new["spec"]["b"] = json!("tooooo");
    let e = s.admit_update(&new, &old).unwrap_err();
    // A changed field is validated; being "Too long" it also keeps the rules from running.
    let fields: Vec<&str> = e.causes.iter().map(|c| c.field.as_str()).collect();
    assert_eq!(fields, vec!["spec.b", "<nil>"]);
}

#[test]
fn status_subresource_is_kept_out_of_the_main_resource() {
    let s = CrdSchema::compile(&crd_with(spec_schema(json!({"type": "object"})), json!({"status": {}})), "v1").unwrap();
    let mut obj = widget(json!({}));
    obj["status"] = json!({"ready": true});
    let created = s.admit_create(&obj).unwrap();
    assert!(created.get("status").is_none());
    let mut stored = created.clone();
    stored["status"] = json!({"ready": false});
    let mut update = stored.clone();
    update["status"] = json!({"ready": true});
    assert_eq!(s.admit_update(&update, &stored).unwrap()["status"], json!({"ready": false}));
}

#[test]
fn metadata_name_is_a_dns_subdomain() {
    let s = compile(json!({"type": "object"}));
    let mut obj = widget(json!({}));
    obj["metadata"]["name"] = json!("Not_Valid");
    let e = s.admit_create(&obj).unwrap_err();
    assert_eq!(e.name, "Not_Valid");
    assert_eq!(e.causes[0].field, "metadata.name");
    assert!(e.causes[0].message.starts_with("Invalid value: \"Not_Valid\": a lowercase RFC 1123 subdomain"));
    obj["metadata"] = json!({"namespace": "default"});
    assert_eq!(
        s.admit_create(&obj).unwrap_err().to_string(),
        r#"Widget.example.com "" is invalid: metadata.name: Required value: name or generateName is required"#
    );
}

#[test]
fn kind_and_api_version_must_match() {
    let s = compile(json!({"type": "object"}));
    let mut obj = widget(json!({}));
    obj["kind"] = json!("Gadget");
    assert_eq!(
        s.admit_create(&obj).unwrap_err().to_string(),
        // The Status names the kind the body declares (as kube-apiserver 1.36 answers).
        r#"Gadget.example.com "w" is invalid: kind: Invalid value: "Gadget": must be Widget"#
    );
}

#[test]
fn embedded_resources_keep_and_check_their_metadata() {
    let s = compile(json!({"type": "object", "properties": {
        "template": {"type": "object", "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true}
    }}));
    let out = s
        .admit_create(&widget(
            json!({"template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "junk": 1}, "spec": {}}}),
        ))
        .unwrap();
    assert_eq!(out["spec"]["template"]["metadata"], json!({"name": "p"}));
    assert_eq!(
        rejected(&s, json!({"template": {"spec": {}}})),
        format!("{PREFIX}[spec.template.apiVersion: Required value, spec.template.kind: Required value]")
    );
}

#[test]
fn int_or_string_and_nullable() {
    let s = compile(json!({"type": "object", "properties": {
        "q": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
        "n": {"type": "string", "nullable": true},
        "s": {"type": "string"}
    }}));
    let out = s.admit_create(&widget(json!({"q": "1Gi", "n": null, "s": null}))).unwrap();
    assert_eq!(out["spec"], json!({"q": "1Gi", "n": null}), "non-nullable nulls are dropped, nullable ones kept");
    assert!(s.admit_create(&widget(json!({"q": 3}))).is_ok());
}

#[test]
fn cluster_scoped_resources_lose_their_namespace() {
    let mut crd = crd_with(spec_schema(json!({"type": "object"})), json!({}));
    crd.spec.scope = "Cluster".into();
    let s = CrdSchema::compile(&crd, "v1").unwrap();
    assert!(!s.namespaced());
    let out = s.admit_create(&widget(json!({}))).unwrap();
    assert!(out["metadata"].get("namespace").is_none());
}

#[test]
fn compile_rejects_uncompilable_rules() {
    let errs = compile_err(json!({"type": "object", "x-kubernetes-validations": [{"rule": "self.a >"}]}));
    assert_eq!(errs.len(), 1);
    assert!(
        errs[0].starts_with("spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Invalid value: {\"Rule\":\"self.a \\u003e\""),
        "{errs:?}"
    );
    assert!(errs[0].contains("compilation failed"));
    let errs = compile_err(json!({"type": "object", "x-kubernetes-validations": [{"rule": "unknownVar == 1"}]}));
    assert!(errs[0].contains("undeclared reference to 'unknownVar'"), "{errs:?}");
}

#[test]
fn compile_rejects_expensive_rules() {
    let errs = compile_err(json!({"type": "object", "properties": {
        "names": {"type": "array", "items": {"type": "string"}}
    }, "x-kubernetes-validations": [{"rule": "self.names.all(a, self.names.all(b, a == b || !a.contains(b)))"}]}));
    assert!(
        errs.iter().any(|e| e.ends_with("x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)")),
        "{errs:?}"
    );
    // Bounded, the same rule is accepted.
    compile(json!({"type": "object", "properties": {
        "names": {"type": "array", "maxItems": 10, "items": {"type": "string", "maxLength": 20}}
    }, "x-kubernetes-validations": [{"rule": "self.names.all(a, self.names.all(b, a == b || !a.contains(b)))"}]}));
}

#[test]
fn compile_checks_structural_rules() {
    let errs = compile_err(json!({"type": "object", "properties": {"untyped": {}}}));
    assert_eq!(
        errs,
        vec![
            "spec.validation.openAPIV3Schema.properties[spec].properties[untyped].type: Required value: must not be empty for specified object fields"
        ]
    );
    let errs = compile_err(
        json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "string"}}),
    );
    assert_eq!(
        errs,
        vec![
            "spec.validation.openAPIV3Schema.properties[spec].additionalProperties: Forbidden: additionalProperties and properties are mutual exclusive"
        ]
    );
    let errs = compile_err(
        json!({"type": "object", "properties": {"l": {"type": "array", "x-kubernetes-list-type": "bag", "items": {"type": "string"}}}}),
    );
    assert_eq!(
        errs,
        vec![
            r#"spec.validation.openAPIV3Schema.properties[spec].properties[l].x-kubernetes-list-type: Unsupported value: "bag": supported values: "atomic", "set", "map""#
        ]
    );
    let errs = compile_err(
        json!({"type": "object", "properties": {"l": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
        "items": {"type": "object", "properties": {"name": {"type": "string"}}}}}}),
    );
    assert_eq!(
        errs,
        vec![
            "spec.validation.openAPIV3Schema.properties[spec].properties[l].items.properties[name].default: Required value: this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property"
        ]
    );
    let errs = compile_err(
        json!({"type": "object", "properties": {"l": {"type": "array", "uniqueItems": true, "items": {"type": "string"}}}}),
    );
    assert_eq!(
        errs,
        vec![
            "spec.validation.openAPIV3Schema.properties[spec].properties[l].uniqueItems: Forbidden: uniqueItems cannot be set to true since the runtime complexity becomes quadratic"
        ]
    );
}

#[test]
fn compile_validates_defaults() {
    let errs =
        compile_err(json!({"type": "object", "properties": {"w": {"type": "integer", "minimum": 1, "default": 0}}}));
    // The default is validated with a validator rooted at "", hence the nameless " in body".
    assert_eq!(
        errs,
        vec![
            "spec.validation.openAPIV3Schema.properties[spec].properties[w].default: Invalid value: 0:  in body should be greater than or equal to 1"
        ]
    );
    let errs = compile_err(
        json!({"type": "object", "properties": {"o": {"type": "object", "default": {"x": 1}, "properties": {"y": {"type": "integer"}}}}}),
    );
    assert_eq!(
        errs,
        vec![
            r#"spec.validation.openAPIV3Schema.properties[spec].properties[o].default: Invalid value: {"x":1}: must not have unknown fields"#
        ]
    );
}

#[test]
fn compile_forbids_transition_rules_on_uncorrelatable_items() {
    let errs = compile_err(json!({"type": "object", "properties": {"l": {"type": "array", "maxItems": 5,
        "items": {"type": "string", "maxLength": 5, "x-kubernetes-validations": [{"rule": "self == oldSelf"}]}}}}));
    assert_eq!(
        errs,
        vec![
            r#"spec.validation.openAPIV3Schema.properties[spec].properties[l].items.x-kubernetes-validations[0].rule: Invalid value: "self == oldSelf": oldSelf cannot be used on the uncorrelatable portion of the schema within spec.validation.openAPIV3Schema.properties[spec].properties[l]"#
        ]
    );
}

#[test]
fn unknown_version_is_an_error() {
    assert!(CrdSchema::compile(&crd_with(spec_schema(json!({"type": "object"})), json!({})), "v2").is_err());
}

#[test]
fn compiled_schemas_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CrdSchema>();
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        "[a-zA-Z0-9 ._/-]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("spec".to_string()),
                    Just("metadata".to_string()),
                    Just("name".to_string()),
                    Just("items".to_string()),
                    Just("labels".to_string()),
                    "[a-z]{1,6}"
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn rich_schema() -> CrdSchema {
    compile(json!({"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "maxLength": 8, "pattern": "^[a-z]+$", "default": "x"},
        "items": {"type": "array", "maxItems": 4, "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                  "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string", "maxLength": 5}, "n": {"type": "number", "minimum": 0}},
                            "x-kubernetes-validations": [{"rule": "!has(self.n) || self.n < 100", "messageExpression": "self.n > 1000 ? 'n is far too large' : 'n is too large'"}]}},
        "labels": {"type": "object", "maxProperties": 4, "additionalProperties": {"type": "string", "maxLength": 5}},
        "when": {"type": "string", "format": "date-time"},
        "q": {"x-kubernetes-int-or-string": true},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
    }, "x-kubernetes-validations": [{"rule": "self.name.size() > 0 && (!has(self.labels) || self.labels.all(k, k.size() < 5))"}]}))
}

proptest! {
    #[test]
    fn arbitrary_json_never_panics(v in arb_json(), spec in arb_json()) {
        let s = rich_schema();
        let _ = s.admit_create(&v);
        let obj = widget(spec);
        let created = s.admit_create(&obj);
        let _ = s.admit_update(&obj, &v);
        if let Ok(c) = created {
            let _ = s.admit_update(&c, &c);
        }
    }
}
