//! The hub process (`B4_ROLE=hub`): the production hub against the emulators, reading its own
//! memory and CPU, driving the phases through the emulator process it starts.

use super::*;

struct Emulators {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Emulators {
    async fn reply(&mut self, timeout: Duration) -> Value {
        loop {
            let line = tokio::time::timeout(timeout, self.lines.recv())
                .await
                .expect("the emulator process answers in time")
                .expect("the emulator process is alive");
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                return v;
            }
        }
    }

    fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").expect("write to the emulator process");
        self.stdin.flush().expect("flush");
    }

    async fn ask(&mut self, cmd: &str, timeout: Duration) -> Value {
        self.send(cmd);
        self.reply(timeout).await
    }

    /// The hub's requests since the emulators started, by side (served minus the emulator
    /// process's own), and both processes' CPU time.
    async fn snap(&mut self) -> Snap {
        let v = self.ask("counters", Duration::from_secs(60)).await;
        Snap {
            counts: sub(&counts_from_json(&v["served"]), &counts_from_json(&v["own"])),
            hub_cpu: cpu_seconds(),
            emu_cpu: f(&v, "cpu_s"),
        }
    }
}

struct Snap {
    counts: Counts,
    hub_cpu: f64,
    emu_cpu: f64,
}

impl Snap {
    /// (requests, hub CPU s, emulator CPU s) since `before`.
    fn since(&self, before: &Snap) -> (Counts, f64, f64) {
        (sub(&self.counts, &before.counts), self.hub_cpu - before.hub_cpu, self.emu_cpu - before.emu_cpu)
    }
}

/// Sum and count of the hub's scheduling-duration histogram, over every cluster.
fn scheduling(metrics: &metrics::Metrics) -> (f64, f64) {
    let text = metrics.render();
    let total = |suffix: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(&format!("karpenter_provisioner_scheduling_duration_seconds_{suffix}")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    (total("sum"), total("count"))
}

impl Emulators {}

/// The disruption passes so far that ended with `result` (`built`, `kept`), over every cluster.
fn views(metrics: &metrics::Metrics, result: &str) -> f64 {
    let label = format!("result=\"{result}\"");
    metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("karpenter_hub_disruption_views_total") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The hub's own `karpenter_hub_pod_provisioning_latency_seconds` over every cluster: cumulative
/// count per bucket bound (seconds), `+Inf` last.
fn hub_latency(metrics: &metrics::Metrics, stage: Option<&str>) -> BTreeMap<u64, f64> {
    let text = metrics.render();
    let mut out = BTreeMap::new();
    let (family, label) = match stage {
        None => ("karpenter_hub_pod_provisioning_latency_seconds_bucket", String::new()),
        Some(s) => ("karpenter_hub_pod_provisioning_stage_seconds_bucket", format!("stage=\"{s}\"")),
    };
    for l in text.lines().filter(|l| l.starts_with(family) && l.contains(&label)) {
        let Some(le) = l.split("le=\"").nth(1).and_then(|r| r.split('"').next()) else { continue };
        let bound =
            if le == "+Inf" { u64::MAX } else { le.parse::<f64>().map_or(u64::MAX, |b| (b * 1000.0).round() as u64) };
        let n = l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        *out.entry(bound).or_insert(0.0) += n;
    }
    out
}

/// Between two readings of [`hub_latency`]: (pods, p50 ms, p99 ms, share within `target_ms`), the
/// quantiles interpolated linearly within their bucket (the histogram's resolution).
fn hub_latency_since(after: &BTreeMap<u64, f64>, before: &BTreeMap<u64, f64>, target_ms: u64) -> (f64, f64, f64, f64) {
    let cumulative: Vec<(u64, f64)> =
        after.iter().map(|(b, n)| (*b, n - before.get(b).copied().unwrap_or(0.0))).collect();
    let total = cumulative.last().map_or(0.0, |(_, n)| *n);
    let quantile = |q: f64| {
        let want = q * total;
        let mut lower = (0u64, 0.0);
        for &(bound, n) in &cumulative {
            if n >= want {
                if bound == u64::MAX {
                    return f64::INFINITY;
                }
                let span = (n - lower.1).max(f64::MIN_POSITIVE);
                return lower.0 as f64 + (bound - lower.0) as f64 * ((want - lower.1) / span);
            }
            lower = (bound, n);
        }
        f64::NAN
    };
    let within = cumulative.iter().find(|(b, _)| *b == target_ms).map_or(f64::NAN, |(_, n)| n / total.max(1.0));
    (total, quantile(0.5), quantile(0.99), within)
}

/// The hub's own view of its requests (from its kube-client spans), by side and detail.
fn hub_view(observed: &Observed, mgmt_port: u16) -> BTreeMap<(String, Req), i64> {
    let mut out = BTreeMap::new();
    for ((port, req), n) in lock(&observed.0).iter() {
        let side = if *port == mgmt_port { "mgmt" } else { "workload" };
        *out.entry((side.to_string(), req.clone())).or_insert(0) += *n as i64;
    }
    out
}

fn view_sub(a: &BTreeMap<(String, Req), i64>, b: &BTreeMap<(String, Req), i64>) -> BTreeMap<(String, Req), i64> {
    let mut out = a.clone();
    for (k, n) in b {
        *out.entry(k.clone()).or_insert(0) -= n;
    }
    out.retain(|_, n| *n != 0);
    out
}

fn print_totals(title: &str, c: &Counts, clusters: usize) {
    let total: i64 = c.values().sum();
    println!(
        "{title}: {total} requests ({:.1} per cluster); by (side, verb, resource):",
        total as f64 / clusters as f64
    );
    for ((s, v, r), n) in c {
        let r = if r.is_empty() { "(non-resource)" } else { r.as_str() };
        println!("    {s:<9} {v:<7} {r:<28} {n:>7}  {:>9.1} per cluster", *n as f64 / clusters as f64);
    }
}

fn print_counts(title: &str, c: &Counts, seconds: f64, clusters: usize) {
    let total: i64 = c.values().sum();
    println!(
        "{title}: {total} requests in {seconds:.0} s = {:.1}/min ({:.2}/min per cluster); by (side, verb, resource):",
        total as f64 * 60.0 / seconds,
        total as f64 * 60.0 / seconds / clusters as f64
    );
    for ((s, v, r), n) in c {
        let r = if r.is_empty() { "(non-resource)" } else { r.as_str() };
        println!("    {s:<9} {v:<7} {r:<28} {n:>7}  {:>9.1}/min", *n as f64 * 60.0 / seconds);
    }
}

fn print_view(title: &str, v: &BTreeMap<(String, Req), i64>, counted: &Counts, seconds: f64) {
    let mut folded = Counts::new();
    for ((side, r), n) in v {
        *folded.entry((side.clone(), r.verb.clone(), r.resource.clone())).or_insert(0) += n;
    }
    let differ: i64 = sub(&folded, counted).values().map(|n| n.abs()).sum();
    let agree = if differ == 0 {
        "they agree with the emulator counters".to_string()
    } else {
        format!("{differ} requests differ from the emulator counters (requests in flight at a snapshot)")
    };
    println!("{title} (the hub's kube-client spans, with the path or selector; {agree}):");
    for ((side, r), n) in v {
        let res = if r.resource.is_empty() { "(non-resource)" } else { r.resource.as_str() };
        println!(
            "    {side:<9} {:<7} {res:<28} {:<52} {n:>7}  {:>9.1}/min",
            r.verb,
            r.detail,
            *n as f64 * 60.0 / seconds
        );
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn stats(mut v: Vec<f64>) -> (usize, f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v.len(), percentile(&v, 0.5), percentile(&v, 0.99), v.last().copied().unwrap_or(f64::NAN))
}

pub fn main() {
    let clusters = env_usize("B4_CLUSTERS").max(1);
    let opts = Options::from_env(clusters);
    let observed = Observed::default();
    init_tracing(&observed);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(run_hub(clusters, &opts, observed));
}

async fn run_hub(n: usize, opts: &Options, observed: Observed) {
    let dir = std::env::temp_dir().join(format!("b4-hub-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut child = Command::new(std::env::current_exe().expect("own executable"))
        .env("B4_ROLE", "emulators")
        .env("B4_CLUSTERS", n.to_string())
        .env("B4_DIR", &dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the emulator process");
    let stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, lines) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut emu = Emulators { child, stdin, lines };
    println!("\n--- N = {n} clusters: hub pid {}, emulator pid {} ---", std::process::id(), emu.child.id());
    let ready = emu.reply(Duration::from_secs(1800)).await;
    let mgmt_port = ready["mgmt_port"].as_u64().unwrap_or(0) as u16;
    let cluster_keys: Vec<String> = ready["clusters"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    println!(
        "emulators: {n} workload clusters filled in {:.1} s ({} objects, {:.0} writes/s); emulator process RSS {:.0} MiB",
        f(&ready, "fill_s"),
        ready["objects"].as_u64().unwrap_or(0),
        f(&ready, "writes_per_s"),
        f(&ready, "rss_mib")
    );
    let path = PathBuf::from(ready["mgmt_kubeconfig"].as_str().unwrap_or_default());
    let mgmt = run::management_client(Some(&path)).await.expect("management client");
    let c0 = emu.snap().await;
    let (rss_base, _) = rss_mib();

    // Start-up.
    let metrics = Arc::new(metrics::Metrics::new());
    let shutdown = CancellationToken::new();
    let t0 = Instant::now();
    let hub_task = {
        let (metrics, shutdown) = (metrics.clone(), shutdown.clone());
        tokio::spawn(async move {
            if let Err(e) =
                run::run_with(mgmt, hub::Settings::default(), registry::Settings::default(), metrics, shutdown).await
            {
                eprintln!("hub stopped: {e}");
            }
        })
    };
    emu.send("waitpools");
    let synced_at = loop {
        let connected = cluster_keys
            .iter()
            .filter(|k| metrics.cluster_connected.get(&metrics::ClusterLabels { cluster: (*k).clone() }).get() == 1)
            .count();
        if connected == cluster_keys.len() {
            break t0.elapsed();
        }
        if t0.elapsed() > Duration::from_secs(900) {
            println!("start-up: only {connected}/{n} clusters synced after 900 s");
            break t0.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let pools = emu.reply(Duration::from_secs(900)).await;
    let pools_ready_at = t0.elapsed();
    let (rss_started, _) = rss_mib();
    let c1 = emu.snap().await;
    println!(
        "start-up: all {n} clusters connected and synced (watch caches listed) in {:.2} s; all NodePools Ready (ClusterReachable) in {:.2} s{}",
        synced_at.as_secs_f64(),
        pools_ready_at.as_secs_f64(),
        if pools["ok"].as_bool() == Some(true) { String::new() } else { format!(" — NOT all: {pools}") }
    );
    let (startup, startup_hub_cpu, startup_emu_cpu) = c1.since(&c0);
    println!("start-up CPU: hub {startup_hub_cpu:.1} s, emulator process {startup_emu_cpu:.1} s");
    print_totals("start-up requests (hub, until every NodePool is Ready)", &startup, n);

    // Idle #1: the steady fleet, no hub-managed nodes.
    tokio::time::sleep(Duration::from_secs(opts.settle_seconds)).await;
    let c2 = emu.snap().await;
    let v2 = hub_view(&observed, mgmt_port);
    let idle_t = Instant::now();
    tokio::time::sleep(Duration::from_secs(opts.idle_seconds)).await;
    let c3 = emu.snap().await;
    let v3 = hub_view(&observed, mgmt_port);
    let idle_s = idle_t.elapsed().as_secs_f64();
    let (rss_idle, _) = rss_mib();
    let (idle, idle_hub_cpu, idle_emu_cpu) = c3.since(&c2);
    let idle_view = view_sub(&v3, &v2);
    println!(
        "\nidle #1 (steady fleet, no hub-managed node), {idle_s:.0} s starting {:.0} s after start-up:",
        opts.settle_seconds
    );
    println!("  CPU: hub {idle_hub_cpu:.2} s, emulator process {idle_emu_cpu:.2} s");
    print_counts("  hub requests (emulator counters minus the emulator process's own)", &idle, idle_s, n);
    print_view("  the same", &idle_view, &idle, idle_s);

    // Latency burst.
    let sched0 = scheduling(&metrics);
    let stages = ["batch", "decide", "launch"];
    let own0 = hub_latency(&metrics, None);
    let stages0: Vec<_> = stages.iter().map(|s| hub_latency(&metrics, Some(s))).collect();
    let burst_t = Instant::now();
    let b = emu.ask(&format!("burst {}", opts.burst_pods), Duration::from_secs(900)).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let c4 = emu.snap().await;
    let v4 = hub_view(&observed, mgmt_port);
    let burst_s = burst_t.elapsed().as_secs_f64();
    let (rss_burst, _) = rss_mib();
    let rows = b["pods"].as_array().cloned().unwrap_or_default();
    let lat = |a: usize, z: usize| -> Vec<f64> {
        rows.iter().filter_map(|r| Some(r.get(z)?.as_f64()? - r.get(a)?.as_f64()?)).collect::<Vec<f64>>()
    };
    // Row: [cluster, created, unschedulable, claim, nodegroup, running] in ms from the burst start.
    let ng = stats(lat(1, 4));
    let unsched = stats(lat(1, 2));
    let claim = stats(lat(2, 3));
    let launch = stats(lat(3, 4));
    let hub_share = stats(lat(2, 4));
    let running = stats(lat(1, 5));
    let created = stats(rows.iter().filter_map(|r| r.get(1)?.as_f64()).collect());
    let groups: i64 = b["nodegroups_per_cluster"].as_array().map_or(0, |a| a.iter().filter_map(Value::as_i64).sum());
    let claims: i64 = b["claims_per_cluster"].as_array().map_or(0, |a| a.iter().filter_map(Value::as_i64).sum());
    let without_group =
        b["nodegroups_per_cluster"].as_array().map_or(0, |a| a.iter().filter(|g| g.as_i64() == Some(0)).count());
    println!(
        "\nlatency burst: {} pending pods in each of the {n} clusters at once ({} pods; the creates took {:.0} ms); {claims} NodeClaims, {groups} NodeGroups{}",
        opts.burst_pods,
        rows.len(),
        created.3,
        if without_group > 0 { format!(", {without_group} clusters got NO NodeGroup") } else { String::new() }
    );
    println!("    {:<46} {:>6} {:>9} {:>9} {:>9}", "interval (ms)", "n", "p50", "p99", "max");
    for (name, s) in [
        ("pod created -> NodeGroup created (B4)", ng),
        ("pod created -> PodScheduled=False (sim binder)", unsched),
        ("Unschedulable -> NodeGroup created (hub)", hub_share),
        ("  Unschedulable -> NodeClaim created", claim),
        ("  NodeClaim -> NodeGroup created", launch),
        ("pod created -> Running (incl. simulated boot)", running),
    ] {
        println!("    {name:<46} {:>6} {:>9.0} {:>9.0} {:>9.0}", s.0, s.1, s.2, s.3);
    }
    let (prov, prov_hub_cpu, prov_emu_cpu) = c4.since(&c3);
    let sched1 = scheduling(&metrics);
    let (solve_s, rounds) = (sched1.0 - sched0.0, sched1.1 - sched0.1);
    println!(
        "    {rounds:.0} scheduling rounds solved ({:.1} per cluster), solver time {:.0} ms in all ({:.1} ms per round); CPU over the window: hub {prov_hub_cpu:.1} s, emulator process {prov_emu_cpu:.1} s",
        rounds / n as f64,
        solve_s * 1000.0,
        if rounds > 0.0 { solve_s * 1000.0 / rounds } else { f64::NAN }
    );
    // The hub's own share, measured inside it: from its cache holding the mark to its create request.
    let own = hub_latency_since(&hub_latency(&metrics, None), &own0, 1250);
    println!(
        "    hub-attributable (the hub's cache holding the Unschedulable mark -> its NodeGroup create request, its own histogram): {:.0} pods, p50 {:.0} ms, p99 {:.0} ms, {:.1} % within 1.25 s",
        own.0,
        own.1,
        own.2,
        own.3 * 100.0
    );
    for (stage, before) in stages.iter().zip(&stages0) {
        let s = hub_latency_since(&hub_latency(&metrics, Some(stage)), before, 1250);
        println!("      stage {stage:<7} p50 {:>6.0} ms, p99 {:>6.0} ms", s.1, s.2);
    }
    let prov_view = view_sub(&v4, &v3);
    let prov_total: i64 = prov.values().sum();
    let idle_total: i64 = idle.values().sum();
    let expected_idle = idle_total as f64 * burst_s / idle_s;
    let per_node = if groups > 0 { (prov_total as f64 - expected_idle) / groups as f64 } else { f64::NAN };
    println!(
        "provisioning: {prov_total} hub requests from the burst to 10 s after every pod ran ({burst_s:.0} s; idle rate would give {expected_idle:.0}) = {per_node:.1} per provisioned node ({groups} nodes)"
    );
    print_counts("  hub requests during provisioning", &prov, burst_s, n);
    print_view("  the same", &prov_view, &prov, burst_s);

    // Idle #2: the same fleet plus one hub-managed node per cluster.
    tokio::time::sleep(Duration::from_secs(opts.settle_seconds)).await;
    let c5 = emu.snap().await;
    let v5 = hub_view(&observed, mgmt_port);
    let views5 = (views(&metrics, "built"), views(&metrics, "kept"));
    let idle2_t = Instant::now();
    tokio::time::sleep(Duration::from_secs(opts.idle_seconds)).await;
    let c6 = emu.snap().await;
    let v6 = hub_view(&observed, mgmt_port);
    let views6 = (views(&metrics, "built"), views(&metrics, "kept"));
    let idle2_s = idle2_t.elapsed().as_secs_f64();
    let (rss_end, rss_peak) = rss_mib();
    let (idle2, idle2_hub_cpu, idle2_emu_cpu) = c6.since(&c5);
    let idle2_view = view_sub(&v6, &v5);
    println!("\nidle #2 (the same fleet plus the {groups} hub-managed nodes of the burst), {idle2_s:.0} s:");
    println!("  CPU: hub {idle2_hub_cpu:.2} s, emulator process {idle2_emu_cpu:.2} s");
    println!(
        "  disruption passes: {:.0} built the cluster's view, {:.0} kept the last verdict",
        views6.0 - views5.0,
        views6.1 - views5.1
    );
    print_counts("  hub requests", &idle2, idle2_s, n);
    print_view("  the same", &idle2_view, &idle2, idle2_s);

    shutdown.cancel();
    let _ = hub_task.await;

    let per_min = |c: &Counts, s: f64, pred: &dyn Fn(&str, &str, &str) -> bool| total_where(c, pred) as f64 * 60.0 / s;
    let is_write = |_: &str, v: &str, _: &str| WRITE_VERBS.contains(&v);
    let is_list = |_: &str, v: &str, _: &str| v == "list";
    let full_lists = |v: &BTreeMap<(String, Req), i64>, s: f64| {
        v.iter().filter(|((_, r), _)| r.verb == "list" && r.detail == "full").map(|(_, n)| n).sum::<i64>() as f64 * 60.0
            / s
    };
    println!(
        "\nN={n}: hub RSS {rss_base:.1} MiB before start, {rss_started:.1} after start-up, {rss_idle:.1} idle, {rss_burst:.1} after the burst, {rss_end:.1} at the end, peak {rss_peak:.1} (VmHWM); ({rss_idle:.1} - {rss_base:.1}) / {n} = {:.2} MiB per cluster",
        (rss_idle - rss_base) / n as f64
    );
    println!(
        "N={n}: idle #1 per minute: {:.1} writes, {:.1} LISTs ({:.1} full), {:.1} requests in all; idle #2: {:.1} writes, {:.1} LISTs ({:.1} full), {:.1} in all",
        per_min(&idle, idle_s, &is_write),
        per_min(&idle, idle_s, &is_list),
        full_lists(&idle_view, idle_s),
        idle_total as f64 * 60.0 / idle_s,
        per_min(&idle2, idle2_s, &is_write),
        per_min(&idle2, idle2_s, &is_list),
        full_lists(&idle2_view, idle2_s),
        idle2.values().sum::<i64>() as f64 * 60.0 / idle2_s,
    );
    let result = json!({
        "bench": "hub_scale",
        "clusters": n,
        "rss_base_mib": rss_base,
        "rss_started_mib": rss_started,
        "rss_idle_mib": rss_idle,
        "rss_burst_mib": rss_burst,
        "rss_end_mib": rss_end,
        "rss_peak_mib": rss_peak,
        "rss_per_cluster_mib": (rss_idle - rss_base) / n as f64,
        "startup_synced_s": synced_at.as_secs_f64(),
        "startup_pools_ready_s": pools_ready_at.as_secs_f64(),
        "startup_requests": startup.values().sum::<i64>(),
        "startup_hub_cpu_s": startup_hub_cpu,
        "idle_hub_cpu_s": idle_hub_cpu,
        "idle2_hub_cpu_s": idle2_hub_cpu,
        "provisioning_hub_cpu_s": prov_hub_cpu,
        "provisioning_emulator_cpu_s": prov_emu_cpu,
        "scheduling_rounds": rounds,
        "solver_ms": solve_s * 1000.0,
        "idle_seconds": idle_s,
        "idle_writes_per_min": per_min(&idle, idle_s, &is_write),
        "idle_lists_per_min": per_min(&idle, idle_s, &is_list),
        "idle_full_lists_per_min": full_lists(&idle_view, idle_s),
        "idle_requests_per_min": idle_total as f64 * 60.0 / idle_s,
        "idle2_writes_per_min": per_min(&idle2, idle2_s, &is_write),
        "idle2_lists_per_min": per_min(&idle2, idle2_s, &is_list),
        "idle2_full_lists_per_min": full_lists(&idle2_view, idle2_s),
        "idle2_requests_per_min": idle2.values().sum::<i64>() as f64 * 60.0 / idle2_s,
        "idle": counts_to_json(&idle),
        "idle2": counts_to_json(&idle2),
        "burst_pods": rows.len(),
        "nodegroups": groups,
        "nodeclaims": claims,
        "clusters_without_nodegroup": without_group,
        "latency_ng_p50_ms": ng.1,
        "latency_ng_p99_ms": ng.2,
        "latency_ng_max_ms": ng.3,
        "hub_attributable_pods": own.0,
        "hub_attributable_p50_ms": own.1,
        "hub_attributable_p99_ms": own.2,
        "hub_attributable_within_target": own.3,
        "latency_unschedulable_ng_p50_ms": hub_share.1,
        "latency_unschedulable_ng_p99_ms": hub_share.2,
        "latency_unschedulable_ng_max_ms": hub_share.3,
        "latency_binder_p99_ms": unsched.2,
        "latency_claim_p99_ms": claim.2,
        "latency_launch_p99_ms": launch.2,
        "requests_per_node": per_node,
        "provisioning": counts_to_json(&prov),
    });
    println!("B4_RESULT {result}");
    let _ = emu.ask("quit", Duration::from_secs(60)).await;
    let _ = emu.child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    // Tasks of the stopped hub may still be retrying against the emulators that just left.
    std::process::exit(0);
}
