//! Field errors shaped like `k8s.io/apimachinery/pkg/util/validation/field`, and the 422 they become.
//!
//! Owns: the error types and their wire names (`FieldValueInvalid`...), `ErrorBody()` rendering, field
//! path building (`a.b[0][key]`, `<nil>` for the root), and `Invalid`/`Cause` with the
//! `StatusError` message (`Kind.group "name" is invalid: [...]`). Must not decide what is an error.

use std::fmt;

use serde_json::Value;

use super::gofmt;

/// `field.ErrorType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ErrorType {
    Required,
    Duplicate,
    Invalid,
    NotSupported,
    Forbidden,
    TooLong,
    TooMany,
    TypeInvalid,
}

impl ErrorType {
    /// The `StatusCause.reason` (`metav1.CauseType`).
    pub(crate) fn reason(self) -> &'static str {
        match self {
            ErrorType::Required => "FieldValueRequired",
            ErrorType::Duplicate => "FieldValueDuplicate",
            ErrorType::Invalid => "FieldValueInvalid",
            ErrorType::NotSupported => "FieldValueNotSupported",
            ErrorType::Forbidden => "FieldValueForbidden",
            ErrorType::TooLong => "FieldValueTooLong",
            ErrorType::TooMany => "FieldValueTooMany",
            ErrorType::TypeInvalid => "FieldValueTypeInvalid",
        }
    }

    fn text(self) -> &'static str {
        match self {
            ErrorType::Required => "Required value",
            ErrorType::Duplicate => "Duplicate value",
            ErrorType::Invalid | ErrorType::TypeInvalid => "Invalid value",
            ErrorType::NotSupported => "Unsupported value",
            ErrorType::Forbidden => "Forbidden",
            ErrorType::TooLong => "Too long",
            ErrorType::TooMany => "Too many",
        }
    }
}

/// `field.Error.BadValue`, restricted to what our callers hold.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum BadValue {
    /// `omitValue`: only the type is printed.
    Omit,
    /// A value decoded from JSON (`interface{}` in Go); `Null` prints as `null`.
    Json(Value),
    /// A Go `int` (e.g. `TooMany`'s actual count), printed with `%#v` (plain decimal).
    Int(i64),
    /// A Go value printed verbatim (structs printed with `%#v` in the apiserver).
    Raw(String),
}

/// A field path: `None` is Go's nil `*field.Path`, which prints as `<nil>`.
pub(crate) type FPath = Option<String>;

pub(crate) fn child(p: &FPath, name: &str) -> FPath {
    Some(match p {
        None => name.to_string(),
        Some(p) if p.is_empty() => name.to_string(),
        Some(p) => format!("{p}.{name}"),
    })
}

pub(crate) fn index(p: &FPath, i: usize) -> FPath {
    Some(format!("{}[{i}]", p.as_deref().unwrap_or("")))
}

pub(crate) fn key(p: &FPath, k: &str) -> FPath {
    Some(format!("{}[{k}]", p.as_deref().unwrap_or("")))
}

pub(crate) fn path_str(p: &FPath) -> String {
    p.clone().unwrap_or_else(|| "<nil>".to_string())
}

/// `field.Error`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FieldError {
    pub ty: ErrorType,
    pub field: String,
    pub bad: BadValue,
    pub detail: String,
}

impl FieldError {
    pub(crate) fn new(ty: ErrorType, p: &FPath, bad: BadValue, detail: impl Into<String>) -> Self {
        FieldError { ty, field: path_str(p), bad, detail: detail.into() }
    }

    pub(crate) fn required(p: &FPath, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Required, p, BadValue::Json(Value::String(String::new())), detail)
    }

    pub(crate) fn forbidden(p: &FPath, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Forbidden, p, BadValue::Json(Value::String(String::new())), detail)
    }

    pub(crate) fn invalid(p: &FPath, bad: BadValue, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Invalid, p, bad, detail)
    }

    pub(crate) fn invalid_json(p: &FPath, v: &Value, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Invalid, p, BadValue::Json(v.clone()), detail)
    }

    pub(crate) fn invalid_str(p: &FPath, s: &str, detail: impl Into<String>) -> Self {
        Self::invalid(p, BadValue::Json(Value::String(s.to_string())), detail)
    }

    pub(crate) fn duplicate(p: &FPath, v: &Value) -> Self {
        Self::new(ErrorType::Duplicate, p, BadValue::Json(v.clone()), "")
    }

    pub(crate) fn not_supported<S: AsRef<str>>(p: &FPath, v: &Value, valid: &[S]) -> Self {
        let detail = if valid.is_empty() {
            String::new()
        } else {
            let quoted: Vec<String> = valid.iter().map(|s| gofmt::quote(s.as_ref())).collect();
            format!("supported values: {}", quoted.join(", "))
        };
        Self::new(ErrorType::NotSupported, p, BadValue::Json(v.clone()), detail)
    }

    /// `field.TooLong`: the value is never printed.
    pub(crate) fn too_long(p: &FPath, max: i64) -> Self {
        let detail =
            if max >= 0 { format!("may not be more than {max} bytes") } else { "value is too long".to_string() };
        Self::new(ErrorType::TooLong, p, BadValue::Omit, detail)
    }

    /// `field.TooMany`.
    pub(crate) fn too_many(p: &FPath, actual: i64, max: i64) -> Self {
        let detail = if max >= 0 {
            // apimachinery's tests show no singular form: "must have at most 1 items".
            format!("must have at most {max} items")
        } else {
            "has too many items".to_string()
        };
        let bad = if actual >= 0 { BadValue::Int(actual) } else { BadValue::Omit };
        Self::new(ErrorType::TooMany, p, bad, detail)
    }

    /// `ErrorBody()`: the message without the field.
    pub(crate) fn body(&self) -> String {
        let mut s = match self.ty {
            ErrorType::Required | ErrorType::Forbidden | ErrorType::TooLong => self.ty.text().to_string(),
            _ => match &self.bad {
                BadValue::Omit => self.ty.text().to_string(),
                BadValue::Json(v) => format!("{}: {}", self.ty.text(), render_value(v)),
                BadValue::Int(i) => format!("{}: {i}", self.ty.text()),
                BadValue::Raw(r) => format!("{}: {r}", self.ty.text()),
            },
        };
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }

    pub(crate) fn cause(&self) -> Cause {
        Cause { field: self.field.clone(), reason: self.ty.reason().to_string(), message: self.body() }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// How `ErrorBody` (apimachinery as of Kubernetes 1.34+) prints a `BadValue` holding decoded JSON:
/// simple types with `%v`, strings with `%q`, nil and composite values as JSON (`null`,
/// `{"port":80}`), as kube-apiserver 1.36 answers.
fn render_value(v: &Value) -> String {
    match v {
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => gofmt::num_v(gofmt::go_num(n)),
        Value::String(s) => gofmt::quote(s),
        other => gofmt::go_json(other),
    }
}

/// One `StatusCause` of a 422 Invalid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// The field path, e.g. `spec.template.spec.requirements[0].values` (`<nil>` for the object itself).
    pub field: String,
    /// The `StatusCause.reason`, e.g. `FieldValueInvalid`.
    pub reason: String,
    /// The message without the field, e.g. `Invalid value: 0: spec.weight in body should be greater than or equal to 1`.
    pub message: String,
}

/// A 422 Invalid as kube-apiserver returns it for a custom resource (`StatusReasonInvalid`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// `Kind.group` of the rejected object, e.g. `NodePool.karpenter.clever-cloud.com`.
    pub qualified_kind: String,
    /// `metadata.name` of the rejected object (may be empty).
    pub name: String,
    /// The causes, in the order the apiserver reports them (not de-duplicated, like `details.causes`).
    pub causes: Vec<Cause>,
}

impl Invalid {
    /// Whether any cause is on `field` with `reason`.
    pub fn has(&self, field: &str, reason: &str) -> bool {
        self.causes.iter().any(|c| c.field == field && c.reason == reason)
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `ErrorList.ToAggregate` drops repeated messages, then a one-element aggregate prints bare.
        let mut seen = std::collections::BTreeSet::new();
        let mut msgs = Vec::new();
        for c in &self.causes {
            let m = format!("{}: {}", c.field, c.message);
            if seen.insert(m.clone()) {
                msgs.push(m);
            }
        }
        write!(f, "{} {} is invalid", self.qualified_kind, gofmt::quote(&self.name))?;
        match msgs.len() {
            0 => Ok(()),
            1 => write!(f, ": {}", msgs[0]),
            _ => write!(f, ": [{}]", msgs.join(", ")),
        }
    }
}

impl std::error::Error for Invalid {}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bodies_render_like_apimachinery() {
        let p = Some("spec.x".to_string());
        assert_eq!(FieldError::required(&p, "").body(), "Required value");
        assert_eq!(FieldError::too_long(&p, 63).body(), "Too long: may not be more than 63 bytes");
        assert_eq!(FieldError::too_many(&p, 3, 2).body(), "Too many: 3: must have at most 2 items");
        assert_eq!(
            FieldError::not_supported(&p, &json!("x"), &["a", "b"]).body(),
            r#"Unsupported value: "x": supported values: "a", "b""#
        );
        assert_eq!(FieldError::duplicate(&p, &json!({"name": "a"})).body(), r#"Duplicate value: {"name":"a"}"#);
        assert_eq!(FieldError::invalid_json(&None, &Value::Null, "x").to_string(), r#"<nil>: Invalid value: null: x"#);
    }

    #[test]
    fn invalid_message_brackets_only_for_several_causes() {
        let one = Invalid {
            qualified_kind: "NodePool.karpenter.clever-cloud.com".into(),
            name: "default".into(),
            causes: vec![FieldError::required(&Some("spec.a".into()), "").cause()],
        };
        assert_eq!(
            one.to_string(),
            r#"NodePool.karpenter.clever-cloud.com "default" is invalid: spec.a: Required value"#
        );
        let mut two = one.clone();
        two.causes.push(FieldError::required(&Some("spec.b".into()), "").cause());
        two.causes.push(FieldError::required(&Some("spec.b".into()), "").cause());
        assert_eq!(
            two.to_string(),
            r#"NodePool.karpenter.clever-cloud.com "default" is invalid: [spec.a: Required value, spec.b: Required value]"#
        );
    }
}
