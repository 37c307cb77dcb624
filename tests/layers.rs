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

/// The module path of a source file under a crate's `src/` (`fabric/ibsim.rs` →
/// `[fabric, ibsim]`, `cli/mod.rs` → `[cli]`, `lib.rs` → `[]`).
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap();
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_str().unwrap().to_string())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") || !parts.is_empty() && stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
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

/// The paths a file's code names that start at `crate::`, `super::` or `self::`, each as
/// its segments (a `use` group `super::{a, b::c}` gives `super::a` and `super::b::c`;
/// comments and the file's test module left out).
fn local_paths(text: &str) -> Vec<Vec<String>> {
    let code: String = text
        .split("#[cfg(test)]")
        .next()
        .unwrap_or("")
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = ["crate::", "super::", "self::"].iter().find(|w| {
            let w: Vec<char> = w.chars().collect();
            chars[i..].starts_with(&w)
                && (i == 0 || !(chars[i - 1].is_ascii_alphanumeric() || chars[i - 1] == '_'))
        });
        if starts.is_some() {
            let (mut paths, end) = path_at(&chars, i);
            out.append(&mut paths);
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// The path (or `use` group of paths) that starts at `chars[i]`, and where it ends.
fn path_at(chars: &[char], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    loop {
        let start = i;
        while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
            i += 1;
        }
        if i > start {
            prefix.push(chars[start..i].iter().collect::<String>());
        }
        if chars[i..].starts_with(&[':', ':']) {
            i += 2;
            if i < chars.len() && chars[i] == '{' {
                // A group: each item is a path of its own after the prefix.
                let mut paths = Vec::new();
                i += 1;
                loop {
                    while i < chars.len() && (chars[i].is_whitespace() || chars[i] == ',') {
                        i += 1;
                    }
                    if i >= chars.len() || chars[i] == '}' {
                        break;
                    }
                    let (inner, end) = path_at(chars, i);
                    for p in inner {
                        paths.push(prefix.iter().cloned().chain(p).collect());
                    }
                    i = end;
                    // Skip `as name` and anything else up to the next item.
                    while i < chars.len() && chars[i] != ',' && chars[i] != '}' {
                        i += 1;
                    }
                }
                return (paths, i + 1);
            }
            continue;
        }
        return (vec![prefix], i);
    }
}

/// `path`, named in module `at`, as a module path from the crate root, cut at the deepest
/// module that exists.
fn resolve(at: &[String], path: &[String], modules: &BTreeSet<Vec<String>>) -> Vec<String> {
    let mut abs: Vec<String> = at.to_vec();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            abs.clear();
            rest = &rest[1..];
        }
        _ => {
            while let Some(w) = rest.first().map(String::as_str) {
                match w {
                    "super" => {
                        abs.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
    }
    for seg in rest {
        let mut next = abs.clone();
        next.push(seg.clone());
        if !modules.contains(&next) {
            break;
        }
        abs = next;
    }
    abs
}

/// Every crate's modules, and for each pair of sibling modules (children of one parent at
/// any depth) whether code in one names the other: a cycle among siblings is two modules
/// that each need the other, and the first one found is returned.
fn module_cycle(root: &Path) -> Option<Vec<String>> {
    let mut files = vec![];
    rust_files(root, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(root, f)).collect();
    // parent → (child → children it needs)
    let mut edges: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for f in &files {
        let at = module_of(root, f);
        let text = std::fs::read_to_string(f).unwrap();
        for p in local_paths(&text) {
            let to = resolve(&at, &p, &modules);
            let common = at.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if at.len() > common && to.len() > common {
                edges
                    .entry(at[..common].to_vec())
                    .or_default()
                    .entry(at[common].clone())
                    .or_default()
                    .insert(to[common].clone());
            }
        }
    }
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
    for (parent, siblings) in &edges {
        let mut state = BTreeMap::new();
        for n in siblings.keys() {
            if !state.contains_key(n.as_str())
                && let Some(c) = visit(n, siblings, &mut state, &mut vec![])
            {
                let under = match parent.is_empty() {
                    true => String::new(),
                    false => format!("{}::", parent.join("::")),
                };
                return Some(c.iter().map(|m| format!("{under}{m}")).collect());
            }
        }
    }
    None
}

/// No two modules of one parent, in any crate, need each other (through `crate::`,
/// `super::` or `self::` paths, `use` groups included): what both need belongs in a module
/// of its own.
#[test]
fn no_crate_has_a_module_import_cycle() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut roots = vec![repo.join("src")];
    for e in std::fs::read_dir(repo.join("crates")).unwrap().flatten() {
        roots.push(e.path().join("src"));
    }
    for root in roots {
        if let Some(c) = module_cycle(&root) {
            panic!("{}: module import cycle {}", root.display(), c.join(" → "));
        }
    }
}

#[test]
fn a_cycle_is_found_where_there_is_one() {
    // The checker itself, on a crate written for it: `a` and `b::c` need each other
    // through a `use` group and a `super::` path; `d` needs `a` and is needed by none.
    let dir = std::env::temp_dir().join(format!("iblab-layers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("b")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod b;\nmod d;\n").unwrap();
    std::fs::write(
        dir.join("a.rs"),
        "use crate::{b::c::X, b as _};\n// crate::d\n",
    )
    .unwrap();
    std::fs::write(dir.join("b/mod.rs"), "pub mod c;\n").unwrap();
    std::fs::write(
        dir.join("b/c.rs"),
        "pub struct X;\nfn f() { super::super::a::g() }\n",
    )
    .unwrap();
    std::fs::write(dir.join("d.rs"), "use super::a;\n").unwrap();
    let found = module_cycle(&dir);
    // Without the way back, none.
    std::fs::write(
        dir.join("b/c.rs"),
        "pub struct X;\n#[cfg(test)]\nfn f() { super::super::a::g() }\n",
    )
    .unwrap();
    let none = module_cycle(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let found = found.expect("the cycle a → b → a");
    assert!(
        found.contains(&"a".to_string()) && found.contains(&"b".to_string()),
        "{found:?}"
    );
    assert_eq!(none, None);
    assert_eq!(
        local_paths("use super::{Backend, local::ip_batch, wiring as w};"),
        vec![
            vec!["super".to_string(), "Backend".into()],
            vec!["super".into(), "local".into(), "ip_batch".into()],
            vec!["super".into(), "wiring".into()],
        ]
    );
}

/// The backends (`iblab-backend-*`): none depends on another or on the engine, so that a
/// backend is read, built and tested alone; a new one is a crate of its own.
#[test]
fn no_backend_depends_on_another_backend_or_the_engine() {
    let m = metadata();
    let backends: Vec<&Value> = m["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"].as_str().unwrap().starts_with("iblab-backend-"))
        .collect();
    assert!(backends.len() >= 4, "only {} backends", backends.len());
    for p in backends {
        let name = p["name"].as_str().unwrap();
        for d in p["dependencies"].as_array().unwrap() {
            let dep = d["name"].as_str().unwrap();
            assert!(
                !dep.starts_with("iblab-backend-") && dep != "iblab-engine",
                "{name} depends on {dep}: a backend may use only the crates below it \
                 (iblab-backend, wiring, fabric-free helpers), never another backend or the engine"
            );
        }
    }
}

/// Every backend crate of the workspace is the binary's dependency and named once in its
/// registry (src/backends.rs `BACKENDS`): a backend added as a crate but not registered
/// fails here.
#[test]
fn every_backend_crate_is_registered_in_the_binary() {
    let m = metadata();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let registry = std::fs::read_to_string(repo.join("src/backends.rs")).unwrap();
    let registered = registry
        .split("pub static BACKENDS")
        .nth(1)
        .and_then(|r| r.split("];").next())
        .expect("src/backends.rs has `pub static BACKENDS: … = &[ … ];`");
    let packages = m["packages"].as_array().unwrap();
    let binary = packages
        .iter()
        .find(|p| p["name"] == "iblab")
        .expect("the iblab package");
    let deps: Vec<&str> = binary["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    for p in packages {
        let name = p["name"].as_str().unwrap();
        if !name.starts_with("iblab-backend-") {
            continue;
        }
        assert!(deps.contains(&name), "the binary does not depend on {name}");
        let line = format!("&{}::BACKEND", name.replace('-', "_"));
        assert_eq!(
            registered.matches(&line).count(),
            1,
            "{name} is not registered in src/backends.rs BACKENDS (`{line},`)"
        );
    }
}

/// What each backend builds: the Docker client only for the docker backend, kube-rs and
/// k8s-openapi only for the kube backend, the guest image only for the vm backend (read
/// from the resolved dependency graph, as `cargo build -p` of one backend would build it).
#[test]
fn a_backend_builds_without_the_other_backends_dependencies() {
    let m = metadata();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let heavy = [
        ("bollard", "iblab-backend-docker"),
        ("kube", "iblab-backend-kube"),
        ("k8s-openapi", "iblab-backend-kube"),
        ("iblab-vm-image", "iblab-backend-vm"),
    ];
    let mut backends = 0;
    for p in m["packages"].as_array().unwrap() {
        let backend = p["name"].as_str().unwrap();
        if !backend.starts_with("iblab-backend-") {
            continue;
        }
        backends += 1;
        // Normal dependencies on this host's target: what `cargo build -p` builds.
        let out = Command::new(&cargo)
            .args([
                "tree",
                "-p",
                backend,
                "-e",
                "normal",
                "--offline",
                "--prefix",
                "none",
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("cargo tree runs");
        assert!(
            out.status.success(),
            "cargo tree -p {backend}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let built: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect();
        for (dep, owner) in heavy {
            assert_eq!(
                built.contains(dep),
                backend == owner,
                "{backend} {} {dep}",
                if built.contains(dep) {
                    "builds"
                } else {
                    "does not build"
                }
            );
        }
    }
    assert!(backends >= 4, "only {backends} backends");
}

/// The string literals in `text` (plain `"…"` ones, escapes left as written; comment lines
/// skipped), each with its byte offset.
fn literals(text: &str) -> Vec<(usize, String)> {
    // Comment lines blanked, offsets kept: a quote in prose is no string.
    let code: String = text
        .split_inclusive('\n')
        .map(|l| match l.trim_start().starts_with("//") {
            true => " ".repeat(l.len() - 1) + "\n",
            false => l.to_string(),
        })
        .collect();
    let text = code.as_str();
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'"' && (i == 0 || b[i - 1] != b'\'') {
            let start = i + 1;
            let mut j = start;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            let mut end = j.min(b.len());
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            out.push((i, text[start..end].to_string()));
            i = j + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// `rel` joined to `dir`, `..` taken away lexically.
fn normal(dir: &Path, rel: &str) -> PathBuf {
    let mut out = PathBuf::new();
    for c in dir.join(rel).components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// The places in a crate's sources that read a file outside the crate: an `include_str!`
/// or `include_bytes!` whose path leaves the crate's folder, or a path built on
/// `CARGO_MANIFEST_DIR` that climbs out of it with `..`. Each as `file:line`.
fn reads_outside(krate: &Path) -> Vec<String> {
    let mut files = vec![];
    rust_files(&krate.join("src"), &mut files);
    let mut out = vec![];
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let line = |at: usize| text[..at].lines().count().max(1);
        // A byte offset moved back to the start of its character.
        let floor = |mut i: usize| {
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            i
        };
        for (at, lit) in literals(&text) {
            let before = &text[floor(at.saturating_sub(60))..at];
            let included = before.contains("include_str!(") || before.contains("include_bytes!(");
            let window = &text[floor(at.saturating_sub(160))..floor((at + 160).min(text.len()))];
            let outside = if included && before.trim_end().ends_with('(') {
                !normal(f.parent().unwrap(), &lit).starts_with(krate)
            } else {
                window.contains("CARGO_MANIFEST_DIR")
                    && (lit.starts_with("../") || lit.contains("/../") || lit.ends_with("/.."))
            };
            if outside {
                out.push(format!(
                    "{}:{}",
                    f.strip_prefix(krate.parent().unwrap().parent().unwrap())
                        .unwrap()
                        .display(),
                    line(at)
                ));
            }
        }
    }
    out
}

/// Each crate's test data is inside the crate (docs/testing.md): no crate's source reads a
/// file outside its folder, so `cargo test -p CRATE` needs nothing else. What another
/// crate's tests need they get from that crate's `testdata` module. The exceptions are
/// named, with why; one that no longer reaches out must leave the list.
#[test]
fn no_crate_reads_outside_itself() {
    const KNOWN: &[(&str, &str)] = &[
        // The built-in course: the lab files themselves, embedded in the binary.
        ("crates/lab/src/builtin.rs", "labs/"),
        // The chart's CRDs must be what `iblab crd` prints (rewritten with IBLAB_BLESS=1).
        ("crates/k8s/src/crd/mod.rs", "charts/"),
    ];
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = vec![];
    for e in std::fs::read_dir(repo.join("crates")).unwrap().flatten() {
        found.extend(reads_outside(&e.path()));
    }
    let unknown: Vec<&String> = found
        .iter()
        .filter(|at| !KNOWN.iter().any(|(f, _)| at.starts_with(&format!("{f}:"))))
        .collect();
    assert!(
        unknown.is_empty(),
        "read outside their crate: {unknown:?}; keep the data in the crate's tests/fixtures/ \
         (docs/testing.md), or take another crate's from its `testdata` module"
    );
    for (f, what) in KNOWN {
        assert!(
            found.iter().any(|at| at.starts_with(&format!("{f}:"))),
            "{f} no longer reads {what} outside its crate: take it off the list"
        );
    }
    // The checker itself: a path out of the crate is found, one inside is not.
    let dir = std::env::temp_dir().join(format!("iblab-reads-{}", std::process::id()));
    let krate = dir.join("crates/x");
    std::fs::create_dir_all(krate.join("src/m")).unwrap();
    std::fs::write(
        krate.join("src/m/a.rs"),
        "const A: &str = include_str!(\"../../tests/fixtures/a.txt\");\n\
         const B: &str = include_str!(\"../../../../tests/fixtures/b.txt\");\n\
         fn c() { Path::new(env!(\"CARGO_MANIFEST_DIR\")).join(\"../../labs\"); }\n\
         fn d() { Path::new(env!(\"CARGO_MANIFEST_DIR\")).join(\"tests/fixtures\"); }\n",
    )
    .unwrap();
    let seen = reads_outside(&krate);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(seen, vec!["crates/x/src/m/a.rs:2", "crates/x/src/m/a.rs:3"]);
}

/// The backquoted spans of `text` (a span may run over a line break).
fn spans(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// The text of a file, or of every Rust file below a folder.
fn text_at(path: &Path) -> String {
    if path.is_dir() {
        let mut files = Vec::new();
        rust_files(path, &mut files);
        files
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap())
            .collect()
    } else {
        std::fs::read_to_string(path).unwrap()
    }
}

/// The step kinds' keywords: words of lab files, not names of code.
const KIND_WORDS: &[&str] = &["exec", "traffic", "fault", "wait", "sleep", "probe", "sm"];

/// docs/architecture.md's "Adding a step kind" is a walk-through a maintainer follows, so
/// what it says is there must be (see [`walk_through_problems`]; the kinds' keywords and the
/// example kind `capture` aside).
#[test]
fn the_step_kind_walk_through_names_what_is_there() {
    let problems = walk_through_problems("Adding a step kind", "capture", KIND_WORDS, &[]);
    assert!(
        problems.is_empty(),
        "docs/architecture.md, \"Adding a step kind\":\n{}",
        problems.join("\n")
    );
}

/// docs/architecture.md's "Adding a backend" likewise: the example backend `podman` does
/// not exist, so a file it would have is looked for in the backends that do (its
/// `crates/backend-podman/src/lib.rs` is what `crates/backend-local/src/lib.rs`, `-vm`,
/// `-docker` and `-kube` hold), and the code names the walk-through gives (`BackendOps`,
/// `Deployment`, `BACKENDS`, …) must be words of those files.
#[test]
fn the_backend_walk_through_names_what_is_there() {
    let stand_ins = ["local", "vm", "docker", "kube"];
    let problems = walk_through_problems("Adding a backend", "podman", &[], &stand_ins);
    assert!(
        problems.is_empty(),
        "docs/architecture.md, \"Adding a backend\":\n{}",
        problems.join("\n")
    );
}

/// What is not there of what docs/architecture.md's walk-through `## {title}` says is: every
/// file or folder an item names exists (one named after the walk-through's `example` that
/// does not: the same path after each of `stand_ins`, one of which must exist), every code
/// name of the item (`plan_step`, `StepKind::ALL`, `step_kinds!`; the `keywords` and names
/// of the example aside) is a word of the files that item names, and every test the
/// walk-through says checks it ("Checked by tests:") is a test of the repository.
fn walk_through_problems(
    title: &str,
    example: &str,
    keywords: &[&str],
    stand_ins: &[&str],
) -> Vec<String> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(repo.join("docs/architecture.md")).unwrap();
    let section = doc
        .split(&format!("\n## {title}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("docs/architecture.md has \"## {title}\""));
    let section = section.split("\n## ").next().unwrap();
    let (steps, checked) = section
        .split_once("\nChecked by tests:")
        .unwrap_or_else(|| panic!("\"{title}\" says which tests check it"));
    let code_name =
        regex::Regex::new(r"^[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*!?$").unwrap();
    let mut items: Vec<String> = Vec::new();
    for line in steps.lines() {
        let numbered = line
            .split_once(". ")
            .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        match items.last_mut() {
            Some(item) if !numbered && line.starts_with("   ") => {
                item.push('\n');
                item.push_str(line);
            }
            _ if numbered => items.push(line.to_string()),
            _ => {}
        }
    }
    assert!(
        items.len() >= 5,
        "the walk-through's numbered items: {items:?}"
    );
    let mut problems = Vec::new();
    for item in &items {
        let all = spans(item);
        let paths: Vec<&String> = all
            .iter()
            .filter(|s| s.contains('/') && !s.contains(' '))
            .collect();
        let mut texts = String::new();
        for p in &paths {
            let at = repo.join(p.as_str());
            let found: Vec<PathBuf> = if at.exists() {
                vec![at]
            } else {
                stand_ins
                    .iter()
                    .map(|s| repo.join(p.replace(example, s)))
                    .filter(|a| a.exists())
                    .collect()
            };
            if found.is_empty() {
                problems.push(format!("`{p}` does not exist"));
            }
            for at in found {
                texts.push_str(&text_at(&at));
            }
        }
        for name in all.iter().filter(|s| {
            code_name.is_match(s)
                && !s.to_lowercase().contains(example)
                && !keywords.contains(&s.as_str())
        }) {
            for word in name.trim_end_matches('!').split("::") {
                let w = regex::Regex::new(&format!(r"\b{word}\b")).unwrap();
                if !w.is_match(&texts) {
                    problems.push(format!(
                        "`{name}`: no `{word}` in {}",
                        paths
                            .iter()
                            .map(|p| p.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
            }
        }
    }
    let mut sources = Vec::new();
    for dir in ["crates", "src", "tests"] {
        rust_files(&repo.join(dir), &mut sources);
    }
    let code: String = sources
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap_or_default())
        .collect();
    let tests: Vec<String> = spans(checked)
        .into_iter()
        .filter(|s| code_name.is_match(s) && s.matches('_').count() >= 3)
        .collect();
    assert!(tests.len() >= 4, "the tests named: {tests:?}");
    for t in &tests {
        if !code.contains(&format!("fn {t}(")) {
            problems.push(format!("the test `{t}` does not exist"));
        }
    }
    for p in spans(checked)
        .iter()
        .filter(|s| s.contains('/') && !s.contains(' '))
    {
        if !repo.join(p).exists() {
            problems.push(format!("`{p}` does not exist"));
        }
    }
    problems
}
