//! Bounds on connections: how many are open at once, how long one may sit idle, and how long the
//! head of each request may take to arrive, for HTTP/1.1 and HTTP/2 alike.
//!
//! hyper has no idle timeout for either protocol and no header timeout for HTTP/2, and its HTTP/1
//! header timeout runs from the moment a connection goes idle (so it cannot be longer than the
//! idle time allowed). These bounds are therefore kept here, below the protocol: each TLS stream is
//! wrapped in a [`Guarded`] stream, and the service of its connection in a layer that counts the
//! requests in flight on it. While no request is in flight the connection has a deadline:
//! `idle_timeout` after the last request ended (or `header_read_timeout` after the handshake, for
//! the first), brought forward to `header_read_timeout` after a request starts arriving while idle:
//! its first byte over HTTP/1.1, the type byte of a frame other than SETTINGS, PING,
//! WINDOW_UPDATE, PRIORITY, RST_STREAM or GOAWAY over HTTP/2 (so the acknowledgements and window
//! updates a client sends after an answer leave the idle time as it is). A read past the deadline
//! fails with `TimedOut` and hyper closes the connection; bytes trickling in never push a deadline
//! back. While a request is in flight there is none: `request_timeout` bounds each request, body
//! read included.
//!
//! Must not: parse more of HTTP/2 than frame boundaries and types, or hold a lock across a poll of
//! the inner stream.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use axum_server::accept::Accept;
use axum_server::tls_rustls::RustlsAcceptor;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_rustls::server::TlsStream;

use crate::metrics::{Metrics, Refused};

/// How long connections may live without a request, and how many may be open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// How long a connection may stay open with no request in flight.
    pub idle_timeout: Duration,
    /// How long the head of a request (or the first one of a connection) may take to arrive.
    pub header_read_timeout: Duration,
}

/// What one connection is doing, shared by its stream and the requests it carries.
#[derive(Debug)]
struct Activity {
    in_flight: usize,
    /// When the connection is closed unless a request starts; none while one is in flight.
    deadline: Option<Instant>,
    /// Whether a byte arrived since the connection went idle (the deadline is then the header one).
    head_started: bool,
    /// The task reading the stream, woken when the last request ends so its deadline is armed.
    reader: Option<Waker>,
}

/// One connection's state.
#[derive(Debug)]
pub struct Connection {
    activity: Mutex<Activity>,
    limits: ConnectionLimits,
}

impl Connection {
    fn new(limits: ConnectionLimits) -> Self {
        Connection {
            activity: Mutex::new(Activity {
                in_flight: 0,
                deadline: Some(Instant::now() + limits.header_read_timeout),
                head_started: true,
                reader: None,
            }),
            limits,
        }
    }

    fn owe_first_head(&self) {
        self.activity().deadline = Some(Instant::now() + self.limits.header_read_timeout);
    }

    fn activity(&self) -> std::sync::MutexGuard<'_, Activity> {
        self.activity.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A request began; the connection is not idle until it ends (the returned guard dropped).
    fn begin(self: &Arc<Self>) -> InFlight {
        let mut activity = self.activity();
        activity.in_flight += 1;
        activity.deadline = None;
        InFlight(self.clone())
    }

    /// The deadline to enforce now, after `read_some` bytes arrived (or none).
    fn deadline_after_read(&self, read_some: bool) -> Option<Instant> {
        let mut activity = self.activity();
        if read_some && activity.in_flight == 0 && !activity.head_started {
            activity.head_started = true;
            let head = Instant::now() + self.limits.header_read_timeout;
            activity.deadline = activity.deadline.map(|idle| idle.min(head));
        }
        activity.deadline
    }

    fn park(&self, waker: &Waker) {
        let mut activity = self.activity();
        match &activity.reader {
            Some(reader) if reader.will_wake(waker) => {}
            _ => activity.reader = Some(waker.clone()),
        }
    }
}

/// A request in flight on a connection.
#[derive(Debug)]
struct InFlight(Arc<Connection>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut activity = self.0.activity();
        activity.in_flight = activity.in_flight.saturating_sub(1);
        if activity.in_flight == 0 {
            activity.deadline = Some(Instant::now() + self.0.limits.idle_timeout);
            activity.head_started = false;
            if let Some(reader) = activity.reader.take() {
                reader.wake();
            }
        }
    }
}

/// Counts a request as in flight on its connection for as long as it is served.
async fn track(State(connection): State<Arc<Connection>>, request: Request, next: Next) -> Response {
    let _in_flight = connection.begin();
    next.run(request).await
}

/// Where an HTTP/2 byte stream is: in the client preface, a frame header, or a frame's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frames {
    Preface { left: usize },
    Header { got: usize, length: usize },
    Payload { left: usize },
}

/// The client connection preface of HTTP/2.
const PREFACE_BYTES: usize = 24;
/// Frames a client sends on an idle connection that do not start a request: PRIORITY, RST_STREAM,
/// SETTINGS, PING, GOAWAY, WINDOW_UPDATE.
const CONTROL_FRAMES: [u8; 6] = [0x2, 0x3, 0x4, 0x6, 0x7, 0x8];

impl Frames {
    /// Follows `bytes`; whether a frame that is not control began in them (its type byte arrived).
    fn feed(&mut self, mut bytes: &[u8]) -> bool {
        let mut request = false;
        while let Some((&byte, rest)) = bytes.split_first() {
            match *self {
                Frames::Preface { left } | Frames::Payload { left } => {
                    let n = left.min(bytes.len());
                    bytes = bytes.get(n..).unwrap_or_default();
                    *self = match *self {
                        _ if left == n => Frames::Header { got: 0, length: 0 },
                        Frames::Preface { .. } => Frames::Preface { left: left - n },
                        _ => Frames::Payload { left: left - n },
                    };
                }
                Frames::Header { got, length } => {
                    bytes = rest;
                    let length = if got < 3 { length << 8 | usize::from(byte) } else { length };
                    if got == 3 && !CONTROL_FRAMES.contains(&byte) {
                        request = true;
                    }
                    *self = match got + 1 {
                        9 if length == 0 => Frames::Header { got: 0, length: 0 },
                        9 => Frames::Payload { left: length },
                        got => Frames::Header { got, length },
                    };
                }
            }
        }
        request
    }
}

/// How the bytes read tell that a request is arriving.
#[derive(Debug)]
enum Protocol {
    /// Any byte.
    Http1,
    /// A frame that is not control.
    Http2(Frames),
}

/// A TLS stream whose reads fail once its connection passed its deadline; holds the connection's
/// place among `max_connections`.
#[derive(Debug)]
pub struct Guarded<S> {
    inner: S,
    protocol: Protocol,
    connection: Arc<Connection>,
    timer: Pin<Box<Sleep>>,
    _place: OwnedSemaphorePermit,
}

fn timed_out(connection: &Connection) -> io::Error {
    let why = if connection.activity().head_started {
        "no complete request head within --header-read-timeout"
    } else {
        "idle for longer than --idle-timeout"
    };
    io::Error::new(io::ErrorKind::TimedOut, why)
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // Checked before reading: a client sending a byte now and then must not outlive the deadline.
        if let Some(deadline) = this.connection.deadline_after_read(false)
            && Instant::now() >= deadline
        {
            return Poll::Ready(Err(timed_out(&this.connection)));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        let read = match polled {
            Poll::Ready(Ok(())) => buf.filled().get(before..).unwrap_or_default(),
            _ => &[],
        };
        let request_arriving = match &mut this.protocol {
            Protocol::Http1 => !read.is_empty(),
            Protocol::Http2(frames) => frames.feed(read),
        };
        let deadline = this.connection.deadline_after_read(request_arriving);
        if polled.is_ready() {
            return polled;
        }
        this.connection.park(cx.waker());
        let Some(deadline) = deadline else { return Poll::Pending };
        if this.timer.deadline() != deadline {
            this.timer.as_mut().reset(deadline);
        }
        match this.timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(timed_out(&this.connection))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The acceptor of the HTTPS listener: takes a place among `max_connections` or closes the
/// connection before its handshake, then runs the TLS acceptor and wraps the stream in
/// [`Guarded`] and the router in the request count.
#[derive(Debug, Clone)]
pub struct Guard {
    tls: RustlsAcceptor,
    limits: ConnectionLimits,
    places: Arc<Semaphore>,
    metrics: Arc<Metrics>,
}

impl Guard {
    /// A guard allowing `limits.max_connections` connections at once, around `tls`.
    pub fn new(tls: RustlsAcceptor, limits: ConnectionLimits, metrics: Arc<Metrics>) -> Self {
        Guard { tls, places: Arc::new(Semaphore::new(limits.max_connections)), limits, metrics }
    }
}

type TlsService = <RustlsAcceptor as Accept<TcpStream, Router>>::Service;
type Accepted = io::Result<(Guarded<TlsStream<TcpStream>>, TlsService)>;

impl Accept<TcpStream, Router> for Guard {
    type Stream = Guarded<TlsStream<TcpStream>>;
    type Service = TlsService;
    type Future = Pin<Box<dyn Future<Output = Accepted> + Send>>;

    fn accept(&self, stream: TcpStream, router: Router) -> Self::Future {
        let Ok(place) = self.places.clone().try_acquire_owned() else {
            self.metrics.refused(Refused::Connections);
            tracing::debug!(limit = self.limits.max_connections, "connection closed: --max-connections reached");
            // Dropping the stream closes it: nothing is read or buffered.
            return Box::pin(std::future::ready(Err(io::Error::other("--max-connections reached"))));
        };
        let _ = stream.set_nodelay(true);
        let connection = Arc::new(Connection::new(self.limits));
        let router = router.layer(axum::middleware::from_fn_with_state(connection.clone(), track));
        let handshake = self.tls.accept(stream, router);
        Box::pin(async move {
            let (stream, service) = handshake.await?;
            let protocol = match stream.get_ref().1.alpn_protocol() {
                Some(b"h2") => Protocol::Http2(Frames::Preface { left: PREFACE_BYTES }),
                _ => Protocol::Http1,
            };
            // The first request's head is owed from the end of the handshake.
            connection.owe_first_head();
            let timer = Box::pin(tokio::time::sleep(Duration::ZERO));
            Ok((Guarded { inner: stream, protocol, connection, timer, _place: place }, service))
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn limits() -> ConnectionLimits {
        ConnectionLimits {
            max_connections: 2,
            idle_timeout: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(5),
        }
    }

    /// Asserts `deadline` is `after` past some instant between `from` and now.
    fn about(deadline: Option<Instant>, from: Instant, after: Duration) {
        let deadline = deadline.unwrap();
        assert!(
            deadline >= from + after && deadline <= Instant::now() + after,
            "{deadline:?} not {after:?} after {from:?}"
        );
    }

    #[test]
    fn the_deadline_follows_the_requests_in_flight() {
        let start = Instant::now();
        let connection = Arc::new(Connection::new(limits()));
        // A new connection owes its first request head.
        about(connection.deadline_after_read(true), start, Duration::from_secs(5));
        let first = connection.begin();
        let second = connection.begin();
        assert_eq!(connection.deadline_after_read(true), None, "no deadline while requests are in flight");
        drop(first);
        assert_eq!(connection.deadline_after_read(false), None, "one request is still in flight");
        let idle_from = Instant::now();
        drop(second);
        about(connection.deadline_after_read(false), idle_from, Duration::from_secs(30));
        // The first byte of the next head brings the deadline forward, later bytes leave it.
        let head_from = Instant::now();
        let head = connection.deadline_after_read(true);
        about(head, head_from, Duration::from_secs(5));
        assert_eq!(connection.deadline_after_read(true), head);
        assert_eq!(connection.deadline_after_read(false), head);
    }

    #[test]
    fn http2_frames_other_than_control_start_a_request() {
        let frame = |kind: u8, payload: &[u8]| {
            let mut frame = vec![0, 0, u8::try_from(payload.len()).unwrap(), kind, 0, 0, 0, 0, 1];
            frame.extend(payload);
            frame
        };
        let mut frames = Frames::Preface { left: PREFACE_BYTES };
        assert!(!frames.feed(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"));
        assert!(!frames.feed(&frame(0x4, &[])), "SETTINGS");
        assert!(!frames.feed(&frame(0x8, &[0, 0, 1, 0])), "WINDOW_UPDATE");
        assert!(!frames.feed(&frame(0x6, &[0; 8])), "PING");
        // HEADERS, even split byte by byte, and with a payload holding control-like bytes.
        let headers = frame(0x1, &[0x4, 0x6, 0x8, 0x82]);
        assert!(!frames.feed(&headers[..3]));
        assert!(frames.feed(&headers[3..4]));
        assert!(!frames.feed(&headers[4..]));
        assert_eq!(frames, Frames::Header { got: 0, length: 0 });
        assert!(frames.feed(&frame(0x0, &[1, 2, 3])), "DATA");
        // Several frames in one read: one starts a request.
        let mut both = frame(0x4, &[]);
        both.extend(frame(0x9, &[1]));
        assert!(frames.feed(&both), "CONTINUATION after SETTINGS");
        // A preface split across reads.
        let mut frames = Frames::Preface { left: PREFACE_BYTES };
        assert!(!frames.feed(&[b'P'; 20]));
        assert!(!frames.feed(&[b'x'; 4]));
        assert!(frames.feed(&frame(0x1, &[0x82])));
    }

    #[test]
    fn a_head_started_near_the_end_of_the_idle_time_keeps_the_idle_deadline() {
        let connection =
            Arc::new(Connection::new(ConnectionLimits { idle_timeout: Duration::from_nanos(1), ..limits() }));
        drop(connection.begin());
        let idle = connection.deadline_after_read(false);
        assert_eq!(connection.deadline_after_read(true), idle);
    }
}
