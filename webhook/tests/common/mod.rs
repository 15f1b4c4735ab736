//! Shared by the integration tests: a throw-away CA, certificate files on disk, a started server,
//! an HTTPS client trusting the CA, and AdmissionReview bodies.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use serde_json::{Value, json};
use webhook::references::References;
use webhook::server::{Running, Settings};

pub const UID: &str = "705ab4f5-6393-11e8-b7cc-42010a800002";

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A CA that issues serving certificates for `localhost` and `127.0.0.1`.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    pub fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, "karpenter-hub-webhook test CA");
        Ca { issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap() }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A leaf for `names` (DNS names or IP addresses): (cert PEM, key PEM, cert DER).
    pub fn issue(&self, names: &[&str]) -> (String, String, Vec<u8>) {
        self.issue_until(names, None)
    }

    /// As [`Ca::issue`], valid until the given (year, month, day) when set.
    pub fn issue_until(&self, names: &[&str], until: Option<(i32, u8, u8)>) -> (String, String, Vec<u8>) {
        let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        if let Some((year, month, day)) = until {
            params.not_after = rcgen::date_time_ymd(year, month, day);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem(), cert.der().to_vec())
    }
}

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("karpenter-hub-webhook-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A server on 127.0.0.1 with a fresh certificate, its CA and its files.
pub struct Harness {
    pub ca: Ca,
    pub dir: TempDir,
    pub server: Running,
    pub leaf_der: Vec<u8>,
}

pub fn settings(dir: &Path) -> Settings {
    let mut settings = Settings::new(([127, 0, 0, 1], 0).into(), dir.join("tls.crt"), dir.join("tls.key"));
    settings.certificate_poll_interval = Duration::from_millis(50);
    settings.request_timeout = Duration::from_secs(2);
    settings.shutdown_grace = Duration::from_secs(5);
    settings
}

impl Harness {
    pub async fn start(name: &str, references: Arc<dyn References>) -> Self {
        Self::start_with(name, references, |_| {}).await
    }

    pub async fn start_with(name: &str, references: Arc<dyn References>, edit: impl FnOnce(&mut Settings)) -> Self {
        let ca = Ca::new();
        let dir = TempDir::new(name);
        let (cert, key, leaf_der) = ca.issue(&["localhost", "127.0.0.1"]);
        std::fs::write(dir.path().join("tls.crt"), cert).unwrap();
        std::fs::write(dir.path().join("tls.key"), key).unwrap();
        let mut settings = settings(dir.path());
        edit(&mut settings);
        let server = webhook::server::start(settings, references, provider()).await.unwrap();
        Harness { ca, dir, server, leaf_der }
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.server.address().port())
    }

    /// A client trusting this harness's CA, one connection per request when `fresh`.
    pub fn client(&self, fresh: bool) -> reqwest::Client {
        client(&self.ca.pem(), fresh)
    }
}

pub fn client(ca_pem: &str, fresh: bool) -> reqwest::Client {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    if fresh {
        // A resumed session shows the certificate of the session it resumes, not the one served now.
        tls.resumption = rustls::client::Resumption::disabled();
    }
    let mut builder =
        reqwest::Client::builder().tls_backend_preconfigured(tls).tls_info(true).timeout(Duration::from_secs(10));
    if fresh {
        // HTTP/1.1 without idle connections: every request makes a new TLS handshake.
        builder = builder.pool_max_idle_per_host(0).http1_only();
    }
    builder.build().unwrap()
}

/// An AdmissionReview v1 request for `kind`.
pub fn review(kind: &str, operation: &str, object: Value, old: Option<Value>) -> Value {
    let mut request = json!({
        "uid": UID,
        "kind": {"group": "karpenter.clever-cloud.com", "version": "v1alpha1", "kind": kind},
        "resource": {"group": "karpenter.clever-cloud.com", "version": "v1alpha1", "resource": kind.to_lowercase()},
        "requestKind": {"group": "karpenter.clever-cloud.com", "version": "v1alpha1", "kind": kind},
        "operation": operation,
        "namespace": "team-a",
        "name": object["metadata"]["name"].clone(),
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": object,
        "dryRun": false,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
    });
    if let Some(old) = old {
        request["oldObject"] = old;
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// An AdmissionReview v1 request for a cluster-scoped `kind`, as the API server sends it: without
/// a namespace.
pub fn cluster_review(kind: &str, operation: &str, object: Value, old: Option<Value>) -> Value {
    let mut review = review(kind, operation, object, old);
    review["request"].as_object_mut().unwrap().remove("namespace");
    review
}

/// A `CleverOrganization` (cluster-scoped: no namespace).
pub fn organization(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "CleverOrganization",
        "metadata": {"name": name, "uid": "2"},
        "spec": spec
    })
}

/// A `CapacityBuffer` in namespace `team-a`.
pub fn capacity_buffer(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "CapacityBuffer",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": spec
    })
}

/// A `NodeOverlay` in namespace `team-a`.
pub fn node_overlay(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeOverlay",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": spec
    })
}

pub fn node_class(name: &str, labels: Value, catalog: Option<&str>) -> Value {
    let mut spec = json!({"labels": labels});
    if let Some(catalog) = catalog {
        spec["flavorCatalogRef"] = json!({"name": catalog});
    }
    json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "CleverNodeClass",
        "metadata": {"name": name, "namespace": "team-a", "uid": "1"},
        "spec": spec
    })
}

pub fn flavor_catalog(name: &str, flavors: Value) -> Value {
    json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "FlavorCatalog",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"flavors": flavors}
    })
}

pub fn node_pool(name: &str, requirements: Value) -> Value {
    json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodePool",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {
            "clusterName": "prod-paris",
            "template": {"spec": {
                "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"},
                "requirements": requirements
            }},
            "disruption": {"consolidateAfter": "1m"}
        }
    })
}

/// Posts a review and returns the HTTP status and the parsed body (Null when not JSON).
pub async fn post(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let response = client.post(url).json(body).send().await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.bytes().await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// Waits for `check` with a bounded timeout.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Waits until the process `child` answers 200 on `http://127.0.0.1:<probe_port>/readyz`; kills it
/// and panics with its `log` if it exits or `timeout` passes first.
pub async fn ready_or_panic(child: &mut std::process::Child, probe_port: u16, timeout: Duration, log: &Path) {
    // reqwest's client needs the process's crypto provider, even for plain HTTP.
    let _ = rustls::crypto::CryptoProvider::install_default(rustls::crypto::ring::default_provider());
    let client = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let url = format!("http://127.0.0.1:{probe_port}/readyz");
        if client.get(url).send().await.is_ok_and(|r| r.status() == 200) {
            return;
        }
        if child.try_wait().unwrap().is_some() || tokio::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the webhook did not get ready:\n{}", std::fs::read_to_string(log).unwrap_or_default());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A child process killed (and reaped) when dropped, however the test ends.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free port on 127.0.0.1 (bound and released: another process may take it first, rarely).
pub fn free_port() -> u16 {
    // Tests run concurrently and each binary binds its ports only after start: a port handed out
    // once is never handed out again by this process (the OS may offer a just-released one again,
    // and a TLS client would then reach another test's probe port).
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if GIVEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(port) {
            return port;
        }
    }
}

/// The real `karpenter-hub-webhook` binary on 127.0.0.1, with a fresh certificate, lookups off and
/// the given environment (flags by their `KARPENTER_HUB_WEBHOOK_*` variables); killed on drop.
pub struct Binary {
    pub ca: Ca,
    pub dir: TempDir,
    pub port: u16,
    pub probe_port: u16,
    child: std::process::Child,
}

impl Binary {
    pub async fn start(name: &str, env: &[(&str, &str)]) -> Self {
        let ca = Ca::new();
        let dir = TempDir::new(name);
        let (cert, key, _) = ca.issue(&["localhost", "127.0.0.1"]);
        std::fs::write(dir.path().join("tls.crt"), cert).unwrap();
        std::fs::write(dir.path().join("tls.key"), key).unwrap();
        let (port, probe_port) = (free_port(), free_port());
        let log = std::fs::File::create(dir.path().join("webhook.log")).unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_karpenter-hub-webhook"))
            .env("KARPENTER_HUB_WEBHOOK_ADDRESS", format!("127.0.0.1:{port}"))
            .env("KARPENTER_HUB_WEBHOOK_PROBE_ADDRESS", format!("127.0.0.1:{probe_port}"))
            .env("KARPENTER_HUB_WEBHOOK_TLS_CERT_FILE", dir.path().join("tls.crt"))
            .env("KARPENTER_HUB_WEBHOOK_TLS_KEY_FILE", dir.path().join("tls.key"))
            .env("KARPENTER_HUB_WEBHOOK_LOOKUPS", "off")
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let binary = Binary { ca, dir, port, probe_port, child };
        let probe = client(&binary.ca.pem(), false);
        let readyz = format!("http://127.0.0.1:{probe_port}/readyz");
        eventually("the webhook binary to be ready", || {
            let (probe, readyz) = (probe.clone(), readyz.clone());
            async move { probe.get(readyz).send().await.is_ok_and(|r| r.status() == 200) }
        })
        .await;
        binary
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A `/proc/<pid>/status` field in KiB (`VmRSS`, `VmHWM`), while the process lives.
    pub fn status_kib(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("webhook.log")).unwrap_or_default()
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A TLS connection to 127.0.0.1:`port` trusting `ca_pem`, offering one ALPN protocol.
pub async fn tls_stream(
    ca_pem: &str,
    port: u16,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config)).connect("localhost".try_into().unwrap(), tcp).await.unwrap()
}
