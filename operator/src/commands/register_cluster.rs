//! `karpenter-hub register`: onboard a workload cluster from an admin kubeconfig. Applies the
//! workload-side RBAC (`config/hub/workload-rbac.yaml`), waits for the ServiceAccount's token,
//! mints a least-privilege kubeconfig (server, CA, token — nothing else), checks that the hub will
//! accept it and that it can list NodeGroups, then writes the `<cluster>-kubeconfig` Secret in the
//! management cluster (hub.md §1).
//!
//! Everything that can be checked is checked before anything changes (both kubeconfigs usable, the
//! management namespace there and the Secret writable, the workload cluster a CKE cluster, the
//! RBAC applicable — by server-side dry runs), so a refusal leaves both clusters as they were; and
//! every step converges, so running it again after a failure is safe.
//!
//! Owns: that sequence. Must not: copy the admin credentials anywhere, print the minted token, or
//! write the Secret before the minted kubeconfig has been proven to work.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use k8s_openapi::{ByteString, api::core::v1::Secret};
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
const SERVICE_ACCOUNT: &str = "karpenter-hub";
const TOKEN_SECRET: &str = "karpenter-hub-token";

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
}

fn parse_cluster(s: &str) -> Result<String, String> {
    crds::validation::dns1123_label(s)
        .map_err(|e| format!("--cluster must be a DNS label (it names the Secret `<cluster>-kubeconfig`): {e}"))?;
    Ok(s.to_string())
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
        "the token of ServiceAccount {namespace}/{SERVICE_ACCOUNT} did not appear in Secret {TOKEN_SECRET} within 30 s: is the token controller running in the workload cluster?"
    )]
    NoToken { namespace: String },
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
}

impl From<manifests::ManifestError> for RegisterError {
    fn from(e: manifests::ManifestError) -> Self {
        match e {
            // Shown plainly, without kube's debug dump of the Status.
            manifests::ManifestError::Kube(e) => RegisterError::Kube(e),
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
}

/// Register one workload cluster. Returns the Secret's name.
pub async fn register(args: &RegisterArgs) -> Result<String, RegisterError> {
    let Checked { admin, mgmt, server } = check(args).await?;

    let ns = &args.workload_namespace;
    manifests::ensure_namespace(&admin, ns).await?;
    for doc in rbac_documents(ns)? {
        manifests::apply_value(&admin, &doc, ns, "config/hub/workload-rbac.yaml").await?;
    }
    tracing::info!(cluster = %args.cluster, namespace = %ns, "workload RBAC applied");

    let secrets: Api<Secret> = Api::namespaced(admin.clone(), ns);
    let (token, ca) = wait_for_token(&secrets).await.ok_or_else(|| RegisterError::NoToken { namespace: ns.clone() })?;
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

    let name = write_secret(&mgmt, &args.namespace, &args.cluster, minted.into_bytes()).await?;
    tracing::info!(cluster = %args.cluster, namespace = %args.namespace, secret = %name, "cluster registered");
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
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
    let namespace_exists = dry_run_apply(&admin, &namespace, ns, &path).await?;
    for doc in rbac_documents(ns)? {
        // Objects of a namespace this run will create cannot be tried before it exists.
        let in_missing_namespace = !namespace_exists && !manifests::is_cluster_scoped(kind_of(&doc));
        if !in_missing_namespace {
            dry_run_apply(&admin, &doc, ns, &path).await?;
        }
    }
    Ok(Checked { admin, mgmt, server })
}

/// A syntactically valid CA for the stand-in kubeconfig (never used to connect).
const STAND_IN_CA: &[u8] = b"-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n";

fn kind_of(doc: &Value) -> &str {
    doc.get("kind").and_then(Value::as_str).unwrap_or_default()
}

/// Whether the Secret could be created (or replaced) in the management namespace: a dry run.
async fn check_secret_writable(mgmt: &Client, ns: &str, cluster: &str) -> Result<(), RegisterError> {
    let api: Api<Secret> = Api::namespaced(mgmt.clone(), ns);
    let secret = secret_object(cluster, Vec::new());
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

/// Dry run of what [`manifests::apply_value`] will do with `doc`: create, or merge into the
/// existing object. `Ok(true)` when the object already exists.
async fn dry_run_apply(client: &Client, doc: &Value, ns: &str, path: &str) -> Result<bool, RegisterError> {
    let kind = kind_of(doc);
    let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let api_version = doc.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    let api: Api<DynamicObject> = if manifests::is_cluster_scoped(kind) {
        Api::all_with(client.clone(), &ar)
    } else {
        Api::namespaced_with(client.clone(), ns, &ar)
    };
    let refused = |e: kube::Error| RegisterError::WorkloadRefused {
        path: path.to_string(),
        kind: kind.to_string(),
        name: name.to_string(),
        message: plain(&e).to_string(),
    };
    let obj: DynamicObject = serde_json::from_value(doc.clone()).map_err(|e| {
        RegisterError::Rbac(manifests::ManifestError::Invalid {
            file: "config/hub/workload-rbac.yaml".into(),
            message: format!("{kind} {name}: {e}"),
        })
    })?;
    match api.create(&PostParams { dry_run: true, ..PostParams::default() }, &obj).await {
        Ok(_) => Ok(false),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let patch = PatchParams { dry_run: true, ..PatchParams::default() };
            api.patch(name, &patch, &Patch::Merge(doc)).await.map_err(refused)?;
            Ok(true)
        }
        Err(e) => Err(refused(e)),
    }
}

/// The token and CA the token controller put in the ServiceAccount's token Secret.
async fn wait_for_token(secrets: &Api<Secret>) -> Option<(String, Vec<u8>)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        if let Ok(Some(s)) = secrets.get_opt(TOKEN_SECRET).await {
            let data = s.data.unwrap_or_default();
            if let (Some(t), Some(ca)) = (data.get("token"), data.get("ca.crt"))
                && !t.0.is_empty()
                && !ca.0.is_empty()
                && let Ok(token) = String::from_utf8(t.0.clone())
            {
                return Some((token, ca.0.clone()));
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}

/// The labelled `<cluster>-kubeconfig` Secret the registry watches.
fn secret_object(cluster: &str, kubeconfig: Vec<u8>) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("{cluster}-kubeconfig")),
            labels: Some(BTreeMap::from([(registry::CLUSTER_NAME_LABEL.to_string(), cluster.to_string())])),
            ..Default::default()
        },
        type_: Some("cluster.x-k8s.io/secret".to_string()),
        data: Some(BTreeMap::from([(registry::KUBECONFIG_KEY.to_string(), ByteString(kubeconfig))])),
        ..Default::default()
    }
}

/// Create or replace the labelled `<cluster>-kubeconfig` Secret the registry watches.
pub async fn write_secret(mgmt: &Client, ns: &str, cluster: &str, kubeconfig: Vec<u8>) -> Result<String, kube::Error> {
    let api: Api<Secret> = Api::namespaced(mgmt.clone(), ns);
    let mut secret = secret_object(cluster, kubeconfig);
    let name = secret.name_any();
    match api.get_opt(&name).await? {
        None => {
            api.create(&PostParams::default(), &secret).await?;
        }
        Some(old) => {
            secret.metadata.resource_version = old.resource_version();
            api.replace(&name, &PostParams::default(), &secret).await?;
        }
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_rbac_binds_the_service_account_of_the_chosen_namespace() {
        let docs = rbac_documents("ops").unwrap();
        let binding = docs.iter().find(|d| d["kind"] == "ClusterRoleBinding").unwrap();
        assert_eq!(binding["subjects"][0]["namespace"], "ops");
        assert!(docs.iter().any(|d| d["kind"] == "ServiceAccount" && d["metadata"]["name"] == SERVICE_ACCOUNT));
        assert!(docs.iter().any(|d| d["kind"] == "Secret" && d["metadata"]["name"] == TOKEN_SECRET));
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
