//! The `karpenter-hub-webhook` binary itself: it starts from flags, serves, stops cleanly on
//! SIGTERM, and refuses to start without a usable certificate, saying why.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Waits without blocking the runtime: open client connections must keep being served (an HTTP/2
/// graceful shutdown waits for the client to answer a PING).
async fn wait_exit(child: &mut std::process::Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the webhook did not exit within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(unix)]
#[tokio::test]
async fn serves_from_flags_and_stops_on_sigterm() {
    let ca = Ca::new();
    let dir = TempDir::new("binary");
    let (cert, key, _) = ca.issue(&["localhost"]);
    std::fs::write(dir.path().join("tls.crt"), cert).unwrap();
    std::fs::write(dir.path().join("tls.key"), key).unwrap();
    let (port, probe_port) = (free_port(), free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_karpenter-hub-webhook"))
        .env("KARPENTER_HUB_WEBHOOK_ADDRESS", format!("127.0.0.1:{port}"))
        .env("KARPENTER_HUB_WEBHOOK_PROBE_ADDRESS", format!("127.0.0.1:{probe_port}"))
        .env("KARPENTER_HUB_WEBHOOK_TLS_CERT_FILE", dir.path().join("tls.crt"))
        .env("KARPENTER_HUB_WEBHOOK_TLS_KEY_FILE", dir.path().join("tls.key"))
        .env("KARPENTER_HUB_WEBHOOK_LOOKUPS", "off")
        // What a log collector gets: pipes, and no NO_COLOR to lean on.
        .env_remove("NO_COLOR")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = client(&ca.pem(), false);
    eventually("the webhook to be ready", || {
        let client = client.clone();
        async move {
            client.get(format!("http://127.0.0.1:{probe_port}/readyz")).send().await.is_ok_and(|r| r.status() == 200)
        }
    })
    .await;
    let body = review(
        "FlavorCatalog",
        "CREATE",
        flavor_catalog("c", serde_json::json!([{"name": "M", "priceHourly": 0.1}])),
        None,
    );
    let (status, answer) = post(&client, &format!("https://localhost:{port}/validate/flavorcatalogs"), &body).await;
    assert_eq!((status, answer["response"]["allowed"].as_bool()), (200, Some(true)), "{answer}");

    let kill = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
    assert!(kill.success());
    // The client's connections are still open: the shutdown closes them rather than waiting 20 s.
    let status = wait_exit(&mut child, Duration::from_secs(10)).await;
    let output = child.wait_with_output().unwrap();
    let logs = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    assert!(status.success(), "exit {status:?}\n{logs}");
    assert!(logs.contains("shutting down") && logs.contains("stopped"), "{logs}");
    assert!(!logs.contains('\u{1b}'), "ANSI escape codes written to a pipe:\n{logs}");
    assert!(!logs.contains("Some("), "Rust debug formatting in the logs:\n{logs}");
}

#[tokio::test]
async fn refuses_to_start_without_a_usable_certificate() {
    let dir = TempDir::new("binary-bad-cert");
    std::fs::write(dir.path().join("tls.crt"), "not a certificate").unwrap();
    std::fs::write(dir.path().join("tls.key"), "not a key").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_karpenter-hub-webhook"))
        .arg("--address=127.0.0.1:0")
        .arg(format!("--tls-cert-file={}", dir.path().join("tls.crt").display()))
        .arg(format!("--tls-key-file={}", dir.path().join("tls.key").display()))
        .arg("--lookups=off")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(10)).await;
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!status.success());
    assert!(stderr.contains("cannot start the webhook") && stderr.contains("no usable PEM certificate"), "{stderr}");
}

/// The README's `karpenter-hub-webhook --help`: it prints the flags a user sets and exits 0.
#[test]
fn help_lists_the_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_karpenter-hub-webhook")).arg("--help").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for flag in ["--address", "--tls-cert-file", "--tls-key-file", "--lookups"] {
        assert!(stdout.contains(flag), "{flag} missing from --help:\n{stdout}");
    }
}
