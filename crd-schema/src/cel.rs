//! `x-kubernetes-validations`: compiling rules, and evaluating them over an object the way
//! `apiextensions-apiserver/pkg/apiserver/schema/cel/validation.go` does.
//!
//! Owns: rule compilation (parse, static checks the cel crate does not do: undeclared variables and
//! unknown functions, `fieldPath` normalization), JSON-to-CEL value conversion (property name
//! escaping, `date-time`/`duration`/`byte` typing), the evaluation walk (which nodes see `oldSelf`,
//! error paths `a.b[key][0]`, `message`/`messageExpression`/`reason`/`fieldPath`) and CEL ratcheting.
//! Must not run OpenAPI checks or decide whether CEL runs at all (the caller checks blocking errors).
//! CEL evaluation uses kube's CEL engine (`kube::core::cel`); it is dynamically typed, so type errors
//! the apiserver reports at CRD creation only surface here at evaluation time.

use std::collections::HashMap;
use std::sync::Arc;

use kube::core::cel::KubeCelExt;
use kube::core::cel::cel::common::ast::{EntryExpr, Expr};
use kube::core::cel::cel::objects::{Key, Map, OptionalValue};
use kube::core::cel::cel::parser::Expression;
use kube::core::cel::cel::{self as celcrate, Context, ExecutionError, Program};
use serde_json::Value;

use super::errors::{self, BadValue, ErrorType, FPath, FieldError};
use super::formats;
use super::node::Node;

/// The largest message a `messageExpression` may produce (`MaxEvaluatedMessageExpressionSizeBytes`).
const MAX_MESSAGE_EXPRESSION_BYTES: usize = 5 * 1024;

/// One compiled `x-kubernetes-validations` entry.
#[derive(Debug)]
pub(crate) struct Rule {
    pub rule: String,
    pub message: String,
    pub message_expression: String,
    pub reason: Option<String>,
    pub field_path: String,
    pub optional_old_self: Option<bool>,
    /// The program, or the compile error detail (`compilation failed: ...`).
    pub program: Result<Program, CompileError>,
    pub message_program: Option<Result<Program, CompileError>>,
    pub uses_old_self: bool,
}

fn s(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_str).unwrap_or_default().to_string()
}

impl Rule {
    pub(crate) fn compile(raw: &Value) -> Rule {
        let rule = s(raw, "rule");
        let message_expression = s(raw, "messageExpression");
        let program = compile_expression(&rule, true);
        let uses_old_self = program.as_ref().map(|p| p.references().has_variable("oldSelf")).unwrap_or(false);
        let message_program =
            (!message_expression.trim().is_empty()).then(|| compile_expression(&message_expression, false));
        Rule {
            rule,
            message: s(raw, "message"),
            message_expression,
            reason: raw.get("reason").and_then(Value::as_str).map(str::to_string),
            field_path: s(raw, "fieldPath"),
            optional_old_self: raw.get("optionalOldSelf").and_then(Value::as_bool),
            program,
            message_program,
            uses_old_self,
        }
    }

    /// `ruleErrorString`: the message if set, else the rule.
    fn error_string(&self) -> String {
        if self.message.is_empty() { self.rule.trim().to_string() } else { self.message.trim().to_string() }
    }

    /// `ruleMessageOrDefault`.
    fn message_or_default(&self) -> String {
        if self.message.is_empty() {
            format!("failed rule: {}", self.error_string())
        } else {
            self.message.trim().to_string()
        }
    }

    /// The rule rendered like Go's `%#v` of `apiextensions.ValidationRule` (the bad value of rule errors).
    pub(crate) fn go_struct(&self) -> String {
        // ErrorBody prints the rule struct as JSON, fields in declaration order, nil pointers as null.
        let q = super::gofmt::go_json_str;
        let reason = self.reason.as_deref().map(q).unwrap_or_else(|| "null".into());
        let old = self.optional_old_self.map(|b| b.to_string()).unwrap_or_else(|| "null".into());
        format!(
            r#"{{"Rule":{},"Message":{},"MessageExpression":{},"Reason":{reason},"FieldPath":{},"OptionalOldSelf":{old}}}"#,
            q(&self.rule),
            q(&self.message),
            q(&self.message_expression),
            q(&self.field_path),
        )
    }
}

/// Functions the apiserver's CEL environment offers and the cel crate (with kube's library) implements:
/// the standard library, the macros (expanded to comprehensions by the parser), and Kubernetes' libraries.
const KNOWN_FUNCTIONS: &[&str] = &[
    // operators and macro internals
    "_==_",
    "_!=_",
    "_<_",
    "_<=_",
    "_>_",
    "_>=_",
    "_+_",
    "_-_",
    "_*_",
    "_/_",
    "_%_",
    "-_",
    "!_",
    "_&&_",
    "_||_",
    "_?_:_",
    "_[_]",
    "_[?_]",
    "_?._",
    "@in",
    "@not_strictly_false",
    // standard library
    "contains",
    "size",
    "max",
    "min",
    "startsWith",
    "endsWith",
    "string",
    "bytes",
    "double",
    "int",
    "uint",
    "dyn",
    "type",
    "matches",
    "duration",
    "timestamp",
    "getFullYear",
    "getMonth",
    "getDayOfYear",
    "getDayOfMonth",
    "getDate",
    "getDayOfWeek",
    "getHours",
    "getMinutes",
    "getSeconds",
    "getMilliseconds",
    "optional.none",
    "optional.of",
    "optional.ofNonZeroValue",
    "value",
    "hasValue",
    "or",
    "orValue",
    "has",
    // Kubernetes libraries (as registered by kube-cel)
    "add",
    "asApproximateFloat",
    "asInteger",
    "base64.decode",
    "base64.encode",
    "charAt",
    "cidr",
    "compareTo",
    "containsCIDR",
    "containsIP",
    "distinct",
    "family",
    "find",
    "findAll",
    "first",
    "flatten",
    "format",
    "format.byte",
    "format.date",
    "format.datetime",
    "format.dns1035Label",
    "format.dns1035LabelPrefix",
    "format.dns1123Label",
    "format.dns1123LabelPrefix",
    "format.dns1123Subdomain",
    "format.dns1123SubdomainPrefix",
    "format.labelValue",
    "format.named",
    "format.qualifiedName",
    "format.uri",
    "format.uuid",
    "getEscapedPath",
    "getHost",
    "getHostname",
    "getPort",
    "getQuery",
    "getScheme",
    "indexOf",
    "ip",
    "ip.isCanonical",
    "isCIDR",
    "isCIDRv4",
    "isCIDRv6",
    "isGlobalUnicast",
    "isGreaterThan",
    "isIP",
    "isIPv4",
    "isIPv6",
    "isInteger",
    "isLessThan",
    "isLinkLocalMulticast",
    "isLinkLocalUnicast",
    "isLoopback",
    "isQuantity",
    "isSemver",
    "isSorted",
    "isURL",
    "isUnspecified",
    "join",
    "jsonpatch.escapeKey",
    "last",
    "lastIndexOf",
    "lists.range",
    "lowerAscii",
    "major",
    "masked",
    "math.abs",
    "math.bitAnd",
    "math.bitNot",
    "math.bitOr",
    "math.bitShiftLeft",
    "math.bitShiftRight",
    "math.bitXor",
    "math.ceil",
    "math.floor",
    "math.greatest",
    "math.isFinite",
    "math.isInf",
    "math.isNaN",
    "math.least",
    "math.round",
    "math.sign",
    "math.sqrt",
    "math.trunc",
    "minor",
    "patch",
    "prefixLength",
    "quantity",
    "replace",
    "reverse",
    "semver",
    "sets.contains",
    "sets.equivalent",
    "sets.intersects",
    "sign",
    "slice",
    "sort",
    "split",
    "strings.quote",
    "sub",
    "substring",
    "sum",
    "trim",
    "upperAscii",
    "url",
    "validate",
];

/// Why an expression (a rule, or a `messageExpression` when not `is_rule`) does not compile; the
/// text is the API server's detail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CompileError {
    /// The parser refused it; `detail` is the parser's message laid out as cel-go's.
    #[error("{}: {detail}", compile_failed(*.is_rule))]
    Parse { is_rule: bool, detail: String },
    /// It names something the environment does not declare.
    #[error("{}: ERROR: <input>: {undeclared}", compile_failed(*.is_rule))]
    Check { is_rule: bool, undeclared: Undeclared },
}

fn compile_failed(is_rule: bool) -> &'static str {
    if is_rule { "compilation failed" } else { "messageExpression compilation failed" }
}

/// A reference to a variable, function or type the environment does not declare.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("undeclared reference to '{name}' (in container '')")]
pub(crate) struct Undeclared {
    name: String,
}

/// Parses an expression and runs the static checks the cel crate leaves to evaluation time.
fn compile_expression(src: &str, is_rule: bool) -> Result<Program, CompileError> {
    // The parser's message already reads `ERROR: <input>:1:17: ...`; cel-go indents the source lines.
    let program = Program::compile(src).map_err(|e| {
        let e = e.to_string();
        let e = if e.starts_with("ERROR: <input>:") { e } else { format!("ERROR: <input>: {e}") };
        CompileError::Parse { is_rule, detail: e.replace("\n| ", "\n | ") }
    })?;
    let mut scope = vec!["self".to_string(), "oldSelf".to_string()];
    check_expr(program.expression(), &mut scope).map_err(|undeclared| CompileError::Check { is_rule, undeclared })?;
    Ok(program)
}

fn check_expr(e: &Expression, scope: &mut Vec<String>) -> Result<(), Undeclared> {
    match &e.expr {
        Expr::Ident(name) => {
            if name.starts_with('@') || scope.iter().any(|s| s == name) || TYPE_NAMES.contains(&name.as_str()) {
                Ok(())
            } else {
                Err(Undeclared { name: name.clone() })
            }
        }
        Expr::Call(call) => {
            // `math.abs(x)` parses as a call with target `math`: a namespaced function, not a variable.
            let namespaced = match call.target.as_deref().map(|t| &t.expr) {
                Some(Expr::Ident(ns)) if !scope.iter().any(|s| s == ns) => {
                    let q = format!("{ns}.{}", call.func_name);
                    KNOWN_FUNCTIONS.contains(&q.as_str()).then_some(q)
                }
                _ => None,
            };
            if namespaced.is_none() {
                if !KNOWN_FUNCTIONS.contains(&call.func_name.as_str()) {
                    return Err(Undeclared { name: call.func_name.clone() });
                }
                if let Some(t) = &call.target {
                    check_expr(t, scope)?;
                }
            }
            for a in &call.args {
                check_expr(a, scope)?;
            }
            Ok(())
        }
        Expr::Select(sel) => {
            // `optional.none()` style qualified identifiers are handled as calls; a select on an
            // undeclared identifier is an undeclared reference.
            check_expr(&sel.operand, scope)
        }
        Expr::Comprehension(c) => {
            check_expr(&c.iter_range, scope)?;
            check_expr(&c.accu_init, scope)?;
            let pushed = 1 + usize::from(c.iter_var2.is_some());
            scope.push(c.iter_var.clone());
            if let Some(v2) = &c.iter_var2 {
                scope.push(v2.clone());
            }
            let r = check_expr(&c.loop_cond, scope).and_then(|_| check_expr(&c.loop_step, scope));
            scope.truncate(scope.len() - pushed);
            r?;
            check_expr(&c.result, scope)
        }
        Expr::List(l) => l.elements.iter().try_for_each(|x| check_expr(x, scope)),
        Expr::Map(m) => m.entries.iter().try_for_each(|en| match &en.expr {
            EntryExpr::MapEntry(me) => check_expr(&me.key, scope).and_then(|_| check_expr(&me.value, scope)),
            EntryExpr::StructField(f) => check_expr(&f.value, scope),
        }),
        Expr::Struct(st) => Err(Undeclared { name: st.type_name.clone() }),
        Expr::Literal(_) | Expr::Unspecified => Ok(()),
    }
}

/// Normalizes a rule's `fieldPath` like `ValidFieldPath`, relative to the node the rule is on.
/// Returns the `field.Path` string to append, or `None` when it does not refer to a field.
pub(crate) fn normalize_field_path(path: &str, node: &Node) -> Option<String> {
    let mut out: FPath = None;
    let mut cur = node;
    let mut rest = path;
    while !rest.is_empty() {
        let (name, named, next) = if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            if end == 0 {
                return None;
            }
            (r[..end].to_string(), !cur.properties.is_empty() || cur.additional.is_none(), &r[end..])
        } else if let Some(r) = rest.strip_prefix('[') {
            let r = r.strip_prefix('\'')?;
            let mut lit = String::new();
            let mut chars = r.char_indices();
            let mut close = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some((_, e)) => lit.push(match e {
                            'n' => '\n',
                            't' => '\t',
                            'r' => '\r',
                            '\'' => '\'',
                            '\\' => '\\',
                            _ => return None,
                        }),
                        None => return None,
                    },
                    '\'' => {
                        close = Some(i);
                        break;
                    }
                    c => lit.push(c),
                }
            }
            let after = &r[close? + 1..];
            let after = after.strip_prefix(']')?;
            (lit, !cur.properties.is_empty() || cur.additional.is_none(), after)
        } else {
            return None;
        };
        if named {
            cur = cur.properties.get(&name)?;
            out = errors::child(&out, &name);
        } else {
            cur = cur.additional_schema()?;
            out = errors::key(&out, &name);
        }
        rest = next;
    }
    out
}

/// Escapes a property name like `apiserver/pkg/cel.Escape`; `None` when it cannot be a CEL field.
pub(crate) fn escape(ident: &str) -> Option<String> {
    const RESERVED: &[&str] = &[
        "true",
        "false",
        "null",
        "in",
        "as",
        "break",
        "const",
        "continue",
        "else",
        "for",
        "function",
        "if",
        "import",
        "let",
        "loop",
        "package",
        "namespace",
        "return",
        "var",
        "void",
        "while",
    ];
    let first = ident.chars().next()?;
    if first.is_ascii_digit() {
        return None;
    }
    if RESERVED.contains(&ident) {
        return Some(format!("__{ident}__"));
    }
    if !ident.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/')) {
        return None;
    }
    let mut out = String::with_capacity(ident.len());
    let mut chars = ident.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '_' if chars.peek() == Some(&'_') => {
                chars.next();
                out.push_str("__underscores__");
            }
            '.' => out.push_str("__dot__"),
            '-' => out.push_str("__dash__"),
            '/' => out.push_str("__slash__"),
            c => out.push(c),
        }
    }
    Some(out)
}

fn cel_str(s: &str) -> celcrate::Value {
    celcrate::Value::String(Arc::new(s.to_string()))
}

/// Converts a decoded JSON value to CEL the way `UnstructuredToVal` types it by schema. `resource`
/// marks a resource root (the object itself or an embedded resource), whose `apiVersion`, `kind` and
/// `metadata` are visible to rules.
pub(crate) fn to_cel(v: &Value, node: Option<&Node>, resource: bool) -> celcrate::Value {
    match v {
        Value::Null => celcrate::Value::Null,
        Value::Bool(b) => celcrate::Value::Bool(*b),
        Value::Number(n) => {
            let wants_double = node.is_some_and(|n| n.ty == "number");
            match n.as_i64() {
                Some(i) if !wants_double => celcrate::Value::Int(i),
                _ => celcrate::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
            }
        }
        Value::String(s) => {
            match node.map(|n| (n.ty.as_str(), n.raw_format.as_str(), n.int_or_string)) {
                Some(("string", "date-time" | "date", false)) => parse_timestamp(s).unwrap_or_else(|| cel_str(s)),
                Some(("string", "duration", false)) => match formats::parse_duration(s) {
                    Some(ns) => celcrate::Value::Duration(chrono::Duration::nanoseconds(
                        i64::try_from(ns).unwrap_or(if ns < 0 { i64::MIN } else { i64::MAX }),
                    )),
                    None => cel_str(s),
                },
                Some(("string", "byte", false)) => match base64_decode(s) {
                    Some(b) => celcrate::Value::Bytes(Arc::new(b)),
                    None => cel_str(s),
                },
                _ => cel_str(s),
            }
        }
        Value::Array(items) => {
            let item_node = node.and_then(|n| n.items.as_deref());
            celcrate::Value::List(Arc::new(
                items.iter().map(|i| to_cel(i, item_node, item_node.is_some_and(|n| n.embedded))).collect(),
            ))
        }
        Value::Object(map) => {
            let mut out: HashMap<Key, celcrate::Value> = HashMap::with_capacity(map.len());
            match node.and_then(Node::additional_schema) {
                // A map: keys are data and are not escaped.
                Some(add) if node.is_some_and(|n| n.properties.is_empty()) => {
                    for (k, v) in map {
                        out.insert(Key::String(Arc::new(k.clone())), to_cel(v, Some(add), add.embedded));
                    }
                }
                _ => {
                    for (k, v) in map {
                        let child = node.and_then(|n| n.properties.get(k));
                        let meta = resource && matches!(k.as_str(), "apiVersion" | "kind" | "metadata");
                        if child.is_none() && !meta && node.is_some_and(|n| !n.preserve_unknown && !n.embedded) {
                            continue;
                        }
                        let Some(name) = escape(k) else { continue };
                        let converted = if meta && k == "metadata" {
                            // Rules see only metadata.name and metadata.generateName.
                            let kept: serde_json::Map<String, Value> = v
                                .as_object()
                                .map(|m| {
                                    m.iter()
                                        .filter(|(k, _)| *k == "name" || *k == "generateName")
                                        .map(|(k, v)| (k.clone(), v.clone()))
                                        .collect()
                                })
                                .unwrap_or_default();
                            to_cel(&Value::Object(kept), None, false)
                        } else {
                            to_cel(v, child, child.is_some_and(|c| c.embedded))
                        };
                        out.insert(Key::String(Arc::new(name)), converted);
                    }
                }
            }
            celcrate::Value::Map(Map { map: Arc::new(out) })
        }
    }
}

fn parse_timestamp(s: &str) -> Option<celcrate::Value> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Some(celcrate::Value::Timestamp(t));
    }
    let date = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").ok()?;
    let t = date.and_hms_opt(0, 0, 0)?.and_utc().fixed_offset();
    Some(celcrate::Value::Timestamp(t))
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let bytes = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut acc = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            acc |= val(*c)? << (18 - 6 * i);
        }
        let n = match chunk.len() {
            4 => 3,
            3 => 2,
            2 => 1,
            _ => return None,
        };
        for i in 0..n {
            out.push((acc >> (16 - 8 * i)) as u8);
        }
    }
    Some(out)
}

/// `dyn(x)` only disables type checking in cel-go; at runtime it is the identity.
fn dyn_identity(_ftx: &celcrate::FunctionContext, v: celcrate::Value) -> Result<celcrate::Value, ExecutionError> {
    Ok(v)
}

/// The type identifiers of CEL's standard environment (`type(self) == int`), which the cel crate lacks.
const TYPE_NAMES: &[&str] = &["int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type"];

/// A CEL type value: what `type(x)` returns and what `int`, `string`... name.
#[derive(Debug, PartialEq, Eq)]
struct CelType(&'static str);

impl celcrate::objects::Opaque for CelType {
    fn runtime_type_name(&self) -> &str {
        "type"
    }
}

/// `type(x)`.
fn type_of(_ftx: &celcrate::FunctionContext, v: celcrate::Value) -> Result<celcrate::Value, ExecutionError> {
    use celcrate::Value as V;
    let name = match &v {
        V::Int(_) => "int",
        V::UInt(_) => "uint",
        V::Float(_) => "double",
        V::Bool(_) => "bool",
        V::String(_) => "string",
        V::Bytes(_) => "bytes",
        V::List(_) => "list",
        V::Map(_) => "map",
        V::Null => "null_type",
        V::Duration(_) => "google.protobuf.Duration",
        V::Timestamp(_) => "google.protobuf.Timestamp",
        V::Opaque(o) if o.runtime_type_name() == "type" => "type",
        _ => "dyn",
    };
    Ok(V::Opaque(Arc::new(CelType(name))))
}

thread_local! {
    /// The cel crate's context is not `Sync`; one per thread, with Kubernetes' libraries registered once.
    static BASE: Context<'static> = {
        let mut ctx = Context::default().with_all();
        ctx.add_function("dyn", dyn_identity);
        ctx.add_function("type", type_of);
        for &t in TYPE_NAMES {
            ctx.add_variable_from_value(t, celcrate::Value::Opaque(Arc::new(CelType(t))));
        }
        ctx
    };
}

/// What the CEL walk needs to know about the update it validates.
pub(crate) struct Walk<'a> {
    pub errors: &'a mut Vec<FieldError>,
    /// Ratcheted errors, reported by the apiserver as warnings.
    pub warnings: &'a mut Vec<String>,
}

/// The nearest correlated old/new pair for ratcheting (`ratchetingOptions`).
#[derive(Clone, Copy)]
pub(crate) struct Ratchet<'v> {
    /// This node's correlated old value, when it has one.
    pub current: Option<(&'v Value, &'v Value)>,
    /// The nearest ancestor that was correlated.
    pub parent: Option<(&'v Value, &'v Value)>,
}

impl<'v> Ratchet<'v> {
    pub(crate) const NONE: Ratchet<'static> = Ratchet { current: None, parent: None };

    fn should_ratchet(&self) -> bool {
        match (self.current, self.parent) {
            (Some((o, n)), _) => o == n,
            (None, Some((o, n))) => o == n,
            (None, None) => false,
        }
    }

    fn key(&self, new: &'v Value, k: &str, at_root: bool) -> Ratchet<'v> {
        let Some((old, _)) = self.current else {
            return *self;
        };
        if at_root && (k == "apiVersion" || k == "kind") {
            return Ratchet::NONE;
        }
        let pair = old.get(k).zip(new.get(k));
        Ratchet { current: pair, parent: self.current }
    }

    fn index(&self, node: &Node, new: &'v Value, i: usize) -> Ratchet<'v> {
        let Some((old, _)) = self.current else {
            return *self;
        };
        let pair = correlate_index(node, old, new, i).zip(new.get(i));
        Ratchet { current: pair, parent: self.current }
    }
}

/// The old item correlated with new item `i` (ratcheting): by keys for map lists, never for sets and
/// atomic lists, by index otherwise.
pub(crate) fn correlate_index<'v>(node: &Node, old: &'v Value, new: &Value, i: usize) -> Option<&'v Value> {
    let old_items = old.as_array()?;
    let new_items = new.as_array()?;
    let item = new_items.get(i)?;
    match node.list_type.as_deref() {
        Some("map") => map_list_get(&node.list_map_keys, old_items, item),
        Some("set") | Some("atomic") => None,
        _ => old_items.get(i),
    }
}

/// The element of a map-type list with the same key values as `item` (`MapList.Get`).
pub(crate) fn map_list_get<'v>(keys: &[String], list: &'v [Value], item: &Value) -> Option<&'v Value> {
    let item = item.as_object()?;
    let want: Vec<Option<&Value>> = keys.iter().map(|k| item.get(k)).collect();
    list.iter().find(|o| o.as_object().is_some_and(|o| keys.iter().zip(&want).all(|(k, w)| o.get(k) == *w)))
}

/// Evaluates every rule at and below `node` over `v` (`Validator.validate`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn validate<'v>(
    walk: &mut Walk<'_>,
    node: &Node,
    path: &FPath,
    v: &'v Value,
    old: Option<&'v Value>,
    ratchet: Ratchet<'v>,
    resource_root: bool,
    at_root: bool,
) {
    if v.is_null() || !node.has_rules() {
        return;
    }
    if !node.rules.is_empty() {
        validate_expressions(walk, node, path, v, old, ratchet, resource_root);
    }
    match v {
        Value::Array(items) => {
            let Some(item_node) = node.items.as_deref() else { return };
            // Only map-type lists correlate items with their old values for rules.
            let old_items = old.and_then(Value::as_array).filter(|_| node.list_type.as_deref() == Some("map"));
            for (i, item) in items.iter().enumerate() {
                let old_item = old_items.and_then(|o| map_list_get(&node.list_map_keys, o, item));
                let r = ratchet.index(node, v, i);
                validate(walk, item_node, &errors::index(path, i), item, old_item, r, item_node.embedded, false);
            }
        }
        Value::Object(map) => {
            let correlatable = matches!(node.map_type.as_deref(), None | Some("granular") | Some("atomic"));
            if let Some(add) = node.additional_schema() {
                for (k, child) in map {
                    let old_child = old.and_then(|o| o.get(k)).filter(|_| correlatable);
                    let r = ratchet.key(v, k, at_root);
                    validate(walk, add, &errors::key(path, k), child, old_child, r, add.embedded, false);
                }
            }
            for (k, child) in map {
                if let Some(prop) = node.properties.get(k) {
                    let old_child = old.and_then(|o| o.get(k)).filter(|_| correlatable);
                    let r = ratchet.key(v, k, at_root);
                    validate(walk, prop, &errors::child(path, k), child, old_child, r, prop.embedded, false);
                }
            }
        }
        _ => {}
    }
}

/// `validateExpressions` for one node.
fn validate_expressions(
    walk: &mut Walk<'_>,
    node: &Node,
    path: &FPath,
    v: &Value,
    old: Option<&Value>,
    ratchet: Ratchet<'_>,
    resource: bool,
) {
    // The value printed in rule errors is the schema type (`"object"`, `"string"`, ...).
    let ty = BadValue::Json(Value::String(node.ty.clone()));
    let self_val = to_cel(v, Some(node), resource);
    let old_val = old.filter(|o| !o.is_null()).map(|o| to_cel(o, Some(node), resource));
    BASE.with(|base| {
        for rule in &node.rules {
            let program = match &rule.program {
                Ok(p) => p,
                Err(e) => {
                    walk.errors.push(FieldError::invalid(path, ty.clone(), format!("rule compile error: {e}")));
                    continue;
                }
            };
            let optional = rule.optional_old_self == Some(true);
            if rule.uses_old_self && old_val.is_none() && !optional {
                // Transition rules run only when there is a correlated old value.
                continue;
            }
            let mut ctx = base.new_inner_scope();
            ctx.add_variable_from_value("self", self_val.clone());
            if rule.uses_old_self {
                let o = match (&old_val, optional) {
                    (Some(o), false) => o.clone(),
                    (Some(o), true) => celcrate::Value::Opaque(Arc::new(OptionalValue::of(o.clone()))),
                    (None, _) => celcrate::Value::Opaque(Arc::new(OptionalValue::none())),
                };
                ctx.add_variable_from_value("oldSelf", o);
            }
            let result = program.execute(&ctx);
            let err = match result {
                Ok(celcrate::Value::Bool(true)) => continue,
                Ok(_) => None,
                Err(e) => Some(e),
            };
            if let Some(e) = err {
                let text = execution_error_text(&e);
                let detail = if text.starts_with("no such overload") {
                    format!(
                        "'{text}': call arguments did not match a supported operator, function or macro signature for rule: {}",
                        rule.error_string()
                    )
                } else {
                    format!("{text} evaluating rule: {}", rule.error_string())
                };
                walk.errors.push(FieldError::invalid(path, ty.clone(), detail));
                continue;
            }
            let field = match normalize_field_path(&rule.field_path, node) {
                Some(p) if !rule.field_path.is_empty() => errors::child(path, &p),
                _ => path.clone(),
            };
            // messageExpression sees the plain activation: oldSelf is not optional there, and absent
            // when there is no old value.
            let detail = if optional {
                let mut mctx = base.new_inner_scope();
                mctx.add_variable_from_value("self", self_val.clone());
                if let Some(o) = &old_val {
                    mctx.add_variable_from_value("oldSelf", o.clone());
                }
                message_expression(rule, &mctx)
            } else {
                message_expression(rule, &ctx)
            }
            ;
            // Kubernetes 1.36 prints the failing value itself: scalars as they are, objects and lists
            // omitted; a messageExpression's message is expected to embed the value, so none is printed.
            let shown = match (&detail, v) {
                (Some(_), _) | (None, Value::Object(_) | Value::Array(_)) => BadValue::Omit,
                (None, other) => BadValue::Json(other.clone()),
            };
            let detail = detail.unwrap_or_else(|| rule.message_or_default());
            let fe = match rule.reason.as_deref() {
                Some("FieldValueForbidden") => FieldError::forbidden(&field, detail),
                Some("FieldValueRequired") => FieldError::required(&field, detail),
                Some("FieldValueDuplicate") => FieldError::new(ErrorType::Duplicate, &field, BadValue::Json(v.clone()), ""),
                _ => FieldError::invalid(&field, shown, detail),
            };
            if !rule.uses_old_self && ratchet.should_ratchet() {
                walk.warnings.push(fe.to_string());
            } else {
                walk.errors.push(fe);
            }
        }
    });
}

/// Evaluates `messageExpression`; `None` falls back to `message` (the apiserver logs the reason).
fn message_expression(rule: &Rule, ctx: &Context<'_>) -> Option<String> {
    let program = rule.message_program.as_ref()?.as_ref().ok()?;
    let celcrate::Value::String(s) = program.execute(ctx).ok()? else { return None };
    let trimmed = s.trim();
    if trimmed.is_empty() || trimmed.len() > MAX_MESSAGE_EXPRESSION_BYTES || trimmed.contains('\n') {
        return None;
    }
    Some(trimmed.to_string())
}

/// cel-go's wording for the runtime errors the cel crate reports differently.
fn execution_error_text(e: &ExecutionError) -> String {
    match e {
        ExecutionError::NoSuchKey(k) => format!("no such key: {k}"),
        ExecutionError::NoSuchOverload => "no such overload".to_string(),
        ExecutionError::UndeclaredReference(r) => format!("no such attribute: {r}"),
        // cel-go says only "division by zero" / "modulus by zero" (the cel crate adds the operand).
        ExecutionError::DivisionByZero(_) => "division by zero".to_string(),
        ExecutionError::RemainderByZero(_) => "modulus by zero".to_string(),
        other => {
            let t = other.to_string();
            let mut c = t.chars();
            match c.next() {
                Some(f) => f.to_lowercase().chain(c).collect(),
                None => t,
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn escaping_follows_the_apiserver() {
        assert_eq!(escape("foo").as_deref(), Some("foo"));
        assert_eq!(escape("namespace").as_deref(), Some("__namespace__"));
        assert_eq!(escape("a.b-c/d").as_deref(), Some("a__dot__b__dash__c__slash__d"));
        assert_eq!(escape("a__b").as_deref(), Some("a__underscores__b"));
        assert_eq!(escape("1abc"), None);
        assert_eq!(escape("a b"), None);
    }

    #[test]
    fn undeclared_variables_and_functions_do_not_compile() {
        assert!(compile_expression("self.x > 0", true).is_ok());
        assert!(compile_expression("self.all(k, k.startsWith('a'))", true).is_ok());
        assert!(compile_expression("math.abs(self.x) > 0", true).is_ok());
        assert!(compile_expression("foo > 0", true).is_err());
        assert!(compile_expression("self.frobnicate()", true).is_err());
        assert!(compile_expression("self.x >", true).is_err());
    }

    #[test]
    fn field_paths_normalize_against_the_schema() {
        let node = Node::parse(&json!({
            "type": "object",
            "properties": {
                "a": {"type": "object", "properties": {"b.c": {"type": "string"}}},
                "m": {"type": "object", "additionalProperties": {"type": "string"}}
            }
        }));
        assert_eq!(normalize_field_path(".a", &node).as_deref(), Some("a"));
        assert_eq!(normalize_field_path(".a['b.c']", &node).as_deref(), Some("a.b.c"));
        assert_eq!(normalize_field_path(".m['k']", &node).as_deref(), Some("m[k]"));
        assert_eq!(normalize_field_path(".nope", &node), None);
    }

    #[test]
    fn base64_decodes() {
        assert_eq!(base64_decode("aGVsbG8=").as_deref(), Some(&b"hello"[..]));
        assert_eq!(base64_decode("!!"), None);
    }
}
