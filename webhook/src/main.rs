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
    let references: Arc<dyn References> = match args.lookups {
        Lookups::Off => Arc::new(NoReferences),
        Lookups::Api => {
            let client = kube::Client::try_default()
                .await
                .context("cannot build a Kubernetes client for lookups (in-cluster or KUBECONFIG); use --lookups=off to run without")?;
            Arc::new(ApiReferences::new(client, args.lookup_timeout))
        }
    };
    let running =
        webhook::server::start(args.settings(), references, provider).await.context("cannot start the webhook")?;
    shutdown_signal().await;
    tracing::info!(grace_seconds = args.shutdown_grace.as_secs_f64(), "shutting down");
    running.shutdown().await.context("the webhook stopped with an error")?;
    tracing::info!("stopped");
    Ok(())
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
