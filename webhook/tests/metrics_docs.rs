//! docs/metrics.md lists exactly the series `karpenter-hub-webhook` exports on `/metrics`, each with
//! its type, labels and help text (the hub's section is checked by operator/tests/suite/metrics_docs.rs).
//! A failure names the series and gives the row to write.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

/// `series as queried → documentation row`, from an OpenMetrics exposition where every family has a
/// sample (the webhook pre-creates all of its series).
fn expected_rows(text: &str) -> BTreeMap<String, String> {
    let mut help = BTreeMap::new();
    let mut kind = BTreeMap::new();
    let mut labels: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, h) = rest.split_once(' ').unwrap_or((rest, ""));
            help.insert(name.to_string(), h.to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, k) = rest.split_once(' ').unwrap();
            kind.insert(name.to_string(), k.to_string());
        } else if !line.starts_with('#') && !line.is_empty() {
            let series = line.split(['{', ' ']).next().unwrap();
            let family = help.keys().filter(|f| series.starts_with(f.as_str())).max_by_key(|f| f.len()).unwrap();
            let names = line
                .split_once('{')
                .and_then(|(_, r)| r.split_once('}'))
                .map(|(inner, _)| inner)
                .unwrap_or("")
                .split(',')
                .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.to_string()))
                .filter(|k| k != "le")
                .collect();
            labels.entry(family.clone()).or_insert(names);
        }
    }
    let unsampled: BTreeSet<&String> = help.keys().filter(|f| !labels.contains_key(*f)).collect();
    assert!(unsampled.is_empty(), "{unsampled:?} have no sample: their labels cannot be read");
    help.iter()
        .map(|(family, h)| {
            let k = &kind[family];
            let name = if k == "counter" { format!("{family}_total") } else { family.clone() };
            let l = &labels[family];
            let l = if l.is_empty() {
                "—".to_string()
            } else {
                l.iter().map(|l| format!("`{l}`")).collect::<Vec<_>>().join(", ")
            };
            (name.clone(), format!("| `{name}` | {k} | {l} | {h} |"))
        })
        .collect()
}

fn doc_rows(doc: &str) -> BTreeMap<String, String> {
    let body = doc
        .split_once("<!-- metrics:webhook -->")
        .and_then(|(_, r)| r.split_once("<!-- /metrics:webhook -->"))
        .map(|(b, _)| b)
        .expect("docs/metrics.md has a section between <!-- metrics:webhook --> and <!-- /metrics:webhook -->");
    let mut rows = BTreeMap::new();
    for l in body.lines().filter(|l| l.starts_with("| `")) {
        let name = l.trim_start_matches("| `").split('`').next().unwrap().to_string();
        let earlier = rows.insert(name.clone(), l.trim_end().to_string());
        assert!(earlier.is_none(), "docs/metrics.md lists {name} twice in its webhook table: keep one row");
    }
    rows
}

fn problems(expected: &BTreeMap<String, String>, rows: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    for (name, row) in expected {
        match rows.get(name) {
            None => out.push(format!("{name} is exported but not documented: add the row\n  {row}")),
            Some(a) if a != row => {
                out.push(format!("{name} is documented differently from the code: replace\n  {a}\nwith\n  {row}"))
            }
            Some(_) => {}
        }
    }
    for name in rows.keys().filter(|n| !expected.contains_key(*n)) {
        out.push(format!("{name} is documented but not exported: remove its row or fix its name"));
    }
    out
}

#[test]
fn every_series_the_webhook_exports_is_documented_with_its_labels_and_help_and_nothing_else_is() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let expected = expected_rows(&webhook::metrics::Metrics::new().encode().unwrap());
    assert!(expected.len() >= 7, "{expected:?}");
    let rows = doc_rows(&doc);
    let found = problems(&expected, &rows);
    assert!(found.is_empty(), "{} is out of date:\n{}", path.display(), found.join("\n"));
    // The check itself sees a missing and an unknown row.
    let mut broken = rows.clone();
    broken.remove("karpenter_hub_webhook_denials_total");
    broken.insert("karpenter_hub_webhook_nope".into(), "| `karpenter_hub_webhook_nope` | gauge | — | x |".into());
    let found = problems(&expected, &broken).join("\n");
    assert!(found.contains("karpenter_hub_webhook_denials_total is exported but not documented"), "{found}");
    assert!(found.contains("karpenter_hub_webhook_nope is documented but not exported"), "{found}");
}
