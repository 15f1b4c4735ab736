//! Kubeconfig hardening (hub.md §2): a kubeconfig read from a registration Secret is untrusted
//! input. This module turns its bytes into a [`HardenedKubeconfig`] — one cluster, one user, one
//! context, inline credentials only — or a [`KubeconfigRejected`] that says which field is wrong and
//! how to fix it.
//!
//! Owns: size bound, parsing, the refusal of anything that would make the hub run a program
//! (`exec`, `auth-provider`), read its own files (`certificate-authority`, `client-certificate`,
//! `client-key`, `tokenFile`) or talk to a server without verifying it (`insecure-skip-tls-verify`,
//! plain `http://`), and the choice of the context.
//!
//! Must not: build clients or do any I/O, and must never put credential bytes in an error message
//! (the messages end up in conditions and events): parse errors report a location, never a snippet.

use kube::config::{Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};
use serde_json::Value;

/// Largest kubeconfig accepted. Real ones are a few KiB; a megabyte means a mistake or an attack.
pub const MAX_KUBECONFIG_BYTES: usize = 1024 * 1024;

/// What the operator allows beyond the safe default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    /// Accept `insecure-skip-tls-verify: true` and `http://` servers (flag
    /// `--allow-insecure-kubeconfig`; off by default: it exposes the cluster's token to anyone on the path).
    pub allow_insecure: bool,
}

/// Why a kubeconfig was refused. The message names the field and the fix; it never holds a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeconfigRejected {
    #[error(
        "the kubeconfig is {size} bytes, more than the {max} accepted; store only the one cluster, user and context the hub needs"
    )]
    TooLarge { size: usize, max: usize },
    #[error("the kubeconfig is not UTF-8 text; store the kubeconfig file itself under the key `value`")]
    NotUtf8,
    #[error("the kubeconfig is not valid YAML ({location}); check the indentation there")]
    Syntax { location: String },
    #[error("the kubeconfig holds {0} YAML documents; store a single kubeconfig")]
    MultipleDocuments(usize),
    #[error("`{field}` {problem}")]
    Shape { field: String, problem: String },
    #[error(
        "`{field}` runs a credential plugin; the hub never runs programs from a Secret: use a ServiceAccount token (`token`) or a client certificate (`client-certificate-data`/`client-key-data`), e.g. as written by `karpenter-hub register`"
    )]
    CredentialPlugin { field: String },
    #[error("`{field}` refers to a file; only inline data is accepted: use `{inline}` with the content instead")]
    FileReference { field: String, inline: &'static str },
    #[error(
        "`{field}` disables TLS verification; set `certificate-authority-data` to the cluster's CA instead (or start the hub with --allow-insecure-kubeconfig, not recommended)"
    )]
    InsecureTls { field: String },
    #[error(
        "`{field}` is `{server}`, not an https:// URL; the hub only sends credentials over verified TLS (or start the hub with --allow-insecure-kubeconfig, not recommended)"
    )]
    InsecureServer { field: String, server: String },
    #[error("{0}")]
    Context(String),
}

impl KubeconfigRejected {
    /// The `ClusterReachable` condition reason for this refusal (hub.md §4).
    pub fn reason(&self) -> &'static str {
        "InvalidKubeconfig"
    }
}

/// A kubeconfig reduced to the one context the hub uses, with every check passed.
#[derive(Debug, Clone)]
pub struct HardenedKubeconfig {
    /// Holds exactly one cluster, one user and one context, which is current.
    pub kubeconfig: Kubeconfig,
    /// The context's name.
    pub context: String,
    /// The API server URL (not a secret: shown in conditions).
    pub server: String,
}

/// Parse and check a kubeconfig from a registration Secret.
pub fn harden(bytes: &[u8], policy: Policy) -> Result<HardenedKubeconfig, KubeconfigRejected> {
    if bytes.len() > MAX_KUBECONFIG_BYTES {
        return Err(KubeconfigRejected::TooLarge { size: bytes.len(), max: MAX_KUBECONFIG_BYTES });
    }
    let text = std::str::from_utf8(bytes).map_err(|_| KubeconfigRejected::NotUtf8)?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| KubeconfigRejected::Syntax {
        location: e
            .location()
            .map_or_else(|| "location unknown".to_string(), |l| format!("line {}, column {}", l.line(), l.column())),
    })?;
    let mut docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    let doc = match docs.len() {
        0 => return Err(shape("value", "is empty; store a kubeconfig with a cluster, a user and a context")),
        1 => docs.remove(0),
        n => return Err(KubeconfigRejected::MultipleDocuments(n)),
    };
    check_shape(&doc)?;
    check_forbidden(&doc, policy)?;
    // The shape check above makes this conversion total in practice; its error text could quote a
    // value (a token), so it is replaced rather than passed on.
    let kubeconfig: Kubeconfig = serde_json::from_value(doc).map_err(|_| {
        shape(
            "value",
            "does not have the structure of a kubeconfig; compare it with `kubectl config view --raw --minify`",
        )
    })?;
    select(kubeconfig, policy)
}

fn shape(field: impl Into<String>, problem: impl Into<String>) -> KubeconfigRejected {
    KubeconfigRejected::Shape { field: field.into(), problem: problem.into() }
}

/// Field types, checked by hand so that errors name the field and never quote its value.
fn check_shape(doc: &Value) -> Result<(), KubeconfigRejected> {
    let Some(top) = doc.as_object() else {
        return Err(shape("value", "is not a YAML mapping; store a kubeconfig file"));
    };
    for (list, inner) in [("clusters", "cluster"), ("users", "user"), ("contexts", "context")] {
        let Some(items) = top.get(list) else { continue };
        if items.is_null() {
            continue;
        }
        let Some(items) = items.as_array() else {
            return Err(shape(list, "must be a list"));
        };
        for (i, item) in items.iter().enumerate() {
            let Some(item) = item.as_object() else {
                return Err(shape(format!("{list}[{i}]"), "must be a mapping with `name` and `{inner}`"));
            };
            if !item.get("name").is_some_and(Value::is_string) {
                return Err(shape(format!("{list}[{i}].name"), "must be a string"));
            }
            match item.get(inner) {
                None | Some(Value::Null) | Some(Value::Object(_)) => {}
                Some(_) => return Err(shape(format!("{list}[{i}].{inner}"), "must be a mapping")),
            }
            if let Some(Value::Object(body)) = item.get(inner) {
                for (key, value) in body {
                    let expected_string = matches!(
                        key.as_str(),
                        "server"
                            | "certificate-authority-data"
                            | "token"
                            | "client-certificate-data"
                            | "client-key-data"
                            | "username"
                            | "password"
                            | "cluster"
                            | "user"
                            | "namespace"
                            | "tls-server-name"
                            | "proxy-url"
                    );
                    if expected_string && !value.is_string() {
                        return Err(shape(format!("{list}[{i}].{inner}.{key}"), "must be a string"));
                    }
                    if key == "insecure-skip-tls-verify" && !value.is_boolean() {
                        return Err(shape(format!("{list}[{i}].{inner}.{key}"), "must be true or false"));
                    }
                }
            }
        }
    }
    if let Some(current) = top.get("current-context")
        && !(current.is_string() || current.is_null())
    {
        return Err(shape("current-context", "must be a string"));
    }
    Ok(())
}

/// Refuse programs, files and unverified TLS anywhere in the file, not only in the context used:
/// a kubeconfig that carries them was not written for the hub.
fn check_forbidden(doc: &Value, policy: Policy) -> Result<(), KubeconfigRejected> {
    let entries = |list: &str, inner: &str| -> Vec<(String, serde_json::Map<String, Value>)> {
        doc.get(list)
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .enumerate()
                    .filter_map(|(i, item)| {
                        item.get(inner).and_then(Value::as_object).map(|b| (format!("{list}[{i}].{inner}"), b.clone()))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    for (path, user) in entries("users", "user") {
        for plugin in ["exec", "auth-provider"] {
            if user.get(plugin).is_some_and(|v| !v.is_null()) {
                return Err(KubeconfigRejected::CredentialPlugin { field: format!("{path}.{plugin}") });
            }
        }
        for (file, inline) in [
            ("tokenFile", "token"),
            ("client-certificate", "client-certificate-data"),
            ("client-key", "client-key-data"),
        ] {
            if user.get(file).is_some_and(|v| !v.is_null()) {
                return Err(KubeconfigRejected::FileReference { field: format!("{path}.{file}"), inline });
            }
        }
    }
    for (path, cluster) in entries("clusters", "cluster") {
        if cluster.get("certificate-authority").is_some_and(|v| !v.is_null()) {
            return Err(KubeconfigRejected::FileReference {
                field: format!("{path}.certificate-authority"),
                inline: "certificate-authority-data",
            });
        }
        if !policy.allow_insecure && cluster.get("insecure-skip-tls-verify").and_then(Value::as_bool) == Some(true) {
            return Err(KubeconfigRejected::InsecureTls { field: format!("{path}.insecure-skip-tls-verify") });
        }
    }
    Ok(())
}

/// Keep the current context (or the only one) with its cluster and user.
fn select(kubeconfig: Kubeconfig, policy: Policy) -> Result<HardenedKubeconfig, KubeconfigRejected> {
    let context: NamedContext = match &kubeconfig.current_context {
        Some(name) if !name.is_empty() => {
            kubeconfig.contexts.iter().find(|c| &c.name == name).cloned().ok_or_else(|| {
                KubeconfigRejected::Context(format!(
                    "`current-context` is `{name}` but no entry of `contexts` has that name; set it to one of: {}",
                    names(kubeconfig.contexts.iter().map(|c| &c.name))
                ))
            })?
        }
        _ => match kubeconfig.contexts.as_slice() {
            [only] => only.clone(),
            [] => {
                return Err(KubeconfigRejected::Context(
                    "`contexts` is empty; add a context naming the cluster and the user".to_string(),
                ));
            }
            many => {
                return Err(KubeconfigRejected::Context(format!(
                    "`current-context` is not set and there are {} contexts; set `current-context` to one of: {}",
                    many.len(),
                    names(many.iter().map(|c| &c.name))
                )));
            }
        },
    };
    let Some(ctx) = context.context.as_ref() else {
        return Err(KubeconfigRejected::Context(format!(
            "context `{}` has no `context` body; give it `cluster` and `user`",
            context.name
        )));
    };
    let cluster: NamedCluster =
        kubeconfig.clusters.iter().find(|c| c.name == ctx.cluster).cloned().ok_or_else(|| {
            KubeconfigRejected::Context(format!(
                "context `{}` names cluster `{}`, which is not in `clusters`",
                context.name, ctx.cluster
            ))
        })?;
    let server = cluster.cluster.as_ref().and_then(|c| c.server.clone()).unwrap_or_default();
    let cluster_index = kubeconfig.clusters.iter().position(|c| c.name == ctx.cluster).unwrap_or_default();
    let server_field = format!("clusters[{cluster_index}].cluster.server");
    if server.is_empty() {
        return Err(shape(server_field, "is missing; set it to the API server's https:// URL"));
    }
    let acceptable = server.starts_with("https://") || (policy.allow_insecure && server.starts_with("http://"));
    if !acceptable {
        return Err(KubeconfigRejected::InsecureServer { field: server_field, server });
    }
    let user: Option<NamedAuthInfo> = match ctx.user.as_deref() {
        None | Some("") => None,
        Some(user) => Some(kubeconfig.auth_infos.iter().find(|u| u.name == user).cloned().ok_or_else(|| {
            KubeconfigRejected::Context(format!(
                "context `{}` names user `{user}`, which is not in `users`",
                context.name
            ))
        })?),
    };
    let name = context.name.clone();
    Ok(HardenedKubeconfig {
        kubeconfig: Kubeconfig {
            clusters: vec![cluster],
            auth_infos: user.into_iter().collect(),
            contexts: vec![context],
            current_context: Some(name.clone()),
            ..Kubeconfig::default()
        },
        context: name,
        server,
    })
}

fn names<'a>(names: impl Iterator<Item = &'a String>) -> String {
    names.map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const TOKEN: &str = "sekrit-token-9f8e7d";

    fn good() -> String {
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: prod
  cluster:
    server: https://prod.example:6443
    certificate-authority-data: Zm9v
users:
- name: hub
  user:
    token: {TOKEN}
contexts:
- name: hub@prod
  context:
    cluster: prod
    user: hub
current-context: hub@prod
"
        )
    }

    fn reject(yaml: &str) -> KubeconfigRejected {
        harden(yaml.as_bytes(), Policy::default()).expect_err("must be rejected")
    }

    #[test]
    fn a_plain_token_kubeconfig_is_accepted_and_reduced_to_its_context() {
        let extra = good().replace(
            "current-context: hub@prod",
            "- name: other\n  context:\n    cluster: prod\n    user: hub\ncurrent-context: hub@prod",
        );
        let h = harden(extra.as_bytes(), Policy::default()).unwrap();
        assert_eq!(h.context, "hub@prod");
        assert_eq!(h.server, "https://prod.example:6443");
        assert_eq!(h.kubeconfig.contexts.len(), 1);
        assert_eq!(h.kubeconfig.clusters.len(), 1);
        assert_eq!(h.kubeconfig.auth_infos.len(), 1);
        assert!(!format!("{h:?}").contains(TOKEN), "Debug must not show the token");
    }

    #[test]
    fn the_only_context_is_used_when_none_is_current() {
        let y = good().replace("current-context: hub@prod\n", "");
        assert_eq!(harden(y.as_bytes(), Policy::default()).unwrap().context, "hub@prod");
    }

    #[test]
    fn credential_plugins_are_refused() {
        let exec = good().replace(
            &format!("    token: {TOKEN}"),
            "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      args: [-c, id]",
        );
        let e = reject(&exec);
        assert_eq!(e, KubeconfigRejected::CredentialPlugin { field: "users[0].user.exec".into() });
        assert!(e.to_string().contains("never runs programs"));
        let ap = good().replace(&format!("    token: {TOKEN}"), "    auth-provider:\n      name: gcp");
        assert!(
            matches!(reject(&ap), KubeconfigRejected::CredentialPlugin { field } if field.ends_with("auth-provider"))
        );
    }

    #[test]
    fn file_references_are_refused_with_the_inline_field_to_use() {
        let e = reject(&good().replace(&format!("token: {TOKEN}"), "tokenFile: /var/run/secrets/token"));
        assert!(e.to_string().contains("`users[0].user.tokenFile`") && e.to_string().contains("`token`"), "{e}");
        let e = reject(&good().replace("certificate-authority-data: Zm9v", "certificate-authority: /etc/ca.crt"));
        assert!(e.to_string().contains("certificate-authority-data"), "{e}");
        let e = reject(&good().replace(&format!("token: {TOKEN}"), "client-key: /etc/hub.key"));
        assert!(e.to_string().contains("client-key-data"), "{e}");
    }

    #[test]
    fn unverified_tls_needs_the_operator_flag() {
        let insecure = good().replace("certificate-authority-data: Zm9v", "insecure-skip-tls-verify: true");
        assert!(matches!(reject(&insecure), KubeconfigRejected::InsecureTls { .. }));
        assert!(harden(insecure.as_bytes(), Policy { allow_insecure: true }).is_ok());
        let http = good().replace("https://", "http://");
        assert!(matches!(reject(&http), KubeconfigRejected::InsecureServer { .. }));
        assert!(harden(http.as_bytes(), Policy { allow_insecure: true }).is_ok());
    }

    #[test]
    fn size_encoding_and_syntax_errors_are_named() {
        let big = vec![b'#'; MAX_KUBECONFIG_BYTES + 1];
        assert!(matches!(harden(&big, Policy::default()), Err(KubeconfigRejected::TooLarge { .. })));
        assert_eq!(harden(&[0xff, 0xfe], Policy::default()).unwrap_err(), KubeconfigRejected::NotUtf8);
        let e = reject(&format!("clusters: [\n token: {TOKEN}"));
        assert!(matches!(e, KubeconfigRejected::Syntax { .. }), "{e:?}");
        assert!(!e.to_string().contains(TOKEN), "a syntax error must not quote the file: {e}");
        assert!(matches!(reject(&format!("{}---\n{}", good(), good())), KubeconfigRejected::MultipleDocuments(2)));
        assert!(matches!(reject(""), KubeconfigRejected::Shape { .. }));
    }

    #[test]
    fn wrong_types_name_the_field_without_quoting_the_value() {
        let e = reject(&good().replace(&format!("token: {TOKEN}"), &format!("token: [{TOKEN}]")));
        assert_eq!(e.to_string(), "`users[0].user.token` must be a string");
        let e = reject(&format!("users: {TOKEN}"));
        assert!(!e.to_string().contains(TOKEN));
    }

    #[test]
    fn context_problems_say_what_to_set() {
        let e = reject(&good().replace("current-context: hub@prod", "current-context: nope"));
        assert!(e.to_string().contains("`hub@prod`"), "{e}");
        let two =
            good().replace("current-context: hub@prod", "- name: b\n  context:\n    cluster: prod\n    user: hub");
        assert!(reject(&two).to_string().contains("set `current-context`"));
        let e = reject(&good().replace("    cluster: prod\n    user", "    cluster: gone\n    user"));
        assert!(e.to_string().contains("cluster `gone`"), "{e}");
        let e = reject(&good().replace("server: https://prod.example:6443", "tls-server-name: x"));
        assert!(e.to_string().contains("clusters[0].cluster.server"), "{e}");
    }

    proptest::proptest! {
        /// Whatever the bytes, hardening answers (never panics) and never echoes them back.
        #[test]
        fn arbitrary_input_never_panics_nor_leaks(prefix in "[ -~\n]{0,200}", secret in "[a-z]{24}") {
            let text = format!("{prefix}\ntoken: {secret}\n");
            if let Err(e) = harden(text.as_bytes(), Policy::default()) {
                proptest::prop_assert!(!e.to_string().contains(&secret));
            }
        }
    }
}
