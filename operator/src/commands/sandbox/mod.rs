//! `karpenter-hub sandbox`: three simulated workload clusters with the real hub running against
//! them, a scripted workload and its live progress display.
//!
//! Owns: the command's flags, script and output. Must not: reach into the hub's internals — the
//! world it drives goes through the Kubernetes API only.

#[cfg(feature = "testing")]
pub mod world;
#[cfg(not(feature = "testing"))]
#[allow(dead_code)]
mod world;

pub use world::SandboxError;
use world::{Progress, World, quick_cke, scale};

use std::{io::Write, path::PathBuf, time::Duration};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// Flags of `karpenter-hub sandbox`.
#[derive(Debug, Clone, clap::Args)]
pub struct SandboxArgs {
    /// Keep running after the scripted workload, until Ctrl-C.
    #[arg(long)]
    pub follow: bool,
    /// Directory for the kubeconfigs of the simulated clusters.
    #[arg(long, default_value = "target/sandbox", value_name = "DIR")]
    pub dir: PathBuf,
    /// Pods per cluster at the peak.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=500))]
    pub pods: u16,
    /// Give up on the scripted workload after this many seconds.
    #[arg(long, default_value_t = 180)]
    pub timeout_seconds: u64,
}

const CLUSTERS: [(&str, &str); 3] = [("team-a", "prod-paris"), ("team-b", "staging-paris"), ("team-c", "dev-paris")];
const EXAMPLE: &str = include_str!("../../../../examples/general-purpose.yaml");

/// `karpenter-hub sandbox`.
pub async fn sandbox(args: SandboxArgs, shutdown: CancellationToken) -> Result<(), SandboxError> {
    let mut out = std::io::stdout();
    let mut world = World::start(&CLUSTERS, |i| quick_cke(i as u64 + 1)).await?;
    let files = world.write_kubeconfigs(&args.dir)?;
    let _ = writeln!(
        out,
        "Clever Karpenter Hub sandbox: a management cluster and {} simulated CKE clusters.",
        world.clusters.len()
    );
    let _ = writeln!(out, "Watch them with kubectl while this runs, e.g.:");
    for f in &files {
        let _ = writeln!(out, "  kubectl --kubeconfig {} get nodes,nodegroups,pods -o wide", f.display());
    }
    let _ = writeln!(
        out,
        "  kubectl --kubeconfig {} get nodepools,nodeclaims -A",
        args.dir.join("management.kubeconfig").display()
    );
    for c in &world.clusters {
        let cluster = c.name.clone();
        world
            .apply_yaml("examples/general-purpose.yaml", EXAMPLE, &c.namespace, |doc| {
                if doc.get("kind").and_then(Value::as_str) == Some("NodePool") {
                    doc["spec"]["clusterName"] = Value::String(cluster.clone());
                }
            })
            .await?;
    }
    let _ = writeln!(out, "Applied examples/general-purpose.yaml to each team's namespace; starting the hub.\n");
    world.start_hub();
    for i in 0..world.clusters.len() {
        scale(&world, i, usize::from(args.pods), "1", "1Gi").await?;
    }
    let _ = writeln!(out, "Scaled each cluster's workload to {} pods (1 CPU, 1Gi each).", args.pods);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout_seconds);
    let target = usize::from(args.pods);
    let done = watch_until(&world, &mut out, deadline, &shutdown, |p| p.running == target && p.pending == 0).await?;
    if done && !shutdown.is_cancelled() {
        let down = target / 2;
        for i in 0..world.clusters.len() {
            scale(&world, i, down, "1", "1Gi").await?;
        }
        let _ = writeln!(out, "\nScaled each workload down to {down} pods.");
        let _ = watch_until(&world, &mut out, tokio::time::Instant::now() + Duration::from_secs(10), &shutdown, |p| {
            p.running == down && p.pending == 0
        })
        .await?;
        let _ = writeln!(
            out,
            "The nodes stay as they are: consolidation (disruption) is not built yet, so an under-used node is not replaced."
        );
    }
    let _ = writeln!(out, "\nSummary:");
    let mut total = 0.0;
    for (i, c) in world.clusters.iter().enumerate() {
        let p = world.progress(i).await?;
        total += p.price_per_hour;
        let _ = writeln!(
            out,
            "  {:<28} {} pods running on {} nodes ({} NodeGroups), {:.4} EUR/h",
            format!("{}/{}", c.namespace, c.name),
            p.running,
            p.nodes_ready,
            p.groups,
            p.price_per_hour
        );
    }
    let _ = writeln!(out, "  fleet: {total:.4} EUR/h");
    if !done {
        let _ = writeln!(out, "The workload did not settle within {}s; see the log above.", args.timeout_seconds);
    }
    if args.follow && !shutdown.is_cancelled() {
        let _ = writeln!(out, "\nStill running (--follow): Ctrl-C to stop.");
        shutdown.cancelled().await;
    }
    world.shutdown().await;
    if done {
        Ok(())
    } else {
        Err(SandboxError::Timeout(format!("the workload did not settle within {}s", args.timeout_seconds)))
    }
}

/// Print progress every second until `settled` holds for every cluster (true) or the deadline (false).
async fn watch_until(
    world: &World,
    out: &mut impl Write,
    deadline: tokio::time::Instant,
    shutdown: &CancellationToken,
    settled: impl Fn(&Progress) -> bool,
) -> Result<bool, SandboxError> {
    let started = tokio::time::Instant::now();
    let mut last: Vec<Progress> = Vec::new();
    loop {
        let mut now = Vec::new();
        for i in 0..world.clusters.len() {
            now.push(world.progress(i).await?);
        }
        if now != last {
            for (c, p) in world.clusters.iter().zip(&now) {
                let _ = writeln!(
                    out,
                    "[{:>5.1}s] {:<24} pending {:>3}  claims {:>2}  nodegroups {:>2}  nodes ready {:>2}  running {:>3}  {:.4} EUR/h",
                    started.elapsed().as_secs_f64(),
                    c.name,
                    p.pending,
                    p.claims,
                    p.groups,
                    p.nodes_ready,
                    p.running,
                    p.price_per_hour
                );
            }
            last = now.clone();
        }
        if now.iter().all(&settled) {
            return Ok(true);
        }
        if tokio::time::Instant::now() >= deadline || shutdown.is_cancelled() {
            return Ok(false);
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(false),
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}
