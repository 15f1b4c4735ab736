//! `sim::apiserver::behaviour::names`: the names kube-apiserver accepts for a built-in kind (an
//! RFC 1123 label for namespaces and service accounts, a path segment for RBAC objects, an RFC
//! 1123 subdomain for the rest), refused with its wording.
//!
//! Owns: name validation of built-in kinds. Must not: judge custom resources' names (their schema
//! layer does) or touch the store.

use crate::apiserver::resources::Resource;

/// Why `name` is not a valid name for an object of `res` (the field error), or `None`.
pub(super) fn name_error(res: &Resource, name: &str) -> Option<String> {
    match res.plural.as_str() {
        "namespaces" | "serviceaccounts" => dns_label_errors(name),
        "roles" | "rolebindings" | "clusterroles" | "clusterrolebindings" => {
            (name.contains('/') || name.contains('%') || name == "." || name == "..")
                .then(|| format!("metadata.name: Invalid value: \"{name}\": may not contain '/'"))
        }
        _ => dns_subdomain_errors(name),
    }
}

/// DNS-1123 subdomain check (names of most kinds).
fn dns_subdomain_errors(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    (!ok).then(|| {
        format!(
            "metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        )
    })
}

fn dns_label_errors(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    (!ok).then(|| {
        format!(
            "metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        )
    })
}
