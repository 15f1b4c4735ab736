//! Credentials never reach a log line, a status or an event (hub.md §1): everything the hub and its
//! libraries log at debug level during a provisioning, a token rotation answered by 401 and a
//! series of hostile kubeconfigs is captured, then searched for every token, key and CA body.
//!
//! This file holds a single test: it installs the process-wide log subscriber.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{io::Write, time::Duration};

use crds::NodePool;
use k8s_openapi::api::core::v1::Event;
use kube::{Api, Client, api::ListParams};
use operator::commands::sandbox::world::{World, quick_cke, scale};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::util::SubscriberInitExt;

mod common;
use common::{apply_example, running, wait_for};

/// `ClusterReachable` of the pool `default` in `ns`: (status, reason, message).
async fn reachable(mgmt: &Client, ns: &str) -> Option<(String, String, String)> {
    let pool = Api::<NodePool>::namespaced(mgmt.clone(), ns).get("default").await.ok()?;
    let c = pool.status?.conditions.into_iter().find(|c| c.type_ == "ClusterReachable")?;
    Some((c.status, c.reason, c.message))
}

async fn wait_reachable(mgmt: &Client, ns: &str, reason: &str, message_has: &str) {
    wait_for(
        &format!("{ns}: ClusterReachable {reason} mentioning {message_has:?}"),
        Duration::from_secs(30),
        || async { reachable(mgmt, ns).await.is_some_and(|(_, r, m)| r == reason && m.contains(message_has)) },
    )
    .await;
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

/// A line from the middle of a PEM body (the header is the same for every certificate).
fn pem_body_line(pem: &str) -> String {
    pem.lines().nth(2).unwrap().to_string()
}

fn kubeconfig(server: &str, ca_data: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca_data}\nusers:\n- name: u\n  user:\n{user}contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_credential_is_ever_logged_or_published() {
    let capture = common::LogCapture::default();
    tracing_subscriber::fmt()
        .with_writer(capture.clone())
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .finish()
        .try_init()
        .unwrap();
    // Panic messages too (a panic in a spawned task would otherwise only reach stderr).
    let panics = capture.clone();
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let _ = writeln!(panics.clone(), "PANIC {info}");
        default_hook(info);
    }));

    let mut world =
        World::start(&[("team-a", "alpha"), ("team-b", "beta")], |i| quick_cke(i as u64 + 50)).await.unwrap();
    world.registry_settings.probe_interval = Duration::from_secs(1);
    apply_example(&world, 0).await;
    apply_example(&world, 1).await;
    world.start_hub();
    let mgmt = world.mgmt.client();
    let (alpha, beta) = (&world.clusters[0].server, &world.clusters[1].server);
    let mut secrets = vec![world.mgmt.token(), alpha.token(), beta.token()];

    // A full provisioning.
    scale(&world, 0, 1, "500m", "1Gi").await.unwrap();
    wait_for("alpha's pod running", Duration::from_secs(60), || async { running(&world, 0).await == 1 }).await;

    // A rotation answered by 401, then the new token registered (CKE moves to the new token too).
    secrets.push(alpha.rotate_token());
    let cke = CancellationToken::new();
    let (client, stop) = (alpha.client(), cke.clone());
    tokio::spawn(async move {
        let _ = sim::cke::run(client, quick_cke(59), stop.cancelled_owned()).await;
    });
    wait_reachable(&mgmt, "team-a", "Unauthorized", "401").await;
    world.register(0).await.unwrap();
    wait_reachable(&mgmt, "team-a", "Connected", "").await;
    scale(&world, 0, 2, "500m", "1Gi").await.unwrap();
    wait_for("alpha's second pod running", Duration::from_secs(60), || async { running(&world, 0).await == 2 }).await;

    // Hostile and broken kubeconfigs for beta, each full of credentials.
    let key_body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDhubT3st5ecretK3yB0dyL1ne";
    let key_pem = format!("-----BEGIN PRIVATE KEY-----\n{key_body}\n-----END PRIVATE KEY-----\n");
    let cert_body = "MIIDBTCCAe2gAwIBAgIUhubT3st5ecretC3rtB0dyL1neXXXXXXXXXXXXXXXXXXXXXXXXXXX";
    let cert_pem = format!("-----BEGIN CERTIFICATE-----\n{cert_body}\n-----END CERTIFICATE-----\n");
    let (key_data, cert_data) = (b64(&key_pem), b64(&cert_pem));
    let ca_data = b64(beta.ca_pem());
    let registered = beta.kubeconfig().clusters[0].cluster.clone().unwrap().certificate_authority_data.unwrap();
    assert_eq!(registered, ca_data, "the CA needle is what the registered kubeconfig holds");
    let url = beta.url();
    secrets.extend([
        key_body.to_string(),
        key_data.clone(),
        cert_data.clone(),
        pem_body_line(beta.ca_pem()),
        pem_body_line(alpha.ca_pem()),
        ca_data[100..160].to_string(),
        b64(alpha.ca_pem())[100..160].to_string(),
    ]);
    let creds = |token: &str| {
        format!("    token: {token}\n    client-certificate-data: {cert_data}\n    client-key-data: {key_data}\n")
    };
    let hostile: Vec<(&str, &str, String)> = vec![
        (
            "InvalidKubeconfig",
            "exec",
            kubeconfig(
                &url,
                &ca_data,
                &format!(
                    "{}    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      args: [-c, 'echo hostile-exec-token-4f1d']\n",
                    creds("hostile-exec-token-7c2e")
                ),
            ),
        ),
        (
            "InvalidKubeconfig",
            "auth-provider",
            kubeconfig(
                &url,
                &ca_data,
                "    auth-provider:\n      name: oidc\n      config:\n        access-token: hostile-oidc-token-9b3a\n        refresh-token: hostile-oidc-refresh-5e8d\n",
            ),
        ),
        (
            "InvalidKubeconfig",
            "tokenFile",
            kubeconfig(
                &url,
                &ca_data,
                &format!("{}    tokenFile: /var/run/secrets/token\n", creds("hostile-file-token-2a6f")),
            ),
        ),
        (
            "InvalidKubeconfig",
            "not valid YAML",
            kubeconfig(&url, &ca_data, "    token: hostile-yaml-token-8d4c\n  : [unclosed\n"),
        ),
        (
            "InvalidKubeconfig",
            "cannot build a client",
            kubeconfig(&url, &ca_data, &creds("hostile-keypair-token-3e7b")),
        ),
        ("Unauthorized", "401", kubeconfig(&url, &ca_data, "    token: hostile-wrong-token-6c1a\n")),
    ];
    secrets.extend(
        [
            "hostile-exec-token-7c2e",
            "hostile-oidc-token-9b3a",
            "hostile-oidc-refresh-5e8d",
            "hostile-file-token-2a6f",
            "hostile-yaml-token-8d4c",
            "hostile-keypair-token-3e7b",
            "hostile-wrong-token-6c1a",
        ]
        .map(String::from),
    );
    for (reason, marker, bytes) in &hostile {
        world.put_secret("team-b", "beta", bytes.as_bytes()).await.unwrap();
        wait_reachable(&mgmt, "team-b", reason, marker).await;
    }
    world.register(1).await.unwrap();
    wait_reachable(&mgmt, "team-b", "Connected", "").await;
    scale(&world, 1, 1, "500m", "1Gi").await.unwrap();
    wait_for("beta's pod running", Duration::from_secs(60), || async { running(&world, 1).await == 1 }).await;

    // Statuses and events as the API shows them.
    let mut published = String::new();
    for ns in ["team-a", "team-b"] {
        let pools = Api::<NodePool>::namespaced(mgmt.clone(), ns).list(&ListParams::default()).await.unwrap();
        published.push_str(&serde_json::to_string(&pools.items).unwrap());
    }
    for client in [mgmt.clone(), alpha.client(), beta.client()] {
        let events = Api::<Event>::all(client).list(&ListParams::default()).await.unwrap();
        published.push_str(&serde_json::to_string(&events.items).unwrap());
    }
    cke.cancel();
    world.shutdown().await;

    let logs = capture.text();
    // The capture saw the run, at debug level, including the refusals.
    for expected in ["DEBUG", "workload cluster connected and synced", "Unauthorized", "exec", "tokenFile"] {
        assert!(logs.contains(expected), "the captured logs lack {expected:?}");
    }
    assert!(published.contains("InvalidKubeconfig") || published.contains("Connected"), "statuses were read");
    for secret in &secrets {
        assert!(!secret.is_empty());
        if let Some(at) = logs.find(secret.as_str()) {
            let line_start = logs[..at].rfind('\n').map_or(0, |i| i + 1);
            let line_end = logs[at..].find('\n').map_or(logs.len(), |i| at + i);
            panic!("a credential was logged: {}", &logs[line_start..line_end]);
        }
        assert!(!published.contains(secret.as_str()), "a credential was published in a status or an event");
    }
}
