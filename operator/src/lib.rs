//! The hub's library: everything `karpenter-hub` runs, laid out by role so the tree shows the
//! architecture, and so that integration tests and benchmarks drive the same code as the binary.
//!
//! - [`commands`]: the binary's subcommands (`run`, `sandbox`, `plan`, `register`).
//! - [`controllers`]: loops that gather facts from the clusters, call a decision and carry out its
//!   writes idempotently.
//! - [`decisions`]: pure functions over plain data (no I/O, time passed in).
//! - [`infra`]: what the controllers run on: the shared hub context, the registry of workload
//!   clusters, leader election, metrics, kubeconfig hardening.
//!
//! Dependencies point one way: commands → controllers → infra → decisions. The time every decision
//! is made at comes from `infra::hub::Settings::clock` (the `clock` crate). Only `sandbox` (and the
//! binary's `sim-cke`) use the emulators of `sim`, behind the default feature `sandbox`.

pub mod commands;
pub mod controllers;
pub mod decisions;
pub mod infra;

/// The layering rule of the header, checked on the sources (docs/architecture.md): no module
/// imports from a layer above its own, no controller from another controller, and no two modules
/// import each other, directly or around a circle. Comments and test modules are not imports.
#[cfg(test)]
mod layering {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    const LAYERS: [&str; 4] = ["decisions", "infra", "controllers", "commands"];

    fn rank(layer: &str) -> Option<usize> {
        LAYERS.iter().position(|l| *l == layer)
    }

    /// Every `.rs` file under `dir`, with its path relative to `src/`.
    fn sources(dir: &Path, rel: &str, out: &mut Vec<(String, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let rel = if rel.is_empty() { name.clone() } else { format!("{rel}/{name}") };
            if path.is_dir() {
                sources(&path, &rel, out);
            } else if name.ends_with(".rs") {
                out.push((rel, std::fs::read_to_string(&path).unwrap()));
            }
        }
    }

    /// `layer::module` of a source file (`None` for the crate root and the layers' `mod.rs`).
    fn module_of(rel: &str) -> Option<(String, String)> {
        let mut parts = rel.trim_end_matches(".rs").split('/');
        let (layer, module) = (parts.next()?, parts.next()?);
        (rank(layer).is_some() && module != "mod").then(|| (layer.to_string(), module.to_string()))
    }

    fn ident(s: &str) -> &str {
        let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
        &s[..end]
    }

    /// The `layer::module`s a source names, from `layer::module` paths and `layer::{a, b::c}` groups.
    fn imports(code: &str, rel: &str) -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for layer in LAYERS {
            let pat = format!("{layer}::");
            let mut from = 0;
            while let Some(i) = code[from..].find(&pat).map(|i| i + from) {
                from = i + pat.len();
                let before = code[..i].chars().next_back();
                if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                    continue;
                }
                let rest = &code[from..];
                if let Some(group) = rest.strip_prefix('{') {
                    let (mut depth, mut start) = (0usize, true);
                    for (j, c) in group.char_indices() {
                        match c {
                            '{' => depth += 1,
                            '}' if depth == 0 => break,
                            '}' => depth -= 1,
                            ',' if depth == 0 => start = true,
                            c if start && !c.is_whitespace() => {
                                start = false;
                                let m = ident(&group[j..]);
                                if !m.is_empty() && m != "self" {
                                    out.insert((layer.to_string(), m.to_string()));
                                }
                            }
                            _ => {}
                        }
                    }
                } else {
                    let m = ident(rest);
                    if !m.is_empty() {
                        out.insert((layer.to_string(), m.to_string()));
                    }
                }
            }
        }
        // `super::x` in a layer's top-level module names a sibling module of that layer.
        if let Some((layer, _)) = module_of(rel)
            && rel.matches('/').count() == 1
        {
            let mut from = 0;
            while let Some(i) = code[from..].find("super::").map(|i| i + from) {
                from = i + "super::".len();
                let m = ident(&code[from..]);
                if !m.is_empty() {
                    out.insert((layer.clone(), m.to_string()));
                }
            }
        }
        out
    }

    #[test]
    fn imports_go_down_the_layers_and_never_around_a_circle() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&src, "", &mut files);
        let mut graph: BTreeMap<(String, String), BTreeSet<(String, String)>> = BTreeMap::new();
        for (rel, text) in &files {
            let Some(me) = module_of(rel) else { continue };
            let code: String = text
                .split("#[cfg(test)]")
                .next()
                .unwrap_or_default()
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            let deps = imports(&code, rel);
            graph.entry(me.clone()).or_default().extend(deps.into_iter().filter(|d| *d != me));
        }
        assert!(graph.len() > 40, "the scan found only {} modules: is it reading the sources?", graph.len());
        let mut wrong = Vec::new();
        for ((layer, module), deps) in &graph {
            for (dl, dm) in deps {
                if rank(dl) > rank(layer) {
                    wrong.push(format!("{layer}::{module} imports {dl}::{dm}, a layer above it"));
                } else if layer == "controllers" && dl == "controllers" && graph.contains_key(&(dl.clone(), dm.clone()))
                {
                    wrong.push(format!("controllers::{module} imports controllers::{dm}: share it from below both"));
                }
            }
        }
        // A circle: a module that reaches itself.
        for start in graph.keys() {
            let (mut seen, mut todo) = (BTreeSet::new(), vec![start.clone()]);
            while let Some(m) = todo.pop() {
                for d in graph.get(&m).into_iter().flatten() {
                    if d == start {
                        wrong.push(format!(
                            "{}::{} is part of an import circle (through {}::{})",
                            start.0, start.1, m.0, m.1
                        ));
                    } else if graph.contains_key(d) && seen.insert(d.clone()) {
                        todo.push(d.clone());
                    }
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn the_scan_sees_paths_groups_and_siblings() {
        let code = "use crate::{decisions::{ownership, launch::X}, infra::hub::Hub};\nsuper::gc::f();";
        let found = imports(code, "controllers/provisioning.rs");
        let want = [("decisions", "ownership"), ("decisions", "launch"), ("infra", "hub"), ("controllers", "gc")];
        for (l, m) in want {
            assert!(found.contains(&(l.to_string(), m.to_string())), "{l}::{m} in {found:?}");
        }
    }
}
