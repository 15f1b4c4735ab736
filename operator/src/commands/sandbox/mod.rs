//! `karpenter-hub sandbox`: three simulated workload clusters with the real hub running against
//! them, a scripted workload and its live progress display.
//!
//! Owns: the command's flags, script and output. Must not: reach into the hub's internals — the
//! world it drives goes through the Kubernetes API only.

#[cfg(feature = "testing")]
pub mod why;
#[cfg(not(feature = "testing"))]
mod why;
#[cfg(feature = "testing")]
pub mod world;
#[cfg(not(feature = "testing"))]
#[allow(dead_code)]
mod world;

pub use world::SandboxError;
use world::{Progress, World, quick_cke, scale};

use std::{io::Write, path::PathBuf, time::Duration};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams},
};
use serde_json::Value;

use crds::{NodeClaim, NodeGroup, nodepool::RolloutPhase};
use tokio_util::sync::CancellationToken;

/// Flags of `karpenter-hub sandbox`.
#[derive(Debug, Clone, clap::Args)]
pub struct SandboxArgs {
    /// Keep running after the scripted workload, reporting its progress as it changes (and why pods
    /// wait), until Ctrl-C.
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

/// The fleet's namespace: a fleet pool serves the registered clusters of its own namespace only.
const NAMESPACE: &str = "fleet";
const CLUSTERS: [(&str, &str); 3] = [(NAMESPACE, "prod-paris"), (NAMESPACE, "staging-paris"), (NAMESPACE, "dev-paris")];
/// Each cluster's `env` label (on its registration Secret), in the order of [`CLUSTERS`].
const ENVS: [&str; 3] = ["prod", "staging", "dev"];
/// The rollout's order: dev first, then staging; prod (not named) after them.
const ROLLOUT_ORDER: [&str; 2] = ["dev-paris", "staging-paris"];
const SOAK: &str = "10s";
const EXAMPLE: &str = include_str!("../../../../examples/general-purpose.yaml");

/// `karpenter-hub sandbox`.
pub async fn sandbox(args: SandboxArgs, shutdown: CancellationToken) -> Result<(), SandboxError> {
    let mut out = std::io::stdout();
    // The organisation's quota leaves room for a consolidation's replacement, launched before the
    // node it replaces goes (CKE's default sandbox quota, 40 GB, is full with an S and the control plane).
    let mut world = World::start(&CLUSTERS, |i| {
        let mut cke = quick_cke(i as u64 + 1);
        cke.quota.limit = sim::cke::Usage { vcpu: 64, ram_gb: 64 };
        cke
    })
    .await?;
    let files = world.write_kubeconfigs(&args.dir)?;
    let _ = writeln!(
        out,
        "Clever Karpenter Hub sandbox: a management cluster and {} simulated CKE clusters.",
        world.clusters.len()
    );
    let _ = writeln!(out, "Watch them with kubectl while this runs, e.g.:");
    for command in banner(&world, &files, &args.dir.join("management.kubeconfig")) {
        let _ = writeln!(out, "  {}", command.join(" "));
    }
    for ((ns, name), env) in CLUSTERS.iter().zip(ENVS) {
        world.label_cluster(ns, name, serde_json::json!({"env": env})).await?;
    }
    world.apply_yaml("examples/general-purpose.yaml", EXAMPLE, NAMESPACE, fleet_pool).await?;
    let _ = writeln!(
        out,
        "Labelled the clusters env=prod, env=staging, env=dev (their registration Secrets) and applied \
         examples/general-purpose.yaml to namespace {NAMESPACE}, its NodePool made one fleet pool for the three: \
         clusterSelector env in (prod, staging, dev), a change rolled out one cluster at a time ({}, then prod-paris; \
         soak {SOAK}). Starting the hub.\n",
        ROLLOUT_ORDER.join(", then ")
    );
    world.start_hub();
    for i in 0..world.clusters.len() {
        scale(&world, i, usize::from(args.pods), "1", "1Gi").await?;
    }
    let _ = writeln!(out, "Scaled each cluster's workload to {} pods (1 CPU, 1Gi each).", args.pods);
    let target = usize::from(args.pods);
    let done = settle(&world, &mut out, Duration::from_secs(args.timeout_seconds), &shutdown, target).await?;
    if done && !shutdown.is_cancelled() {
        let down = target / 2;
        let mut before = Vec::new();
        for i in 0..world.clusters.len() {
            before.push(world.progress(i).await?.price_per_hour);
            scale(&world, i, down, "1", "1Gi").await?;
        }
        let _ = writeln!(out, "\nScaled each workload down to {down} pods.");
        let _ = writeln!(
            out,
            "The hub consolidates by itself once the pool's consolidateAfter (30s) has passed and a 15 s \
             validation holds: a cheaper node is launched first, then the under-used one is drained and \
             removed. Evicted pods are recreated here, as their ReplicaSet would."
        );
        let consolidated = watch_until(
            &world,
            &mut out,
            tokio::time::Instant::now() + Duration::from_secs(150),
            &shutdown,
            Some(down),
            |i, p| {
                p.running == down
                    && p.pending == 0
                    && p.claims == p.groups
                    && p.groups == p.nodes_ready
                    && before.get(i).is_some_and(|b| p.price_per_hour < *b)
            },
        )
        .await?;
        if consolidated {
            let _ = writeln!(out, "Consolidated: every cluster runs its {down} pods on cheaper capacity.");
        } else if !shutdown.is_cancelled() {
            let _ = writeln!(
                out,
                "Not every cluster got cheaper within 150 s; `kubectl get events -n fleet` on the management \
                 cluster shows DisruptionBlocked and the other disruption events."
            );
        }
        if !shutdown.is_cancelled() {
            drain_one(&world, &mut out, &shutdown).await?;
            // The evicted pods come back, as their ReplicaSet would recreate them.
            scale(&world, 0, down, "1", "1Gi").await?;
            let _ = writeln!(out, "Recreated the evicted pods (as their ReplicaSet would); the hub places them again.");
            let _ = watch_until(
                &world,
                &mut out,
                tokio::time::Instant::now() + Duration::from_secs(60),
                &shutdown,
                None,
                |_, p| p.running == down && p.pending == 0,
            )
            .await?;
        }
        if !shutdown.is_cancelled() {
            roll_out(&world, &mut out, &shutdown, down).await?;
        }
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
    // The hub's reports follow within seconds: wait (briefly) until they agree with the summary.
    let mut view = crate::commands::fleet::gather(&world.mgmt.client(), Some(NAMESPACE)).await?;
    let settle_by = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut agree = true;
        for (i, c) in world.clusters.iter().enumerate() {
            let claims = world.progress(i).await?.claims;
            let row = view.clusters.iter().find(|r| r.name == c.name);
            agree &= row.is_some_and(|r| usize::try_from(r.nodes.hub).is_ok_and(|n| n == claims));
        }
        if agree || tokio::time::Instant::now() >= settle_by || shutdown.is_cancelled() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        view = crate::commands::fleet::gather(&world.mgmt.client(), Some(NAMESPACE)).await?;
    }
    let _ = writeln!(out, "\nThe fleet view (karpenter-hub fleet -n {NAMESPACE}, from the management cluster only):");
    for line in crate::commands::fleet::table(&view, false).lines() {
        let _ = writeln!(out, "  {line}");
    }
    if !done {
        let _ = writeln!(
            out,
            "The workload did not settle within {}s: the pods still pending and why are listed above.",
            args.timeout_seconds
        );
    }
    if args.follow && !shutdown.is_cancelled() {
        let _ = writeln!(out, "\nStill running (--follow): progress is shown as it changes; Ctrl-C to stop.");
        follow(&world, &mut out, &shutdown).await?;
    }
    world.shutdown().await;
    if done {
        Ok(())
    } else {
        Err(SandboxError::Timeout(format!("the workload did not settle within {}s", args.timeout_seconds)))
    }
}

/// The general-purpose example's NodePool as the sandbox's fleet pool: every cluster of the
/// namespace labelled `env` prod, staging or dev, a change rolled out one cluster at a time.
fn fleet_pool(doc: &mut Value) {
    if doc.get("kind").and_then(Value::as_str) != Some("NodePool") {
        return;
    }
    let Some(spec) = doc.get_mut("spec").and_then(Value::as_object_mut) else { return };
    spec.remove("clusterName");
    spec.insert(
        "clusterSelector".into(),
        serde_json::json!({"matchExpressions": [{"key": "env", "operator": "In", "values": ENVS}]}),
    );
    spec.insert("rollout".into(), serde_json::json!({"maxClusters": "1", "order": ROLLOUT_ORDER, "soak": SOAK}));
}

/// Change the fleet pool's template and show its rollout: the pool's nodes drift in every cluster,
/// and are replaced one cluster at a time, in the rollout's order, each soaking before the next.
/// The progress lines carry each cluster's phase.
async fn roll_out(
    world: &World,
    out: &mut impl Write,
    shutdown: &CancellationToken,
    pods: usize,
) -> Result<(), SandboxError> {
    let pools: Api<crds::NodePool> = Api::namespaced(world.mgmt.client(), NAMESPACE);
    let change = serde_json::json!({"spec": {"template": {"metadata": {"labels": {"example.com/revision": "2"}}}}});
    let changed = pools.patch("default", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&change)).await?;
    let revision = crds::drift::nodepool_hash(&changed.spec);
    let _ = writeln!(
        out,
        "\nChanged the fleet pool's template (a label example.com/revision=2, revision {revision}): its nodes drift in \
         all three clusters. The rollout replaces them one cluster at a time ({}, then prod-paris), each cluster \
         watched {SOAK} after its last replacement before the next starts; the others wait (Pending).",
        ROLLOUT_ORDER.join(", then ")
    );
    let started = tokio::time::Instant::now();
    let deadline = started + Duration::from_secs(180);
    let mut last: Vec<Progress> = Vec::new();
    let mut most_progressing = 0;
    loop {
        let now = look(world, Some(pods), out, started, &mut last).await?;
        most_progressing =
            most_progressing.max(now.iter().filter(|p| p.rollout == Some(RolloutPhase::Progressing)).count());
        let status = pools.get("default").await?.status.and_then(|s| s.rollout);
        let on_revision = status.as_ref().is_some_and(|r| r.revision == revision);
        let done = on_revision
            && now.iter().all(|p| p.rollout == Some(RolloutPhase::Done) && p.running == pods && p.pending == 0);
        if done {
            // The order they finished in, from the status: each cluster's Done started after the
            // previous one's.
            let mut finished: Vec<(k8s_openapi::jiff::Timestamp, String)> =
                status.iter().flat_map(|r| &r.clusters).map(|c| (c.since.0, c.name.clone())).collect();
            finished.sort();
            let order: Vec<String> = finished.into_iter().map(|(_, name)| name).collect();
            let _ = writeln!(
                out,
                "Rolled out cluster by cluster: {} (at most {most_progressing} cluster progressing at any look).",
                order.join(" -> ")
            );
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            let _ = writeln!(
                out,
                "The rollout did not finish within 180 s: `kubectl describe nodepool default -n {NAMESPACE}` shows \
                 its status.rollout and any RolloutHalted condition."
            );
            return Ok(());
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// The kubectl commands the sandbox suggests, each as its arguments (`kubectl` first): workload
/// clusters show nodes, NodeGroups and pods; the management cluster the hub's objects and events.
/// operator/tests/suite/sandbox.rs runs each one against a running world.
pub fn banner(world: &World, files: &[std::path::PathBuf], management: &std::path::Path) -> Vec<Vec<String>> {
    let kubectl = |file: &std::path::Path, rest: &str| -> Vec<String> {
        let mut v = vec!["kubectl".to_string(), "--kubeconfig".to_string(), file.display().to_string()];
        v.extend(rest.split(' ').map(str::to_string));
        v
    };
    let mut out: Vec<Vec<String>> = files
        .iter()
        .filter(|f| f.as_path() != management)
        .map(|f| kubectl(f, "get nodes,nodegroups,pods -o wide"))
        .collect();
    let ns = world.clusters.first().map_or("team-a", |c| c.namespace.as_str());
    out.push(kubectl(management, "get nodepools,nodeclaims -A"));
    out.push(kubectl(management, &format!("get workloadclusters -n {ns}")));
    out.push(kubectl(management, &format!("get events -n {ns}")));
    out.push(kubectl(management, &format!("describe nodeclaims -n {ns}")));
    out.push(kubectl(management, "explain nodepool.spec"));
    out
}

/// Delete the first cluster's busiest NodeClaim, as `kubectl delete nodeclaim` would, and show the
/// drain step by step: the taint, each pod evicted, `Drained`, the NodeGroup and the Node going, the
/// claim released.
async fn drain_one(world: &World, out: &mut impl Write, shutdown: &CancellationToken) -> Result<(), SandboxError> {
    let c = &world.clusters[0];
    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), &c.namespace);
    let pods: Api<Pod> = Api::namespaced(c.client(), "default");
    let on = |node: &str, list: &[Pod]| -> Vec<String> {
        let mut v: Vec<String> = list
            .iter()
            .filter(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                    && p.metadata.deletion_timestamp.is_none()
            })
            .map(ResourceExt::name_any)
            .collect();
        v.sort();
        v
    };
    let all = pods.list(&ListParams::default()).await?.items;
    let Some((claim, node)) = claims
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|k| {
            let node = k.status.as_ref()?.node_name.clone()?;
            Some((k, node))
        })
        .max_by_key(|(_, node)| on(node, &all).len())
    else {
        return Ok(());
    };
    let name = claim.name_any();
    let group = claim
        .status
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .and_then(|p| p.strip_prefix("clevercloud://"))
        .unwrap_or_default()
        .to_string();
    let _ = writeln!(
        out,
        "\nDeleting NodeClaim {}/{name} (kubectl delete nodeclaim {name} -n {}): its node {node} is drained before it goes.",
        c.namespace, c.namespace
    );
    claims.delete(&name, &DeleteParams::default()).await?;
    let nodes: Api<Node> = Api::all(c.client());
    let groups: Api<NodeGroup> = Api::all(c.client());
    let started = tokio::time::Instant::now();
    let mut left = on(&node, &all);
    let (mut tainted, mut drained, mut group_gone, mut node_gone) = (false, false, false, false);
    let deadline = started + Duration::from_secs(90);
    loop {
        let t = started.elapsed().as_secs_f64();
        let live = claims.get_opt(&name).await?.filter(|k| k.uid() == claim.uid());
        let n = nodes.get_opt(&node).await?;
        if !tainted
            && n.as_ref()
                .and_then(|n| n.spec.as_ref()?.taints.as_ref())
                .is_some_and(|ts| ts.iter().any(|x| x.key == crds::labels::DISRUPTED_TAINT))
        {
            tainted = true;
            let _ =
                writeln!(out, "[{t:>5.1}s] node {node} tainted karpenter.sh/disrupted:NoSchedule; evicting its pods");
        }
        let now_on = on(&node, &pods.list(&ListParams::default()).await?.items);
        for p in left.iter().filter(|p| !now_on.contains(p)) {
            let _ = writeln!(out, "[{t:>5.1}s] pod {p} evicted");
        }
        left = now_on;
        let is_drained = live
            .as_ref()
            .and_then(|k| k.status.as_ref())
            .is_some_and(|s| s.conditions.iter().any(|x| x.type_ == "Drained" && x.status == "True"));
        // A pass may go from Drained to the NodeGroup's deletion between two looks.
        let group_going = groups.get_opt(&group).await?.is_none_or(|g| g.metadata.deletion_timestamp.is_some());
        if (is_drained || group_going) && !drained {
            drained = true;
            let _ = writeln!(out, "[{t:>5.1}s] node {node} drained; deleting NodeGroup {group}");
        }
        if !group_gone && groups.get_opt(&group).await?.is_none() {
            group_gone = true;
            let _ = writeln!(out, "[{t:>5.1}s] NodeGroup {group} gone");
        }
        if !node_gone && n.is_none() {
            node_gone = true;
            let _ = writeln!(out, "[{t:>5.1}s] node {node} gone");
        }
        if live.is_none() && group_gone && node_gone {
            let _ = writeln!(out, "[{t:>5.1}s] NodeClaim {name} released");
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            let _ = writeln!(out, "[{t:>5.1}s] the drain of {node} did not finish within 90s");
            return Ok(());
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
}

/// Watch until every cluster runs `target` pods with none pending, for at most `timeout`. When they
/// do not, say why: for each cluster with pods still pending, those pods and their reasons, and its
/// NodePools' conditions and limits (see [`why::why_pending`]). Whether they settled.
pub async fn settle(
    world: &World,
    out: &mut impl Write,
    timeout: Duration,
    shutdown: &CancellationToken,
    target: usize,
) -> Result<bool, SandboxError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let done = watch_until(world, out, deadline, shutdown, None, |_, p| p.running == target && p.pending == 0).await?;
    if !done && !shutdown.is_cancelled() {
        let _ =
            writeln!(out, "\nNot settled after {}s ({target} running pods per cluster expected):", timeout.as_secs());
        for (i, c) in world.clusters.iter().enumerate() {
            let p = world.progress(i).await?;
            let _ = writeln!(out, "  {}/{}: {} running, {} pending", c.namespace, c.name, p.running, p.pending);
            for line in why::why_pending(world, i).await? {
                let _ = writeln!(out, "    {line}");
            }
        }
    }
    Ok(done)
}

/// After the script (`--follow`): progress lines as they change and, for a cluster with pods
/// pending, why, whenever that changes; until `shutdown`.
pub async fn follow(world: &World, out: &mut impl Write, shutdown: &CancellationToken) -> Result<(), SandboxError> {
    let started = tokio::time::Instant::now();
    let mut last: Vec<(Progress, Vec<String>)> = Vec::new();
    while !shutdown.is_cancelled() {
        let mut now = Vec::new();
        for i in 0..world.clusters.len() {
            now.push((world.progress(i).await?, why::why_pending(world, i).await?));
        }
        for (i, (c, (p, why))) in world.clusters.iter().zip(&now).enumerate() {
            let before = last.get(i);
            if before.is_none_or(|(b, _)| b != p) {
                progress_line(out, started, &c.name, p);
            }
            if before.is_none_or(|(_, w)| w != why) {
                for line in why {
                    let _ = writeln!(out, "        {line}");
                }
            }
        }
        last = now;
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    Ok(())
}

fn progress_line(out: &mut impl Write, started: tokio::time::Instant, cluster: &str, p: &Progress) {
    let rollout = p.rollout.map(|r| format!("  rollout {r:?}")).unwrap_or_default();
    let _ = writeln!(
        out,
        "[{:>5.1}s] {:<24} pending {:>3}  claims {:>2}  nodegroups {:>2}  nodes ready {:>2}  running {:>3}  {:.4} EUR/h{rollout}",
        started.elapsed().as_secs_f64(),
        cluster,
        p.pending,
        p.claims,
        p.groups,
        p.nodes_ready,
        p.running,
        p.price_per_hour
    );
}

/// Every cluster's progress now (first recreating up to `replicas` pods in each, as a ReplicaSet
/// recreates the pods a drain evicted), printed when it differs from `last`, which it then becomes.
async fn look(
    world: &World,
    replicas: Option<usize>,
    out: &mut impl Write,
    started: tokio::time::Instant,
    last: &mut Vec<Progress>,
) -> Result<Vec<Progress>, SandboxError> {
    let mut now = Vec::new();
    for i in 0..world.clusters.len() {
        if let Some(n) = replicas {
            scale(world, i, n, "1", "1Gi").await?;
        }
        now.push(world.progress(i).await?);
    }
    if now != *last {
        for (c, p) in world.clusters.iter().zip(&now) {
            progress_line(out, started, &c.name, p);
        }
        last.clone_from(&now);
    }
    Ok(now)
}

/// Print progress every second until `settled` holds for every cluster (true) or the deadline (false).
async fn watch_until(
    world: &World,
    out: &mut impl Write,
    deadline: tokio::time::Instant,
    shutdown: &CancellationToken,
    replicas: Option<usize>,
    settled: impl Fn(usize, &Progress) -> bool,
) -> Result<bool, SandboxError> {
    let started = tokio::time::Instant::now();
    let mut last: Vec<Progress> = Vec::new();
    loop {
        let now = look(world, replicas, out, started, &mut last).await?;
        if now.iter().enumerate().all(|(i, p)| settled(i, p)) {
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
