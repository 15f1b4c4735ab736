//! `karpenter-hub register`: onboard a workload cluster from an admin kubeconfig. Applies the
//! workload-side RBAC (`config/hub/workload-rbac.yaml`) by server-side apply, mints a bound token
//! with an expiry for its ServiceAccount (TokenRequest), builds a least-privilege kubeconfig
//! (server, CA, token — nothing else), checks that the hub will accept it and that it can list
//! NodeGroups, then writes the `<cluster>-kubeconfig` Secret in the management cluster (hub.md §1).
//! Running it again mints a new token: that is how the token is rotated.
//!
//! Everything that can be checked is checked before anything changes (both kubeconfigs usable, the
//! management namespace there and the Secret writable, the workload cluster a CKE cluster, no
//! object of the workload RBAC's names that `register` did not make, the RBAC applicable — by
//! server-side dry runs), so a refusal leaves both clusters as they were; and every step
//! converges, so running it again after a failure is safe.
//!
//! Owns: that sequence. Must not: copy the admin credentials anywhere, print the minted token,
//! change an object it did not make (the [`MANAGED_BY`] label), or write the Secret before the
//! minted kubeconfig has been proven to work.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use k8s_openapi::{
    ByteString,
    api::{
        authentication::v1::TokenRequest,
        core::v1::{ConfigMap, Secret, ServiceAccount},
    },
};
use kube::{
    Api, Client, Config, ResourceExt,
    api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::{Value, json};

use crate::{commands::run, infra::apierror::plain, infra::kubeconfig, infra::manifests, infra::registry};
use crds::NodeGroup;

/// The workload-side RBAC, as shipped for people who apply it by hand.
pub const WORKLOAD_RBAC: &str = include_str!("../../../config/hub/workload-rbac.yaml");
/// The hub's ServiceAccount in a workload cluster (distinct from the chart's `karpenter-hub`).
pub const SERVICE_ACCOUNT: &str = "karpenter-hub-workload";
/// The field manager of `register`'s server-side applies.
pub const FIELD_MANAGER: &str = "karpenter-hub-register";
/// The label (and its value) on every object `register` makes: it changes no other.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "karpenter-hub-register";
/// On the registration Secret: when the minted token expires (RFC 3339), for people and alerts.
pub const TOKEN_EXPIRES_ANNOTATION: &str = "karpenter.clever-cloud.com/token-expires-at";
/// The never-expiring token Secret of registrations made before bound tokens: never touched,
/// named in a warning.
const LEGACY_TOKEN_SECRET: &str = "karpenter-hub-token";
const LEGACY_SERVICE_ACCOUNT: &str = "karpenter-hub";

/// Flags of `karpenter-hub register`.
#[derive(Debug, Clone, clap::Args)]
pub struct RegisterArgs {
    /// Name of the workload cluster; the Secret is `<cluster>-kubeconfig` and NodePools name it in
    /// `spec.clusterName`.
    #[arg(long, value_parser = parse_cluster)]
    pub cluster: String,
    /// Namespace of the management cluster holding the cluster's NodePools.
    #[arg(long, short = 'n')]
    pub namespace: String,
    /// Kubeconfig with admin rights on the workload cluster (used once, never stored).
    #[arg(long, value_name = "FILE")]
    pub workload_kubeconfig: PathBuf,
    /// Context of that kubeconfig (default: its current context).
    #[arg(long)]
    pub workload_context: Option<String>,
    /// Kubeconfig of the management cluster (default: in-cluster, then $KUBECONFIG / ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of the hub's ServiceAccount in the workload cluster.
    #[arg(long, default_value = "karpenter-hub")]
    pub workload_namespace: String,
    /// API server URL the hub should use, when it differs from the admin kubeconfig's (e.g. a
    /// private endpoint reachable from the management cluster).
    #[arg(long)]
    pub server: Option<String>,
    /// Days the minted token is valid (a bound token; the workload API server may cap it with
    /// --service-account-max-token-expiration). Run `register` again before then: it mints a new
    /// one and replaces the Secret.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub token_duration_days: u32,
    /// A label of the cluster, `KEY=VALUE` (repeatable), set on the registration Secret; labels set
    /// there earlier, by `register` or by hand, are kept (docs/hub.md, "Cluster labels").
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
}

/// `--cluster` is not a DNS label (clap prints it after the value).
#[derive(Debug, thiserror::Error)]
#[error("--cluster must be a DNS label (it names the Secret `<cluster>-kubeconfig`): {reason}")]
pub struct ClusterArgError {
    reason: crds::validation::Reason,
}

fn parse_cluster(s: &str) -> Result<String, ClusterArgError> {
    crds::validation::dns1123_label(s).map_err(|reason| ClusterArgError { reason })?;
    Ok(s.to_string())
}

/// `--label` is not a Kubernetes label `KEY=VALUE` (clap prints it after the value).
#[derive(Debug, thiserror::Error)]
pub enum LabelArgError {
    #[error("--label takes KEY=VALUE (e.g. --label env=prod); this has no '='")]
    NoEquals,
    #[error("--label's key must be a label key ([prefix/]name, e.g. example.com/env): {0}")]
    Key(crds::validation::Reason),
    #[error("--label's value must be a label value (at most 63 characters, alphanumerics, '-', '_', '.'): {0}")]
    Value(crds::validation::Reason),
    #[error("--label may not set {} (it names the registered cluster; use --cluster)", registry::CLUSTER_NAME_LABEL)]
    Reserved,
}

fn parse_label(s: &str) -> Result<(String, String), LabelArgError> {
    let (key, value) = s.split_once('=').ok_or(LabelArgError::NoEquals)?;
    crds::validation::qualified_name(key).map_err(LabelArgError::Key)?;
    crds::validation::label_value(value).map_err(LabelArgError::Value)?;
    if key == registry::CLUSTER_NAME_LABEL {
        return Err(LabelArgError::Reserved);
    }
    Ok((key.to_string(), value.to_string()))
}

/// What stops a registration, each saying what to fix. Those raised by the checks before any
/// change say that nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("cannot use the workload kubeconfig {path}: {message}; nothing was changed")]
    WorkloadKubeconfig { path: String, message: String },
    #[error(
        "cannot reach the workload cluster with {path} ({message}): check the kubeconfig and its context; nothing was changed"
    )]
    WorkloadUnreachable { path: String, message: String },
    #[error(
        "the workload cluster of {path} serves no NodeGroups (api.clever-cloud.com/v1): is it a CKE cluster, and the right context? nothing was changed"
    )]
    NotCke { path: String },
    #[error(
        "the workload kubeconfig {path} may not apply {kind} {name} of the hub's workload RBAC ({message}): use a kubeconfig with admin rights on the workload cluster; nothing was changed"
    )]
    WorkloadRefused { path: String, kind: String, name: String, message: String },
    #[error("the hub would refuse a kubeconfig for server {server}: {message}; nothing was changed")]
    Server { server: String, message: String },
    #[error(
        "cannot reach the management cluster ({message}): check --kubeconfig (default: in-cluster, then $KUBECONFIG / ~/.kube/config); nothing was changed"
    )]
    ManagementUnreachable { message: String },
    #[error(
        "namespace {namespace} does not exist in the management cluster: create it (kubectl create namespace {namespace}) or name the namespace of the cluster's NodePools with -n; nothing was changed"
    )]
    ManagementNamespaceMissing { namespace: String },
    #[error(
        "the management kubeconfig may not write Secret {secret} in namespace {namespace} ({message}): it needs get, create and update on Secrets there; nothing was changed"
    )]
    ManagementRefused { namespace: String, secret: String, message: String },
    #[error("applying the workload RBAC: {0}")]
    Rbac(manifests::ManifestError),
    #[error(
        "{kind} {name} already exists in the workload cluster and was not made by `karpenter-hub register` (it lacks the label {MANAGED_BY_LABEL}={MANAGED_BY}), so register will not change it: if it is a leftover of the hub's workload RBAC, delete it (kubectl delete {resource} {name}{namespace_flag}) and run register again; if it is someone else's, it must go or be renamed before the hub's identity can use that name; nothing was changed"
    )]
    Foreign { kind: String, resource: String, name: String, namespace_flag: String },
    #[error(
        "cannot mint a token for ServiceAccount {namespace}/{SERVICE_ACCOUNT} (TokenRequest: {message}): the workload API server must serve serviceaccounts/token (service account token signing configured)"
    )]
    Token { namespace: String, message: String },
    #[error(
        "no CA for the workload API server: the admin kubeconfig trusts none of its own and ConfigMap {namespace}/kube-root-ca.crt did not appear within 30 s; give the kubeconfig a certificate-authority-data"
    )]
    NoCa { namespace: String },
    #[error("the minted kubeconfig would be refused by the hub: {0}")]
    Refused(String),
    #[error(
        "the minted identity cannot list NodeGroups in the workload cluster ({0}): check that it is a CKE cluster and that the RBAC applied"
    )]
    Verify(String),
    #[error("management cluster: {0}")]
    Management(#[from] run::RunError),
    #[error("Kubernetes API error: {}", plain(.0))]
    Kube(#[from] kube::Error),
    /// A request of the workload RBAC's apply, with its step.
    #[error(transparent)]
    Api(#[from] crate::infra::errors::ApiError),
}

impl From<manifests::ManifestError> for RegisterError {
    fn from(e: manifests::ManifestError) -> Self {
        match e {
            // Shown plainly, without kube's debug dump of the Status.
            manifests::ManifestError::Api(e) => RegisterError::Api(e),
            other => RegisterError::Rbac(other),
        }
    }
}

/// The RBAC documents with the ServiceAccount's namespace applied everywhere it appears.
pub fn rbac_documents(workload_namespace: &str) -> Result<Vec<Value>, manifests::ManifestError> {
    let mut docs = manifests::documents("config/hub/workload-rbac.yaml", WORKLOAD_RBAC)?;
    for doc in &mut docs {
        if let Some(subjects) = doc.get_mut("subjects").and_then(Value::as_array_mut) {
            for s in subjects {
                if s.get("kind").and_then(Value::as_str) == Some("ServiceAccount") {
                    s["namespace"] = Value::String(workload_namespace.to_string());
                }
            }
        }
    }
    Ok(docs)
}

/// The least-privilege kubeconfig: one cluster (server + CA), one token user, one context.
pub fn minted_kubeconfig(cluster: &str, server: &str, ca_pem: &[u8], token: &str) -> String {
    // ByteString serialises as base64, as `certificate-authority-data` wants.
    let ca = serde_json::to_value(ByteString(ca_pem.to_vec())).unwrap_or_default();
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": "karpenter-hub", "user": {"token": token}}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": "karpenter-hub"}}],
        "current-context": cluster,
    });
    // A kubeconfig is YAML; JSON is YAML.
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

/// What the checks established, for the steps that act.
struct Checked {
    admin: Client,
    mgmt: Client,
    server: String,
    /// The CA the admin kubeconfig trusts for the workload API server, as PEM.
    admin_ca: Option<Vec<u8>>,
}

/// Register one workload cluster. Returns the Secret's name.
pub async fn register(args: &RegisterArgs) -> Result<String, RegisterError> {
    let Checked { admin, mgmt, server, admin_ca } = check(args).await?;

    let ns = &args.workload_namespace;
    manifests::ensure_namespace(&admin, ns).await?;
    let path = args.workload_kubeconfig.display().to_string();
    for doc in rbac_documents(ns)? {
        apply(&admin, &doc, ns, &path, false).await?;
    }
    tracing::info!(cluster = %args.cluster, namespace = %ns, field_manager = FIELD_MANAGER, "workload RBAC applied");

    let (token, expires) = mint_token(&admin, ns, args.token_duration_days).await?;
    let ca = cluster_ca(&admin, admin_ca, ns).await?;
    let minted = minted_kubeconfig(&args.cluster, &server, &ca, &token);

    // The hub's own checks, then a real call as the minted identity.
    let hardened = kubeconfig::harden(minted.as_bytes(), kubeconfig::Policy::default())
        .map_err(|e| RegisterError::Refused(e.to_string()))?;
    let options = KubeConfigOptions { context: Some(hardened.context.clone()), ..KubeConfigOptions::default() };
    let config = Config::from_custom_kubeconfig(hardened.kubeconfig, &options)
        .await
        .map_err(|e| RegisterError::Refused(e.to_string()))?;
    let as_hub = Client::try_from(config).map_err(|e| RegisterError::Refused(e.to_string()))?;
    Api::<NodeGroup>::all(as_hub)
        .list(&ListParams::default().limit(1))
        .await
        .map_err(|e| RegisterError::Verify(plain(&e).to_string()))?;

    let expires_at = expires.map(|t| t.to_string());
    let name = write_registration(
        &mgmt,
        &args.namespace,
        &args.cluster,
        minted.into_bytes(),
        expires_at.as_deref(),
        &args.labels,
    )
    .await?;
    let asked = jiff::SignedDuration::from_hours(24 * i64::from(args.token_duration_days));
    if let Some(t) = expires
        && t < jiff::Timestamp::now() + asked - jiff::SignedDuration::from_hours(1)
    {
        tracing::warn!(cluster = %args.cluster, expires_at = %t, "the workload API server shortened the token's lifetime (--service-account-max-token-expiration): run register again before it expires");
    }
    tracing::info!(cluster = %args.cluster, namespace = %args.namespace, secret = %name, token_expires_at = expires_at.as_deref().unwrap_or("unknown"), "cluster registered; run register again before the token expires to rotate it");
    warn_about_legacy_token(&admin, ns).await;
    Ok(name)
}

/// Everything that can be known before acting, checked without changing either cluster (reads and
/// server-side dry runs, which the API server authorises, validates and admits like real writes).
async fn check(args: &RegisterArgs) -> Result<Checked, RegisterError> {
    let path = args.workload_kubeconfig.display().to_string();
    let bad = |message: String| RegisterError::WorkloadKubeconfig { path: path.clone(), message };
    let admin_kc = Kubeconfig::read_from(&args.workload_kubeconfig).map_err(|e| bad(e.to_string()))?;
    let options = KubeConfigOptions { context: args.workload_context.clone(), ..KubeConfigOptions::default() };
    let admin_config = Config::from_custom_kubeconfig(admin_kc, &options).await.map_err(|e| bad(e.to_string()))?;
    let server =
        args.server.clone().unwrap_or_else(|| admin_config.cluster_url.to_string().trim_end_matches('/').to_string());
    let admin_ca = admin_config.root_cert.as_deref().filter(|c| !c.is_empty()).map(pem_of);
    let admin = Client::try_from(admin_config).map_err(|e| bad(e.to_string()))?;

    // The server the hub will use must pass the hub's own policy (https, …): checked on a
    // stand-in of the minted kubeconfig, before a token exists.
    let stand_in = minted_kubeconfig(&args.cluster, &server, STAND_IN_CA, "stand-in");
    kubeconfig::harden(stand_in.as_bytes(), kubeconfig::Policy::default()).map_err(|e| RegisterError::Server {
        server: kubeconfig::redact_url(&server).into_owned(),
        message: e.to_string(),
    })?;

    // The management side first: the Secret is the last write, and the most common mistake (a
    // namespace not created yet) must not leave the workload cluster half set up.
    let mgmt = run::management_client(args.kubeconfig.as_ref()).await?;
    mgmt.apiserver_version()
        .await
        .map_err(|e| RegisterError::ManagementUnreachable { message: plain(&e).to_string() })?;
    check_secret_writable(&mgmt, &args.namespace, &args.cluster).await?;

    admin
        .apiserver_version()
        .await
        .map_err(|e| RegisterError::WorkloadUnreachable { path: path.clone(), message: plain(&e).to_string() })?;
    if let Err(e) = Api::<NodeGroup>::all(admin.clone()).list(&ListParams::default().limit(1)).await {
        return Err(match e {
            kube::Error::Api(s) if s.code == 404 => RegisterError::NotCke { path },
            e => RegisterError::WorkloadUnreachable { path, message: plain(&e).to_string() },
        });
    }
    let ns = &args.workload_namespace;
    let namespace_exists = namespace_exists(&admin, ns, &path).await?;
    for doc in rbac_documents(ns)? {
        // Objects of a namespace this run will create cannot be tried before it exists (and
        // cannot exist yet either).
        let in_missing_namespace = !namespace_exists && !manifests::is_cluster_scoped(kind_of(&doc));
        if !in_missing_namespace {
            apply(&admin, &doc, ns, &path, true).await?;
        }
    }
    Ok(Checked { admin, mgmt, server, admin_ca })
}

/// A syntactically valid CA for the stand-in kubeconfig (never used to connect).
const STAND_IN_CA: &[u8] = b"-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n";

fn kind_of(doc: &Value) -> &str {
    doc.get("kind").and_then(Value::as_str).unwrap_or_default()
}

/// Whether the Secret could be created (or replaced) in the management namespace: a dry run.
async fn check_secret_writable(mgmt: &Client, ns: &str, cluster: &str) -> Result<(), RegisterError> {
    let api: Api<Secret> = Api::namespaced(mgmt.clone(), ns);
    let secret = secret_object(cluster, Vec::new(), None, &[]);
    let name = secret.name_any();
    let dry = PostParams { dry_run: true, ..PostParams::default() };
    let refused = |e: kube::Error| match e {
        kube::Error::Api(s) if s.code == 404 && s.details.as_ref().is_some_and(|d| d.kind == "namespaces") => {
            RegisterError::ManagementNamespaceMissing { namespace: ns.to_string() }
        }
        kube::Error::Api(s) if s.code == 403 || s.code == 401 => RegisterError::ManagementRefused {
            namespace: ns.to_string(),
            secret: name.clone(),
            message: plain(&kube::Error::Api(s)).to_string(),
        },
        e => RegisterError::ManagementUnreachable { message: plain(&e).to_string() },
    };
    match api.create(&dry, &secret).await {
        Ok(_) => Ok(()),
        // Registered before: it will be replaced.
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let old = api.get(&name).await.map_err(refused)?;
            let mut secret = secret;
            secret.metadata.resource_version = old.resource_version();
            api.replace(&name, &dry, &secret).await.map(|_| ()).map_err(refused)
        }
        Err(e) => Err(refused(e)),
    }
}

/// Whether the workload namespace exists, by a dry run of its creation (which also proves the
/// admin may create it).
async fn namespace_exists(client: &Client, ns: &str, path: &str) -> Result<bool, RegisterError> {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap_or_default();
    match api.create(&PostParams { dry_run: true, ..PostParams::default() }, &namespace).await {
        Ok(_) => Ok(false),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(true),
        Err(e) => Err(RegisterError::WorkloadRefused {
            path: path.to_string(),
            kind: "Namespace".into(),
            name: ns.to_string(),
            message: plain(&e).to_string(),
        }),
    }
}

/// The API of one manifest document, with its kind and name.
fn api_of(client: &Client, doc: &Value, ns: &str) -> (Api<DynamicObject>, String, String) {
    let kind = kind_of(doc).to_string();
    let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
    let api_version = doc.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &kind));
    let api = if manifests::is_cluster_scoped(&kind) {
        Api::all_with(client.clone(), &ar)
    } else {
        Api::namespaced_with(client.clone(), ns, &ar)
    };
    (api, kind, name)
}

/// Server-side apply of one document of the workload RBAC as [`FIELD_MANAGER`], after checking
/// that the object is absent or carries [`MANAGED_BY`]: an object of that name someone else made
/// (the Helm chart's, another tool's) is refused, never merged into. Forced: an object that is
/// ours takes back every field of the manifest, e.g. after a `kubectl edit` of its rules.
/// `dry_run`: the check before any change (its refusals say that nothing was changed).
async fn apply(client: &Client, doc: &Value, ns: &str, path: &str, dry_run: bool) -> Result<(), RegisterError> {
    let (api, kind, name) = api_of(client, doc, ns);
    let refused = |e: kube::Error| {
        if dry_run {
            RegisterError::WorkloadRefused {
                path: path.to_string(),
                kind: kind.clone(),
                name: name.clone(),
                message: plain(&e).to_string(),
            }
        } else {
            RegisterError::Rbac(manifests::ManifestError::Refused {
                file: "config/hub/workload-rbac.yaml".into(),
                kind: kind.clone(),
                name: name.clone(),
                message: plain(&e).to_string(),
            })
        }
    };
    if let Some(existing) = api.get_opt(&name).await.map_err(refused)?
        && existing.labels().get(MANAGED_BY_LABEL).map(String::as_str) != Some(MANAGED_BY)
    {
        let namespace_flag = if manifests::is_cluster_scoped(&kind) { String::new() } else { format!(" -n {ns}") };
        return Err(RegisterError::Foreign { resource: kind.to_lowercase(), kind, name, namespace_flag });
    }
    let params = PatchParams { dry_run, ..PatchParams::apply(FIELD_MANAGER).force() };
    api.patch(&name, &params, &Patch::Apply(doc)).await.map_err(refused)?;
    Ok(())
}

/// A bound token of the hub's ServiceAccount (TokenRequest), valid `days` unless the API server
/// caps it; with its expiry as the API server set it.
async fn mint_token(admin: &Client, ns: &str, days: u32) -> Result<(String, Option<jiff::Timestamp>), RegisterError> {
    let failed = |message: String| RegisterError::Token { namespace: ns.to_string(), message };
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": i64::from(days) * 86_400}}))
            .map_err(|e| failed(e.to_string()))?;
    let answer = Api::<ServiceAccount>::namespaced(admin.clone(), ns)
        .create_token_request(SERVICE_ACCOUNT, &PostParams::default(), &request)
        .await
        .map_err(|e| failed(plain(&e).to_string()))?;
    let status = answer.status.ok_or_else(|| failed("the answer has no status".into()))?;
    if status.token.is_empty() {
        return Err(failed("the answer holds no token".into()));
    }
    Ok((status.token, Some(status.expiration_timestamp.0)))
}

/// The CA of the workload API server: the cluster's own (`kube-root-ca.crt`, what its pods
/// trust) when it is published in the namespace, else the one the admin kubeconfig trusts, else
/// the cluster's once published (30 s at most).
async fn cluster_ca(admin: &Client, admin_ca: Option<Vec<u8>>, ns: &str) -> Result<Vec<u8>, RegisterError> {
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), ns);
    let published = || async {
        let cm = api.get_opt("kube-root-ca.crt").await.ok().flatten()?;
        cm.data?.remove("ca.crt").filter(|c| !c.is_empty()).map(String::into_bytes)
    };
    if let Some(ca) = published().await.or(admin_ca) {
        return Ok(ca);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if let Some(ca) = published().await {
            return Ok(ca);
        }
    }
    Err(RegisterError::NoCa { namespace: ns.to_string() })
}

/// DER certificates as PEM.
fn pem_of(ders: &[Vec<u8>]) -> Vec<u8> {
    let mut out = String::new();
    for der in ders {
        // ByteString serialises as base64.
        let b64 = serde_json::to_value(ByteString(der.clone()))
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        for line in b64.as_bytes().chunks(64) {
            out.push_str(std::str::from_utf8(line).unwrap_or_default());
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out.into_bytes()
}

/// A registration made before bound tokens left a never-expiring token Secret: say so (it is
/// not `register`'s to delete — it carries no ownership label — but it should go).
async fn warn_about_legacy_token(admin: &Client, ns: &str) {
    let Ok(Some(s)) = Api::<Secret>::namespaced(admin.clone(), ns).get_opt(LEGACY_TOKEN_SECRET).await else { return };
    let for_legacy_account =
        s.annotations().get("kubernetes.io/service-account.name").map(String::as_str) == Some(LEGACY_SERVICE_ACCOUNT);
    if s.type_.as_deref() == Some("kubernetes.io/service-account-token") && for_legacy_account {
        tracing::warn!(
            namespace = %ns,
            secret = LEGACY_TOKEN_SECRET,
            "a never-expiring token of an older registration is still valid in the workload cluster: once the hub serves the cluster with the new registration, delete it (kubectl -n {ns} delete secret {LEGACY_TOKEN_SECRET}) and, unless this is the management cluster where the Helm chart owns them, the older identity (kubectl delete clusterrolebinding,clusterrole {LEGACY_SERVICE_ACCOUNT}; kubectl -n {ns} delete serviceaccount {LEGACY_SERVICE_ACCOUNT})"
        );
    }
}

/// The labelled `<cluster>-kubeconfig` Secret the registry watches.
fn secret_object(
    cluster: &str,
    kubeconfig: Vec<u8>,
    token_expires_at: Option<&str>,
    labels: &[(String, String)],
) -> Secret {
    let mut all: BTreeMap<String, String> = labels.iter().cloned().collect();
    all.insert(registry::CLUSTER_NAME_LABEL.to_string(), cluster.to_string());
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("{cluster}-kubeconfig")),
            labels: Some(all),
            annotations: token_expires_at
                .map(|t| BTreeMap::from([(TOKEN_EXPIRES_ANNOTATION.to_string(), t.to_string())])),
            ..Default::default()
        },
        type_: Some("cluster.x-k8s.io/secret".to_string()),
        data: Some(BTreeMap::from([(registry::KUBECONFIG_KEY.to_string(), ByteString(kubeconfig))])),
        ..Default::default()
    }
}

/// Create or replace the labelled `<cluster>-kubeconfig` Secret the registry watches.
pub async fn write_secret(mgmt: &Client, ns: &str, cluster: &str, kubeconfig: Vec<u8>) -> Result<String, kube::Error> {
    write_registration(mgmt, ns, cluster, kubeconfig, None, &[]).await
}

/// [`write_secret`], with the minted token's expiry noted on the Secret and `labels` added to it.
async fn write_registration(
    mgmt: &Client,
    ns: &str,
    cluster: &str,
    kubeconfig: Vec<u8>,
    token_expires_at: Option<&str>,
    labels: &[(String, String)],
) -> Result<String, kube::Error> {
    let api: Api<Secret> = Api::namespaced(mgmt.clone(), ns);
    let mut secret = secret_object(cluster, kubeconfig, token_expires_at, labels);
    let name = secret.name_any();
    match api.get_opt(&name).await? {
        None => {
            api.create(&PostParams::default(), &secret).await?;
        }
        Some(old) => {
            keep_metadata(&old, &mut secret);
            api.replace(&name, &PostParams::default(), &secret).await?;
        }
    }
    Ok(name)
}

/// What a replacement of registration Secret `old` keeps: its labels and annotations not set anew
/// (the cluster's labels, a Cluster API pause, a declared move: a token rotation must not drop
/// them), and its resourceVersion, so a concurrent change is a conflict rather than lost.
fn keep_metadata(old: &Secret, new: &mut Secret) {
    for (kept, set) in
        [(&old.metadata.labels, &mut new.metadata.labels), (&old.metadata.annotations, &mut new.metadata.annotations)]
    {
        if let Some(kept) = kept {
            let set = set.get_or_insert_with(BTreeMap::new);
            for (k, v) in kept {
                set.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    new.metadata.resource_version = old.metadata.resource_version.clone();
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_label_flag_is_a_kubernetes_label_or_refused_naming_what_to_fix() {
        assert_eq!(parse_label("env=prod").unwrap(), ("env".to_string(), "prod".to_string()));
        assert_eq!(parse_label("example.com/tier=").unwrap(), ("example.com/tier".to_string(), String::new()));
        assert!(matches!(parse_label("env"), Err(LabelArgError::NoEquals)));
        assert!(matches!(parse_label("bad key=x"), Err(LabelArgError::Key(_))));
        assert!(matches!(parse_label("env=not ok"), Err(LabelArgError::Value(_))));
        assert!(matches!(parse_label(&format!("env={}", "x".repeat(64))), Err(LabelArgError::Value(_))));
        let reserved = parse_label(&format!("{}=other", registry::CLUSTER_NAME_LABEL)).unwrap_err();
        assert!(reserved.to_string().contains("use --cluster"), "{reserved}");
        assert!(LabelArgError::NoEquals.to_string().contains("--label env=prod"));
    }

    #[test]
    fn a_new_registration_secret_keeps_what_the_old_one_carried_and_takes_what_is_set_anew() {
        let labels = [("env".to_string(), "prod".to_string())];
        let mut new = secret_object("alpha", b"new".to_vec(), Some("2027-01-01T00:00:00Z"), &labels);
        let mut old = secret_object("alpha", b"old".to_vec(), Some("2026-01-01T00:00:00Z"), &[]);
        old.metadata.resource_version = Some("42".into());
        old.metadata
            .labels
            .as_mut()
            .unwrap()
            .extend([("env".to_string(), "staging".to_string()), ("team".to_string(), "payments".to_string())]);
        old.metadata.annotations.as_mut().unwrap().insert("cluster.x-k8s.io/paused".into(), String::new());
        keep_metadata(&old, &mut new);
        let labels = new.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["env"], "prod", "a label set anew wins");
        assert_eq!(labels["team"], "payments", "a label set by hand is kept");
        assert_eq!(labels[registry::CLUSTER_NAME_LABEL], "alpha");
        let annotations = new.metadata.annotations.as_ref().unwrap();
        assert!(annotations.contains_key("cluster.x-k8s.io/paused"), "a pause survives a rotation");
        assert_eq!(annotations[TOKEN_EXPIRES_ANNOTATION], "2027-01-01T00:00:00Z");
        assert_eq!(new.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(new.data.as_ref().unwrap()[registry::KUBECONFIG_KEY].0, b"new");
    }

    #[test]
    fn the_rbac_binds_the_service_account_of_the_chosen_namespace() {
        let docs = rbac_documents("ops").unwrap();
        let binding = docs.iter().find(|d| d["kind"] == "ClusterRoleBinding").unwrap();
        assert_eq!(binding["subjects"][0]["namespace"], "ops");
        assert_eq!(binding["subjects"][0]["name"], SERVICE_ACCOUNT);
        assert!(docs.iter().any(|d| d["kind"] == "ServiceAccount" && d["metadata"]["name"] == SERVICE_ACCOUNT));
    }

    #[test]
    fn the_workload_rbac_has_names_of_its_own_an_ownership_label_and_no_token_secret() {
        let docs = rbac_documents("karpenter-hub").unwrap();
        for d in &docs {
            let name = d["metadata"]["name"].as_str().unwrap();
            assert_eq!(name, SERVICE_ACCOUNT, "{} {name} would clash with the chart's objects", d["kind"]);
            assert_eq!(d["metadata"]["labels"][MANAGED_BY_LABEL], MANAGED_BY, "{} {name}", d["kind"]);
            assert_ne!(d["kind"], "Secret", "no legacy token Secret");
        }
        let role = docs.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
        let nodes = role["rules"].as_array().unwrap().iter().find(|r| r["resources"] == json!(["nodes"])).unwrap();
        assert_eq!(nodes["verbs"], json!(["list", "watch", "patch"]), "nodes are only ever patched");
        for rule in role["rules"].as_array().unwrap() {
            let verbs = rule["verbs"].as_array().unwrap();
            assert!(!verbs.contains(&json!("*")) && !verbs.contains(&json!("deletecollection")), "{rule}");
            assert!(!verbs.contains(&json!("update")), "no update anywhere: {rule}");
        }
    }

    #[test]
    fn der_certificates_become_pem_in_lines_of_64() {
        let pem = pem_of(&[vec![0x30; 100]]);
        let text = String::from_utf8(pem).unwrap();
        assert!(text.starts_with("-----BEGIN CERTIFICATE-----\n") && text.ends_with("-----END CERTIFICATE-----\n"));
        assert!(text.lines().all(|l| l.len() <= 64), "{text}");
    }

    #[test]
    fn the_minted_kubeconfig_passes_the_hubs_hardening_and_holds_only_a_token() {
        let k = minted_kubeconfig(
            "prod",
            "https://10.0.0.1:6443",
            b"-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n",
            "t0k3n",
        );
        let h = kubeconfig::harden(k.as_bytes(), kubeconfig::Policy::default()).unwrap();
        assert_eq!(h.server, "https://10.0.0.1:6443");
        let user = &h.kubeconfig.auth_infos[0].auth_info.as_ref().unwrap();
        assert!(user.exec.is_none() && user.client_key_data.is_none() && user.token.is_some());
    }
}
