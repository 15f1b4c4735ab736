//! `karpenter-hub`: the Clever Karpenter Hub command line.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::Context;
use clap::{Parser, Subcommand};
use operator::commands::run::{LogFormat, RunArgs};
use tokio_util::sync::CancellationToken;

/// Clever Karpenter Hub: one Karpenter for a fleet of Clever Kubernetes Engine clusters.
#[derive(Debug, Parser)]
#[command(name = "karpenter-hub", version, about, long_about = None, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// With no subcommand, `karpenter-hub` runs the operator with these flags.
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the operator: watch kubeconfig Secrets, NodePools and NodeClaims in the management
    /// cluster and provision nodes in every registered CKE cluster (the default).
    Run(RunArgs),
    /// The zero-setup demo: a simulated management cluster and three simulated CKE clusters in this
    /// process, the examples applied, a workload scaled up then down, progress shown live.
    #[cfg(feature = "sandbox")]
    Sandbox(operator::commands::sandbox::SandboxArgs),
    /// Play CKE on a cluster that has none (like KWOK): turn NodeGroups into Ready Nodes, run a
    /// kubelet stand-in and a basic binder.
    #[cfg(feature = "sandbox")]
    SimCke(SimCkeArgs),
    /// Print the hub's CustomResourceDefinitions as YAML (what `kubectl apply --server-side -f` takes).
    Crds {
        /// Write one file per CRD into this directory (as committed under `crds/`) instead of printing
        /// them; the stand-in NodeGroup CRD for tests goes to `<DIR>/testing/`.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
    /// Onboard a workload cluster from an admin kubeconfig: apply the hub's workload RBAC, mint a
    /// least-privilege kubeconfig, check it, and write `<cluster>-kubeconfig` in the management cluster.
    Register(operator::commands::register_cluster::RegisterArgs),
    /// Offline dry run: read manifests (NodePools, node classes, catalogues, NodeClaims, Nodes, Pods,
    /// DaemonSets, PDBs) and print the NodeClaims the hub would create for the pending pods.
    Plan(operator::commands::plan::PlanArgs),
    /// One line per registered workload cluster: reachability, pools, nodes, pending pods, EUR/h,
    /// disruption and rollouts, as the hub reported them in the management cluster.
    Fleet(operator::commands::fleet::FleetArgs),
}

/// Flags of `karpenter-hub sim-cke`.
#[cfg(feature = "sandbox")]
#[derive(Debug, clap::Args)]
struct SimCkeArgs {
    /// Kubeconfig of the workload cluster to play CKE on.
    #[arg(long, env = "KARPENTER_HUB_SIM_KUBECONFIG", value_name = "FILE")]
    kubeconfig: PathBuf,
    /// Seed of every random draw (delays, vanishing).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Do not bind pods (when a real kube-scheduler runs).
    #[arg(long)]
    no_binder: bool,
}

/// Colours only for a person at a terminal: a file, a pipe or a log collector gets plain text
/// (and `NO_COLOR`, <https://no-color.org>, turns them off anywhere).
fn colour() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(operator::commands::run::DEFAULT_LOG_FILTER));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(colour()).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// The sandbox prints its own progress; logs only say what went wrong unless RUST_LOG asks for more.
#[cfg(feature = "sandbox")]
fn init_logs_quiet() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,kube=error"));
    let _ =
        tracing_subscriber::fmt().with_env_filter(filter).with_ansi(colour()).with_writer(std::io::stderr).try_init();
}

/// Ctrl-C or SIGTERM cancels the token.
fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    t.cancel();
                    return;
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutting down");
        t.cancel();
    });
    token
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    // One TLS crypto provider for the whole process.
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Run(cli.run));
    match command {
        Command::Run(args) => {
            init_logs(args.log_format);
            runtime()?.block_on(async move { operator::commands::run::run(args, shutdown_on_signal()).await })?;
        }
        #[cfg(feature = "sandbox")]
        Command::Sandbox(args) => {
            init_logs_quiet();
            runtime()?
                .block_on(async move { operator::commands::sandbox::sandbox(args, shutdown_on_signal()).await })?;
        }
        #[cfg(feature = "sandbox")]
        Command::SimCke(args) => {
            init_logs(LogFormat::Text);
            runtime()?.block_on(async move {
                let client = operator::commands::run::management_client(Some(&args.kubeconfig)).await?;
                let config = sim::cke::SimCkeConfig {
                    seed: args.seed,
                    binder: !args.no_binder,
                    ..sim::cke::SimCkeConfig::default()
                };
                let shutdown = shutdown_on_signal();
                sim::cke::run(client, config, shutdown.cancelled_owned()).await?;
                anyhow::Ok(())
            })?;
        }
        Command::Crds { out_dir: None } => {
            let yaml = crds::crd::render_all()?;
            std::io::stdout().lock().write_all(yaml.as_bytes()).context("writing to stdout")?;
        }
        Command::Crds { out_dir: Some(dir) } => write_crds(&dir)?,
        Command::Register(args) => {
            init_logs(LogFormat::Text);
            let secret = runtime()?.block_on(async move {
                operator::commands::register_cluster::register(&args).await.map(|s| (s, args))
            });
            let (secret, args) = secret?;
            println!(
                "Registered cluster {} in namespace {}: Secret {secret} holds a least-privilege kubeconfig.\nNext: point a NodePool at it (spec.clusterName: {}) and watch `kubectl get nodepools -n {}`.",
                args.cluster, args.namespace, args.cluster, args.namespace
            );
        }
        Command::Fleet(args) => {
            let out = runtime()?.block_on(async move { operator::commands::fleet::run(&args).await })?;
            std::io::stdout().lock().write_all(out.as_bytes()).context("writing to stdout")?;
        }
        Command::Plan(args) => {
            let out = operator::commands::plan::run(&args)?;
            std::io::stdout().lock().write_all(out.as_bytes()).context("writing to stdout")?;
        }
    }
    Ok(())
}

fn write_crds(dir: &Path) -> anyhow::Result<()> {
    let testing = dir.join("testing");
    fs::create_dir_all(&testing).with_context(|| format!("creating {}", testing.display()))?;
    let files = crds::crd::hub_crds()
        .into_iter()
        .map(|f| (dir.to_path_buf(), f))
        .chain(crds::crd::testing_crds().into_iter().map(|f| (testing.clone(), f)));
    for (parent, file) in files {
        let path = parent.join(&file.file_name);
        // Write to a temporary file and rename, so an interrupted run never leaves a half-written CRD.
        let tmp = parent.join(format!(".{}.tmp", file.file_name));
        fs::write(&tmp, crds::crd::render(&file.crd)?).with_context(|| format!("writing {}", tmp.display()))?;
        fs::rename(&tmp, &path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
