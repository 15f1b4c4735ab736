//! `karpenter-hub register`: onboard a workload cluster from an admin kubeconfig. Applies the
//! workload-side RBAC (`config/hub/workload-rbac.yaml`), waits for the ServiceAccount's token,
//! mints a least-privilege kubeconfig (server, CA, token — nothing else), checks that the hub will
//! accept it and that it can list NodeGroups, then writes the `<cluster>-kubeconfig` Secret in the
//! management cluster (hub.md §1).
//!
//! Owns: that sequence. Must not: copy the admin credentials anywhere, print the minted token, or
//! write the Secret before the minted kubeconfig has been proven to work.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api, Client, Config, ResourceExt,
    api::{ListParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::{Value, json};

use crate::{kubeconfig, manifests, registry, run};
use crds::NodeGroup;

/// The workload-side RBAC, as shipped for people who apply it by hand.
pub const WORKLOAD_RBAC: &str = include_str!("../../config/hub/workload-rbac.yaml");
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

/// What stops a registration, each saying what to fix.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("cannot use the workload kubeconfig {path}: {message}")]
    WorkloadKubeconfig { path: String, message: String },
    #[error("applying the workload RBAC: {0}")]
    Rbac(#[from] manifests::ManifestError),
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
    #[error("Kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
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

/// Register one workload cluster. Returns the Secret's name.
pub async fn register(args: &RegisterArgs) -> Result<String, RegisterError> {
    let path = args.workload_kubeconfig.display().to_string();
    let bad = |message: String| RegisterError::WorkloadKubeconfig { path: path.clone(), message };
    let admin_kc = Kubeconfig::read_from(&args.workload_kubeconfig).map_err(|e| bad(e.to_string()))?;
    let options = KubeConfigOptions { context: args.workload_context.clone(), ..KubeConfigOptions::default() };
    let admin_config = Config::from_custom_kubeconfig(admin_kc, &options).await.map_err(|e| bad(e.to_string()))?;
    let server =
        args.server.clone().unwrap_or_else(|| admin_config.cluster_url.to_string().trim_end_matches('/').to_string());
    let admin = Client::try_from(admin_config).map_err(|e| bad(e.to_string()))?;

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
        .map_err(|e| RegisterError::Verify(e.to_string()))?;

    let mgmt = run::management_client(args.kubeconfig.as_ref()).await?;
    let name = write_secret(&mgmt, &args.namespace, &args.cluster, minted.into_bytes()).await?;
    tracing::info!(cluster = %args.cluster, namespace = %args.namespace, secret = %name, "cluster registered");
    Ok(name)
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

/// Create or replace the labelled `<cluster>-kubeconfig` Secret the registry watches.
pub async fn write_secret(mgmt: &Client, ns: &str, cluster: &str, kubeconfig: Vec<u8>) -> Result<String, kube::Error> {
    let api: Api<Secret> = Api::namespaced(mgmt.clone(), ns);
    let name = format!("{cluster}-kubeconfig");
    let mut secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([(registry::CLUSTER_NAME_LABEL.to_string(), cluster.to_string())])),
            ..Default::default()
        },
        type_: Some("cluster.x-k8s.io/secret".to_string()),
        data: Some(BTreeMap::from([(registry::KUBECONFIG_KEY.to_string(), ByteString(kubeconfig))])),
        ..Default::default()
    };
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
