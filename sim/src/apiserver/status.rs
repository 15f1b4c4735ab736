//! API errors rendered as `metav1.Status`, worded like kube-apiserver's.
//! Must not do: decide when an error happens.

use serde_json::{Value, json};

use super::resources::Resource;
use crate::schema::Invalid;

/// An error response: HTTP code, `reason` and message, optional `details`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
    /// `Retry-After` seconds, for 429/503.
    pub retry_after: Option<u64>,
}

fn details(res: &Resource, name: &str) -> Value {
    let mut d = json!({"name": name, "kind": res.plural});
    if !res.group.is_empty() {
        d["group"] = json!(res.group);
    }
    d
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { code, reason, message: message.into(), details: None, retry_after: None }
    }

    pub fn not_found(res: &Resource, name: &str) -> ApiError {
        ApiError {
            details: Some(details(res, name)),
            ..ApiError::new(404, "NotFound", format!("{} \"{name}\" not found", res.qualified()))
        }
    }

    pub fn namespace_not_found(ns: &str) -> ApiError {
        ApiError {
            details: Some(json!({"name": ns, "kind": "namespaces"})),
            ..ApiError::new(404, "NotFound", format!("namespaces \"{ns}\" not found"))
        }
    }

    pub fn already_exists(res: &Resource, name: &str) -> ApiError {
        ApiError {
            details: Some(details(res, name)),
            ..ApiError::new(409, "AlreadyExists", format!("{} \"{name}\" already exists", res.qualified()))
        }
    }

    pub fn conflict(res: &Resource, name: &str, why: &str) -> ApiError {
        ApiError {
            details: Some(details(res, name)),
            ..ApiError::new(
                409,
                "Conflict",
                format!("Operation cannot be fulfilled on {} \"{name}\": {why}", res.qualified()),
            )
        }
    }

    pub fn stale(res: &Resource, name: &str) -> ApiError {
        ApiError::conflict(
            res,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn invalid(inv: &Invalid) -> ApiError {
        let (kind, group) = inv.qualified_kind.split_once('.').unwrap_or((inv.qualified_kind.as_str(), ""));
        let causes: Vec<Value> =
            inv.causes.iter().map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field})).collect();
        let mut d = json!({"name": inv.name, "kind": kind, "causes": causes});
        if !group.is_empty() {
            d["group"] = json!(group);
        }
        ApiError { details: Some(d), ..ApiError::new(422, "Invalid", inv.to_string()) }
    }

    /// A 422 from a list of `field: message` strings (built-in validation, CRD validation).
    pub fn invalid_fields(res: &Resource, name: &str, errs: &[String]) -> ApiError {
        let qualified = if res.group.is_empty() { res.kind.clone() } else { format!("{}.{}", res.kind, res.group) };
        let msg = match errs {
            [] => format!("{qualified} \"{name}\" is invalid"),
            [one] => format!("{qualified} \"{name}\" is invalid: {one}"),
            many => format!("{qualified} \"{name}\" is invalid: [{}]", many.join(", ")),
        };
        let causes: Vec<Value> = errs
            .iter()
            .map(|e| {
                let (field, m) = e.split_once(": ").unwrap_or(("", e.as_str()));
                json!({"reason": "FieldValueInvalid", "message": m, "field": field})
            })
            .collect();
        let mut d = json!({"name": name, "kind": res.kind, "causes": causes});
        if !res.group.is_empty() {
            d["group"] = json!(res.group);
        }
        ApiError { details: Some(d), ..ApiError::new(422, "Invalid", msg) }
    }

    pub fn bad_request(msg: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", msg)
    }

    pub fn forbidden(res: &Resource, name: &str, why: &str) -> ApiError {
        ApiError {
            details: Some(details(res, name)),
            ..ApiError::new(403, "Forbidden", format!("{} \"{name}\" is forbidden: {why}", res.qualified()))
        }
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
    }

    pub fn not_found_path() -> ApiError {
        ApiError::new(404, "NotFound", "the server could not find the requested resource")
    }

    pub fn gone(msg: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", msg)
    }

    pub fn internal(msg: impl Into<String>) -> ApiError {
        ApiError::new(500, "InternalError", format!("Internal error occurred: {}", msg.into()))
    }

    pub fn unsupported_media_type(ct: &str) -> ApiError {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {ct})"
            ),
        )
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    /// An injected fault with this HTTP status.
    pub fn injected(code: u16) -> ApiError {
        match code {
            429 => ApiError {
                retry_after: Some(1),
                details: Some(json!({"retryAfterSeconds": 1})),
                ..ApiError::new(429, "TooManyRequests", "Too many requests, please try again later.")
            },
            503 => ApiError {
                retry_after: Some(1),
                ..ApiError::new(503, "ServiceUnavailable", "The server is currently unable to handle the request")
            },
            c => ApiError { code: c, ..ApiError::internal("injected fault") },
        }
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

/// A success `Status` (binding, eviction, some deletes).
pub(crate) fn success(code: u16) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code})
}
