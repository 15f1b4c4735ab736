//! Kubeconfig hardening (hub.md §2): a kubeconfig read from a registration Secret is untrusted
//! input. This module turns its bytes into a [`HardenedKubeconfig`] — one cluster, one user, one
//! context, inline credentials only — or a [`KubeconfigRejected`] that says which field is wrong and
//! how to fix it.
//!
//! Owns: size bound, parsing under explicit YAML limits ([`YamlLimit`]: aliases, anchors, nesting,
//! and what aliases expand to), the refusal of anything that would make the hub run a program
//! (`exec`, `auth-provider`), read its own files (`certificate-authority`, `client-certificate`,
//! `client-key`, `tokenFile`), talk to a server without verifying it (`insecure-skip-tls-verify`,
//! plain `http://`), put credentials in a URL (`user:password@`), go through a proxy
//! (`proxy-url`) or reach a link-local address (cloud metadata endpoints), and the choice of the
//! context. Also how the hub prints a URL: [`redact_url`], [`redact_urls`].
//!
//! Must not: build clients or do any I/O, and must never put credential bytes in an error message
//! (the messages end up in conditions and events): parse errors report a location, never a snippet,
//! and a refused URL is named by its field, never echoed.

use std::{
    borrow::Cow,
    fmt,
    net::{IpAddr, Ipv4Addr},
};

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
    /// Accept servers on link-local addresses, 169.254.0.0/16 and fe80::/10 (flag
    /// `--allow-link-local-servers`; off by default: cloud metadata endpoints answer there, and a
    /// tenant's kubeconfig would make the hub send requests to them). Loopback is always accepted.
    pub allow_link_local: bool,
}

/// The limits of the YAML parse. A kubeconfig as kubectl, clusterctl or `karpenter-hub register`
/// writes it has no anchor or alias and nests a handful of levels deep; these leave room for a hand-written
/// one and bound what aliases and merge keys can expand a 1 MiB Secret into (a few MiB of parsed
/// values instead of the parser's defaults, 64 MiB of text and 250,000 nodes per Secret).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum YamlLimit {
    /// Alias references (`*name`), and aliases out of proportion to the anchors they use.
    Aliases,
    /// Anchor definitions (`&name`).
    Anchors,
    /// Aliases replayed inside the expansion of other aliases.
    AliasNesting,
    /// Mappings and sequences nested in one another.
    Depth,
    /// Nodes (mappings, sequences, scalars) once every alias and merge key is expanded.
    ExpandedNodes,
    /// Bytes of text once every alias and merge key is expanded.
    ExpandedBytes,
    /// Merge keys (`<<`).
    MergeKeys,
    /// YAML documents (`---`).
    Documents,
}

impl YamlLimit {
    /// The largest number accepted.
    pub const fn max(self) -> usize {
        match self {
            YamlLimit::Aliases => 32,
            YamlLimit::Anchors => 32,
            YamlLimit::AliasNesting => 4,
            YamlLimit::Depth => 20,
            YamlLimit::ExpandedNodes => 20_000,
            YamlLimit::ExpandedBytes => MAX_KUBECONFIG_BYTES,
            YamlLimit::MergeKeys => 32,
            YamlLimit::Documents => 8,
        }
    }

    fn what(self) -> &'static str {
        match self {
            YamlLimit::Aliases => "YAML aliases (`*name`)",
            YamlLimit::Anchors => "YAML anchors (`&name`)",
            YamlLimit::AliasNesting => "levels of YAML aliases inside aliases",
            YamlLimit::Depth => "levels of nested mappings and sequences",
            YamlLimit::ExpandedNodes => "YAML nodes once aliases are expanded",
            YamlLimit::ExpandedBytes => "bytes of text once aliases are expanded",
            YamlLimit::MergeKeys => "YAML merge keys (`<<`)",
            YamlLimit::Documents => "YAML documents",
        }
    }

    /// serde-saphyr's options enforcing these limits. The parser counts what it replays from an
    /// alias like what it reads, so nodes and text are bounded after expansion.
    fn options() -> serde_saphyr::Options {
        let mut budget = serde_saphyr::Budget::default();
        budget.max_aliases = YamlLimit::Aliases.max();
        budget.max_anchors = YamlLimit::Anchors.max();
        budget.max_depth = YamlLimit::Depth.max();
        budget.flow_nesting_limit = YamlLimit::Depth.max();
        budget.max_nodes = YamlLimit::ExpandedNodes.max();
        // Every node is one or two events (start and end), plus the document's own.
        budget.max_events = 2 * YamlLimit::ExpandedNodes.max() + 4 * YamlLimit::Documents.max();
        budget.max_total_scalar_bytes = YamlLimit::ExpandedBytes.max();
        budget.max_recorded_anchor_bytes = YamlLimit::ExpandedBytes.max();
        budget.max_recorded_anchor_events = YamlLimit::ExpandedNodes.max();
        budget.max_merge_keys = YamlLimit::MergeKeys.max();
        budget.max_documents = YamlLimit::Documents.max();
        budget.max_inclusion_depth = 0;
        let mut aliases = serde_saphyr::options::AliasLimits::default();
        aliases.max_total_replayed_events = YamlLimit::ExpandedNodes.max();
        aliases.max_replay_stack_depth = YamlLimit::AliasNesting.max();
        let mut options = serde_saphyr::Options::default();
        options.budget = Some(budget);
        options.alias_limits = aliases;
        // Comments are never read: not kept either.
        options.emit_comments = false;
        options
    }

    /// The limit a parse error reports, if it is one.
    fn of(e: &serde_saphyr::Error) -> Option<YamlLimit> {
        use serde_saphyr::{Error as E, budget::BudgetBreach as B};
        let mut e = e;
        while let E::AliasError { error, .. } | E::WithSnippet { error, .. } = e {
            e = error;
        }
        Some(match e {
            E::Budget { breach, .. } => match breach {
                B::Aliases { .. } | B::AliasAnchorRatio { .. } => YamlLimit::Aliases,
                B::Anchors { .. } => YamlLimit::Anchors,
                B::Depth { .. } => YamlLimit::Depth,
                B::Documents { .. } => YamlLimit::Documents,
                B::MergeKeys { .. } => YamlLimit::MergeKeys,
                B::ScalarBytes { .. } | B::RecordedAnchorBytes { .. } | B::InputBytes { .. } => {
                    YamlLimit::ExpandedBytes
                }
                B::SequenceUnbalanced => return None,
                _ => YamlLimit::ExpandedNodes,
            },
            E::AliasReplayLimitExceeded { .. }
            | E::AliasExpansionLimitExceeded { .. }
            | E::AliasReplayCounterOverflow { .. } => YamlLimit::ExpandedNodes,
            E::AliasReplayStackDepthExceeded { .. } => YamlLimit::AliasNesting,
            // The scanner's own bound on nested flow collections (`[[[…`), which it can meet
            // before the parser reports the depth.
            E::ExternalMessage { source, .. }
                if matches!(
                    source.as_ref(),
                    serde_saphyr::ExternalMessageSource::Parser(scan)
                        if matches!(scan.kind(), serde_saphyr::granit_parser::ErrorKind::RecursionLimitExceeded)
                ) =>
            {
                YamlLimit::Depth
            }
            _ => return None,
        })
    }
}

impl fmt::Display for YamlLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.max(), self.what())
    }
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
    #[error(
        "the kubeconfig goes over the hub's limit of {limit} ({location}); a kubeconfig needs no YAML anchors, aliases, merge keys or deep nesting: store it as `kubectl config view --raw --minify --flatten` writes it"
    )]
    YamlLimit { limit: YamlLimit, location: String },
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
    #[error(
        "`{field}` holds credentials before its host (`user:password@` or `user@`); the hub refuses them, since it shows URLs in conditions, events and logs: remove them from the URL and authenticate with the user's `token` or `client-certificate-data`/`client-key-data`"
    )]
    CredentialsInUrl { field: String },
    #[error(
        "`{field}` is set, but the hub does not connect through proxies: remove it and let the hub reach the API server directly"
    )]
    Proxy { field: String },
    #[error(
        "`{field}` is a link-local address (169.254.0.0/16 or fe80::/10), where cloud metadata services answer; set the API server's own address (or start the hub with --allow-link-local-servers if the API server really is there)"
    )]
    LinkLocalServer { field: String },
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
    /// The API server URL (not a secret: shown in conditions; credentials in it were refused).
    pub server: String,
}

impl HardenedKubeconfig {
    /// The server's host name and port, when the host is a name rather than an address: what a
    /// connection resolves (and what the hub checks for link-local answers before it connects).
    pub fn server_host_name(&self) -> Option<(String, u16)> {
        let (scheme, authority, _) = split_url(&self.server);
        let (host, port) = host_port(authority);
        if host.is_empty() || host_ip(host).is_some() {
            return None;
        }
        let default = if scheme.eq_ignore_ascii_case("http://") { 80 } else { 443 };
        Some((host.to_string(), port.and_then(|p| p.parse().ok()).unwrap_or(default)))
    }
}

/// Parse and check a kubeconfig from a registration Secret.
pub fn harden(bytes: &[u8], policy: Policy) -> Result<HardenedKubeconfig, KubeconfigRejected> {
    if bytes.len() > MAX_KUBECONFIG_BYTES {
        return Err(KubeconfigRejected::TooLarge { size: bytes.len(), max: MAX_KUBECONFIG_BYTES });
    }
    let text = std::str::from_utf8(bytes).map_err(|_| KubeconfigRejected::NotUtf8)?;
    let docs: Vec<Value> = serde_saphyr::from_multiple_with_options(text, YamlLimit::options()).map_err(|e| {
        let location = e
            .location()
            .filter(|l| l.line() > 0)
            .map_or_else(|| "location unknown".to_string(), |l| format!("line {}, column {}", l.line(), l.column()));
        match YamlLimit::of(&e) {
            Some(limit) => KubeconfigRejected::YamlLimit { limit, location },
            None => KubeconfigRejected::Syntax { location },
        }
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
        let url = |key: &str| cluster.get(key).and_then(Value::as_str).filter(|u| !u.is_empty());
        for key in ["server", "proxy-url"] {
            if url(key).is_some_and(has_userinfo) {
                return Err(KubeconfigRejected::CredentialsInUrl { field: format!("{path}.{key}") });
            }
        }
        // kube's client here is built without its proxy features: a proxy would fail every client
        // build, and it would hide from the hub where its requests really go (docs/hub.md).
        if url("proxy-url").is_some() {
            return Err(KubeconfigRejected::Proxy { field: format!("{path}.proxy-url") });
        }
        if !policy.allow_link_local && url("server").is_some_and(is_link_local_url) {
            return Err(KubeconfigRejected::LinkLocalServer { field: format!("{path}.server") });
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
        return Err(KubeconfigRejected::InsecureServer {
            field: server_field,
            server: redact_url(&server).into_owned(),
        });
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

/// `url` split into its scheme with `://` (empty when there is none), its authority
/// (`userinfo@host:port`) and the rest (path, query, fragment).
fn split_url(url: &str) -> (&str, &str, &str) {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, rest) = rest.split_at(end);
    (scheme, authority, rest)
}

/// Whether a URL carries credentials. Any `@` counts, not only one in the authority as parsed:
/// no API server or proxy URL has one elsewhere, and a password holding an unescaped `/` would
/// otherwise pass for a path.
fn has_userinfo(url: &str) -> bool {
    url.contains('@')
}

/// `url` with any credentials before its host replaced by `<redacted>`: what the hub prints of a URL.
pub fn redact_url(url: &str) -> Cow<'_, str> {
    match url.rfind('@') {
        None => Cow::Borrowed(url),
        Some(at) => {
            let (scheme, _, _) = split_url(url);
            Cow::Owned(format!("{scheme}<redacted>{}", &url[at..]))
        }
    }
}

/// `text` with the credentials of every URL in it redacted (see [`redact_url`]): for messages
/// that quote what a library says, which may name a URL (kube's errors about a proxy do).
pub fn redact_urls(text: &str) -> Cow<'_, str> {
    if !text.contains('@') || !text.contains("://") {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (before, after) = rest.split_at(i + 3);
        out.push_str(before);
        // The URL runs to the next white space or quote: a password may hold any other character.
        let end = after.find(|c: char| c.is_whitespace() || "\"<>`".contains(c)).unwrap_or(after.len());
        let (url, tail) = after.split_at(end);
        match url.rfind('@') {
            Some(at) => {
                out.push_str("<redacted>");
                out.push_str(&url[at..]);
            }
            None => out.push_str(url),
        }
        rest = tail;
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// The host of an authority (brackets and an IPv6 zone removed) and its port, if any.
fn host_port(authority: &str) -> (&str, Option<&str>) {
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if let Some(inner) = hostport.strip_prefix('[') {
        let (host, after) = inner.split_once(']').unwrap_or((inner, ""));
        let host = host.split_once('%').map_or(host, |(h, _)| h);
        return (host, after.strip_prefix(':'));
    }
    match hostport.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (hostport, None),
    }
}

/// The address a host names literally, in any form a resolver accepts: IPv6, dotted IPv4, and
/// the shorter, octal and hexadecimal IPv4 forms of `inet_aton` (`2852039166`, `0xa9.0xfe.0xa9.0xfe`),
/// which `getaddrinfo` answers without asking DNS.
fn host_ip(host: &str) -> Option<IpAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Some(ip);
    }
    let number = |part: &str| -> Option<u64> {
        let (digits, radix) = match part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            Some(hex) => (hex, 16),
            None if part.len() > 1 && part.starts_with('0') => (&part[1..], 8),
            None => (part, 10),
        };
        if digits.is_empty() || digits.len() > 11 || !digits.chars().all(|c| c.is_digit(radix)) {
            return None;
        }
        u64::from_str_radix(digits, radix).ok()
    };
    let parts: Vec<u64> = host.split('.').map(number).collect::<Option<_>>()?;
    let (last, leading) = parts.split_last()?;
    if parts.len() > 4 || leading.iter().any(|p| *p > 255) || *last >= 1u64 << (8 * (5 - parts.len())) {
        return None;
    }
    let value = leading.iter().enumerate().fold(*last, |v, (i, p)| v | p << (24 - 8 * i));
    u32::try_from(value).ok().map(|v| IpAddr::V4(Ipv4Addr::from(v)))
}

/// Whether `ip` is link-local: 169.254.0.0/16 or fe80::/10, also as an IPv4-mapped IPv6 address.
pub fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_link_local()),
    }
}

/// Whether the host of `url` is a link-local address written literally.
fn is_link_local_url(url: &str) -> bool {
    let (_, authority, _) = split_url(url);
    host_ip(host_port(authority).0).is_some_and(is_link_local)
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
        let allow = Policy { allow_insecure: true, ..Policy::default() };
        assert!(harden(insecure.as_bytes(), allow).is_ok());
        let http = good().replace("https://", "http://");
        assert!(matches!(reject(&http), KubeconfigRejected::InsecureServer { .. }));
        assert!(harden(http.as_bytes(), allow).is_ok());
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

    /// What `e` says, checked never to quote `needles`.
    fn says(e: &KubeconfigRejected, needles: &[&str]) -> String {
        let m = e.to_string();
        for n in needles {
            assert!(!m.contains(n), "the refusal quotes {n:?}: {m}");
        }
        m
    }

    /// The classic alias bomb: a string, then levels of `fan` aliases of the level before.
    fn alias_bomb(levels: usize, fan: usize, leaf: &str) -> String {
        let mut y = format!("{}l0: &l0 \"{leaf}\"\n", good());
        for i in 1..=levels {
            let refs = vec![format!("*l{}", i - 1); fan].join(", ");
            y.push_str(&format!("l{i}: &l{i} [{refs}]\n"));
        }
        y
    }

    #[test]
    fn an_alias_bomb_is_refused_naming_the_limit_it_went_over() {
        // 650 bytes that would expand to 100 MiB (8^6 copies of 400 bytes): stopped in the fifth
        // level, past 1 MiB of text.
        let e = reject(&alias_bomb(6, 8, &"x".repeat(400)));
        assert!(matches!(e, KubeconfigRejected::YamlLimit { limit: YamlLimit::ExpandedBytes, .. }), "{e:?}");
        let m = says(&e, &["xxxxxxxx", TOKEN]);
        assert!(m.contains("limit of 1048576 bytes of text once aliases are expanded (line 22, column"), "{m}");
        assert!(m.contains("kubectl config view --raw --minify --flatten"), "the fix: {m}");
        // Many aliases of a short string.
        let e = reject(&alias_bomb(2, 20, "x"));
        assert!(matches!(e, KubeconfigRejected::YamlLimit { limit: YamlLimit::Aliases, .. }), "{e:?}");
        assert!(e.to_string().contains("limit of 32 YAML aliases (`*name`)"), "{e}");
        // Few aliases of a long list: the node limit.
        let list = format!("{}l0: &l0 [{}]\nl1: [{}]\n", good(), vec!["x"; 5_000].join(","), ["*l0"; 5].join(","));
        let e = reject(&list);
        assert!(matches!(e, KubeconfigRejected::YamlLimit { limit: YamlLimit::ExpandedNodes, .. }), "{e:?}");
        assert!(e.to_string().contains("20000 YAML nodes once aliases are expanded"), "{e}");
        // An anchor or two, as a hand-written kubeconfig may use, is fine.
        let shared = good().replace("certificate-authority-data: Zm9v", "certificate-authority-data: &ca Zm9v")
            + "extensions:\n- name: copy\n  extension: *ca\n";
        assert!(harden(shared.as_bytes(), Policy::default()).is_ok());
    }

    #[test]
    fn deep_nesting_is_refused_naming_the_depth_limit() {
        for nested in [
            format!("{}x: {}{}\n", good(), "[".repeat(200), "]".repeat(200)),
            format!("{}x: {}1{}\n", good(), "{a: ".repeat(50), "}".repeat(50)),
            (1..40).fold(good() + "x:\n", |y, i| format!("{y}{}k:\n", "  ".repeat(i))),
        ] {
            let e = reject(&nested);
            assert!(matches!(e, KubeconfigRejected::YamlLimit { limit: YamlLimit::Depth, .. }), "{e:?}");
            assert!(e.to_string().contains("20 levels of nested mappings and sequences"), "{e}");
        }
    }

    #[test]
    fn credentials_in_a_server_or_proxy_url_are_refused_without_echoing_them() {
        for (server, proxy, field) in [
            ("https://hub:pa55word@prod.example:6443", None, "clusters[0].cluster.server"),
            ("https://hub@prod.example:6443", None, "clusters[0].cluster.server"),
            ("https://hub:pa/55word@prod.example:6443", None, "clusters[0].cluster.server"),
            ("https://prod.example:6443", Some("http://squid:pa55word@10.0.0.1:3128"), "clusters[0].cluster.proxy-url"),
        ] {
            let mut y = good().replace("https://prod.example:6443", server);
            if let Some(proxy) = proxy {
                y = y.replace(
                    "    certificate-authority-data",
                    &format!("    proxy-url: {proxy}\n    certificate-authority-data"),
                );
            }
            let e = reject(&y);
            assert_eq!(e, KubeconfigRejected::CredentialsInUrl { field: field.into() }, "{server} {proxy:?}");
            let m = says(&e, &["pa55word", "squid", "hub:", "hub@"]);
            assert!(m.contains(&format!("`{field}` holds credentials")) && m.contains("`token`"), "{m}");
            // The insecure flag changes nothing.
            let allow = Policy { allow_insecure: true, allow_link_local: true };
            assert!(harden(y.as_bytes(), allow).is_err());
        }
        // Also on a cluster the context does not use.
        let other =
            good().replace("users:", "- name: spare\n  cluster:\n    server: https://a:pa55word@spare.example\nusers:");
        assert_eq!(reject(&other), KubeconfigRejected::CredentialsInUrl { field: "clusters[1].cluster.server".into() });
    }

    #[test]
    fn a_proxy_is_refused_with_the_fix() {
        let y = good().replace(
            "    certificate-authority-data",
            "    proxy-url: socks5://10.0.0.1:1080\n    certificate-authority-data",
        );
        let e = reject(&y);
        assert_eq!(e, KubeconfigRejected::Proxy { field: "clusters[0].cluster.proxy-url".into() });
        assert!(e.to_string().contains("remove it"), "{e}");
    }

    #[test]
    fn link_local_servers_need_the_operator_flag_and_loopback_does_not() {
        for server in [
            "https://169.254.169.254",
            "https://169.254.169.254:6443/api",
            "https://[fe80::1]:6443",
            "https://[fe80::a:b%25eth0]:6443",
            "https://[::ffff:169.254.169.254]",
            "https://2852039166:6443",
            "https://0xa9fea9fe",
            "https://0251.0376.0251.0376",
            "https://169.254.43518",
        ] {
            let y = good().replace("https://prod.example:6443", server);
            let e = reject(&y);
            assert_eq!(
                e,
                KubeconfigRejected::LinkLocalServer { field: "clusters[0].cluster.server".into() },
                "{server}"
            );
            assert!(e.to_string().contains("--allow-link-local-servers"), "{e}");
            let allow = Policy { allow_link_local: true, ..Policy::default() };
            assert_eq!(harden(y.as_bytes(), allow).unwrap().server, server);
        }
        for server in [
            "https://127.0.0.1:6443",
            "https://[::1]:6443",
            "https://localhost:6443",
            "https://169.255.0.1",
            "https://10.169.254.1",
            "https://169.254.example",
            "https://[fec0::1]",
        ] {
            let y = good().replace("https://prod.example:6443", server);
            assert!(harden(y.as_bytes(), Policy::default()).is_ok(), "{server} is not link-local");
        }
    }

    #[test]
    fn server_host_names_are_what_a_connection_resolves() {
        let host = |server: &str| {
            let y = good().replace("https://prod.example:6443", server);
            harden(y.as_bytes(), Policy { allow_insecure: true, ..Policy::default() }).unwrap().server_host_name()
        };
        assert_eq!(host("https://prod.example:6443"), Some(("prod.example".into(), 6443)));
        assert_eq!(host("https://prod.example/k8s/clusters/c-1"), Some(("prod.example".into(), 443)));
        assert_eq!(host("http://prod.example"), Some(("prod.example".into(), 80)));
        assert_eq!(host("https://10.0.0.1:6443"), None);
        assert_eq!(host("https://[::1]:6443"), None);
    }

    #[test]
    fn urls_are_printed_without_their_credentials() {
        assert_eq!(redact_url("https://u:pw@h.example:1/p"), "https://<redacted>@h.example:1/p");
        assert_eq!(redact_url("https://h.example:1/p"), "https://h.example:1/p");
        assert_eq!(redact_url("u:pw@h.example"), "<redacted>@h.example");
        assert_eq!(
            redact_urls(
                "configured proxy http://u:p@ss/w'rd@10.0.0.1:3128 requires the disabled feature \"kube/http-proxy\""
            ),
            "configured proxy http://<redacted>@10.0.0.1:3128 requires the disabled feature \"kube/http-proxy\""
        );
        assert_eq!(
            redact_urls("a https://x:y@a/b and \"socks5://q:r@c:1\" or mail@example.com"),
            "a https://<redacted>@a/b and \"socks5://<redacted>@c:1\" or mail@example.com"
        );
        assert_eq!(redact_urls("https://a.example/x"), "https://a.example/x");
        // An insecure server is named, its credentials are not (they are refused before).
        let e =
            KubeconfigRejected::InsecureServer { field: "f".into(), server: redact_url("http://u:pw@h").into_owned() };
        assert!(!e.to_string().contains("pw"), "{e}");
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
