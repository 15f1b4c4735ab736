//! docs/metrics.md and docs/dashboards/karpenter-hub.json say only what the hub exports: every series
//! of the hub's registry (what `karpenter-hub run` serves on `/metrics`) is documented with its type,
//! labels and help text, every documented series exists, and every PromQL expression of the
//! dashboard names only exported series and their labels, filtered by cluster. Also: every event or
//! condition reason docs/troubleshooting.md and docs/operations.md quote is one the code writes, and
//! every category of a controller's error is explained there. A failure names the series, the
//! reason or the category and says what to change.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
};

use operator::infra::metrics::{
    CatalogLabels, ClaimLabels, ClusterLabels, DecisionLabels, MethodErrorLabels, MethodLabels, Metrics,
    OrganizationLabels, PhaseLabels, PoolLabels, PoolPhaseLabels, PoolReasonLabels, PoolResourceLabels, ReasonLabels,
    ReconcileErrorLabels, ResultLabels, RetryLabels, StageLabels,
};

fn repo_file(path: &str) -> (PathBuf, String) {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
    (p, text)
}

/// One metric family as exposed on `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Family {
    /// `counter`, `gauge` or `histogram`.
    kind: String,
    help: String,
    /// Label names of its samples, in exposition order, `le` left out.
    labels: Vec<String>,
}

impl Family {
    /// The name a PromQL query uses for it (counters carry `_total`; a histogram is queried through
    /// `_bucket`, `_sum` and `_count`, documented under its base name).
    fn doc_name(&self, family: &str) -> String {
        if self.kind == "counter" { format!("{family}_total") } else { family.to_string() }
    }

    /// Every series name a query may use.
    fn series(&self, family: &str) -> Vec<String> {
        match self.kind.as_str() {
            "counter" => vec![format!("{family}_total")],
            "histogram" => ["_bucket", "_sum", "_count"].iter().map(|s| format!("{family}{s}")).collect(),
            _ => vec![family.to_string()],
        }
    }

    fn row(&self, family: &str) -> String {
        let labels = if self.labels.is_empty() {
            "—".to_string()
        } else {
            self.labels.iter().map(|l| format!("`{l}`")).collect::<Vec<_>>().join(", ")
        };
        format!("| `{}` | {} | {} | {} |", self.doc_name(family), self.kind, labels, self.help)
    }
}

/// The hub's registry with one sample in every family, so each family shows its label names.
fn hub_exposition() -> String {
    let m = Metrics::new();
    let cluster = "team-a/prod".to_string();
    m.cluster_registered(&cluster);
    let pool = PoolLabels { cluster: cluster.clone(), nodepool: "default".into() };
    let pool_reason = PoolReasonLabels { cluster: cluster.clone(), nodepool: "default".into(), reason: "r".into() };
    let pool_resource =
        PoolResourceLabels { cluster: cluster.clone(), nodepool: "default".into(), resource_type: "cpu".into() };
    let result = ResultLabels { cluster: cluster.clone(), result: "ok".into() };
    let c = ClusterLabels { cluster: cluster.clone() };
    m.cluster_phase.get(&PhaseLabels { cluster: cluster.clone(), phase: "Connected".into() }).set(1);
    m.cluster_probes.get(&result).inc();
    m.api_retries.get(&RetryLabels { api: "workload".into(), cluster: cluster.clone(), code: "429".into() }).inc();
    m.reconcile_errors
        .get(&ReconcileErrorLabels {
            cluster: cluster.clone(),
            controller: "nodeclaim".into(),
            step: "write_claim_status".into(),
            category: "kubernetes_conflict".into(),
        })
        .inc();
    m.nodeclaims_created
        .get(&operator::infra::metrics::CreatedLabels {
            cluster: cluster.clone(),
            nodepool: "default".into(),
            reason: "r".into(),
            min_values_relaxed: "false".into(),
        })
        .inc();
    m.nodeclaims_terminated.get(&pool).inc();
    m.nodeclaims_disrupted.get(&pool_reason).inc();
    m.nodes_created.get(&pool).inc();
    m.nodes_drained.get(&pool).inc();
    m.pods_drained.get(&pool_reason).inc();
    m.eviction_requests.get(&result).inc();
    m.termination_duration.get(&pool).observe(12.0);
    m.drain_waiting_pods
        .get(&ClaimLabels { cluster: cluster.clone(), nodepool: "default".into(), nodeclaim: "default-x".into() })
        .set(1);
    m.nodepool_usage.get(&pool_resource).set(1.0);
    m.nodepool_limit.get(&pool_resource).set(1.0);
    m.nodepool_price.get(&pool).set(0.1);
    m.organization_quota
        .get(&OrganizationLabels { organization: "acme".into(), resource: "cpu".into(), kind: "used".into() })
        .set(34.0);
    m.rollout_phase
        .get(&PoolPhaseLabels { cluster: cluster.clone(), nodepool: "default".into(), phase: "Progressing".into() })
        .set(1);
    m.queue_depth.get(&c).set(1);
    m.unschedulable_pods.get(&c).set(1);
    m.buffer_pods
        .get(&operator::infra::metrics::BufferLabels {
            cluster: cluster.clone(),
            capacitybuffer: "warm".into(),
            placement: "existing".into(),
        })
        .set(2);
    m.scheduling_duration.get(&c).observe(0.01);
    m.pod_provisioning_latency.get(&c).observe(1.0);
    m.pod_provisioning_stages.get(&StageLabels { cluster: cluster.clone(), stage: "batch".into() }).observe(1.0);
    m.cloudprovider_duration.get(&MethodLabels { cluster: cluster.clone(), method: "create".into() }).observe(0.01);
    m.cloudprovider_errors
        .get(&MethodErrorLabels { cluster: cluster.clone(), method: "create".into(), error: "Forbidden".into() })
        .inc();
    let decision = DecisionLabels {
        cluster: cluster.clone(),
        decision: "replace".into(),
        reason: "underutilized".into(),
        consolidation_type: "single".into(),
    };
    let reason = ReasonLabels { cluster: cluster.clone(), reason: "underutilized".into() };
    m.disruption_decisions.get(&decision).inc();
    m.disruption_queue_failures.get(&decision).inc();
    m.disruption_eligible_nodes.get(&reason).set(1);
    m.disruption_failed_validations.get(&reason).inc();
    m.disruption_allowed.get(&pool_reason).set(1);
    m.disruption_evaluation.get(&MethodLabels { cluster: cluster.clone(), method: "drift".into() }).observe(0.01);
    m.disruption_views.get(&result).inc();
    m.catalog_invalid.get_or_create(&CatalogLabels { flavorcatalog: "team-a/default".into() }).set(1);
    m.render()
}

/// Families of an OpenMetrics exposition, by name. Samples follow their family's `# HELP` and
/// `# TYPE` lines. A family without a sample has no labels to read, which is reported rather than
/// guessed.
fn parse_exposition(text: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    let mut sampled = BTreeSet::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families
                .insert(name.to_string(), Family { kind: String::new(), help: help.to_string(), labels: Vec::new() });
            current = Some(name.to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            families.get_mut(name).expect("TYPE after HELP").kind = kind.to_string();
        } else if !line.starts_with('#') && !line.is_empty() {
            let family = current.clone().unwrap_or_else(|| panic!("sample {line} before any family"));
            let series = line.split(['{', ' ']).next().unwrap();
            assert!(series.starts_with(&family), "sample {line} is not of family {family}");
            let labels: Vec<String> = line
                .split_once('{')
                .and_then(|(_, r)| r.split_once('}'))
                .map(|(inner, _)| inner)
                .unwrap_or("")
                .split(',')
                .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.to_string()))
                .filter(|k| k != "le")
                .collect();
            if sampled.insert(family.clone()) {
                families.get_mut(&family).unwrap().labels = labels;
            }
        }
    }
    let unsampled: Vec<&String> = families.keys().filter(|f| !sampled.contains(*f)).collect();
    assert!(
        unsampled.is_empty(),
        "{unsampled:?}: registered but without a sample, so their labels cannot be read: add one sample of each in \
         hub_exposition() of operator/tests/metrics_docs.rs"
    );
    families
}

/// The rows of the table between `<!-- metrics:NAME -->` and `<!-- /metrics:NAME -->`, by series.
fn doc_rows(doc: &str, section: &str) -> BTreeMap<String, String> {
    let start = format!("<!-- metrics:{section} -->");
    let end = format!("<!-- /metrics:{section} -->");
    let body = doc
        .split_once(&start)
        .and_then(|(_, r)| r.split_once(&end))
        .map(|(b, _)| b)
        .unwrap_or_else(|| panic!("docs/metrics.md has no section between {start} and {end}"));
    let mut rows = BTreeMap::new();
    for l in body.lines().filter(|l| l.starts_with("| `")) {
        let name = l.trim_start_matches("| `").split('`').next().unwrap().to_string();
        let earlier = rows.insert(name.clone(), l.trim_end().to_string());
        assert!(earlier.is_none(), "docs/metrics.md lists {name} twice in its {section} table: keep one row");
    }
    rows
}

/// What is wrong between the exposition and a documented table, one line per problem, each with
/// its fix.
fn doc_problems(families: &BTreeMap<String, Family>, rows: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut expected = BTreeMap::new();
    for (name, f) in families {
        expected.insert(f.doc_name(name), f.row(name));
    }
    for (name, row) in &expected {
        match rows.get(name) {
            None => problems.push(format!("{name} is exported but not documented: add the row\n  {row}")),
            Some(actual) if actual != row => problems
                .push(format!("{name} is documented differently from the code: replace\n  {actual}\nwith\n  {row}")),
            Some(_) => {}
        }
    }
    for name in rows.keys().filter(|n| !expected.contains_key(*n)) {
        problems.push(format!("{name} is documented but not exported: remove its row or fix its name"));
    }
    problems
}

#[test]
fn every_series_the_hub_exports_is_documented_with_its_labels_and_help_and_nothing_else_is() {
    // The webhook's section is checked by webhook/tests/metrics_docs.rs, the same way.
    let (path, doc) = repo_file("docs/metrics.md");
    let problems = doc_problems(&parse_exposition(&hub_exposition()), &doc_rows(&doc, "hub"));
    assert!(problems.is_empty(), "{} is out of date:\n{}", path.display(), problems.join("\n"));
}

#[test]
fn the_doc_check_reports_a_missing_a_changed_and_an_unknown_series() {
    let families = parse_exposition(&hub_exposition());
    let (_, doc) = repo_file("docs/metrics.md");
    let mut rows = doc_rows(&doc, "hub");
    assert!(rows.remove("karpenter_nodes_drained_total").is_some());
    rows.insert(
        "karpenter_hub_cluster_connected".into(),
        "| `karpenter_hub_cluster_connected` | gauge | x | y |".into(),
    );
    rows.insert("karpenter_pods_state".into(), "| `karpenter_pods_state` | gauge | — | z |".into());
    let problems = doc_problems(&families, &rows).join("\n");
    assert!(problems.contains("karpenter_nodes_drained_total is exported but not documented"), "{problems}");
    assert!(problems.contains("karpenter_hub_cluster_connected is documented differently"), "{problems}");
    assert!(problems.contains("karpenter_pods_state is documented but not exported"), "{problems}");
}

// ---- the dashboard ----

/// Series and label names used by one PromQL expression: `(metric names, label names per metric,
/// label names in by/without/on/ignoring/group_* clauses)`.
#[derive(Debug, Default)]
struct Uses {
    metrics: BTreeSet<String>,
    selector_labels: BTreeMap<String, BTreeSet<String>>,
    grouping_labels: BTreeSet<String>,
}

const KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
];

fn ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Whether `by (` or `without (` starts at `at` (an aggregation written `sum by (x) (...)`).
fn followed_by_grouping(chars: &[char], at: usize) -> bool {
    let rest: String = chars[at.min(chars.len())..].iter().take(16).collect();
    let word: String = rest.chars().take_while(|c| ident_char(*c)).collect();
    matches!(word.as_str(), "by" | "without") && rest[word.len()..].trim_start().starts_with('(')
}

/// A small PromQL reader, enough for dashboards: strings, durations and template variables are
/// skipped; an identifier followed by `(` is a function or aggregation; one after a grouping
/// keyword opens a label list; any other identifier is a metric name, whose `{...}` holds label
/// matchers.
fn promql_uses(expr: &str) -> Result<Uses, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut uses = Uses::default();
    let mut i = 0;
    let mut last_metric: Option<String> = None;
    let skip_ws = |mut j: usize| {
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        j
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            let q = c;
            i += 1;
            while i < chars.len() && chars[i] != q {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else if c == '$' {
            // Grafana variable: `$cluster`, `${cluster}`, `$__rate_interval`.
            i += 1;
            if i < chars.len() && chars[i] == '{' {
                while i < chars.len() && chars[i] != '}' {
                    i += 1;
                }
                i += 1;
            } else {
                while i < chars.len() && ident_char(chars[i]) {
                    i += 1;
                }
            }
        } else if c == '[' {
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c == '{' {
            // Label matchers of the preceding metric (or of a bare `{__name__=...}` selector).
            let Some(metric) = last_metric.clone() else {
                return Err(format!("a selector without a metric name in {expr:?}"));
            };
            i += 1;
            while i < chars.len() && chars[i] != '}' {
                i = skip_ws(i);
                let start = i;
                while i < chars.len() && ident_char(chars[i]) {
                    i += 1;
                }
                let label: String = chars[start..i].iter().collect();
                if !label.is_empty() {
                    uses.selector_labels.entry(metric.clone()).or_default().insert(label);
                }
                while i < chars.len() && !matches!(chars[i], '"' | '\'' | '`' | '}') {
                    i += 1;
                }
                if i < chars.len() && chars[i] != '}' {
                    let q = chars[i];
                    i += 1;
                    while i < chars.len() && chars[i] != q {
                        if chars[i] == '\\' {
                            i += 1;
                        }
                        i += 1;
                    }
                    i += 1;
                }
                i = skip_ws(i);
                if i < chars.len() && chars[i] == ',' {
                    i += 1;
                }
            }
            i += 1;
            last_metric = None;
        } else if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            // Numbers, also 1e3 and durations like 5m after `offset`.
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if ident_start(c) {
            let start = i;
            while i < chars.len() && ident_char(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = skip_ws(i);
            let lower = word.to_ascii_lowercase();
            if KEYWORDS.contains(&lower.as_str()) {
                last_metric = None;
                if matches!(lower.as_str(), "by" | "without" | "on" | "ignoring" | "group_left" | "group_right")
                    && next < chars.len()
                    && chars[next] == '('
                {
                    let close = chars[next..].iter().position(|&c| c == ')').map(|p| p + next).ok_or("unclosed (")?;
                    let list: String = chars[next + 1..close].iter().collect();
                    for l in list.split(',').map(str::trim).filter(|l| !l.is_empty()) {
                        uses.grouping_labels.insert(l.to_string());
                    }
                    i = close + 1;
                }
            } else if (next < chars.len() && chars[next] == '(') || followed_by_grouping(&chars, next) {
                last_metric = None; // a function, or an aggregation (`sum by (x) (...)` too)
            } else {
                uses.metrics.insert(word.clone());
                last_metric = Some(word);
            }
        } else {
            i += 1;
        }
    }
    Ok(uses)
}

/// Every series name the hub exports, with its labels (`le` too for buckets).
fn exported_series() -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for (name, f) in parse_exposition(&hub_exposition()) {
        for s in f.series(&name) {
            let mut labels: BTreeSet<String> = f.labels.iter().cloned().collect();
            if s.ends_with("_bucket") {
                labels.insert("le".into());
            }
            out.insert(s, labels);
        }
    }
    out
}

/// Every panel that queries (rows' nested panels included; text panels left out) as `(title, its
/// PromQL expressions)`.
fn panels(dashboard: &serde_json::Value) -> Vec<(String, Vec<String>)> {
    fn walk(panels: &serde_json::Value, out: &mut Vec<(String, Vec<String>)>) {
        for p in panels.as_array().into_iter().flatten() {
            if p["type"] == "row" {
                walk(&p["panels"], out);
                continue;
            }
            if p["type"] == "text" {
                continue; // prose, no query
            }
            let title = p["title"].as_str().unwrap_or("(untitled)").to_string();
            let exprs = p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["expr"].as_str().map(str::to_string))
                .collect();
            out.push((title, exprs));
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// What is wrong with one expression of a panel, each problem with its fix.
fn expr_problems(title: &str, expr: &str, exported: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let uses = match promql_uses(expr) {
        Ok(u) => u,
        Err(e) => return vec![format!("panel {title:?}: cannot read {expr:?}: {e}")],
    };
    let mut problems = Vec::new();
    if uses.metrics.is_empty() {
        problems.push(format!("panel {title:?}: {expr:?} names no series"));
    }
    let mut known_labels = BTreeSet::new();
    for m in &uses.metrics {
        match exported.get(m) {
            None => problems.push(format!(
                "panel {title:?}: {m} is not exported by the hub (see docs/metrics.md): use an exported series or \
                 export it first"
            )),
            Some(labels) => {
                known_labels.extend(labels.iter().cloned());
                for l in uses.selector_labels.get(m).into_iter().flatten() {
                    if !labels.contains(l) {
                        problems.push(format!("panel {title:?}: {m} has no label {l:?} (its labels: {labels:?})"));
                    }
                }
                if labels.contains("cluster") && !uses.selector_labels.get(m).is_some_and(|s| s.contains("cluster")) {
                    problems.push(format!(
                        "panel {title:?}: {m} is not filtered by cluster: write {m}{{cluster=~\"$cluster\"}}"
                    ));
                }
            }
        }
    }
    // A label `label_replace(v, "dst", ...)` makes is known to what groups outside it.
    let made = |l: &str| expr.contains("label_replace(") && expr.contains(&format!(", \"{l}\", "));
    for l in &uses.grouping_labels {
        if !known_labels.contains(l) && !made(l) && uses.metrics.iter().all(|m| exported.contains_key(m)) {
            problems.push(format!("panel {title:?}: groups by {l:?}, a label none of {:?} has", uses.metrics));
        }
    }
    problems
}

fn dashboard() -> (PathBuf, serde_json::Value) {
    let (path, text) = repo_file("docs/dashboards/karpenter-hub.json");
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    (path, v)
}

#[test]
fn every_dashboard_panel_queries_only_series_the_hub_exports_per_cluster() {
    let (path, d) = dashboard();
    let exported = exported_series();
    let mut problems = Vec::new();
    let panels = panels(&d);
    assert!(panels.len() >= 10, "{}: only {} panels", path.display(), panels.len());
    for (title, exprs) in &panels {
        if exprs.is_empty() {
            problems.push(format!("panel {title:?} has no PromQL target"));
        }
        for e in exprs {
            problems.extend(expr_problems(title, e, &exported));
        }
    }
    // The `cluster` variable lists the hub's clusters from a series every registered cluster has.
    let vars = d["templating"]["list"].as_array().cloned().unwrap_or_default();
    let cluster = vars.iter().find(|v| v["name"] == "cluster");
    match cluster {
        None => problems.push("no template variable `cluster`".into()),
        Some(v) => {
            let q = v["query"]["query"].as_str().or(v["query"].as_str()).unwrap_or_default();
            let inner = q.strip_prefix("label_values(").and_then(|r| r.strip_suffix(", cluster)"));
            match inner {
                Some(series) if exported.get(series.trim()).is_some_and(|l| l.contains("cluster")) => {}
                _ => {
                    problems.push(format!("variable `cluster`: {q:?} must be label_values(<exported series>, cluster)"))
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}:\n{}", path.display(), problems.join("\n"));
}

#[test]
fn the_dashboard_check_refuses_unknown_series_unknown_labels_and_unfiltered_queries() {
    let exported = exported_series();
    let ok = r#"sum by (nodepool) (rate(karpenter_nodeclaims_created_total{cluster=~"$cluster", reason="provisioning"}[$__rate_interval]))"#;
    assert_eq!(expr_problems("t", ok, &exported), Vec::<String>::new());
    let histogram = r#"histogram_quantile(0.99, sum by (le) (rate(karpenter_provisioner_scheduling_duration_seconds_bucket{cluster=~"$cluster"}[5m])))"#;
    assert_eq!(expr_problems("t", histogram, &exported), Vec::<String>::new());
    let unknown = r#"sum(karpenter_pods_state{cluster=~"$cluster"})"#;
    assert!(expr_problems("t", unknown, &exported)[0].contains("karpenter_pods_state is not exported"));
    let no_total = r#"rate(karpenter_nodeclaims_created{cluster=~"$cluster"}[5m])"#;
    assert!(expr_problems("t", no_total, &exported)[0].contains("karpenter_nodeclaims_created is not exported"));
    let bad_label = r#"karpenter_hub_cluster_connected{cluster=~"$cluster", zone="a"}"#;
    assert!(expr_problems("t", bad_label, &exported)[0].contains("has no label \"zone\""));
    let unfiltered = "sum(karpenter_hub_cluster_connected)";
    assert!(expr_problems("t", unfiltered, &exported)[0].contains("is not filtered by cluster"));
    // A series without a cluster label (catalogues are per namespace) needs no cluster filter.
    let catalogues = "sum(karpenter_hub_instancetype_flavors_config_invalid) or vector(0)";
    assert_eq!(expr_problems("t", catalogues, &exported), Vec::<String>::new());
    let bad_group = r#"sum by (instance_type) (karpenter_nodes_created_total{cluster=~"$cluster"})"#;
    assert!(expr_problems("t", bad_group, &exported)[0].contains("groups by \"instance_type\""));
}

// ---- troubleshooting.md ----

/// Every `.rs` file under `dir`, concatenated.
fn sources(dir: &std::path::Path, out: &mut String) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
}

/// The `CamelCase` words inside backticks, e.g. `NodeGroupQuotaExceeded` or `Drained=Unknown`:
/// event and condition reasons, condition types.
fn quoted_reasons(doc: &str) -> BTreeSet<String> {
    // Words of the page's prose that are not the hub's reasons (event types, condition statuses).
    const NOT_REASONS: &[&str] = &["Normal", "Warning", "True", "False", "Unknown", "Pending"];
    // Prose only: fenced blocks (commands) are left out.
    let mut fenced = false;
    let prose: String = doc
        .lines()
        .filter(|l| {
            if l.starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect::<Vec<_>>()
        .join("\n");
    prose
        .split('`')
        .skip(1)
        .step_by(2)
        .flat_map(|quoted| quoted.split(|c: char| !c.is_ascii_alphanumeric()))
        .filter(|w| {
            w.len() > 2
                && w.starts_with(|c: char| c.is_ascii_uppercase())
                && w.chars().all(|c| c.is_ascii_alphanumeric())
                && w.chars().any(|c| c.is_ascii_lowercase())
        })
        .filter(|w| !NOT_REASONS.contains(w))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_reason_troubleshooting_and_operations_quote_is_one_the_code_writes() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut code = String::new();
    for dir in ["operator/src", "crds/src", "scheduling/src"] {
        sources(&root.join(dir), &mut code);
    }
    let mut problems = Vec::new();
    let mut seen = 0;
    for page in ["docs/troubleshooting.md", "docs/operations.md"] {
        let (_, doc) = repo_file(page);
        for reason in quoted_reasons(&doc) {
            seen += 1;
            if !code.contains(&format!("\"{reason}\"")) {
                problems.push(format!("{page} quotes `{reason}`, which no code writes: fix the name or the page"));
            }
        }
    }
    assert!(seen >= 30, "only {seen} reasons found: is the page's format still `Reason`?");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The check itself: a reason the code never writes is reported.
    assert!(quoted_reasons("see `NodeGroupMelted` and `Warning`").contains("NodeGroupMelted"));
    assert!(!code.contains("\"NodeGroupMelted\""));
}

/// Every category a controller's error can have is explained in the troubleshooting table that
/// tells what to look at for it.
#[test]
fn every_error_category_is_explained_in_troubleshooting() {
    let (path, doc) = repo_file("docs/troubleshooting.md");
    let missing: Vec<&str> = operator::infra::errors::Category::ALL
        .iter()
        .map(|c| c.as_str())
        .filter(|c| !doc.contains(&format!("| `{c}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "{} does not explain the error categories {missing:?}: add a row to its table of categories",
        path.display()
    );
}

/// Every family the hub exports is shown by some panel of the dashboard: a new metric family
/// without a panel fails here (the check above only proves that what the panels query exists).
#[test]
fn every_family_the_hub_exports_has_a_dashboard_panel() {
    let (path, d) = dashboard();
    let exprs: Vec<String> = panels(&d).into_iter().flat_map(|(_, e)| e).collect();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mentions = |e: &str, series: &str| {
        e.match_indices(series).any(|(i, _)| {
            let before = e[..i].chars().next_back().is_none_or(|c| !ident(c));
            let after = e[i + series.len()..].chars().next().is_none_or(|c| !ident(c));
            before && after
        })
    };
    let missing: Vec<String> = parse_exposition(&hub_exposition())
        .into_iter()
        .filter(|(name, f)| !f.series(name).iter().any(|s| exprs.iter().any(|e| mentions(e, s))))
        .map(|(name, _)| name)
        .collect();
    assert!(missing.is_empty(), "{}: no panel shows {missing:?}", path.display());
}
