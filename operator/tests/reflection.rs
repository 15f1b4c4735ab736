//! No reflection (issue 23 item 3): the server of a kubeconfig is whatever the tenant who wrote
//! the Secret chose, so what it answers must not come back to the tenant. Hostile HTTPS servers on
//! 127.0.0.1, each failing one step of the connection in its own way, answer a marker
//! (`INTERNAL-ADMIN-PANEL: db_password=hunter2-marker`, in a 20 KB body, a `Status` message and
//! reason, a certificate's names); the hub runs with its production log filter. The marker is in
//! no NodePool condition, no event of the management cluster, no request the hub sent to the
//! servers (events it might write there), and no log line at info or above; at debug it shows,
//! cut to a few hundred bytes.
//!
//! This file holds a single test: it installs the process-wide log subscriber.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use crds::NodePool;
use k8s_openapi::api::{core::v1::Event as CoreEvent, events::v1::Event};
use kube::{Api, Client, api::ListParams};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::json;
use sim::apiserver::{ApiServer, ApiServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::util::SubscriberInitExt;

mod common;
use common::{EXAMPLE, wait_for};
use operator::{
    commands::{register_cluster, run},
    infra::{hub, manifests, metrics::Metrics, registry},
};

const NS: &str = "team-x";
const MARKER: &str = "INTERNAL-ADMIN-PANEL: db_password=hunter2-marker";
/// What must never be published nor logged at info or above (also the certificate's name).
const NEEDLE: &str = "hunter2-marker";

/// An answer: status code, content type, body.
type Answer = (u16, &'static str, String);

/// The marker in a long body (a log line that carried it whole would be 20 KB).
fn marker_body() -> String {
    format!("{MARKER}\n{}", "x".repeat(20_000))
}

/// A `Status` refusal carrying the marker in its message (and in its reason, unless `reason`).
fn status_json(code: u16, reason: Option<&str>) -> String {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": marker_body(),
        "reason": reason.unwrap_or(MARKER), "code": code})
    .to_string()
}

/// Answers a real API server would give to the steps before the watches, so a server using them
/// gets as far as the watch caches (`uid`: its `kube-system` UID).
fn discovery(path: &str, uid: &str) -> Option<Answer> {
    let body = match path {
        "/version" => json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0", "gitCommit": "0",
            "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
            "compiler": "gc", "platform": "linux/amd64"}),
        "/apis/api.clever-cloud.com/v1" => json!({"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": "api.clever-cloud.com/v1", "resources": [{"name": "nodegroups",
            "singularName": "nodegroup", "namespaced": true, "kind": "NodeGroup",
            "verbs": ["get", "list", "watch", "create", "delete", "patch", "update"]}]}),
        "/api/v1/namespaces/kube-system" => json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "kube-system", "uid": uid}}),
        _ => return None,
    };
    Some((200, "application/json", body.to_string()))
}

/// A hostile server: an HTTPS listener on 127.0.0.1 with a CA of its own and a certificate for
/// `names`, answering every request with `answer(path)`. Keeps every request it received.
struct Hostile {
    url: String,
    ca_pem: String,
    received: Arc<Mutex<Vec<u8>>>,
    stop: CancellationToken,
}

impl Hostile {
    async fn start(names: &[&str], answer: fn(&str) -> Answer) -> Hostile {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "hostile-ca");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let (kept, stopped) = (received.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let tcp = tokio::select! {
                    () = stopped.cancelled() => return,
                    accepted = listener.accept() => match accepted { Ok((tcp, _)) => tcp, Err(_) => return },
                };
                let (acceptor, kept) = (acceptor.clone(), kept.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                    let Some((path, request)) = read_request(&mut tls).await else { return };
                    kept.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(&request);
                    let (code, content_type, body) = answer(&path);
                    let head = format!(
                        "HTTP/1.1 {code} Whatever\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = tls.write_all(head.as_bytes()).await;
                    let _ = tls.write_all(body.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        Hostile { url, ca_pem: ca.pem(), received, stop }
    }

    fn kubeconfig(&self) -> Vec<u8> {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n    token: t0ken\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
            self.url,
            b64(&self.ca_pem)
        )
        .into_bytes()
    }

    fn received(&self) -> String {
        String::from_utf8_lossy(&self.received.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// One HTTP/1.1 request (head and body): its path, without the query, and its bytes.
async fn read_request(tls: &mut tokio_rustls::server::TlsStream<tokio::net::TcpStream>) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match tls.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > 1 << 20 {
            return None;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length.min(1 << 20) {
        match tls.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let target = head.split_whitespace().nth(1).unwrap_or("/");
    Some((target.split('?').next().unwrap_or("/").to_string(), buf))
}

/// Standard base64 with padding, as kubeconfig `*-data` fields hold it.
fn b64(s: &str) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in s.as_bytes().chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= chunk.len() { ABC[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}

/// `ClusterReachable` of NodePool `pool` in [`NS`]: (status, reason, message).
async fn reachable(mgmt: &Client, pool: &str) -> Option<(String, String, String)> {
    let pool = Api::<NodePool>::namespaced(mgmt.clone(), NS).get_opt(pool).await.ok()??;
    let c = pool.status?.conditions.into_iter().find(|c| c.type_ == "ClusterReachable")?;
    Some((c.status, c.reason, c.message))
}

/// Register `cluster` (its Secret and a NodePool of the same name) in [`NS`].
async fn register(mgmt: &Client, cluster: &str, kubeconfig: Vec<u8>) {
    register_cluster::write_secret(mgmt, NS, cluster, kubeconfig).await.unwrap();
    for mut doc in manifests::documents("examples/general-purpose.yaml", EXAMPLE).unwrap() {
        if doc["kind"] == "NodePool" {
            doc["metadata"]["name"] = json!(cluster);
            doc["spec"]["clusterName"] = json!(cluster);
        }
        manifests::apply_value(mgmt, &doc, NS, "examples/general-purpose.yaml").await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_a_hostile_server_answers_reaches_a_condition_an_event_or_a_log_line_at_info() {
    let capture = common::LogCapture::default();
    // The production filter, plus the hub's own debug lines (where the server's words may go, cut).
    let filter = format!("{},operator=debug", run::DEFAULT_LOG_FILTER);
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(capture.clone())
        .with_ansi(false)
        .finish()
        .try_init()
        .unwrap();

    let ip = ["127.0.0.1"];
    // (cluster, server, the reason its pool must show, what its message must say)
    let cases: Vec<(&str, Hostile, &str, &str)> = vec![
        (
            "body500",
            Hostile::start(&ip, |_| (500, "text/plain", marker_body())).await,
            "Unreachable",
            "GET /version with HTTP 500",
        ),
        (
            "body200",
            Hostile::start(&ip, |_| (200, "text/plain", marker_body())).await,
            "Unreachable",
            "not a Kubernetes API response",
        ),
        (
            "jsonstring",
            Hostile::start(&ip, |_| (200, "application/json", serde_json::to_string(&marker_body()).unwrap())).await,
            "Unreachable",
            "not a Kubernetes API response",
        ),
        (
            "status401",
            Hostile::start(&ip, |_| (401, "application/json", status_json(401, None))).await,
            "Unauthorized",
            "HTTP 401",
        ),
        (
            "wrongname",
            Hostile::start(&["hunter2-marker.internal-admin-panel.invalid"], |_| (200, "text/plain", String::new()))
                .await,
            "Unreachable",
            "no answer from",
        ),
        (
            "late500",
            Hostile::start(&ip, |p| {
                discovery(p, "7a3c2b1e-0000-4000-8000-000000000500").unwrap_or((500, "text/plain", marker_body()))
            })
            .await,
            "Unreachable",
            "the list and watch of",
        ),
        (
            "late200",
            Hostile::start(&ip, |p| {
                discovery(p, "7a3c2b1e-0000-4000-8000-000000000200").unwrap_or((200, "text/plain", marker_body()))
            })
            .await,
            "Unreachable",
            "the list and watch of",
        ),
        (
            "late403",
            Hostile::start(&ip, |p| {
                discovery(p, "7a3c2b1e-0000-4000-8000-000000000403").unwrap_or((
                    403,
                    "application/json",
                    status_json(403, Some("Forbidden")),
                ))
            })
            .await,
            "Unauthorized",
            "the list and watch of",
        ),
    ];

    // A real workload cluster next to them: published events reach it too.
    let workload = ApiServer::start(ApiServerConfig::workload("fine")).await.unwrap();
    let mgmt_server = ApiServer::start(ApiServerConfig::management("management")).await.unwrap();
    let mgmt = mgmt_server.client();
    manifests::ensure_namespace(&mgmt, NS).await.unwrap();
    register(&mgmt, "fine", serde_json::to_vec(&workload.kubeconfig()).unwrap()).await;
    for (cluster, server, _, _) in &cases {
        register(&mgmt, cluster, server.kubeconfig()).await;
    }
    let shutdown = CancellationToken::new();
    let hub = tokio::spawn(run::run_with(
        mgmt.clone(),
        hub::Settings::default(),
        registry::Settings {
            probe_interval: Duration::from_secs(1),
            probe_timeout: Duration::from_secs(2),
            reconnect_min: Duration::from_millis(200),
            reconnect_max: Duration::from_secs(1),
            ..registry::Settings::default()
        },
        Arc::new(Metrics::new()),
        shutdown.clone(),
    ));
    let _stop = shutdown.clone().drop_guard();

    wait_for("the real cluster connected", Duration::from_secs(30), || async {
        reachable(&mgmt, "fine").await.is_some_and(|(_, r, _)| r == "Connected")
    })
    .await;
    for (cluster, _, reason, _) in &cases {
        // The watch steps flap between Syncing and their failure: wait for the failure.
        let seen = common::poll_until(Duration::from_secs(30), || async {
            reachable(&mgmt, cluster).await.is_some_and(|(_, r, _)| r == *reason)
        })
        .await;
        let last = reachable(&mgmt, cluster).await;
        assert!(seen, "{cluster}: ClusterReachable is not {reason}; last: {last:?}");
    }
    // Each failure also became an event on the Secret (the same text as the condition).
    wait_for("an event on each hostile registration's Secret", Duration::from_secs(30), || async {
        let events = Api::<Event>::namespaced(mgmt.clone(), NS).list(&ListParams::default()).await.unwrap().items;
        cases.iter().all(|(cluster, _, reason, _)| {
            events.iter().any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&format!("{cluster}-kubeconfig"))
                    && e.reason.as_deref() == Some(*reason)
            })
        })
    })
    .await;

    // What the API shows and what the hub sent anywhere.
    let mut published = String::new();
    let pools = Api::<NodePool>::namespaced(mgmt.clone(), NS).list(&ListParams::default()).await.unwrap();
    published.push_str(&serde_json::to_string(&pools.items).unwrap());
    for client in [mgmt.clone(), workload.client()] {
        let events = Api::<Event>::all(client.clone()).list(&ListParams::default()).await.unwrap();
        published.push_str(&serde_json::to_string(&events.items).unwrap());
        let events = Api::<CoreEvent>::all(client).list(&ListParams::default()).await.unwrap();
        published.push_str(&serde_json::to_string(&events.items).unwrap());
    }
    for (_, server, _, _) in &cases {
        published.push_str(&server.received());
    }
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(20), hub).await;

    assert!(published.contains("Unreachable") && published.contains("Unauthorized"), "statuses were read");
    for needle in [NEEDLE, "INTERNAL-ADMIN-PANEL"] {
        if let Some(at) = published.find(needle) {
            let from = at.saturating_sub(300);
            panic!("the server's answer was published: …{}…", &published[from..(at + 100).min(published.len())]);
        }
    }

    // Each says which step failed and how, in the hub's words.
    for (cluster, _, reason, says) in &cases {
        let shown = reachable(&mgmt, cluster).await;
        assert!(shown.as_ref().is_some_and(|(_, r, m)| r == reason && m.contains(says)), "{cluster}: {shown:?}");
    }
    mgmt_server.shutdown().await;
    workload.shutdown().await;

    let logs = capture.text();
    // The operator is told which failure it was, in the hub's own words, at warn or info.
    for cause in [
        "cause=HTTP 500",
        "cause=the answer is not a Kubernetes API response",
        "cause=TLS: the server's certificate is not valid for the server's name",
    ] {
        assert!(
            logs.lines().any(|l| l.contains(cause) && (l.contains(" WARN ") || l.contains(" INFO "))),
            "no log line at info or warn names the cause {cause:?}"
        );
    }
    let mut at_debug = 0;
    for line in logs.lines().filter(|l| l.contains(NEEDLE) || l.contains("INTERNAL-ADMIN-PANEL")) {
        let level = line.split_whitespace().nth(1).unwrap_or_default();
        assert!(level == "DEBUG" || level == "TRACE", "the server's answer was logged above debug: {line}");
        assert!(line.len() < 2_000, "the server's answer was logged whole: {} bytes", line.len());
        at_debug += 1;
    }
    assert!(at_debug > 0, "the capture saw the hub's debug lines, with the server's words cut");
}
