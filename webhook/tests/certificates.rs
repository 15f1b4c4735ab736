//! The self-managed certificate on a real API server (envtest; a visible skip without it, a failure
//! under `KARPENTER_HUB_REQUIRE_ENVTEST=1`): two replicas starting together agree on one Secret and
//! write the same pair; the configuration's webhooks calling the service get its CA and no other
//! webhook is touched; a cleared `caBundle` is set again; a renewal by one replica reaches the
//! other; a Secret of that name that is not the webhook's is never overwritten.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::json;
use webhook::certificates::{CA_CRT, CertificateError, Identity, Manager, Plan, unix_now};
use webhook::tls::CertificateFiles;

const DAY: i64 = 86_400;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("karpenter-hub-webhook-cert-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn manager(client: &Client, namespace: &str, secret: &str, configuration: &str, replica: &str) -> Manager {
    let dir = temp_dir(&format!("{namespace}-{replica}"));
    Manager {
        client: client.clone(),
        identity: Identity {
            namespace: namespace.to_string(),
            service: "karpenter-hub-webhook".to_string(),
            cluster_domain: "cluster.local".to_string(),
        },
        secret: secret.to_string(),
        configuration: Some(configuration.to_string()),
        files: CertificateFiles { cert: dir.join("tls.crt"), key: dir.join("tls.key") },
    }
}

/// A configuration with one webhook calling the service and one calling another, on a resource no
/// one writes, ignoring failures: it can never get in anyone's way.
fn configuration(name: &str, namespace: &str) -> ValidatingWebhookConfiguration {
    let hook = |hook: &str, service: &str| {
        json!({
            "name": format!("{hook}.validate.example.com"),
            "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Ignore",
            "clientConfig": {"service": {"name": service, "namespace": namespace, "path": "/validate", "port": 443}},
            "rules": [{"apiGroups": ["example.com"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["nothings"]}],
        })
    };
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "webhooks": [hook("ours", "karpenter-hub-webhook"), hook("theirs", "someone-else")],
    }))
    .unwrap()
}

fn bundles(cfg: &ValidatingWebhookConfiguration) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    let hooks = cfg.webhooks.as_ref().unwrap();
    let of = |prefix: &str| {
        hooks.iter().find(|w| w.name.starts_with(prefix)).unwrap().client_config.ca_bundle.as_ref().map(|b| b.0.clone())
    };
    (of("ours"), of("theirs"))
}

/// Whether a client trusting `bundle` accepts the certificate in `cert` for the Service's name.
fn trusted(bundle: &[u8], cert: &std::path::Path, namespace: &str) -> bool {
    use rustls::client::danger::ServerCertVerifier;
    let mut roots = rustls::RootCertStore::empty();
    for der in CertificateDer::pem_slice_iter(bundle) {
        roots.add(der.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider).build().unwrap();
    let pem = std::fs::read(cert).unwrap();
    let leaf = CertificateDer::pem_slice_iter(&pem).next().unwrap().unwrap();
    let name = rustls::pki_types::ServerName::try_from(format!("karpenter-hub-webhook.{namespace}.svc")).unwrap();
    verifier.verify_server_cert(&leaf, &[], &name, &[], rustls::pki_types::UnixTime::now()).is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_agree_on_one_certificate_and_keep_the_ca_bundle_on_a_real_api_server() {
    let _ = rustls::crypto::CryptoProvider::install_default(rustls::crypto::ring::default_provider());
    let cp = envtest::shared_or_skip!("webhook-certificates");
    let client = cp.client().await.unwrap();
    let suffix = format!("{:x}", unix_now() % 0xffffff);
    let namespace = format!("webhook-cert-{suffix}");
    let config_name = format!("webhook-cert-{suffix}");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap())
        .await
        .unwrap();
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    configs.create(&PostParams::default(), &configuration(&config_name, &namespace)).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);

    // Two replicas starting together: one makes the CA, the other reads it.
    let (a, b) = (
        manager(&client, &namespace, "webhook-cert", &config_name, "a"),
        manager(&client, &namespace, "webhook-cert", &config_name, "b"),
    );
    let now = unix_now();
    let (pa, pb) = tokio::join!(a.reconcile(now), b.reconcile(now));
    let (pa, pb) = (pa.unwrap(), pb.unwrap());
    let mut plans = [pa.plan, pb.plan];
    plans.sort_by_key(|p| format!("{p:?}"));
    assert_eq!(plans, [Plan::Keep, Plan::NewCa], "exactly one made the CA");
    let read = |p: &PathBuf| std::fs::read(p).unwrap();
    assert_eq!(read(&a.files.cert), read(&b.files.cert), "the same pair on both");
    assert_eq!(read(&a.files.key), read(&b.files.key));
    let secret = secrets.get("webhook-cert").await.unwrap();
    let ca = secret.data.as_ref().unwrap()[CA_CRT].0.clone();
    let (ours, theirs) = bundles(&configs.get(&config_name).await.unwrap());
    assert_eq!(ours.as_deref(), Some(ca.as_slice()), "the service's webhook trusts the CA");
    assert_eq!(theirs, None, "another service's webhook is not touched");
    assert!(trusted(&ca, &a.files.cert, &namespace));

    // Nothing to do the second time.
    let again = a.reconcile(now).await.unwrap();
    assert_eq!((again.plan, again.files_written, again.bundles_set), (Plan::Keep, false, 0));

    // A caBundle something cleared is set again.
    let cleared = json!({"webhooks": [{"name": "ours.validate.example.com", "clientConfig": {"caBundle": null}}]});
    configs.patch(&config_name, &PatchParams::default(), &Patch::Strategic(&cleared)).await.unwrap();
    assert_eq!(bundles(&configs.get(&config_name).await.unwrap()).0, None);
    assert_eq!(b.reconcile(now).await.unwrap().bundles_set, 1);
    assert_eq!(bundles(&configs.get(&config_name).await.unwrap()).0.as_deref(), Some(ca.as_slice()));

    // 70 days on, the serving certificate is due: one replica renews it, the other takes it.
    let old = read(&a.files.cert);
    let later = now + 70 * DAY;
    assert_eq!(a.reconcile(later).await.unwrap().plan, Plan::NewCertificate);
    let pass = b.reconcile(later).await.unwrap();
    assert_eq!((pass.plan, pass.files_written), (Plan::Keep, true));
    assert_ne!(read(&a.files.cert), old);
    assert_eq!(read(&a.files.cert), read(&b.files.cert));
    assert_eq!(secrets.get("webhook-cert").await.unwrap().data.unwrap()[CA_CRT].0, ca, "the same CA");

    // A Secret of that name without the label is someone else's: refused, untouched.
    let foreign: Secret = serde_json::from_value(json!({
        "metadata": {"name": "not-mine", "namespace": namespace},
        "data": {"tls.crt": "", "note": ByteString(b"keep me".to_vec())},
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &foreign).await.unwrap();
    let c = manager(&client, &namespace, "not-mine", &config_name, "c");
    let err = c.reconcile(now).await.unwrap_err();
    assert!(matches!(err, CertificateError::NotOurs { .. }), "{err}");
    assert!(err.to_string().contains("app.kubernetes.io/managed-by=karpenter-hub-webhook"), "{err}");
    assert_eq!(secrets.get("not-mine").await.unwrap().data.unwrap()["note"].0, b"keep me");

    let _ = configs.delete(&config_name, &DeleteParams::default()).await;
    let _ = Api::<Namespace>::all(client).delete(&namespace, &DeleteParams::default()).await;
}
