//! A real API server calls the webhook through a ValidatingWebhookConfiguration (url + caBundle)
//! and admits or denies as documented (docs/webhook.md, "Tested on a real API server").
//!
//! Runs in every `cargo test` on an envtest control plane (`KUBEBUILDER_ASSETS`; a visible skip
//! without it, a failure under `KARPENTER_HUB_REQUIRE_ENVTEST=1`). To run it against a cluster of
//! your own instead:
//!
//! ```sh
//! KARPENTER_HUB_WEBHOOK_E2E_KUBECONFIG=~/.kube/config \
//! KARPENTER_HUB_WEBHOOK_E2E_HOST=192.168.1.20 \
//!     cargo test -p webhook --test e2e -- --nocapture
//! ```
//!
//! `KARPENTER_HUB_WEBHOOK_E2E_HOST` is an address of this machine the API server can reach (an IP
//! or DNS name; default `127.0.0.1`, right when the API server runs on this host, as envtest's
//! does). The test serves the webhook in-process on that address only, with a generated
//! certificate for it and real API lookups, server-side applies the CRDs from `crds/`, creates a
//! scratch namespace and a ValidatingWebhookConfiguration built from `config/webhook/` but pointed
//! at the URL and limited to that namespace, checks the verdicts, then deletes both (the CRDs stay:
//! deleting them would delete user objects).
//!
//! What a real server does and an in-process review cannot show: the CRD's schema and CEL rules
//! run *before* validating webhooks, so an object the CRD refuses never reaches the webhook (the
//! user sees the CRD's message); `matchConditions` keep metadata-only updates away from it; and
//! with `failurePolicy: Fail` a webhook that is down refuses every reviewed write, except in a
//! namespace labelled `karpenter.clever-cloud.com/admission-webhook=disabled`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{ValidatingWebhookConfiguration, WebhookClientConfig};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use webhook::metrics::Metrics;
use webhook::references::ApiReferences;
use webhook::review::Kind;
use webhook::server::Settings;

const KUBECONFIG: &str = "KARPENTER_HUB_WEBHOOK_E2E_KUBECONFIG";
const HOST: &str = "KARPENTER_HUB_WEBHOOK_E2E_HOST";
const MANAGER: &str = "karpenter-hub-webhook-e2e";
/// The namespace label that exempts a namespace from the webhook (config/webhook/); on the object
/// itself for a cluster-scoped kind.
const EXEMPT_LABEL: &str = "karpenter.clever-cloud.com/admission-webhook";
/// The label a cluster-scoped object must carry to reach this test's webhook: a namespaceSelector
/// never skips a cluster-scoped object, so the scratch namespace cannot contain the test's reach.
const SCRATCH_LABEL: &str = "karpenter-hub.example.com/webhook-e2e";
/// How long a change of webhook configuration or a stopped webhook may take to show.
const SETTLE: Duration = Duration::from_secs(60);

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
    let mut names = Vec::new();
    for entry in std::fs::read_dir(repo().join("crds")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let name = crd.metadata.name.clone().unwrap();
        api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&crd)).await.unwrap();
        names.push(name);
    }
    // Established before anything is created through them.
    for name in names {
        wait_for(&format!("CRD {name} Established"), SETTLE, || async {
            let crd = api.get(&name).await.map_err(|e| e.to_string())?;
            let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
            match conditions.iter().any(|c| c.type_ == "Established" && c.status == "True") {
                true => Ok(()),
                false => Err(format!("{conditions:?}")),
            }
        })
        .await;
    }
}

/// Polls `probe` every 250 ms until it is Ok; panics with `what` and the last state after `timeout`.
async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match probe().await {
            Ok(v) => return v,
            Err(last) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "timed out after {timeout:?} waiting for {what}: {last}"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}

/// The committed configuration, pointed at `base_url` with `ca`, limited to `namespace` (on top of
/// its own exemption selector, which stays): namespaced kinds by their namespace, cluster-scoped
/// ones by the label [`SCRATCH_LABEL`]` = namespace` on the object (so that the test never reviews,
/// nor with the webhook down refuses, anyone else's objects).
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
        let cluster_scoped = hook.rules.iter().flatten().any(|r| r.scope.as_deref() == Some("Cluster"));
        let (selector, key) = if cluster_scoped {
            (hook.object_selector.get_or_insert_with(Default::default), SCRATCH_LABEL)
        } else {
            (hook.namespace_selector.get_or_insert_with(Default::default), "kubernetes.io/metadata.name")
        };
        selector.match_labels.get_or_insert_with(Default::default).insert(key.to_string(), namespace.to_string());
    }
    config
}

fn object(kind: &str, name: &str, namespace: &str, spec: Value) -> Value {
    json!({"apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": kind, "metadata": {"name": name, "namespace": namespace}, "spec": spec})
}

/// A cluster-scoped object, labelled so that it reaches this test's webhook (`scratch`: the scratch
/// namespace's name), or not.
fn cluster_object(kind: &str, name: &str, scratch: Option<&str>, spec: Value) -> Value {
    let labels = scratch.map(|s| json!({SCRATCH_LABEL: s})).unwrap_or_else(|| json!({}));
    json!({"apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": kind, "metadata": {"name": name, "labels": labels}, "spec": spec})
}

fn dynamic_api(client: &Client, kind: Kind, namespace: &str) -> Api<kube::core::DynamicObject> {
    let resource = kube::core::ApiResource {
        group: "karpenter.clever-cloud.com".into(),
        version: "v1alpha1".into(),
        api_version: "karpenter.clever-cloud.com/v1alpha1".into(),
        kind: kind.name().into(),
        plural: kind.plural().into(),
    };
    if kind.cluster_scoped() {
        Api::all_with(client.clone(), &resource)
    } else {
        Api::namespaced_with(client.clone(), namespace, &resource)
    }
}

/// Creates the object; Ok or the API server's message.
async fn create(client: &Client, kind: Kind, namespace: &str, value: Value, dry_run: bool) -> Result<(), String> {
    let object: kube::core::DynamicObject = serde_json::from_value(value).unwrap();
    let params = PostParams { dry_run, ..Default::default() };
    dynamic_api(client, kind, namespace).create(&params, &object).await.map(|_| ()).map_err(|e| e.to_string())
}

/// Admission reviews the webhook has answered so far (every kind, every outcome).
fn reviews(metrics: &Metrics) -> u64 {
    metrics
        .encode()
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("karpenter_hub_webhook_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The address the webhook listens on: `host` itself (an IP, or the first address a name resolves
/// to), never every interface.
async fn listen_address(host: &str) -> SocketAddr {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return SocketAddr::new(ip, 0);
    }
    tokio::net::lookup_host((host, 0))
        .await
        .unwrap()
        .next()
        .unwrap_or_else(|| panic!("{HOST}={host} resolves to nothing"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_api_server_admits_and_denies_through_the_webhook() {
    let _ = rustls::crypto::CryptoProvider::install_default(rustls::crypto::ring::default_provider());
    let (client, host) = match std::env::var(KUBECONFIG) {
        Ok(path) => (client(&path).await, std::env::var(HOST).unwrap_or_else(|_| "127.0.0.1".to_string())),
        Err(_) => {
            let cp = envtest::shared_or_skip!("webhook-e2e");
            (cp.client().await.unwrap(), "127.0.0.1".to_string())
        }
    };
    let started = std::time::Instant::now();
    apply_crds(&client).await;

    // A serving certificate for the host, the server on that address only.
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
    let mut settings = Settings::new(listen_address(&host).await, dir.join("tls.crt"), dir.join("tls.key"));
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
        tokio::spawn(async move {
            checks(&client, &namespace, server.metrics()).await;
            // Last: the webhook goes down, and the real server applies the failure policy.
            server.shutdown().await.unwrap();
            webhook_down(&client, &namespace).await;
        })
    };
    let outcome = checks.await;

    let _ = configs.delete(&config_name, &DeleteParams::default()).await;
    let _ = namespaces.delete(&namespace, &DeleteParams::default()).await;
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(error) = outcome {
        std::panic::resume_unwind(error.into_panic());
    }
    eprintln!("webhook through a real API server: {:.1}s", started.elapsed().as_secs_f64());
}

async fn checks(client: &Client, namespace: &str, metrics: &Metrics) {
    let free = object(
        "FlavorCatalog",
        "free",
        namespace,
        json!({"flavors": [{"name": "FREE", "cpu": 2, "memoryKi": 2097152, "priceHourly": 0}]}),
    );
    // The configuration takes effect within seconds: wait until the webhook answers.
    wait_for("the webhook to answer through the API server", SETTLE, || async {
        match create(client, Kind::FlavorCatalog, namespace, free.clone(), true).await {
            Err(message) if message.contains("must not be free") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // Denied with the field and the fix, through the API server (a free flavor is valid for the
    // CRD's schema: only the webhook refuses it).
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
    assert!(message.contains("denied the request") && message.contains("excludes every flavor"), "{message}");

    // Denied by a check the CRD cannot express: a class name too long for the label the hub stamps.
    let long = "a".repeat(64);
    let class = object("CleverNodeClass", &long, namespace, json!({"labels": {"team": "a"}}));
    let message = create(client, Kind::CleverNodeClass, namespace, class, false).await.unwrap_err();
    assert!(message.contains("denied the request"), "{message}");
    assert!(message.contains("metadata.name") && message.contains("choose a shorter name"), "{message}");

    // The CRD's CEL rules run before validating webhooks: an object the CRD refuses never reaches
    // the webhook, and the user reads the CRD's message (the webhook has the same rule, unseen here).
    let before = reviews(metrics);
    let class =
        object("CleverNodeClass", "dropped", namespace, json!({"labels": {"node-role.kubernetes.io/worker": ""}}));
    let message = create(client, Kind::CleverNodeClass, namespace, class, false).await.unwrap_err();
    assert!(message.contains("label keys containing kubernetes.io/ are set by the hub at registration"), "{message}");
    assert!(!message.contains("denied the request"), "the CRD refuses it, not the webhook: {message}");
    let message = create(client, Kind::NodePool, namespace, pool_with_hostname(namespace), false).await.unwrap_err();
    assert!(message.contains("is Invalid") || message.contains("is invalid"), "{message}");
    assert!(!message.contains("denied the request"), "the CRD refuses it, not the webhook: {message}");
    assert_eq!(reviews(metrics), before, "objects the CRD refuses are never sent to the webhook");

    // A fleet pool (fleet.md §2): its selector is mutable (the CRD's transition rules accept the
    // edit, the webhook reviews it), but clusterName can be neither added nor removed: the CRD
    // refuses that before the webhook is asked.
    let fleet = object(
        "NodePool",
        "fleet",
        namespace,
        json!({
            "clusterSelector": {"matchLabels": {"env": "prod"}},
            "template": {"spec": {
                "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"},
                "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["M"]}]
            }},
            "disruption": {"consolidateAfter": "1m"}
        }),
    );
    create(client, Kind::NodePool, namespace, fleet, false).await.unwrap();
    let api = dynamic_api(client, Kind::NodePool, namespace);
    let before = reviews(metrics);
    let patch = json!({"spec": {"clusterSelector": {"matchLabels": {"env": "staging"}, "matchExpressions": [{"key": "example.com/retiring", "operator": "DoesNotExist"}]}}});
    let edited = api.patch("fleet", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    assert_eq!(edited.data["spec"]["clusterSelector"]["matchLabels"], json!({"env": "staging"}));
    assert!(reviews(metrics) > before, "a selector edit is reviewed by the webhook");
    let before = reviews(metrics);
    for (name, patch) in [
        ("fleet", json!({"spec": {"clusterSelector": null, "clusterName": "prod-paris"}})),
        ("big", json!({"spec": {"clusterName": null, "clusterSelector": {"matchLabels": {"env": "prod"}}}})),
    ] {
        let error = api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap_err().to_string();
        assert!(error.contains("clusterName cannot be added or removed"), "{name}: {error}");
        assert!(!error.contains("denied the request"), "the CRD refuses it, not the webhook: {error}");
    }
    assert_eq!(reviews(metrics), before, "updates the CRD refuses are never sent to the webhook");

    // An update that changes the spec is reviewed too.
    let patch = json!({"spec": {"template": {"spec": {"requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["XYZ"]}]}}}});
    let error = api.patch("big", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap_err().to_string();
    assert!(error.contains("excludes every flavor"), "{error}");
    // A metadata-only update skips the webhook (matchConditions) and is allowed.
    let before = reviews(metrics);
    let patch = json!({"metadata": {"labels": {"touched": "yes"}}});
    api.patch("big", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    assert_eq!(reviews(metrics), before, "a metadata-only update is not sent to the webhook");

    organizations(client, namespace, metrics).await;
}

/// The cluster-scoped `CleverOrganization` (fleet.md §4, §5), through its `scope: Cluster` rule: dry
/// runs only, so that nothing outlives the scratch namespace.
async fn organizations(client: &Client, namespace: &str, metrics: &Metrics) {
    let price = "karpenter.clever-cloud.com/price-per-hour";
    let selector = json!({"matchLabels": {"clever-cloud.com/organisation": "orga-acme"}});
    let org = |name: &str, scratch: Option<&str>, spec: Value| {
        let mut spec = spec;
        spec["clusterSelector"] = selector.clone();
        cluster_object("CleverOrganization", name, scratch, spec)
    };
    let name = format!("{namespace}-orga");
    // Allowed: the spec's example with a cost ceiling.
    let good = org(&name, Some(namespace), json!({"quota": {"cpu": "40", "memory": "40G"}, "limits": {price: "2.5"}}));
    let before = reviews(metrics);
    create(client, Kind::CleverOrganization, namespace, good, true).await.unwrap();
    assert_eq!(reviews(metrics), before + 1, "an organisation is reviewed, without a namespace");

    // Denied by the webhook: a label key whose name part is longer than 63 characters (the CRD's
    // pattern bounds the whole key only).
    let long_key = format!("example.com/{}", "a".repeat(70));
    let bad_key = |scratch: Option<&str>| {
        let mut o = org(&name, scratch, json!({"quota": {"cpu": "40"}}));
        o["spec"]["clusterSelector"]["matchLabels"][long_key.as_str()] = json!("x");
        o
    };
    let message =
        create(client, Kind::CleverOrganization, namespace, bad_key(Some(namespace)), true).await.unwrap_err();
    assert!(message.contains("denied the request"), "{message}");
    assert!(
        message.contains("spec.clusterSelector.matchLabels[") && message.contains("is not a valid label key"),
        "{message}"
    );
    // The CRD refuses a price in exponent form before the webhook sees it.
    let before = reviews(metrics);
    let exponent = org(&name, Some(namespace), json!({"limits": {price: "1e3"}}));
    let message = create(client, Kind::CleverOrganization, namespace, exponent, true).await.unwrap_err();
    assert!(message.contains("is EUR per hour as a decimal string"), "{message}");
    assert_eq!(reviews(metrics), before);

    // The CRD's rule runs first: neither quota nor limits never reaches the webhook.
    let before = reviews(metrics);
    let nothing = org(&name, Some(namespace), json!({}));
    let message = create(client, Kind::CleverOrganization, namespace, nothing, true).await.unwrap_err();
    assert!(message.contains("an organisation with neither limits nothing"), "{message}");
    assert!(!message.contains("denied the request"), "the CRD refuses it, not the webhook: {message}");
    assert_eq!(reviews(metrics), before);

    // Without the test's label the object is not this test's: not sent to its webhook at all
    // (whatever another webhook of the cluster may say).
    let _ = create(client, Kind::CleverOrganization, namespace, bad_key(None), true).await;
    assert_eq!(reviews(metrics), before, "the objectSelector keeps other organisations away");
    // The exemption label on the object skips the webhook (a namespace label cannot).
    let mut exempt = bad_key(Some(namespace));
    exempt["metadata"]["labels"][EXEMPT_LABEL] = json!("disabled");
    let _ = create(client, Kind::CleverOrganization, namespace, exempt, true).await;
    assert_eq!(reviews(metrics), before, "an organisation labelled {EXEMPT_LABEL}=disabled is not reviewed");
}

/// A NodePool whose requirement the CRD refuses (the hostname key; karpenter-semantics §1.1).
fn pool_with_hostname(namespace: &str) -> Value {
    object(
        "NodePool",
        "hostname",
        namespace,
        json!({
            "clusterName": "prod-paris",
            "template": {"spec": {
                "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"},
                "requirements": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["a"]}]
            }},
        }),
    )
}

/// `failurePolicy: Fail` with the webhook stopped: reviewed writes are refused by the API server,
/// metadata-only updates still go through, and the exemption label lets a namespace write again.
async fn webhook_down(client: &Client, namespace: &str) {
    let catalog =
        |name: &str| object("FlavorCatalog", name, namespace, json!({"flavors": [{"name": "M", "priceHourly": 0.2}]}));
    // Dry runs until the server's connections to the stopped webhook are gone (they are reviewed too).
    wait_for("the API server to see the webhook down", SETTLE, || async {
        match create(client, Kind::FlavorCatalog, namespace, catalog("while-down"), true).await {
            Err(message) if message.contains("failed calling webhook") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let message = create(client, Kind::FlavorCatalog, namespace, catalog("while-down"), false).await.unwrap_err();
    assert!(message.contains("failed calling webhook"), "failurePolicy Fail refuses what it cannot check: {message}");
    assert!(message.contains("flavorcatalogs.validate.karpenter.clever-cloud.com"), "{message}");

    let api = dynamic_api(client, Kind::NodePool, namespace);
    let patch = json!({"spec": {"limits": {"cpu": "100"}}});
    let error = api.patch("big", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap_err().to_string();
    assert!(error.contains("failed calling webhook"), "{error}");
    let patch = json!({"metadata": {"labels": {"touched": "while-down"}}});
    api.patch("big", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();

    // The documented emergency exemption.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let patch = json!({"metadata": {"labels": {EXEMPT_LABEL: "disabled"}}});
    namespaces.patch(namespace, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    wait_for("the exempted namespace to accept writes with the webhook down", SETTLE, || async {
        create(client, Kind::FlavorCatalog, namespace, catalog("exempted"), false).await
    })
    .await;
}

/// Runs always: the configuration the test registers calls the URL with the CA, for the scratch
/// namespace only, and keeps every other setting of the committed one.
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
        let (selector, key) = if kind.cluster_scoped() {
            assert!(hook.namespace_selector.is_none(), "{kind}");
            (hook.object_selector.as_ref().unwrap(), SCRATCH_LABEL)
        } else {
            (hook.namespace_selector.as_ref().unwrap(), "kubernetes.io/metadata.name")
        };
        assert_eq!(selector.match_labels.as_ref().unwrap()[key], "scratch", "{kind}");
        let exemption = selector.match_expressions.as_ref().unwrap();
        assert!(exemption.iter().any(|e| e.key == EXEMPT_LABEL && e.operator == "NotIn"), "{exemption:?}");
        assert_eq!(hook.failure_policy.as_deref(), Some("Fail"));
        assert!(hook.match_conditions.as_ref().is_some_and(|c| !c.is_empty()));
    }
}
