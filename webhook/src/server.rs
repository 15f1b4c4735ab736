//! The HTTPS server: routes, limits, readiness and graceful shutdown.
//!
//! | route | method | answer |
//! |---|---|---|
//! | `/validate/clevernodeclasses`, `/validate/flavorcatalogs`, `/validate/nodepools` | POST | an AdmissionReview response, or 400 for a body that is not a review, too large or unreadable |
//! | `/livez` | GET | 200 while the process serves |
//! | `/readyz` | GET | 200 when serving, 503 once shutdown began (so endpoints drop the pod first) |
//! | `/metrics` | GET | OpenMetrics text |
//!
//! Bounds: request bodies over `max_body_bytes` get 400 before being read whole; a request (body
//! read included) taking longer than `request_timeout` gets 408; a TLS handshake must finish within
//! `handshake_timeout` and the first request arrive within `request_timeout`. Probes and metrics can
//! also be served over plain HTTP on a second address (`probe_address`), for kubelet probes and
//! Prometheus without the webhook's CA.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum_server::Handle;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use rustls::crypto::CryptoProvider;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::metrics::{self, Metrics, Outcome};
use crate::references::{Metered, References};
use crate::review::{self, Kind};
use crate::tls::{CertificateError, CertificateFiles, ReloadingCertificate};

/// Default bound on a review body: an object and its old version, each at most etcd's 1.5 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Address of the HTTPS listener (port 0 picks a free one).
    pub address: SocketAddr,
    /// Optional plain-HTTP listener for `/livez`, `/readyz` and `/metrics`.
    pub probe_address: Option<SocketAddr>,
    /// The serving certificate and key.
    pub certificate: CertificateFiles,
    /// How often the certificate files are checked for a change.
    pub certificate_poll_interval: Duration,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// Longest time for one request, body read included.
    pub request_timeout: Duration,
    /// Longest TLS handshake.
    pub handshake_timeout: Duration,
    /// How long in-flight requests may finish after shutdown begins.
    pub shutdown_grace: Duration,
}

impl Settings {
    /// Defaults for `address` and the two files.
    pub fn new(address: SocketAddr, cert: PathBuf, key: PathBuf) -> Self {
        Settings {
            address,
            probe_address: None,
            certificate: CertificateFiles { cert, key },
            certificate_poll_interval: Duration::from_secs(10),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            request_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(20),
        }
    }
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The initial certificate pair cannot be served.
    #[error("serving certificate: {0}")]
    Certificate(#[from] CertificateError),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// A listener could not bind or failed.
    #[error("listener on {address}: {source}")]
    Listen {
        /// The address.
        address: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// A server task ended abnormally.
    #[error("server task: {0}")]
    Task(String),
}

#[derive(Clone)]
struct AppState {
    references: Arc<dyn References>,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    max_body_bytes: usize,
}

/// The admission routes, probes and metrics, without TLS: the service the listeners serve.
fn router(state: AppState, max_body_bytes: usize, request_timeout: Duration) -> Router {
    let mut routes = Router::new();
    for kind in Kind::ALL {
        routes = routes.route(
            kind.path(),
            post(move |State(state): State<AppState>, body: Result<Bytes, BytesRejection>| validate(state, kind, body)),
        );
    }
    routes
        .merge(probes())
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(request_timeout, bounded))
        .with_state(state)
}

fn probes() -> Router<AppState> {
    Router::new().route("/livez", get(|| async { "ok" })).route("/readyz", get(readyz)).route("/metrics", get(metrics))
}

async fn bounded(State(timeout): State<Duration>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => (StatusCode::REQUEST_TIMEOUT, "the request took too long\n").into_response(),
    }
}

async fn validate(state: AppState, kind: Kind, body: Result<Bytes, BytesRejection>) -> Response {
    let started = Instant::now();
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            // Too large (checked against Content-Length first, then while reading), or unreadable.
            let why = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                format!("the body is larger than {} bytes (--max-body-bytes)", state.max_body_bytes)
            } else {
                format!("the body could not be read: {rejection}")
            };
            state.metrics.observe(kind, Outcome::Invalid, 0, started.elapsed());
            tracing::info!(%kind, error = %why, "refused a body");
            return (StatusCode::BAD_REQUEST, format!("{why}\n")).into_response();
        }
    };
    match review::review(kind, &body, state.references.as_ref()).await {
        Ok(answer) => {
            let outcome = if answer.allowed { Outcome::Allowed } else { Outcome::Denied };
            state.metrics.observe(kind, outcome, answer.warnings.len(), started.elapsed());
            tracing::debug!(%kind, uid = %answer.uid, allowed = answer.allowed, message = answer.message.as_deref().unwrap_or_default(), "reviewed");
            ([(header::CONTENT_TYPE, "application/json")], answer.to_json()).into_response()
        }
        Err(bad) => {
            state.metrics.observe(kind, Outcome::Invalid, 0, started.elapsed());
            tracing::info!(%kind, error = %bad, "refused a body that is not an AdmissionReview");
            (StatusCode::BAD_REQUEST, format!("{bad}\n")).into_response()
        }
    }
}

async fn readyz(State(state): State<AppState>) -> Response {
    if state.ready.load(Ordering::Relaxed) {
        "ok".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response()
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    match state.metrics.encode() {
        Ok(text) => ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// A started server.
#[derive(Debug)]
pub struct Running {
    address: SocketAddr,
    probe_address: Option<SocketAddr>,
    handle: Handle<SocketAddr>,
    ready: Arc<AtomicBool>,
    stop: watch::Sender<bool>,
    grace: Duration,
    tasks: Vec<JoinHandle<Result<(), ServerError>>>,
    metrics: Arc<Metrics>,
    certificate: Arc<ReloadingCertificate>,
}

impl Running {
    /// The HTTPS address (with the port chosen when 0 was asked).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The plain-HTTP probe address, when enabled.
    pub fn probe_address(&self) -> Option<SocketAddr> {
        self.probe_address
    }

    /// The metrics (for tests and benchmarks).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The certificate being served.
    pub fn certificate(&self) -> &Arc<ReloadingCertificate> {
        &self.certificate
    }

    /// Graceful shutdown: `/readyz` turns 503, new connections are refused, in-flight requests get
    /// the grace period to finish, then everything stops.
    pub async fn shutdown(self) -> Result<(), ServerError> {
        self.ready.store(false, Ordering::Relaxed);
        let _ = self.stop.send(true);
        self.handle.graceful_shutdown(Some(self.grace));
        let mut result = Ok(());
        for task in self.tasks {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => result = Err(error),
                Err(error) => result = Err(ServerError::Task(error.to_string())),
            }
        }
        result
    }
}

/// Loads the certificate, binds the listeners and starts serving.
pub async fn start(
    settings: Settings,
    references: Arc<dyn References>,
    provider: Arc<CryptoProvider>,
) -> Result<Running, ServerError> {
    let metrics = Arc::new(Metrics::new());
    let certificate = Arc::new(ReloadingCertificate::load(settings.certificate.clone(), provider.clone())?);
    metrics.certificate_expiry(certificate.expiry());
    let tls = crate::tls::server_config(certificate.clone(), provider)?;
    let ready = Arc::new(AtomicBool::new(true));
    let references = Arc::new(Metered::new(references, metrics.clone()));
    let state = AppState {
        references,
        metrics: metrics.clone(),
        ready: ready.clone(),
        max_body_bytes: settings.max_body_bytes,
    };
    let (stop, stopped) = watch::channel(false);
    let mut tasks = Vec::new();

    let listen_error = |address| move |source| ServerError::Listen { address, source };
    let listener = std::net::TcpListener::bind(settings.address).map_err(listen_error(settings.address))?;
    listener.set_nonblocking(true).map_err(listen_error(settings.address))?;
    let address = listener.local_addr().map_err(listen_error(settings.address))?;
    let handle = Handle::new();
    let acceptor =
        RustlsAcceptor::new(RustlsConfig::from_config(Arc::new(tls))).handshake_timeout(settings.handshake_timeout);
    let server = axum_server::from_tcp(listener)
        .map_err(listen_error(address))?
        .acceptor(acceptor)
        .first_request_timeout(settings.request_timeout)
        .handle(handle.clone());
    let app = router(state.clone(), settings.max_body_bytes, settings.request_timeout);
    tasks.push(tokio::spawn(async move {
        server.serve(app.into_make_service()).await.map_err(|source| ServerError::Listen { address, source })
    }));

    let probe_address = match settings.probe_address {
        None => None,
        Some(wanted) => {
            let listener = tokio::net::TcpListener::bind(wanted).await.map_err(listen_error(wanted))?;
            let bound = listener.local_addr().map_err(listen_error(wanted))?;
            let app = probes()
                .layer(axum::middleware::from_fn_with_state(settings.request_timeout, bounded))
                .with_state(state);
            let mut stopped = stopped.clone();
            tasks.push(tokio::spawn(async move {
                axum::serve(listener, app)
                    .with_graceful_shutdown(async move {
                        let _ = stopped.wait_for(|s| *s).await;
                    })
                    .await
                    .map_err(|source| ServerError::Listen { address: bound, source })
            }));
            Some(bound)
        }
    };

    let mut watch_stopped = stopped;
    let watcher = certificate.clone().watch(settings.certificate_poll_interval, metrics.clone(), async move {
        let _ = watch_stopped.wait_for(|s| *s).await;
    });
    tasks.push(tokio::spawn(async move {
        watcher.await;
        Ok(())
    }));

    match probe_address {
        Some(probe) => tracing::info!(%address, probe_address = %probe, "admission webhook serving"),
        None => tracing::info!(%address, "admission webhook serving (no probe listener)"),
    }
    Ok(Running {
        address,
        probe_address,
        handle,
        ready,
        stop,
        grace: settings.shutdown_grace,
        tasks,
        metrics,
        certificate,
    })
}
