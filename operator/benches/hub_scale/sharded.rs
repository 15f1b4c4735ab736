//! `--sharded N`: N clusters over `--replicas R` hub processes in sharded mode (production shard
//! timings), each process reporting its owned and connected clusters, RSS and CPU twice a second;
//! then one replica is killed with SIGKILL and the time until the survivors have connected every
//! cluster again is the hand-over; then a burst checks that every cluster provisions, with one
//! NodeGroup per NodeClaim (listed and paired at the end, not inferred from event counts). Per
//! phase: each replica's fences and the worst lag of its runtime (how late a 50 ms timer woke).

use super::*;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug, Clone, Default)]
struct Status {
    owned: f64,
    connected: usize,
    rss: f64,
    cpu: f64,
    /// Fences so far (`karpenter_hub_shard_handovers_total{direction="fenced"}`).
    fenced: u64,
    /// The worst scheduling delay of the replica's runtime since the phase began.
    lag_ms: u64,
}

/// Per replica: fences since the last call and the worst scheduling delay of its runtime
/// (then reset); returns the fences of the phase, summed.
fn phase(title: &str, statuses: &Mutex<Vec<Status>>, fenced_before: &mut [u64], live: &[usize]) -> (u64, u64) {
    let mut s = lock(statuses);
    let (mut fences, mut worst) = (0, 0);
    let mut parts = Vec::new();
    for r in live {
        let f = s[*r].fenced.saturating_sub(fenced_before[*r]);
        fenced_before[*r] = s[*r].fenced;
        parts.push(format!("replica {r}: {f} fences, runtime lag ≤ {} ms", s[*r].lag_ms));
        fences += f;
        worst = worst.max(s[*r].lag_ms);
        s[*r].lag_ms = 0;
    }
    println!("  {title}: {}", parts.join("; "));
    (fences, worst)
}

fn cluster_keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("team-{i:03}/cke-{i:03}")).collect()
}

pub fn orchestrate(n: usize, opts: &Options) {
    let replicas = opts.replicas;
    println!(
        "B4 sharded run: {n} clusters of {} Running pods over {replicas} hub processes (sharded mode, production timings)",
        opts.pods.unwrap_or(1000)
    );
    let dir = std::env::temp_dir().join(format!("b4-sharded-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let exe = std::env::current_exe().expect("own executable");
    let mut emu = Command::new(&exe);
    emu.env("B4_ROLE", "emulators")
        .env("B4_CLUSTERS", n.to_string())
        .env("B4_DIR", &dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in opts.env() {
        emu.env(k, v);
    }
    let mut emu = emu.spawn().expect("start the emulator process");
    let mut emu_in = emu.stdin.take().expect("stdin");
    let mut emu_out = BufReader::new(emu.stdout.take().expect("stdout")).lines();
    let mut ask = |cmd: Option<&str>| -> Value {
        if let Some(cmd) = cmd {
            writeln!(emu_in, "{cmd}").expect("emulator stdin");
            emu_in.flush().expect("emulator stdin");
        }
        let line = emu_out.next().and_then(Result::ok).unwrap_or_default();
        serde_json::from_str(&line).unwrap_or(Value::Null)
    };
    let ready = ask(None);
    println!(
        "emulators: {n} workload clusters filled in {:.1} s ({} objects); emulator process RSS {:.0} MiB",
        f(&ready, "fill_s"),
        ready["objects"].as_u64().unwrap_or(0),
        f(&ready, "rss_mib")
    );
    let kubeconfig = ready["mgmt_kubeconfig"].as_str().unwrap_or_default().to_string();

    let statuses: Arc<Mutex<Vec<Status>>> = Arc::new(Mutex::new(vec![Status::default(); replicas]));
    let alive: Vec<Arc<AtomicBool>> = (0..replicas).map(|_| Arc::new(AtomicBool::new(true))).collect();
    let mut children = Vec::new();
    let t0 = Instant::now();
    for r in 0..replicas {
        let mut child = Command::new(&exe)
            .env("B4_ROLE", "replica")
            .env("B4_CLUSTERS", n.to_string())
            .env("B4_REPLICA", r.to_string())
            .env("B4_MGMT_KUBECONFIG", &kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a replica");
        let out = child.stdout.take().expect("replica stdout");
        let (statuses, alive) = (statuses.clone(), alive[r].clone());
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(j) = line.strip_prefix("B4_REPLICA ")
                    && let Ok(v) = serde_json::from_str::<Value>(j)
                {
                    let mut s = lock(&statuses);
                    let lag_ms = s[r].lag_ms.max(v["lag_ms"].as_u64().unwrap_or(0));
                    s[r] = Status {
                        owned: f(&v, "owned"),
                        connected: v["connected"].as_u64().unwrap_or(0) as usize,
                        rss: f(&v, "rss_mib"),
                        cpu: f(&v, "cpu_s"),
                        fenced: v["fenced"].as_u64().unwrap_or(0),
                        lag_ms,
                    };
                }
            }
            alive.store(false, Ordering::SeqCst);
        });
        children.push(child);
    }
    let wait_connected = |live: &[usize], limit: Duration| -> Option<Duration> {
        let start = Instant::now();
        loop {
            let connected: usize = {
                let s = lock(&statuses);
                live.iter().map(|r| s[*r].connected).sum()
            };
            if connected == n {
                return Some(start.elapsed());
            }
            if start.elapsed() > limit {
                println!("only {connected}/{n} clusters connected after {limit:?}");
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let all: Vec<usize> = (0..replicas).collect();
    let startup = wait_connected(&all, Duration::from_secs(900));
    let pools = ask(Some("waitpools"));
    println!(
        "start-up: every cluster connected by one replica in {:.1} s; every NodePool Ready {:.1} s after start ({})",
        startup.map_or(f64::NAN, |d| d.as_secs_f64()),
        t0.elapsed().as_secs_f64(),
        if pools["ok"].as_bool() == Some(true) { "all" } else { "NOT all" }
    );
    std::thread::sleep(Duration::from_secs(opts.settle_seconds));
    let before = lock(&statuses).clone();
    for (r, s) in before.iter().enumerate() {
        println!(
            "  replica {r}: owns {:.0} clusters, connected {}; RSS {:.0} MiB ({:.2} MiB per owned cluster); CPU {:.1} s",
            s.owned,
            s.connected,
            s.rss,
            s.rss / s.owned.max(1.0),
            s.cpu
        );
    }
    let mut fenced_before = vec![0u64; replicas];
    let (startup_fences, startup_lag) = phase("start-up and settle", &statuses, &mut fenced_before, &all);
    // Idle: the management API writes of the whole hub (every replica) while nothing happens.
    let served = |v: &Value| counts_from_json(&v["served"]);
    let (c0, t_idle) = (served(&ask(Some("counters"))), Instant::now());
    std::thread::sleep(Duration::from_secs(opts.idle_seconds));
    let (c1, idle) = (served(&ask(Some("counters"))), t_idle.elapsed().as_secs_f64());
    let writes = |c: &Counts, leases: bool| -> i64 {
        c.iter()
            .filter(|((side, verb, res), _)| {
                side == "mgmt"
                    && matches!(verb.as_str(), "create" | "update" | "patch" | "delete")
                    && (!leases || res == "leases")
            })
            .map(|(_, n)| *n)
            .sum()
    };
    let (idle_writes, idle_lease_writes) = (
        (writes(&c1, false) - writes(&c0, false)) as f64 / idle,
        (writes(&c1, true) - writes(&c0, true)) as f64 / idle,
    );
    let mut by_kind: Vec<(String, i64)> = c1
        .iter()
        .filter(|((side, verb, _), _)| {
            side == "mgmt" && matches!(verb.as_str(), "create" | "update" | "patch" | "delete")
        })
        .map(|((_, v, r), n)| {
            (format!("{v} {r}"), n - c0.get(&("mgmt".to_string(), v.clone(), r.clone())).copied().unwrap_or(0))
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    by_kind.sort_by_key(|k| std::cmp::Reverse(k.1));
    println!(
        "idle {idle:.0} s: management API writes {idle_writes:.2}/s in all, of which Leases {idle_lease_writes:.2}/s ({by_kind:?})"
    );
    // Kill one replica as a node failure would: no release of its Leases.
    let victim = 0;
    let lost = before[victim].connected;
    let victim_id = format!("replica-{victim}-{}", children[victim].id());
    let kill_ms = wall_ms();
    let t_kill = Instant::now();
    children[victim].kill().expect("SIGKILL the replica");
    let _ = children[victim].wait();
    while alive[victim].load(Ordering::SeqCst) && t_kill.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    lock(&statuses)[victim] = Status::default();
    let survivors: Vec<usize> = (0..replicas).filter(|r| *r != victim).collect();
    let handover = wait_connected(&survivors, Duration::from_secs(300));
    println!(
        "hand-over: replica {victim} (owning {lost} clusters) killed with SIGKILL; the {} survivors connected every cluster {:.1} s later (shard Lease duration {} s)",
        survivors.len(),
        handover.map_or(f64::NAN, |d| d.as_secs_f64()),
        operator::decisions::sharding::Timings::DEFAULT.lease_duration.as_secs()
    );
    std::thread::sleep(Duration::from_secs(opts.settle_seconds));
    for r in &survivors {
        let s = lock(&statuses)[*r].clone();
        println!(
            "  replica {r}: owns {:.0} clusters, connected {}; RSS {:.0} MiB ({:.2} MiB per owned cluster)",
            s.owned,
            s.connected,
            s.rss,
            s.rss / s.owned.max(1.0)
        );
    }
    let (handover_fences, handover_lag) = phase("hand-over and settle", &statuses, &mut fenced_before, &survivors);
    let b = ask(Some(&format!("burst {}", opts.burst_pods)));
    let (burst_fences, burst_lag) = phase("burst", &statuses, &mut fenced_before, &survivors);
    let p = &b["pairing"];
    println!(
        "NodeGroups against NodeClaims after the burst (listed): at most {} live NodeGroup(s) per claim; {} NodeGroups without a live claim; {} claims without a NodeGroup; {} NodeGroups and {} claims added again under a name seen before; {} NodeGroups and {} claims deleted during the burst",
        p["max_nodegroups_per_claim"],
        p["nodegroups_without_claim"],
        p["claims_without_nodegroup"],
        p["nodegroups_readded"],
        p["claims_readded"],
        p["nodegroups_deleted"],
        p["claims_deleted"]
    );
    for c in p["clusters"].as_array().into_iter().flatten().take(20) {
        println!("  {c}");
    }
    // The audit of the workload clusters' writes: per cluster, which replica wrote from when to
    // when. Two replicas' write spans overlapping on one cluster, or the killed replica writing
    // after its kill, would be double writes.
    let audit = ask(Some("audit"));
    let (mut overlapping, mut after_kill, mut written) = (0usize, 0usize, 0u64);
    for c in audit["clusters"].as_array().into_iter().flatten() {
        let mut spans: Vec<(String, u64, u64)> = c[1]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| Some((e[0].as_str()?.to_string(), e[1].as_u64()?, e[2].as_u64()?)))
            .collect();
        written += c[1].as_array().into_iter().flatten().filter_map(|e| e[3].as_u64()).sum::<u64>();
        spans.sort_by_key(|s| s.1);
        overlapping += spans.windows(2).filter(|w| w[1].1 <= w[0].2).count();
        after_kill += spans.iter().filter(|s| s.0 == victim_id && s.2 > kill_ms).count();
        if overlapping > 0 && overlapping <= 5 {
            println!("  overlapping writers on {}: {spans:?}", c[0]);
        }
    }
    println!(
        "audit of the workload clusters' writes ({written} by the replicas): clusters where two replicas' write spans overlap: {overlapping}; clusters the killed replica wrote to after its kill: {after_kill}"
    );
    let groups: Vec<i64> =
        b["nodegroups_per_cluster"].as_array().map_or(Vec::new(), |a| a.iter().filter_map(Value::as_i64).collect());
    let claims: Vec<i64> =
        b["claims_per_cluster"].as_array().map_or(Vec::new(), |a| a.iter().filter_map(Value::as_i64).collect());
    let without = groups.iter().filter(|g| **g == 0).count();
    let mismatched = groups.iter().zip(&claims).filter(|(g, c)| g != c).count();
    let rows = b["pods"].as_array().cloned().unwrap_or_default();
    let mut lat: Vec<f64> = rows.iter().filter_map(|r| Some(r.get(4)?.as_f64()? - r.get(2)?.as_f64()?)).collect();
    lat.sort_by(f64::total_cmp);
    let pct = |q: f64| lat.get(((lat.len() as f64 * q).ceil() as usize).saturating_sub(1)).copied().unwrap_or(f64::NAN);
    println!(
        "burst after the hand-over: {} pending pods per cluster ({} not created); timed on the first {} clusters ({} watches refused): {} NodeClaims, {} NodeGroups; clusters without a NodeGroup: {without}; clusters whose NodeGroups differ from their claims in number: {mismatched}; Unschedulable -> NodeGroup p50 {:.0} ms, p99 {:.0} ms",
        opts.burst_pods,
        b["pods_not_created"],
        b["watched_clusters"],
        b["watches_refused"],
        claims.iter().sum::<i64>(),
        groups.iter().sum::<i64>(),
        pct(0.5),
        pct(0.99)
    );
    let result = json!({
        "bench": "hub_scale_sharded",
        "clusters": n,
        "replicas": replicas,
        "startup_s": startup.map(|d| d.as_secs_f64()),
        "idle_mgmt_writes_per_s": idle_writes,
        "idle_lease_writes_per_s": idle_lease_writes,
        "rss_mib": before.iter().map(|s| s.rss).collect::<Vec<_>>(),
        "owned": before.iter().map(|s| s.owned).collect::<Vec<_>>(),
        "handover_s": handover.map(|d| d.as_secs_f64()),
        "killed_owned": lost,
        "clusters_without_nodegroup": without,
        "clusters_mismatched": mismatched,
        "latency_p50_ms": pct(0.5),
        "latency_p99_ms": pct(0.99),
        "fences": {"startup": startup_fences, "handover": handover_fences, "burst": burst_fences},
        "runtime_lag_ms": {"startup": startup_lag, "handover": handover_lag, "burst": burst_lag},
        "audit_overlapping_writers": overlapping,
        "audit_writes_after_kill": after_kill,
        "max_nodegroups_per_claim": p["max_nodegroups_per_claim"],
        "nodegroups_without_claim": p["nodegroups_without_claim"],
        "nodegroups_readded": p["nodegroups_readded"],
        "claims_readded": p["claims_readded"],
    });
    println!("B4_SHARDED {result}");
    let _ = ask(Some("quit"));
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    let _ = emu.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

pub fn replica_main() {
    let observed = Observed::default();
    init_tracing(&observed);
    let n = env_usize("B4_CLUSTERS").max(1);
    let r = env_usize("B4_REPLICA");
    let path = PathBuf::from(std::env::var("B4_MGMT_KUBECONFIG").unwrap_or_default());
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(async move {
        let config = run::management_config(Some(&path)).await.expect("management client configuration");
        let mgmt = Client::try_from(config.clone()).expect("management client");
        let metrics = Arc::new(metrics::Metrics::new());
        let shard = operator::infra::sharding::Settings::new(
            "default",
            "karpenter-hub",
            &format!("replica-{r}-{}", std::process::id()),
            operator::decisions::sharding::Timings::DEFAULT,
        )
        .with_lease_client(config);
        let shutdown = CancellationToken::new();
        {
            let (metrics, shutdown) = (metrics.clone(), shutdown.clone());
            tokio::spawn(async move {
                if let Err(e) = run::run_sharded_with(
                    mgmt,
                    hub::Settings::default(),
                    registry::Settings::default(),
                    shard,
                    true,
                    metrics,
                    shutdown,
                )
                .await
                {
                    eprintln!("replica stopped: {e}");
                }
            });
        }
        // The runtime's scheduling delay: how late a 50 ms sleep wakes, worst per report.
        let lag = Arc::new(std::sync::atomic::AtomicU64::new(0));
        tokio::spawn({
            let lag = lag.clone();
            async move {
                loop {
                    let t = Instant::now();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let late = t.elapsed().saturating_sub(Duration::from_millis(50)).as_millis() as u64;
                    lag.fetch_max(late, Ordering::Relaxed);
                }
            }
        });
        let keys = cluster_keys(n);
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let connected = keys
                .iter()
                .filter(|k| metrics.cluster_connected.get(&metrics::ClusterLabels { cluster: (*k).clone() }).get() == 1)
                .count();
            let owned = metric_value(&metrics, "karpenter_hub_shard_owned_clusters");
            let fenced = metrics
                .shard_handovers
                .get_or_create(&metrics::DirectionLabels { direction: "fenced".to_string() })
                .get();
            let line = json!({
                "owned": owned, "connected": connected, "rss_mib": rss_mib().0, "cpu_s": cpu_seconds(),
                "fenced": fenced, "lag_ms": lag.swap(0, Ordering::Relaxed),
            });
            let mut out = std::io::stdout().lock();
            if writeln!(out, "B4_REPLICA {line}").and_then(|()| out.flush()).is_err() {
                shutdown.cancel();
                return;
            }
        }
    });
}

/// The sum of a family's samples in the rendered metrics.
fn metric_value(metrics: &metrics::Metrics, name: &str) -> f64 {
    metrics
        .render()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let family = series.split('{').next()?;
            (family == name).then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}

/// Wall-clock milliseconds since the Unix epoch (the emulator's audit log uses the same clock).
fn wall_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
