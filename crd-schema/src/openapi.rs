//! OpenAPI v3 schema validation of a custom resource, ported from kube-openapi's `validate.SchemaValidator`
//! as apiextensions-apiserver drives it, including CRD validation ratcheting on update.
//!
//! Owns: the per-node validator order (type, allOf/anyOf/oneOf/not, string, format, number, array,
//! enum, object), kube-openapi's messages (`spec.x in body should match '...'`), Go's numeric quirks
//! (int64 vs float64 data, truncated bounds for integers) and the conversion of its results to field
//! errors (`kubeOpenAPIResultToFieldErrors`). Must not prune, default, or run CEL/list-type checks.

use serde_json::Value;

use super::errors::{self, BadValue, FPath, FieldError};
use super::formats;
use super::gofmt::{self, GoNum};
use super::node::{Additional, Node};

/// kube-openapi's error codes (only those it can produce for CRD schemas).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Code {
    InvalidType,
    Required,
    TooLong,
    Enum,
    MaxItems,
    TooManyProperties,
    /// Every other `*errors.Validation` (pattern, bounds, minLength, ...): becomes `field.Invalid`.
    Other,
    /// A composite error (anyOf/oneOf/allOf/not), not an `*errors.Validation`.
    Composite,
}

/// One kube-openapi result error.
#[derive(Clone, Debug)]
struct OaError {
    code: Code,
    name: String,
    value: Option<Value>,
    /// `Valid` (the bound) for TooLong/MaxItems/TooManyProperties.
    valid: i64,
    /// The actual count for MaxItems/TooManyProperties.
    actual: i64,
    /// Enum values for `Enum`.
    values: Vec<Value>,
    message: String,
}

impl OaError {
    fn new(code: Code, name: &str, value: Option<Value>, message: String) -> Self {
        OaError { code, name: name.to_string(), value, valid: -1, actual: -1, values: Vec::new(), message }
    }
}

/// The Go kind of a decoded JSON value.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Null,
    Bool,
    Num(GoNum),
    Str,
    Slice,
    Map,
}

fn kind(v: &Value) -> Kind {
    match v {
        Value::Null => Kind::Null,
        Value::Bool(_) => Kind::Bool,
        Value::Number(n) => Kind::Num(gofmt::go_num(n)),
        Value::String(_) => Kind::Str,
        Value::Array(_) => Kind::Slice,
        Value::Object(_) => Kind::Map,
    }
}

/// `schemaInfoForType`: the JSON type and swagger format Go infers from the data.
fn sch_type(k: Kind) -> (&'static str, &'static str) {
    match k {
        Kind::Null => ("", ""),
        Kind::Bool => ("boolean", ""),
        Kind::Str => ("string", ""),
        Kind::Num(GoNum::Int(_)) => ("integer", "int64"),
        Kind::Num(GoNum::Float(_)) => ("number", "double"),
        Kind::Slice => ("array", ""),
        Kind::Map => ("object", ""),
    }
}

const IN: &str = "body";

/// `errors.InvalidType`: the message quotes the value when it is a string.
fn invalid_type(name: &str, type_name: &str, value: Value) -> OaError {
    let message = match &value {
        Value::String(s) => format!("{name} in {IN} must be of type {type_name}: {}", gofmt::quote(s)),
        _ => format!("{name} in {IN} must be of type {type_name}"),
    };
    OaError::new(Code::InvalidType, name, Some(value), message)
}

/// Validates `data` against `node` as `SchemaValidator.Validate` does, returning field errors rooted at
/// the object (`fldPath` nil). `old`, on update, enables ratcheting: errors under a correlated node
/// whose value did not change are dropped (the apiserver turns them into warnings).
pub(crate) fn validate(node: &Node, data: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_at(node, data, &None, old)
}

/// [`validate`] with errors rooted at `base` (e.g. a default value's path in a CRD).
pub(crate) fn validate_at(node: &Node, data: &Value, base: &FPath, old: Option<&Value>) -> Vec<FieldError> {
    let mut out = Vec::new();
    validate_node(node, data, "", old, &mut out);
    out.into_iter().map(|e| to_field_error(e, base)).collect()
}

fn validate_node(node: &Node, data: &Value, path: &str, old: Option<&Value>, out: &mut Vec<OaError>) {
    let start = out.len();
    let k = kind(data);
    if k == Kind::Null {
        type_check(node, data, path, out);
        enum_check(node, data, path, out);
    } else {
        type_check(node, data, path, out);
        schema_props(node, data, path, old, out);
        if k == Kind::Str {
            string_check(node, data, path, out);
            if !node.format.is_empty()
                && formats::known(&node.format)
                && let Value::String(s) = data
                && !formats::validates(&node.format, s)
            {
                out.push(invalid_type(path, &node.format, data.clone()));
            }
        }
        if let Kind::Num(n) = k {
            number_check(node, n, data, path, out);
        }
        if let Value::Array(items) = data {
            slice_check(node, items, data, path, old, out);
        }
        enum_check(node, data, path, out);
        if let Value::Object(_) = data {
            object_check(node, data, path, old, out);
        }
    }
    // Ratcheting: an unchanged, correlated value keeps its errors out of the response.
    if out.len() > start && old.is_some_and(|o| o == data) {
        out.truncate(start);
    }
}

fn type_check(node: &Node, data: &Value, path: &str, out: &mut Vec<OaError>) {
    if node.types.is_empty() && node.format.is_empty() {
        return;
    }
    let k = kind(data);
    if k == Kind::Null {
        if !node.types.is_empty() && !node.types.iter().any(|t| t == "null") && !node.nullable {
            out.push(invalid_type(path, &node.types.join(","), Value::String("null".into())));
        }
        return;
    }
    let (sch, format) = sch_type(k);
    let contains = |t: &str| node.types.iter().any(|x| x == t);
    let is_float_int =
        matches!(k, Kind::Num(GoNum::Float(f)) if gofmt::is_float_json_integer(f)) && contains("integer");
    let is_int_float = sch == "integer" && contains("number");
    if k != Kind::Str
        && k != Kind::Slice
        && !node.format.is_empty()
        && !(contains(sch) || format == node.format || is_float_int || is_int_float)
    {
        out.push(invalid_type(path, &node.format, Value::String(format.into())));
        return;
    }
    if !(contains("number") || contains("integer") || node.format.is_empty()) && (k == Kind::Str || k == Kind::Slice) {
        return;
    }
    if !(contains(sch) || is_float_int || is_int_float) {
        out.push(invalid_type(path, &node.types.join(","), Value::String(sch.into())));
    }
}

fn string_check(node: &Node, data: &Value, path: &str, out: &mut Vec<OaError>) {
    let Value::String(s) = data else { return };
    // Lengths count runes (utf8.RuneCount), not bytes, although the error says "bytes".
    let len = s.chars().count() as i64;
    if let Some(max) = node.max_length
        && len > max
    {
        let mut e = OaError::new(
            Code::TooLong,
            path,
            Some(data.clone()),
            format!("{path} in {IN} should be at most {max} chars long"),
        );
        e.valid = max;
        out.push(e);
        return;
    }
    if let Some(min) = node.min_length
        && len < min
    {
        out.push(OaError::new(
            Code::Other,
            path,
            Some(data.clone()),
            format!("{path} in {IN} should be at least {min} chars long"),
        ));
        return;
    }
    if let Some(p) = &node.pattern {
        match &p.re {
            Ok(re) if re.is_match(s) => {}
            Ok(_) => out.push(OaError::new(
                Code::Other,
                path,
                Some(data.clone()),
                format!("{path} in {IN} should match '{}'", p.src),
            )),
            Err(e) => out.push(OaError::new(
                Code::Other,
                path,
                Some(data.clone()),
                format!("{path} in {IN} should match '{}, but pattern is invalid: {e}'", p.src),
            )),
        }
    }
}

/// `IsValueValidAgainstRange`: the value, printed the way Go prints it, must parse as the schema's
/// type and format (an integer, an int32...). Reported as a plain error, so rooted at the object.
fn range_check(node: &Node, n: GoNum, path: &str, out: &mut Vec<OaError>) {
    // Only for a single declared type: int-or-string values are not range-checked.
    let [ty] = node.types.as_slice() else { return };
    if node.int_or_string {
        return;
    }
    let text = match n {
        GoNum::Int(i) => i.to_string(),
        // strconv.FormatFloat(f, 'f', -1, 64): no exponent, shortest representation.
        GoNum::Float(f) => format!("{f}"),
    };
    let fits = match (ty.as_str(), node.format.as_str()) {
        ("integer", "int32") => text.parse::<i32>().is_ok(),
        ("integer", "uint32") => text.parse::<u32>().is_ok(),
        ("integer", "uint64") => text.parse::<u64>().is_ok(),
        ("integer", _) => text.parse::<i64>().is_ok(),
        (_, "float" | "float32") => n.as_f64().abs() <= f64::from(f32::MAX),
        _ => true,
    };
    if !fits {
        let message = if node.format.is_empty() {
            format!("Checked value must be of type {ty} (default format) in {path}")
        } else {
            format!("Checked value must be of type {ty} with format {} in {path}", node.format)
        };
        out.push(OaError::new(Code::Composite, path, None, message));
    }
}

fn number_check(node: &Node, n: GoNum, data: &Value, path: &str, out: &mut Vec<OaError>) {
    let bound = |b: f64| -> String {
        // Integers are compared with the bound truncated to int64, and print it that way.
        match n {
            GoNum::Int(_) => (b as i64).to_string(),
            GoNum::Float(_) => gofmt::float_v(b),
        }
    };
    range_check(node, n, path, out);
    let mut res = Vec::new();
    if let Some(m) = node.multiple_of {
        let fails = match n {
            GoNum::Int(i) if m as i64 != 0 => {
                let f = m as i64;
                if f < 0 {
                    Some(format!("factor MultipleOf declared for {path} must be positive: {f}"))
                } else {
                    (i.wrapping_div(f).wrapping_mul(f) != i)
                        .then(|| format!("{path} in {IN} should be a multiple of {f}"))
                }
            }
            _ => {
                let d = n.as_f64();
                if m < 0.0 {
                    Some(format!("factor MultipleOf declared for {path} must be positive: {}", gofmt::float_v(m)))
                } else {
                    let mult = if m < 1.0 { 1.0 / m * d } else { d / m };
                    (!gofmt::is_float_json_integer(mult))
                        .then(|| format!("{path} in {IN} should be a multiple of {}", gofmt::float_v(m)))
                }
            }
        };
        if let Some(msg) = fails {
            res.push(OaError::new(Code::Other, path, Some(data.clone()), msg));
        }
    }
    if let Some(min) = node.minimum {
        let below = match n {
            GoNum::Int(i) => {
                let b = min as i64;
                if node.exclusive_minimum { i <= b } else { i < b }
            }
            GoNum::Float(f) => {
                if node.exclusive_minimum {
                    f <= min
                } else {
                    f < min
                }
            }
        };
        if below {
            let rel = if node.exclusive_minimum { "greater than" } else { "greater than or equal to" };
            res.push(OaError::new(
                Code::Other,
                path,
                Some(data.clone()),
                format!("{path} in {IN} should be {rel} {}", bound(min)),
            ));
        }
    }
    if let Some(max) = node.maximum {
        let above = match n {
            GoNum::Int(i) => {
                let b = max as i64;
                if node.exclusive_maximum { i >= b } else { i > b }
            }
            GoNum::Float(f) => {
                if node.exclusive_maximum {
                    f >= max
                } else {
                    f > max
                }
            }
        };
        if above {
            let rel = if node.exclusive_maximum { "less than" } else { "less than or equal to" };
            res.push(OaError::new(
                Code::Other,
                path,
                Some(data.clone()),
                format!("{path} in {IN} should be {rel} {}", bound(max)),
            ));
        }
    }
    out.extend(res);
}

fn slice_check(node: &Node, items: &[Value], data: &Value, path: &str, old: Option<&Value>, out: &mut Vec<OaError>) {
    if let Some(item_node) = node.items.as_deref() {
        for (i, item) in items.iter().enumerate() {
            let old_item = old.and_then(|o| super::cel::correlate_index(node, o, data, i));
            validate_node(item_node, item, &format!("{path}[{i}]"), old_item, out);
        }
    }
    let size = items.len() as i64;
    if let Some(min) = node.min_items
        && size < min
    {
        out.push(OaError::new(
            Code::Other,
            path,
            Some(Value::from(size)),
            format!("{path} in {IN} should have at least {min} items"),
        ));
    }
    if let Some(max) = node.max_items
        && size > max
    {
        let mut e = OaError::new(Code::MaxItems, path, None, format!("{path} in {IN} should have at most {max} items"));
        e.valid = max;
        e.actual = size;
        out.push(e);
    }
    if node.unique_items {
        let dup = items.iter().enumerate().any(|(i, a)| items[..i].iter().any(|b| a == b));
        if dup {
            out.push(OaError::new(Code::Other, path, None, format!("{path} in {IN} shouldn't contain duplicates")));
        }
    }
}

/// `Enum`: equal, or equal after Go's `reflect.Value.Convert` to the enum value's type.
fn enum_check(node: &Node, data: &Value, path: &str, out: &mut Vec<OaError>) {
    let Some(values) = &node.enum_values else { return };
    if values.is_empty() {
        return;
    }
    if values.iter().any(|e| enum_matches(data, e)) {
        return;
    }
    let mut e = OaError::new(
        Code::Enum,
        path,
        Some(data.clone()),
        format!("{path} in {IN} should be one of [{}]", values.iter().map(go_v).collect::<Vec<_>>().join(" ")),
    );
    e.values = values.clone();
    out.push(e);
}

fn go_v(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => gofmt::num_v(gofmt::go_num(n)),
        other => gofmt::go_json(other),
    }
}

fn enum_matches(data: &Value, e: &Value) -> bool {
    if data == e {
        return true;
    }
    match (kind(data), kind(e)) {
        // Numeric conversions (float64 to int64 truncates).
        (Kind::Num(d), Kind::Num(GoNum::Int(ei))) => match d {
            GoNum::Int(di) => di == ei,
            GoNum::Float(df) => df.is_finite() && df as i64 == ei,
        },
        (Kind::Num(d), Kind::Num(GoNum::Float(ef))) => d.as_f64() == ef,
        // An integer converts to the string of that rune.
        (Kind::Num(GoNum::Int(di)), Kind::Str) => {
            let c = u32::try_from(di).ok().and_then(char::from_u32).unwrap_or('\u{FFFD}');
            e.as_str() == Some(c.to_string().as_str())
        }
        _ => false,
    }
}

fn object_check(node: &Node, data: &Value, path: &str, old: Option<&Value>, out: &mut Vec<OaError>) {
    let Value::Object(map) = data else { return };
    let num_keys = map.len() as i64;
    if let Some(min) = node.min_properties
        && num_keys < min
    {
        out.push(OaError::new(
            Code::Other,
            path,
            Some(Value::from(num_keys)),
            format!("{path} in {IN} should have at least {min} properties"),
        ));
        return;
    }
    if let Some(max) = node.max_properties
        && num_keys > max
    {
        let mut e = OaError::new(
            Code::TooManyProperties,
            path,
            None,
            format!("{path} in {IN} should have at most {max} properties"),
        );
        e.valid = max;
        e.actual = num_keys;
        out.push(e);
        return;
    }
    match &node.additional {
        Some(Additional::Bool(false)) => {
            for k in map.keys() {
                if !node.properties.contains_key(k) {
                    out.push(OaError::new(
                        Code::Other,
                        path,
                        Some(Value::String(k.clone())),
                        format!("{path}.{k} in {IN} is a forbidden property"),
                    ));
                }
            }
        }
        Some(Additional::Schema(add)) => {
            for (k, v) in map {
                if !node.properties.contains_key(k) {
                    validate_node(add, v, &format!("{path}.{k}"), old.and_then(|o| o.get(k)), out);
                }
            }
        }
        _ => {}
    }
    for (name, prop) in &node.properties {
        if let Some(v) = map.get(name) {
            let child = if path.is_empty() { name.clone() } else { format!("{path}.{name}") };
            validate_node(prop, v, &child, old.and_then(|o| o.get(name)), out);
        }
    }
    for k in &node.required {
        if !map.contains_key(k) {
            out.push(OaError::new(
                Code::Required,
                &format!("{path}.{k}"),
                None,
                format!("{path}.{k} in {IN} is required"),
            ));
        }
    }
}

/// allOf/anyOf/oneOf/not (`schemaPropsValidator`). Sub-schemas validate the same value at the same path.
fn schema_props(node: &Node, data: &Value, path: &str, old: Option<&Value>, out: &mut Vec<OaError>) {
    let run = |n: &Node| {
        let mut v = Vec::new();
        validate_node(n, data, path, old, &mut v);
        v
    };
    if !node.any_of.is_empty() {
        let mut best: Option<Vec<OaError>> = None;
        let mut ok = false;
        for s in &node.any_of {
            let r = run(s);
            if r.is_empty() {
                ok = true;
                best = None;
                break;
            }
            // kube-openapi keeps the failure with the most passing checks; fewest errors approximates it.
            if best.as_ref().is_none_or(|b| r.len() < b.len()) {
                best = Some(r);
            }
        }
        if !ok {
            out.push(OaError::new(
                Code::Composite,
                path,
                None,
                format!("{} must validate at least one schema (anyOf)", gofmt::quote(path)),
            ));
        }
        if let Some(b) = best {
            out.extend(b);
        }
    }
    if !node.one_of.is_empty() {
        let mut best: Option<Vec<OaError>> = None;
        let mut validated = 0;
        for s in &node.one_of {
            let r = run(s);
            if r.is_empty() {
                validated += 1;
                best = None;
                continue;
            }
            if validated == 0 && best.as_ref().is_none_or(|b| r.len() < b.len()) {
                best = Some(r);
            }
        }
        if validated != 1 {
            let extra = if validated == 0 {
                "Found none valid".to_string()
            } else {
                format!("Found {validated} valid alternatives")
            };
            out.push(OaError::new(
                Code::Composite,
                path,
                None,
                format!("{} must validate one and only one schema (oneOf). {extra}", gofmt::quote(path)),
            ));
            if let Some(b) = best {
                out.extend(b);
            }
        }
    }
    if !node.all_of.is_empty() {
        let mut validated = 0;
        for s in &node.all_of {
            let r = run(s);
            if r.is_empty() {
                validated += 1;
            }
            out.extend(r);
        }
        if validated != node.all_of.len() {
            let extra = if validated == 0 { ". None validated" } else { "" };
            out.push(OaError::new(
                Code::Composite,
                path,
                None,
                format!("{} must validate all the schemas (allOf){extra}", gofmt::quote(path)),
            ));
        }
    }
    if let Some(not) = &node.not
        && run(not).is_empty()
    {
        out.push(OaError::new(
            Code::Composite,
            path,
            None,
            format!("{} must not validate the schema (not)", gofmt::quote(path)),
        ));
    }
}

/// `kubeOpenAPIResultToFieldErrors`.
fn to_field_error(e: OaError, base: &FPath) -> FieldError {
    if e.code == Code::Composite {
        return FieldError::invalid(base, BadValue::Json(Value::String(String::new())), e.message);
    }
    let p = if e.name.is_empty() || e.name == "." {
        base.clone()
    } else {
        errors::child(base, e.name.trim_start_matches('.'))
    };
    let value = e.value.clone().unwrap_or(Value::String(String::new()));
    match e.code {
        Code::Required => FieldError::required(&p, ""),
        Code::Enum => {
            let values: Vec<String> =
                e.values.iter().map(|v| v.as_str().map(str::to_string).unwrap_or_else(|| gofmt::go_json(v))).collect();
            FieldError::not_supported(&p, &value, &values)
        }
        Code::TooLong => FieldError::too_long(&p, e.valid),
        Code::MaxItems | Code::TooManyProperties => FieldError::too_many(&p, e.actual, e.valid),
        Code::InvalidType => {
            FieldError::new(super::errors::ErrorType::TypeInvalid, &p, BadValue::Json(value), e.message)
        }
        Code::Other | Code::Composite => FieldError::invalid(&p, BadValue::Json(value), e.message),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn errs(schema: Value, data: Value) -> Vec<String> {
        validate(&Node::parse(&schema), &data, None).iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn type_errors_name_the_data_type() {
        let s = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {"replicas": {"type": "integer"}}}}});
        assert_eq!(
            errs(s.clone(), json!({"spec": {"replicas": "3"}})),
            vec![r#"spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string""#]
        );
        assert!(errs(s.clone(), json!({"spec": {"replicas": 3.0}})).is_empty(), "integral floats are integers");
        assert_eq!(
            errs(s, json!({"spec": {"replicas": 1.5}})),
            vec![
                r#"spec.replicas: Invalid value: "number": spec.replicas in body must be of type integer: "number""#,
                // kube-openapi's range check, a plain error: no field path (as kube-apiserver 1.36 answers).
                r#"<nil>: Invalid value: "": Checked value must be of type integer (default format) in spec.replicas"#
            ]
        );
    }

    #[test]
    fn bounds_lengths_and_patterns() {
        let s = json!({"type": "object", "properties": {
            "w": {"type": "integer", "minimum": 1, "maximum": 100},
            "p": {"type": "number", "maximum": 1000000},
            "n": {"type": "string", "minLength": 1, "maxLength": 3, "pattern": "^[a-z]+$"},
            "l": {"type": "array", "maxItems": 2, "minItems": 1, "items": {"type": "string"}}
        }});
        assert_eq!(
            errs(s.clone(), json!({"w": 0, "p": 1e7, "n": "ABCD", "l": ["a", "b", "c"]})),
            vec![
                "l: Too many: 3: must have at most 2 items",
                "n: Too long: may not be more than 3 bytes",
                "p: Invalid value: 1e+07: p in body should be less than or equal to 1e+06",
                "w: Invalid value: 0: w in body should be greater than or equal to 1",
            ]
        );
        assert_eq!(
            errs(s.clone(), json!({"n": "AB"})),
            vec![r#"n: Invalid value: "AB": n in body should match '^[a-z]+$'"#]
        );
        assert_eq!(
            errs(s.clone(), json!({"n": ""})),
            vec![r#"n: Invalid value: "": n in body should be at least 1 chars long"#]
        );
        assert_eq!(errs(s, json!({"l": []})), vec!["l: Invalid value: 0: l in body should have at least 1 items"]);
    }

    #[test]
    fn exclusive_bounds_multiples_and_property_counts() {
        let s = json!({"type": "object", "properties": {
            "e": {"type": "integer", "minimum": 0, "exclusiveMinimum": true},
            "m": {"type": "integer", "multipleOf": 5},
            "f": {"type": "number", "multipleOf": 0.5},
            "o": {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string"}},
            "p": {"type": "object", "maxProperties": 1, "additionalProperties": {"type": "string"}}
        }});
        assert_eq!(
            errs(s, json!({"e": 0, "m": 7, "f": 0.7, "o": {}, "p": {"a": "1", "b": "2"}})),
            vec![
                "e: Invalid value: 0: e in body should be greater than 0",
                "f: Invalid value: 0.7: f in body should be a multiple of 0.5",
                "m: Invalid value: 7: m in body should be a multiple of 5",
                "o: Invalid value: 0: o in body should have at least 1 properties",
                "p: Too many: 2: must have at most 1 items",
            ]
        );
    }

    #[test]
    fn max_length_counts_characters() {
        let s = json!({"type": "object", "properties": {"n": {"type": "string", "maxLength": 2}}});
        assert!(errs(s, json!({"n": "éé"})).is_empty());
    }

    #[test]
    fn required_enum_and_null() {
        let s = json!({"type": "object", "required": ["a"], "properties": {
            "a": {"type": "string", "enum": ["x", "y"]},
            "b": {"type": "string"},
            "c": {"type": "string", "nullable": true}
        }});
        assert_eq!(errs(s.clone(), json!({})), vec!["a: Required value"]);
        assert_eq!(
            errs(s.clone(), json!({"a": "z"})),
            vec![r#"a: Unsupported value: "z": supported values: "x", "y""#]
        );
        assert_eq!(
            errs(s.clone(), json!({"a": "x", "b": null})),
            vec![r#"b: Invalid value: "null": b in body must be of type string: "null""#]
        );
        assert!(errs(s, json!({"a": "x", "c": null})).is_empty());
    }

    #[test]
    fn formats_and_int_or_string() {
        let s = json!({"type": "object", "properties": {
            "t": {"type": "string", "format": "date-time"},
            "q": {"x-kubernetes-int-or-string": true}
        }});
        assert_eq!(
            errs(s.clone(), json!({"t": "yesterday"})),
            vec![r#"t: Invalid value: "yesterday": t in body must be of type date-time: "yesterday""#]
        );
        assert!(errs(s.clone(), json!({"q": 1})).is_empty());
        assert!(errs(s.clone(), json!({"q": "1Gi"})).is_empty());
        assert_eq!(
            errs(s, json!({"q": true})),
            vec![r#"q: Invalid value: "boolean": q in body must be of type integer,string: "boolean""#]
        );
    }

    #[test]
    fn ratcheting_drops_errors_on_unchanged_values() {
        let node = Node::parse(&json!({"type": "object", "properties": {
            "a": {"type": "string", "maxLength": 1},
            "b": {"type": "string", "maxLength": 1}
        }}));
        let old = json!({"a": "long", "b": "x"});
        assert!(validate(&node, &json!({"a": "long", "b": "y"}), Some(&old)).is_empty());
        let e = validate(&node, &json!({"a": "long", "b": "yy"}), Some(&old));
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].field, "b");
    }
}
