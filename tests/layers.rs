//! The crate graph is the architecture: every crate depends only on crates of lower layers
//! (as `[workspace.metadata.iblab] layers` in the root Cargo.toml writes them down), no
//! crate has an import cycle between its top-level modules, and only the crates named
//! there may use `unsafe`. Read from `cargo metadata` and the sources themselves.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

fn layers(m: &Value) -> BTreeMap<String, usize> {
    let list = m["metadata"]["iblab"]["layers"]
        .as_array()
        .expect("[workspace.metadata.iblab] layers in Cargo.toml");
    let mut at = BTreeMap::new();
    for (i, layer) in list.iter().enumerate() {
        for name in layer.as_array().unwrap() {
            at.insert(name.as_str().unwrap().to_string(), i);
        }
    }
    at
}

#[test]
fn every_crate_depends_only_on_lower_layers() {
    let m = metadata();
    let at = layers(&m);
    let packages = m["packages"].as_array().unwrap();
    assert!(packages.len() >= 11, "only {} packages", packages.len());
    for p in packages {
        let name = p["name"].as_str().unwrap();
        let mine = *at
            .get(name)
            .unwrap_or_else(|| panic!("{name} is in no layer of [workspace.metadata.iblab]"));
        for d in p["dependencies"].as_array().unwrap() {
            let dep = d["name"].as_str().unwrap();
            if d["kind"].as_str() == Some("dev") || !dep.starts_with("iblab") {
                continue;
            }
            let theirs = at[dep];
            assert!(
                theirs < mine,
                "{name} (layer {mine}) depends on {dep} (layer {theirs}): a crate may use only crates of lower layers"
            );
        }
    }
}

#[test]
fn only_the_named_crates_may_use_unsafe() {
    let m = metadata();
    let allowed: BTreeSet<&str> = m["metadata"]["iblab"]["unsafe"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for p in m["packages"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let manifest = std::fs::read_to_string(p["manifest_path"].as_str().unwrap()).unwrap();
        let dir = Path::new(p["manifest_path"].as_str().unwrap())
            .parent()
            .unwrap();
        let inherits = manifest.contains("[lints]\nworkspace = true");
        let forbids_itself = std::fs::read_to_string(dir.join("src/main.rs"))
            .is_ok_and(|s| s.contains("#![forbid(unsafe_code)]"));
        if allowed.contains(name) {
            assert!(
                manifest.contains("unsafe_code = \"allow\"")
                    && manifest.contains("undocumented_unsafe_blocks = \"deny\""),
                "{name} may use unsafe, with every block documented"
            );
        } else {
            assert!(
                inherits || forbids_itself,
                "{name} must forbid unsafe (inherit the workspace's lints)"
            );
        }
    }
}

/// The top-level module a source file belongs to (`fabric/ibsim.rs` → `fabric`).
fn top_module(root: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(root).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    let top = first.trim_end_matches(".rs").to_string();
    (top != "lib" && top != "main").then_some(top)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `crate::MODULE` paths in a file's code (comments and its test module left out).
fn crate_paths(text: &str) -> BTreeSet<String> {
    let code: String = text
        .split("#[cfg(test)]")
        .next()
        .unwrap_or("")
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.insert(name);
        }
        rest = after;
    }
    out
}

#[test]
fn no_crate_has_a_module_level_import_cycle() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut roots = vec![repo.join("src")];
    for e in std::fs::read_dir(repo.join("crates")).unwrap().flatten() {
        roots.push(e.path().join("src"));
    }
    for root in roots {
        let mut files = vec![];
        rust_files(&root, &mut files);
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for f in &files {
            let Some(top) = top_module(&root, f) else {
                continue;
            };
            let text = std::fs::read_to_string(f).unwrap();
            for to in crate_paths(&text) {
                if to != top {
                    edges.entry(top.clone()).or_default().insert(to);
                }
            }
        }
        // Depth-first search for a back edge.
        fn visit(
            n: &str,
            edges: &BTreeMap<String, BTreeSet<String>>,
            state: &mut BTreeMap<String, u8>,
            path: &mut Vec<String>,
        ) -> Option<Vec<String>> {
            state.insert(n.to_string(), 1);
            path.push(n.to_string());
            for m in edges.get(n).into_iter().flatten() {
                match state.get(m.as_str()) {
                    Some(1) => {
                        let at = path.iter().position(|p| p == m).unwrap();
                        let mut cycle = path[at..].to_vec();
                        cycle.push(m.clone());
                        return Some(cycle);
                    }
                    Some(_) => {}
                    None => {
                        if let Some(c) = visit(m, edges, state, path) {
                            return Some(c);
                        }
                    }
                }
            }
            path.pop();
            state.insert(n.to_string(), 2);
            None
        }
        let mut state = BTreeMap::new();
        for n in edges.keys() {
            if !state.contains_key(n.as_str())
                && let Some(c) = visit(n, &edges, &mut state, &mut vec![])
            {
                panic!("{}: module import cycle {}", root.display(), c.join(" → "));
            }
        }
    }
}

#[test]
fn a_cycle_is_found_where_there_is_one() {
    // The checker itself: `a` → `b` → `a` in text is found as paths both ways.
    assert_eq!(
        crate_paths("use crate::b::X;\n// crate::c in a comment\nfn f() { crate::d::g() }"),
        ["b", "d"].iter().map(|s| s.to_string()).collect()
    );
}
