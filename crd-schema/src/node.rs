//! The compiled form of one version's `openAPIV3Schema`: a tree of [`Node`]s with regexes and CEL
//! programs compiled once.
//!
//! Owns: reading a `JSONSchemaProps` (as JSON) into nodes, the format stripping the apiserver applies
//! (`StripUnsupportedFormatsPostProcess`), and the Go-RE2-to-Rust regex translation. Must not
//! validate objects or the CRD (see `openapi`, `crd`); parsing never fails, problems are found by `crd`.

use std::collections::BTreeMap;

use serde_json::Value;

use super::cel::Rule;

/// `additionalProperties`: a bool or a schema.
#[derive(Debug)]
pub(crate) enum Additional {
    Bool(bool),
    Schema(Box<Node>),
}

/// A `pattern`, compiled with Go RE2 semantics where Rust's `regex` differs.
#[derive(Debug)]
pub(crate) struct Pattern {
    pub src: String,
    pub re: Result<regex::Regex, regex::Error>,
}

/// One schema node. Field names follow the OpenAPI keywords.
#[derive(Debug, Default)]
pub(crate) struct Node {
    /// `type` as written ("" when absent).
    pub ty: String,
    /// The type list kube-openapi checks: `[type]`, `["integer","string"]` for int-or-string, or empty.
    pub types: Vec<String>,
    pub nullable: bool,
    /// `format` after the apiserver strips formats it does not support for the type.
    pub format: String,
    /// `format` as written (CEL typing uses it).
    pub raw_format: String,
    pub properties: BTreeMap<String, Node>,
    pub additional: Option<Additional>,
    pub items: Option<Box<Node>>,
    pub required: Vec<String>,
    pub enum_values: Option<Vec<Value>>,
    pub pattern: Option<Pattern>,
    pub max_length: Option<i64>,
    pub min_length: Option<i64>,
    pub maximum: Option<f64>,
    pub minimum: Option<f64>,
    pub exclusive_maximum: bool,
    pub exclusive_minimum: bool,
    pub multiple_of: Option<f64>,
    pub max_items: Option<i64>,
    pub min_items: Option<i64>,
    pub max_properties: Option<i64>,
    pub min_properties: Option<i64>,
    pub unique_items: bool,
    pub all_of: Vec<Node>,
    pub any_of: Vec<Node>,
    pub one_of: Vec<Node>,
    pub not: Option<Box<Node>>,
    pub default: Option<Value>,
    pub preserve_unknown: bool,
    pub int_or_string: bool,
    pub embedded: bool,
    pub list_type: Option<String>,
    pub list_map_keys: Vec<String>,
    pub map_type: Option<String>,
    pub rules: Vec<Rule>,
    /// Whether this node or one below it (allOf excluded) has rules; cached because the CEL walk asks
    /// at every node.
    pub subtree_rules: bool,
}

/// String formats kube-apiserver validates in CRD schemas (normalized without `-`), as of 1.33.
const STRING_FORMATS: &[&str] = &[
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
];

fn int(v: &Value, k: &str) -> Option<i64> {
    v.get(k).and_then(|x| x.as_i64().or_else(|| x.as_f64().map(|f| f as i64)))
}

fn float(v: &Value, k: &str) -> Option<f64> {
    v.get(k).and_then(Value::as_f64)
}

fn boolean(v: &Value, k: &str) -> bool {
    v.get(k).and_then(Value::as_bool).unwrap_or(false)
}

fn string(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_str).unwrap_or_default().to_string()
}

fn nodes(v: &Value, k: &str) -> Vec<Node> {
    v.get(k).and_then(Value::as_array).map(|a| a.iter().map(Node::parse).collect()).unwrap_or_default()
}

impl Node {
    /// Reads a schema given as JSON (a serialized `JSONSchemaProps`).
    pub(crate) fn parse(v: &Value) -> Node {
        let ty = string(v, "type");
        let int_or_string = boolean(v, "x-kubernetes-int-or-string");
        let types = if int_or_string {
            vec!["integer".to_string(), "string".to_string()]
        } else if ty.is_empty() {
            Vec::new()
        } else {
            vec![ty.clone()]
        };
        let raw_format = string(v, "format");
        let format = strip_format(&ty, &raw_format);
        let additional = match v.get("additionalProperties") {
            Some(Value::Bool(b)) => Some(Additional::Bool(*b)),
            Some(s @ Value::Object(_)) => Some(Additional::Schema(Box::new(Node::parse(s)))),
            _ => None,
        };
        let items = match v.get("items") {
            Some(s @ Value::Object(_)) => Some(Box::new(Node::parse(s))),
            _ => None,
        };
        let properties = v
            .get("properties")
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, s)| (k.clone(), Node::parse(s))).collect())
            .unwrap_or_default();
        let pattern = v
            .get("pattern")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
            .map(|p| Pattern { src: p.to_string(), re: compile_go_regex(p) });
        let rules = v
            .get("x-kubernetes-validations")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(Rule::compile).collect())
            .unwrap_or_default();
        let mut node = Node {
            ty,
            types,
            nullable: boolean(v, "nullable"),
            format,
            raw_format,
            properties,
            additional,
            items,
            required: v
                .get("required")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
                .unwrap_or_default(),
            enum_values: v.get("enum").and_then(Value::as_array).cloned(),
            pattern,
            max_length: int(v, "maxLength"),
            min_length: int(v, "minLength"),
            maximum: float(v, "maximum"),
            minimum: float(v, "minimum"),
            exclusive_maximum: boolean(v, "exclusiveMaximum"),
            exclusive_minimum: boolean(v, "exclusiveMinimum"),
            multiple_of: float(v, "multipleOf"),
            max_items: int(v, "maxItems"),
            min_items: int(v, "minItems"),
            max_properties: int(v, "maxProperties"),
            min_properties: int(v, "minProperties"),
            unique_items: boolean(v, "uniqueItems"),
            all_of: nodes(v, "allOf"),
            any_of: nodes(v, "anyOf"),
            one_of: nodes(v, "oneOf"),
            not: v.get("not").filter(|n| n.is_object()).map(|n| Box::new(Node::parse(n))),
            default: v.get("default").filter(|d| !d.is_null()).cloned(),
            preserve_unknown: boolean(v, "x-kubernetes-preserve-unknown-fields"),
            int_or_string,
            embedded: boolean(v, "x-kubernetes-embedded-resource"),
            list_type: v.get("x-kubernetes-list-type").and_then(Value::as_str).map(str::to_string),
            list_map_keys: v
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
                .unwrap_or_default(),
            map_type: v.get("x-kubernetes-map-type").and_then(Value::as_str).map(str::to_string),
            rules,
            subtree_rules: false,
        };
        node.subtree_rules = !node.rules.is_empty()
            || node.items.as_ref().is_some_and(|i| i.subtree_rules)
            || node.additional_schema().is_some_and(|a| a.subtree_rules)
            || node.properties.values().any(|p| p.subtree_rules);
        node
    }

    /// The schema for `additionalProperties`, when it is a schema.
    pub(crate) fn additional_schema(&self) -> Option<&Node> {
        match &self.additional {
            Some(Additional::Schema(s)) => Some(s),
            _ => None,
        }
    }

    /// The schema applying to key `k` of an object: its property, else `additionalProperties`.
    pub(crate) fn field(&self, k: &str) -> Option<&Node> {
        self.properties.get(k).or_else(|| self.additional_schema())
    }

    /// Whether any node at or below this one has `x-kubernetes-validations` (allOf excluded, as in the apiserver).
    pub(crate) fn has_rules(&self) -> bool {
        self.subtree_rules
    }
}

/// `StripUnsupportedFormatsPostProcess`: formats the apiserver does not know are ignored.
fn strip_format(ty: &str, format: &str) -> String {
    if format.is_empty() {
        return String::new();
    }
    let keep = match ty {
        "" | "string" => STRING_FORMATS.contains(&format.replace('-', "").as_str()),
        "integer" => format == "int32" || format == "int64",
        "number" => format == "float" || format == "double",
        _ => false,
    };
    if keep { format.to_string() } else { String::new() }
}

/// Compiles a Go RE2 pattern. Go's `\d`, `\w`, `\s` and `\b` are ASCII-only, Rust's are Unicode, so
/// those are rewritten to their ASCII forms; everything else in RE2 syntax means the same in `regex`.
pub(crate) fn compile_go_regex(pattern: &str) -> Result<regex::Regex, regex::Error> {
    regex::Regex::new(&translate_go_regex(pattern))
}

fn translate_go_regex(p: &str) -> String {
    let mut out = String::with_capacity(p.len() + 8);
    let mut chars = p.chars().peekable();
    let mut in_class = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e) => {
                    let rewritten = match (in_class, e) {
                        (false, 'd' | 'D' | 'w' | 'W' | 's' | 'S' | 'b' | 'B') => Some(format!("(?-u:\\{e})")),
                        (true, 'd') => Some("0-9".to_string()),
                        (true, 'w') => Some("0-9A-Za-z_".to_string()),
                        (true, 's') => Some("\\t\\n\\x0C\\r ".to_string()),
                        _ => None,
                    };
                    match rewritten {
                        Some(r) => out.push_str(&r),
                        None => {
                            out.push('\\');
                            out.push(e);
                        }
                    }
                }
                None => out.push('\\'),
            },
            '[' if !in_class => {
                in_class = true;
                out.push('[');
                // A leading `^` and a leading `]` belong to the class syntax, not its end.
                if chars.peek() == Some(&'^') {
                    out.push('^');
                    chars.next();
                }
                if chars.peek() == Some(&']') {
                    out.push_str("\\]");
                    chars.next();
                }
            }
            '[' if in_class => {
                // `[:alpha:]` inside a class, or a literal `[`.
                if chars.peek() == Some(&':') {
                    out.push('[');
                    for d in chars.by_ref() {
                        out.push(d);
                        if d == ']' {
                            break;
                        }
                    }
                } else {
                    out.push_str("\\[");
                }
            }
            ']' if in_class => {
                in_class = false;
                out.push(']');
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn go_perl_classes_are_ascii() {
        let re = compile_go_regex(r"^\d+$").unwrap();
        assert!(re.is_match("123"));
        assert!(!re.is_match("١٢٣"), "Arabic-Indic digits are not \\d in Go");
        let re = compile_go_regex(r"^[\w.-]+$").unwrap();
        assert!(re.is_match("a_b.c-d"));
        assert!(!re.is_match("é"));
        assert!(compile_go_regex(r"^[^\]]+$").unwrap().is_match("abc"));
    }

    #[test]
    fn unsupported_formats_are_stripped() {
        assert_eq!(strip_format("string", "date-time"), "date-time");
        assert_eq!(strip_format("string", "k8s-short-name"), "");
        assert_eq!(strip_format("integer", "int32"), "int32");
        assert_eq!(strip_format("integer", "date-time"), "");
        assert_eq!(strip_format("object", "uri"), "");
    }
}
