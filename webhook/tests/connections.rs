//! The connection bounds of the real `karpenter-hub-webhook` binary, over HTTP/1.1 and HTTP/2 on
//! raw TLS streams: a keep-alive connection left idle is closed after `--idle-timeout`; the head of
//! a second request sent a byte at a time is cut at `--header-read-timeout` (issue 23: an idle
//! connection used to live past 180 s, and such a head was accepted for 50 s); connections over
//! `--max-connections` are closed at once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const IDLE: Duration = Duration::from_secs(2);
const HEADER: Duration = Duration::from_secs(1);
/// How much later than its deadline a close may be seen (a loaded 2-core machine).
const SLACK: Duration = Duration::from_secs(2);

async fn webhook(name: &str) -> Binary {
    Binary::start(
        name,
        &[("KARPENTER_HUB_WEBHOOK_IDLE_TIMEOUT", "2s"), ("KARPENTER_HUB_WEBHOOK_HEADER_READ_TIMEOUT", "1s")],
    )
    .await
}

/// Reads until the server closes (EOF or error), or `within` passes: when it closed, if it did.
async fn closed_within<S: AsyncRead + Unpin>(stream: &mut S, within: Duration) -> Option<Instant> {
    let mut buffer = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(Instant::now()),
            Ok(Ok(_)) => {}
        }
    }
}

// ---- HTTP/1.1 ----

const H1_GET: &[u8] = b"GET /livez HTTP/1.1\r\nhost: localhost\r\n\r\n";

/// Sends a GET and reads its answer (`ok`, 2 bytes, with Content-Length).
async fn h1_first_request<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S) {
    stream.write_all(H1_GET).await.unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 1024];
    while !(answer.starts_with(b"HTTP/1.1 200") && answer.ends_with(b"ok")) {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer)).await.unwrap().unwrap();
        assert!(n > 0, "closed before answering: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&buffer[..n]);
    }
}

#[tokio::test]
async fn an_idle_http1_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let webhook = webhook("idle-h1").await;
    let mut stream = tls_stream(&webhook.ca.pem(), webhook.port, b"http/1.1").await;
    h1_first_request(&mut stream).await;
    let idle_from = Instant::now();
    let closed = closed_within(&mut stream, IDLE + SLACK).await;
    let closed = closed.unwrap_or_else(|| panic!("an idle keep-alive connection still open after {:?}", IDLE + SLACK));
    // The idle deadline, not the (shorter) header one, closed it.
    assert!(closed - idle_from >= IDLE - Duration::from_millis(200), "closed after {:?}", closed - idle_from);
}

#[tokio::test]
async fn a_slow_second_http1_request_head_is_cut_at_the_header_timeout() {
    let webhook = webhook("slow-h1").await;
    let stream = tls_stream(&webhook.ca.pem(), webhook.port, b"http/1.1").await;
    let (mut reader, mut writer) = tokio::io::split(stream);
    writer.write_all(H1_GET).await.unwrap();
    let mut answer = [0u8; 1024];
    let n = reader.read(&mut answer).await.unwrap();
    assert!(answer[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer[..n]));
    // A second head at 10 bytes a second: 4 s to send, far past the header timeout.
    let head = b"POST /validate/nodepools HTTP/1.1\r\nhost: localhost\r\n\r\n";
    let started = Instant::now();
    let trickle = tokio::spawn(async move {
        for byte in head {
            if writer.write_all(&[*byte]).await.is_err() || writer.flush().await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let closed = closed_within(&mut reader, HEADER + SLACK).await;
    trickle.abort();
    let closed = closed.unwrap_or_else(|| panic!("a head sent a byte at a time still read after {:?}", HEADER + SLACK));
    assert!(closed - started >= HEADER - Duration::from_millis(200), "closed after {:?}", closed - started);
}

// ---- HTTP/2 ----

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut frame = vec![length[1], length[2], length[3], kind, flags];
    frame.extend(stream.to_be_bytes());
    frame.extend(payload);
    frame
}

/// HEADERS (END_STREAM | END_HEADERS) of `GET /livez` on `stream`, HPACK without the dynamic table:
/// :method GET (static 2), :scheme https (7), :path (name 4) and :authority (name 1) as literals.
fn h2_get(stream: u32) -> Vec<u8> {
    let mut block = vec![0x82, 0x87, 0x04, 6];
    block.extend(b"/livez");
    block.extend([0x01, 9]);
    block.extend(b"localhost");
    h2_frame(0x1, 0x5, stream, &block)
}

/// Reads frames, acknowledging the server's SETTINGS, until the response HEADERS of `stream`.
async fn h2_until_response<S: AsyncRead + AsyncWrite + Unpin>(stream_io: &mut S, stream: u32) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut header = [0u8; 9];
        tokio::time::timeout_at(deadline, stream_io.read_exact(&mut header)).await.unwrap().unwrap();
        let length = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        let mut payload = vec![0u8; length];
        tokio::time::timeout_at(deadline, stream_io.read_exact(&mut payload)).await.unwrap().unwrap();
        let (kind, flags) = (header[3], header[4]);
        let id = u32::from_be_bytes([header[5] & 0x7f, header[6], header[7], header[8]]);
        if kind == 0x4 && flags & 0x1 == 0 {
            stream_io.write_all(&h2_frame(0x4, 0x1, 0, &[])).await.unwrap();
        }
        assert_ne!(kind, 0x7, "GOAWAY before the response");
        if kind == 0x1 && id == stream {
            return;
        }
    }
}

/// An HTTP/2 connection that has had one request answered.
async fn h2_after_one_request(webhook: &Binary) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let mut stream = tls_stream(&webhook.ca.pem(), webhook.port, b"h2").await;
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    stream.write_all(H2_PREFACE).await.unwrap();
    stream.write_all(&h2_frame(0x4, 0, 0, &[])).await.unwrap();
    stream.write_all(&h2_get(1)).await.unwrap();
    h2_until_response(&mut stream, 1).await;
    stream
}

#[tokio::test]
async fn an_idle_http2_connection_is_closed_after_the_idle_timeout() {
    let webhook = webhook("idle-h2").await;
    let mut stream = h2_after_one_request(&webhook).await;
    let idle_from = Instant::now();
    let closed = closed_within(&mut stream, IDLE + SLACK).await;
    let closed = closed.unwrap_or_else(|| panic!("an idle HTTP/2 connection still open after {:?}", IDLE + SLACK));
    assert!(closed - idle_from >= IDLE - Duration::from_millis(200), "closed after {:?}", closed - idle_from);
}

#[tokio::test]
async fn a_slow_second_http2_request_head_is_cut_at_the_header_timeout() {
    let webhook = webhook("slow-h2").await;
    let stream = h2_after_one_request(&webhook).await;
    let (mut reader, mut writer) = tokio::io::split(stream);
    // Stream 3's HEADERS frame (29 bytes) at a byte every 150 ms: 4.4 s to send.
    let frame = h2_get(3);
    let started = Instant::now();
    let trickle = tokio::spawn(async move {
        for byte in frame {
            if writer.write_all(&[byte]).await.is_err() || writer.flush().await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    });
    let closed = closed_within(&mut reader, HEADER + SLACK).await;
    trickle.abort();
    let closed =
        closed.unwrap_or_else(|| panic!("a frame sent a byte at a time still read after {:?}", HEADER + SLACK));
    assert!(closed - started >= HEADER - Duration::from_millis(200), "closed after {:?}", closed - started);
}

#[tokio::test]
async fn connections_over_the_bound_are_closed_at_once() {
    let webhook = Binary::start("max-connections", &[("KARPENTER_HUB_WEBHOOK_MAX_CONNECTIONS", "2")]).await;
    let mut first = tls_stream(&webhook.ca.pem(), webhook.port, b"http/1.1").await;
    let mut second = tls_stream(&webhook.ca.pem(), webhook.port, b"http/1.1").await;
    h1_first_request(&mut first).await;
    h1_first_request(&mut second).await;
    // A third: closed before its handshake.
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", webhook.port)).await.unwrap();
    let mut tcp = tcp;
    let started = Instant::now();
    let closed = closed_within(&mut tcp, Duration::from_secs(2)).await;
    assert!(closed.is_some_and(|at| at - started < Duration::from_secs(1)), "a third connection was kept");
    // The refusal is counted (on the plain probe listener, which has no such bound)...
    let metrics = format!("http://127.0.0.1:{}/metrics", webhook.probe_port);
    let text = client(&webhook.ca.pem(), true).get(metrics).send().await.unwrap().text().await.unwrap();
    assert!(text.contains("karpenter_hub_webhook_refusals_total{bound=\"connections\"} 1"), "{text}");
    // ...and a place freed is taken again.
    drop(first);
    let client = client(&webhook.ca.pem(), true);
    eventually("a freed place to be taken", || {
        let (client, url) = (client.clone(), webhook.url("/livez"));
        async move { client.get(url).send().await.is_ok_and(|r| r.status() == 200) }
    })
    .await;
    h1_first_request(&mut second).await;
}
