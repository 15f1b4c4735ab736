//! Opt-in: a real API server calls the webhook through a ValidatingWebhookConfiguration (url +
//! caBundle) and admits or denies as documented.
//!
//! ```sh
//! KARPENTER_HUB_WEBHOOK_E2E_KUBECONFIG=~/.kube/config \
//! KARPENTER_HUB_WEBHOOK_E2E_HOST=192.168.1.20 \
//!     cargo test -p webhook --test e2e -- --nocapture
//! ```
//!
//! `KARPENTER_HUB_WEBHOOK_E2E_HOST` is an address of this machine the API server can reach (an IP
//! or DNS name; default `127.0.0.1`, right when the API server runs on this host). The test serves
//! the webhook in-process on that address with a generated certificate for it and real API lookups,
//! server-side applies the CRDs from `crds/`, creates a scratch namespace and a
//! ValidatingWebhookConfiguration built from `config/webhook/` but pointed at the URL and limited
//! to that namespace, checks the verdicts, then deletes both (the CRDs stay: deleting them would
//! delete user objects). Without the variable the test passes without doing anything.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{ValidatingWebhookConfiguration, WebhookClientConfig};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use webhook::references::ApiReferences;
use webhook::review::Kind;
use webhook::server::Settings;

const KUBECONFIG: &str = "KARPENTER_HUB_WEBHOOK_E2E_KUBECONFIG";
const HOST: &str = "KARPENTER_HUB_WEBHOOK_E2E_HOST";
const MANAGER: &str = "karpenter-hub-webhook-e2e";

fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

async fn client(path: &str) -> Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await.unwrap();
    Client::try_from(config).unwrap()
}

async fn apply_crds(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for entry in std::fs::read_dir(repo().join("crds")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let name = crd.metadata.name.clone().unwrap();
        api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&crd)).await.unwrap();
    }
}

/// The committed configuration, pointed at `base_url` with `ca`, limited to `namespace`.
fn webhook_configuration(name: &str, base_url: &str, ca: &str, namespace: &str) -> ValidatingWebhookConfiguration {
    let text = std::fs::read_to_string(repo().join("config/webhook/validating-webhook-configuration.yaml")).unwrap();
    let mut config: ValidatingWebhookConfiguration = serde_saphyr::from_str(&text).unwrap();
    config.metadata.name = Some(name.to_string());
    config.metadata.annotations = None;
    for hook in config.webhooks.iter_mut().flatten() {
        let path = hook.client_config.service.as_ref().and_then(|s| s.path.clone()).unwrap();
        hook.client_config = WebhookClientConfig {
            url: Some(format!("{base_url}{path}")),
            ca_bundle: Some(ByteString(ca.as_bytes().to_vec())),
            service: None,
        };
        hook.namespace_selector = Some(LabelSelector {
            match_labels: Some([("kubernetes.io/metadata.name".to_string(), namespace.to_string())].into()),
            match_expressions: None,
        });
    }
    config
}

fn object(kind: &str, name: &str, namespace: &str, spec: Value) -> Value {
    json!({"apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": kind, "metadata": {"name": name, "namespace": namespace}, "spec": spec})
}

fn dynamic_api(client: &Client, kind: Kind, namespace: &str) -> Api<kube::core::DynamicObject> {
    let resource = kube::core::ApiResource {
        group: "karpenter.clever-cloud.com".into(),
        version: "v1alpha1".into(),
        api_version: "karpenter.clever-cloud.com/v1alpha1".into(),
        kind: kind.name().into(),
        plural: kind.plural().into(),
    };
    Api::namespaced_with(client.clone(), namespace, &resource)
}

/// Creates the object; Ok or the API server's message.
async fn create(client: &Client, kind: Kind, namespace: &str, value: Value, dry_run: bool) -> Result<(), String> {
    let object: kube::core::DynamicObject = serde_json::from_value(value).unwrap();
    let params = PostParams { dry_run, ..Default::default() };
    dynamic_api(client, kind, namespace).create(&params, &object).await.map(|_| ()).map_err(|e| e.to_string())
}

#[tokio::test]
async fn a_real_api_server_admits_and_denies_through_the_webhook() {
    let Ok(kubeconfig) = std::env::var(KUBECONFIG) else {
        eprintln!("skipped: set {KUBECONFIG} (and {HOST}) to run against a real API server");
        return;
    };
    let _ = rustls::crypto::CryptoProvider::install_default(rustls::crypto::ring::default_provider());
    let host = std::env::var(HOST).unwrap_or_else(|_| "127.0.0.1".to_string());
    let client = client(&kubeconfig).await;
    apply_crds(&client).await;

    // Certificate for the host, server on all interfaces.
    let dir = std::env::temp_dir().join(format!("karpenter-hub-webhook-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_pem = {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec![host.clone()]).unwrap().signed_by(&key, &ca).unwrap();
        std::fs::write(dir.join("tls.crt"), leaf.pem()).unwrap();
        std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
        ca.pem()
    };
    let mut settings = Settings::new(([0, 0, 0, 0], 0).into(), dir.join("tls.crt"), dir.join("tls.key"));
    settings.shutdown_grace = Duration::from_secs(2);
    let references = Arc::new(ApiReferences::new(client.clone(), Duration::from_secs(2)));
    let server =
        webhook::server::start(settings, references, Arc::new(rustls::crypto::ring::default_provider())).await.unwrap();
    let url_host = if host.parse::<IpAddr>().is_ok_and(|ip| ip.is_ipv6()) { format!("[{host}]") } else { host.clone() };
    let base_url = format!("https://{url_host}:{}", server.address().port());

    let suffix = format!(
        "{:x}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() % 0xffffff
    );
    let namespace = format!("karpenter-hub-webhook-e2e-{suffix}");
    let config_name = format!("karpenter-hub-webhook-e2e-{suffix}");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    namespaces
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap())
        .await
        .unwrap();
    configs
        .create(&PostParams::default(), &webhook_configuration(&config_name, &base_url, &ca_pem, &namespace))
        .await
        .unwrap();

    let checks = {
        let (client, namespace) = (client.clone(), namespace.clone());
        tokio::spawn(async move { checks(&client, &namespace).await })
    };
    let outcome = checks.await;

    let _ = configs.delete(&config_name, &DeleteParams::default()).await;
    let _ = namespaces.delete(&namespace, &DeleteParams::default()).await;
    server.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(error) = outcome {
        std::panic::resume_unwind(error.into_panic());
    }
}

async fn checks(client: &Client, namespace: &str) {
    let free = object(
        "FlavorCatalog",
        "free",
        namespace,
        json!({"flavors": [{"name": "FREE", "cpu": 2, "memoryKi": 2097152, "priceHourly": 0}]}),
    );
    // The configuration takes effect within seconds: wait until the webhook answers.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match create(client, Kind::FlavorCatalog, namespace, free.clone(), true).await {
            Err(message) if message.contains("must not be free") => break,
            other => {
                assert!(tokio::time::Instant::now() < deadline, "the webhook never answered: last {other:?}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    // Denied with the field and the fix, through the API server.
    let message = create(client, Kind::FlavorCatalog, namespace, free, false).await.unwrap_err();
    assert!(message.contains("denied the request"), "{message}");
    assert!(message.contains("spec.flavors[0].priceHourly: a new flavor must not be free"), "{message}");

    // Allowed: a catalogue, a class referencing it (read back by the webhook), a pool using both.
    let catalog = object(
        "FlavorCatalog",
        "negotiated",
        namespace,
        json!({"flavors": [{"name": "M", "priceHourly": 0.105}, {"name": "XXL", "cpu": 32, "memoryKi": 64000000, "priceHourly": 0.4}]}),
    );
    create(client, Kind::FlavorCatalog, namespace, catalog, false).await.unwrap();
    let class = object(
        "CleverNodeClass",
        "default",
        namespace,
        json!({"labels": {"team": "a"}, "flavorCatalogRef": {"name": "negotiated"}}),
    );
    create(client, Kind::CleverNodeClass, namespace, class, false).await.unwrap();
    let pool = |name: &str, flavor: &str| {
        object(
            "NodePool",
            name,
            namespace,
            json!({
                "clusterName": "prod-paris",
                "template": {"spec": {
                    "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"},
                    "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [flavor]}]
                }},
                "disruption": {"consolidateAfter": "1m"}
            }),
        )
    };
    create(client, Kind::NodePool, namespace, pool("big", "XXL"), false).await.unwrap();

    // Denied by a cross-object check: no flavor of the class's catalogue is called XYZ.
    let message = create(client, Kind::NodePool, namespace, pool("nothing", "XYZ"), false).await.unwrap_err();
    assert!(message.contains("excludes every flavor"), "{message}");

    // Denied by a check the CRD cannot express: a label key the hub would drop from NodeGroups.
    let class =
        object("CleverNodeClass", "dropped", namespace, json!({"labels": {"node-role.kubernetes.io/worker": ""}}));
    let message = create(client, Kind::CleverNodeClass, namespace, class, false).await.unwrap_err();
    assert!(message.contains("spec.labels[node-role.kubernetes.io/worker]"), "{message}");

    // An update that changes the spec is reviewed too.
    let api = dynamic_api(client, Kind::NodePool, namespace);
    let patch = json!({"spec": {"template": {"spec": {"requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["XYZ"]}]}}}});
    let error = api.patch("big", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap_err().to_string();
    assert!(error.contains("excludes every flavor"), "{error}");
    // A metadata-only update skips the webhook (matchConditions) and is allowed.
    let patch = json!({"metadata": {"labels": {"touched": "yes"}}});
    api.patch("big", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

/// Runs always: the configuration the opt-in test registers calls the URL with the CA, for the
/// scratch namespace only, and keeps every other setting of the committed one.
#[test]
fn the_registered_configuration_points_at_the_url_and_stays_in_its_namespace() {
    let config = webhook_configuration("e2e", "https://192.0.2.7:4443", "PEM", "scratch");
    assert_eq!(config.metadata.name.as_deref(), Some("e2e"));
    assert!(config.metadata.annotations.is_none(), "no cert-manager injection");
    let hooks = config.webhooks.unwrap();
    assert_eq!(hooks.len(), Kind::ALL.len());
    for (hook, kind) in hooks.iter().zip(Kind::ALL) {
        assert!(hook.client_config.service.is_none());
        assert_eq!(hook.client_config.url.as_deref(), Some(format!("https://192.0.2.7:4443{}", kind.path()).as_str()));
        assert_eq!(hook.client_config.ca_bundle.as_ref().map(|b| b.0.as_slice()), Some(&b"PEM"[..]));
        let selector = hook.namespace_selector.as_ref().unwrap();
        assert_eq!(selector.match_labels.as_ref().unwrap()["kubernetes.io/metadata.name"], "scratch");
        assert_eq!(hook.failure_policy.as_deref(), Some("Fail"));
        assert!(hook.match_conditions.as_ref().is_some_and(|c| !c.is_empty()));
    }
}
