//! `karpenter-hub-webhook`: the admission webhook of Clever Karpenter Hub (see `docs/webhook.md`).

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use tracing_subscriber::EnvFilter;
use webhook::cli::{Args, LogFormat, Lookups};
use webhook::references::{ApiReferences, NoReferences, References};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = EnvFilter::try_new(&args.log).with_context(|| format!("invalid --log filter {:?}", args.log))?;
    // Colours only for a person at a terminal (logs go to stdout): files, pipes and log collectors get plain text
    // (and `NO_COLOR`, https://no-color.org, turns them off anywhere).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stdout())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    match args.log_format {
        LogFormat::Text => tracing_subscriber::fmt().with_env_filter(filter).with_ansi(colour).init(),
        LogFormat::Json => tracing_subscriber::fmt().json().with_env_filter(filter).init(),
    }
    // One crypto provider for the whole process: the server's and the kube client's TLS.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    if rustls::crypto::CryptoProvider::install_default(rustls::crypto::ring::default_provider()).is_err() {
        tracing::debug!("a rustls crypto provider was already installed");
    }
    let client = if args.lookups == Lookups::Api || args.certificate_secret.is_some() {
        Some(kube::Client::try_default().await.context(
            "cannot build a Kubernetes client (in-cluster or KUBECONFIG) for lookups or the self-managed certificate; \
             use --lookups=off and no --certificate-secret to run without",
        )?)
    } else {
        None
    };
    let references: Arc<dyn References> = match (args.lookups, &client) {
        (Lookups::Api, Some(client)) => Arc::new(ApiReferences::new(client.clone(), args.lookup_timeout)),
        _ => Arc::new(NoReferences),
    };
    // The self-managed certificate: in place before the server reads the files.
    let manager = client.and_then(|c| args.certificate_manager(c));
    if let Some(manager) = &manager {
        first_certificate(manager).await?;
    }
    let running =
        webhook::server::start(args.settings(), references, provider).await.context("cannot start the webhook")?;
    let renewals = manager.map(|m| tokio::spawn(m.run(args.certificate_check_interval, std::future::pending())));
    shutdown_signal().await;
    if let Some(task) = renewals {
        task.abort();
    }
    tracing::info!(grace_seconds = args.shutdown_grace.as_secs_f64(), "shutting down");
    running.shutdown().await.context("the webhook stopped with an error")?;
    tracing::info!("stopped");
    Ok(())
}

/// The first pass of the self-managed certificate, tried again (1 s, doubling to 30 s) until it
/// succeeds: the webhook cannot serve before it has a pair. A Secret that is not its own stops it.
async fn first_certificate(manager: &webhook::certificates::Manager) -> anyhow::Result<()> {
    let mut delay = std::time::Duration::from_secs(1);
    loop {
        match manager.reconcile(webhook::certificates::unix_now()).await {
            Ok(pass) => {
                webhook::certificates::log_pass(manager, &pass);
                return Ok(());
            }
            Err(e @ webhook::certificates::CertificateError::NotOurs { .. }) => {
                return Err(e).context("cannot keep the self-managed certificate");
            }
            Err(error) => {
                tracing::warn!(%error, retry_in_seconds = delay.as_secs(), "self-managed certificate not ready yet");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(30));
            }
        }
    }
}

/// Resolves on SIGTERM (what the kubelet sends) or Ctrl-C.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the webhook");
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
