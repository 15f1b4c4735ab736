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
                json!({"reason": cause_reason(m), "message": m, "field": field})
            })
            .collect();
        let mut d = json!({"kind": res.kind, "causes": causes});
        // A nameless object's details have no name (Go's omitempty).
        if !name.is_empty() {
            d["name"] = json!(name);
        }
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
        ApiError {
            details: Some(json!({})),
            ..ApiError::new(404, "NotFound", "the server could not find the requested resource")
        }
    }

    /// A delete precondition (uid or resourceVersion) that does not hold; `what` is `UID` or
    /// `ResourceVersion`. kube-apiserver names the kind here, not the resource.
    pub fn precondition_failed(res: &Resource, name: &str, what: &str, wanted: &str, actual: &str) -> ApiError {
        let hint = if what == "UID" {
            "The object might have been deleted and then recreated"
        } else {
            "The object might have been modified"
        };
        let mut d = details(res, name);
        d["kind"] = json!(res.kind);
        ApiError {
            details: Some(d),
            ..ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": the {what} in the precondition ({wanted}) does not match the {what} in record ({actual}). {hint}",
                    res.kind
                ),
            )
        }
    }

    /// A JSON patch that does not apply (a failed `test`, a missing path): kube-apiserver's 422
    /// says only this, whatever the operation.
    pub fn json_patch_failed() -> ApiError {
        ApiError {
            details: Some(json!({})),
            ..ApiError::new(422, "Invalid", "the server rejected our request due to an error in our request")
        }
    }

    pub fn gone(msg: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", msg)
    }

    pub fn internal(msg: impl Into<String>) -> ApiError {
        ApiError::new(500, "InternalError", format!("Internal error occurred: {}", msg.into()))
    }

    /// A patch type the resource does not take (strategic merge on a custom resource).
    pub fn unsupported_patch_type() -> ApiError {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )
    }

    /// A PATCH whose content type is no patch type at all.
    pub fn unknown_patch_type() -> ApiError {
        ApiError {
            details: Some(json!({})),
            ..ApiError::new(415, "UnsupportedMediaType", "415: Unsupported Media Type")
        }
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
            "code": self.code,
        });
        // Errors without a reason (a plain Go error turned into a 500) have none in their Status.
        if !self.reason.is_empty() {
            s["reason"] = json!(self.reason);
        }
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

/// The reason of a field error's cause, from its message, as Go's `field.Error` types name them.
fn cause_reason(message: &str) -> &'static str {
    const REASONS: [(&str, &str); 7] = [
        ("Required value", "FieldValueRequired"),
        ("Forbidden", "FieldValueForbidden"),
        ("Unsupported value", "FieldValueNotSupported"),
        ("Duplicate value", "FieldValueDuplicate"),
        ("Too long", "FieldValueTooLong"),
        ("Too many", "FieldValueTooMany"),
        ("Not found", "FieldValueNotFound"),
    ];
    REASONS.iter().find(|(prefix, _)| message.starts_with(prefix)).map_or("FieldValueInvalid", |(_, r)| r)
}

/// A success `Status` (binding, eviction, some deletes).
pub(crate) fn success(code: u16) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code})
}
