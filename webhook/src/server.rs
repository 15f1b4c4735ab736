//! The HTTPS server: routes, limits, readiness and graceful shutdown.
//!
//! | route | method | answer |
//! |---|---|---|
//! | `/validate/clevernodeclasses`, `/validate/flavorcatalogs`, `/validate/nodepools`, `/validate/cleverorganizations`, `/validate/capacitybuffers`, `/validate/nodeoverlays` | POST | an AdmissionReview response, or 400 for a body that is not a review, too large or unreadable |
//! | `/livez` | GET | 200 while the process serves |
//! | `/readyz` | GET | 200 when serving, 503 once shutdown began (so endpoints drop the pod first) |
//! | `/metrics` | GET | OpenMetrics text |
//!
//! Bounds: request bodies over `max_body_bytes` get 400 before being read whole; a review that
//! would pass `max_concurrent_reviews` or `max_buffered_bytes` gets 503 with `Retry-After`, unread
//! ([`crate::limits`]); a request (body read included) taking longer than `request_timeout` gets
//! 408; a TLS handshake must finish within `handshake_timeout`; a connection over
//! `max_connections` is closed at once, one idle for `idle_timeout` is closed, and so is one whose
//! next request head takes longer than `header_read_timeout` ([`crate::connection`]). hyper's own
//! buffers are bounded per connection (HTTP/1 read buffer, HTTP/2 windows and streams). Probes and
//! metrics can also be served over plain HTTP on a second address (`probe_address`), for kubelet
//! probes and Prometheus without the webhook's CA.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::body::HttpBody;
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

use crate::connection::{ConnectionLimits, Guard};
use crate::limits::{Budget, LimitsError, Refusal, SMALL_BODY_BYTES};
use crate::metrics::{self, Metrics, Outcome, Refused};
use crate::references::{Metered, References};
use crate::review::{self, Kind};
use crate::tls::{CertificateError, CertificateFiles, ReloadingCertificate};

/// Default bound on a review body: an object and its old version, each at most etcd's 1.5 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// Default bound on the bodies of the reviews in flight, together. Parsing a body into objects
/// takes up to about 11 times its size (measured: 42 MB for a 4 MB body of labels), so this keeps
/// reviews under about 70 MB: one largest body at a time, beside small ones (see docs/webhook.md).
pub const DEFAULT_MAX_BUFFERED_BYTES: u64 = 6 * 1024 * 1024;
/// Default bound on the reviews in flight.
pub const DEFAULT_MAX_CONCURRENT_REVIEWS: usize = 32;
/// Default bound on open connections (the API server opens a few, multiplexed over HTTP/2).
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// Default time a connection may stay open without a request.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default time the head of a request may take to arrive.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// hyper's HTTP/1 read buffer, per connection: a request head must fit (the API server's are
/// well under 4 KiB); hyper's default is about 400 KiB.
const HTTP1_MAX_BUFFER_BYTES: usize = 64 * 1024;
/// HTTP/2 flow-control windows, per stream and per connection: what a client may send before the
/// server reads it (hyper's default, 1 MiB each, would let 64 connections park 64 MiB unread).
const HTTP2_WINDOW_BYTES: u32 = 256 * 1024;

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
    /// Bodies of the reviews in flight, together.
    pub max_buffered_bytes: u64,
    /// Reviews in flight at once.
    pub max_concurrent_reviews: usize,
    /// Open connections, how long they may idle, how long a request head may take.
    pub connections: ConnectionLimits,
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
            max_buffered_bytes: DEFAULT_MAX_BUFFERED_BYTES,
            max_concurrent_reviews: DEFAULT_MAX_CONCURRENT_REVIEWS,
            connections: ConnectionLimits {
                max_connections: DEFAULT_MAX_CONNECTIONS,
                idle_timeout: DEFAULT_IDLE_TIMEOUT,
                header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            },
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
    /// The limits cannot work together.
    #[error("limits: {0}")]
    Limits(#[from] LimitsError),
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
    budget: Arc<Budget>,
    large_bodies: LargeBodies,
}

/// Reads (parses) the bodies over [`SMALL_BODY_BYTES`], one at a time, on one thread of their own.
///
/// Parsing a body allocates about 11 times its size in small pieces. glibc's malloc gives each
/// thread that allocates at once an arena of its own and keeps what is freed in it, so large
/// bodies parsed on whichever runtime worker took them left one parse's worth of memory in each
/// worker's arena (measured under the flood of docs/reliability.md: 112 MiB peak with the parses
/// on the workers, 75 MiB with them all on this thread). The budget admits about one largest body
/// at a time anyway, so nothing is lost by the queue.
#[derive(Debug, Clone)]
struct LargeBodies {
    jobs: std::sync::mpsc::SyncSender<LargeBody>,
}

type LargeBody = (Kind, Bytes, tokio::sync::oneshot::Sender<Result<review::Step, review::BadRequest>>);

impl LargeBodies {
    fn start(queue: usize) -> std::io::Result<Self> {
        let (jobs, queued) = std::sync::mpsc::sync_channel::<LargeBody>(queue);
        std::thread::Builder::new().name("large-bodies".to_string()).spawn(move || {
            for (kind, body, reply) in queued {
                // A panic drops the reply (the request gets 400 saying the body could not be read)
                // but must not end the thread.
                if let Ok(step) = std::panic::catch_unwind(|| review::read(kind, &body)) {
                    let _ = reply.send(step);
                }
            }
        })?;
        Ok(LargeBodies { jobs })
    }

    async fn read(&self, kind: Kind, body: Bytes) -> Result<review::Step, review::BadRequest> {
        let (reply, step) = tokio::sync::oneshot::channel();
        let failed = || {
            review::BadRequest::Malformed("the webhook could not read the body: its reader is busy or gone".to_string())
        };
        self.jobs.try_send((kind, body, reply)).map_err(|_| failed())?;
        step.await.map_err(|_| failed())?
    }
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
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), admit))
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

/// Takes room in the budget for one review before its body is read, or answers 503 at once.
async fn admit(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let declared = request.body().size_hint().exact();
    match state.budget.admit(declared) {
        Ok(room) => {
            let response = next.run(request).await;
            drop(room);
            response
        }
        Err(refusal) => {
            state.metrics.refused(match refusal {
                Refusal::Reviews { .. } => Refused::Reviews,
                Refusal::Bytes { .. } => Refused::Bytes,
            });
            tracing::debug!(path = request.uri().path(), declared_bytes = declared.unwrap_or_default(), error = %refusal, "refused a review: the webhook is busy");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "1")],
                format!("the webhook is busy, retry: {refusal}\n"),
            )
                .into_response()
        }
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
    let step = if u64::try_from(body.len()).unwrap_or(u64::MAX) > SMALL_BODY_BYTES {
        state.large_bodies.read(kind, body).await
    } else {
        review::read(kind, &body)
    };
    let answered = match step {
        Ok(step) => Ok(review::answer(kind, step, state.references.as_ref()).await),
        Err(bad) => Err(bad),
    };
    match answered {
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
    let budget = Arc::new(Budget::new(
        settings.max_concurrent_reviews,
        settings.max_buffered_bytes,
        u64::try_from(settings.max_body_bytes).unwrap_or(u64::MAX),
    )?);
    for (flag, zero) in [
        ("--max-connections", settings.connections.max_connections == 0),
        ("--idle-timeout", settings.connections.idle_timeout.is_zero()),
        ("--header-read-timeout", settings.connections.header_read_timeout.is_zero()),
    ] {
        if zero {
            return Err(LimitsError::Zero { flag }.into());
        }
    }
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
        budget,
        large_bodies: LargeBodies::start(settings.max_concurrent_reviews)
            .map_err(|source| ServerError::Task(format!("cannot start the large-body reader: {source}")))?,
    };
    let (stop, stopped) = watch::channel(false);
    let mut tasks = Vec::new();

    let listen_error = |address| move |source| ServerError::Listen { address, source };
    let listener = std::net::TcpListener::bind(settings.address).map_err(listen_error(settings.address))?;
    listener.set_nonblocking(true).map_err(listen_error(settings.address))?;
    let address = listener.local_addr().map_err(listen_error(settings.address))?;
    let handle = Handle::new();
    // The guard runs first: a connection over the limit is closed before its handshake.
    let tls =
        RustlsAcceptor::new(RustlsConfig::from_config(Arc::new(tls))).handshake_timeout(settings.handshake_timeout);
    let acceptor = Guard::new(tls, settings.connections, metrics.clone());
    let mut server =
        axum_server::from_tcp(listener).map_err(listen_error(address))?.acceptor(acceptor).handle(handle.clone());
    let streams = u32::try_from(settings.max_concurrent_reviews).unwrap_or(u32::MAX);
    let builder = server.http_builder();
    builder.http1().max_buf_size(HTTP1_MAX_BUFFER_BYTES);
    builder
        .http2()
        .max_concurrent_streams(streams)
        .initial_stream_window_size(HTTP2_WINDOW_BYTES)
        .initial_connection_window_size(HTTP2_WINDOW_BYTES);
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
