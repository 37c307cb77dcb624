//! The fuzz target's check on stable Rust, bounded, for every `cargo test`: the loader and
//! validator (`load::load_str`, what `iblab validate FILE` and `iblab up FILE` run) are fed
//! the built-in labs, the broken labs, the cargo-fuzz corpus when one is on disk, and
//! inputs mutated from the first two by a seeded generator. Every input must load, or be refused
//! with diagnostics that each name `file:line:col` (the CLI prints them and exits 2), and
//! render; none may panic or take more than a few seconds.
//!
//! `IBLAB_FUZZ_ITERATIONS=N` mutates N inputs (default 10,000); `IBLAB_FUZZ_SEED=S` replays
//! a run (its seed is printed). The cargo-fuzz target in `fuzz/` explores far more, with
//! coverage feedback, but needs a nightly toolchain.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iblab_lab::load::load_str;

use crate::common::rng::Rng;

/// The repository (the root package's folder): the seeds are its files, so the check lives
/// here rather than in `crates/lab`, which keeps only its own data.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file of a folder with this extension (none if the folder is absent), sorted.
fn files(dir: &Path, ext: Option<&str>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    out.retain(|p| p.is_file() && ext.is_none_or(|x| p.extension().is_some_and(|e| e == x)));
    out.sort();
    out
}

/// The seeds the loop mutates: labs/, tests/broken/, tests/labs/ (in the repository, so
/// a seed replays the same inputs anywhere).
fn seeds() -> Vec<(String, String)> {
    let r = root();
    let mut paths = files(&r.join("labs"), Some("yaml"));
    paths.extend(files(&r.join("tests/broken"), Some("yaml")));
    paths.extend(files(&r.join("tests/labs"), Some("yaml")));
    read_all(paths)
}

/// The cargo-fuzz corpus, where a fuzz run left one: replayed as it is, not mutated.
fn corpus() -> Vec<(String, String)> {
    read_all(files(&root().join("fuzz/corpus/load_validate"), None))
}

fn read_all(paths: Vec<PathBuf>) -> Vec<(String, String)> {
    paths
        .into_iter()
        .filter_map(|p| {
            let bytes = std::fs::read(&p).ok()?;
            let text = String::from_utf8(bytes).ok()?;
            Some((p.display().to_string(), text))
        })
        .collect()
}

/// The format's words, from the fuzzer's dictionary, plus tokens that break YAML and
/// expressions and values at the edges of what fields accept.
fn words() -> Vec<String> {
    let dict = std::fs::read_to_string(root().join("fuzz/lab.dict")).unwrap_or_default();
    let mut out: Vec<String> = dict
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix('"')?
                .strip_suffix('"')
                .map(String::from)
        })
        .collect();
    for w in [
        ": ",
        "- ",
        "{",
        "}",
        "[",
        "]",
        "\"",
        "'",
        "#",
        "&a ",
        "*a",
        "!!str ",
        "|\n",
        ">\n",
        "\t",
        "\n",
        "\n  ",
        "{{",
        "}}",
        "{%",
        "%}",
        "steps.",
        ".tcp.",
        "params.",
        "nodes.",
        "0",
        "-1",
        "1e308",
        "-0.0",
        ".nan",
        ".inf",
        "99999999999999999999",
        "4294967296",
        "65536",
        "1500",
        "0s",
        "1ms",
        "9999999h",
        "100mbit",
        "16kb",
        "0.0.0.0/0",
        "~",
        "null",
        "true",
        "<<: ",
        "? ",
        "\u{feff}",
        "é",
        "\u{0}",
        "==",
        " and ",
        " not ",
        "()",
        "[0]",
        "|length",
        "|float",
    ] {
        out.push(w.to_string());
    }
    out
}

/// A char boundary of `s` at or before byte `i`.
fn boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// One mutation of `text` (valid UTF-8 in, valid UTF-8 out: load_file refuses the rest
/// before the loader sees it).
fn mutate(rng: &mut Rng, text: &str, other: &str, words: &[String]) -> String {
    let at = boundary(text, rng.below(text.len() + 1));
    let to = boundary(text, at + rng.below(64));
    let lines: Vec<&str> = text.lines().collect();
    match rng.below(12) {
        // Delete a range.
        0 => format!("{}{}", &text[..at], &text[to.max(at)..]),
        // Insert a word of the format.
        1 => format!(
            "{}{}{}",
            &text[..at],
            words[rng.below(words.len())],
            &text[at..]
        ),
        // Replace a range with a word.
        2 => format!(
            "{}{}{}",
            &text[..at],
            words[rng.below(words.len())],
            &text[to.max(at)..]
        ),
        // Duplicate a range in place.
        3 => format!(
            "{}{}{}",
            &text[..to.max(at)],
            &text[at..to.max(at)],
            &text[at..]
        ),
        // Swap two lines.
        4 if lines.len() > 1 => {
            let mut l = lines.clone();
            let (a, b) = (rng.below(l.len()), rng.below(l.len()));
            l.swap(a, b);
            l.join("\n")
        }
        // Indent or dedent a line.
        5 if !lines.is_empty() => {
            let mut l: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
            let i = rng.below(l.len());
            l[i] = if rng.below(2) == 0 {
                format!("  {}", l[i])
            } else {
                l[i].trim_start().to_string()
            };
            l.join("\n")
        }
        // Splice in lines of another seed.
        6 => {
            let o: Vec<&str> = other.lines().collect();
            let from = rng.below(o.len().max(1));
            let take = o.iter().skip(from).take(1 + rng.below(6)).copied();
            let mut l: Vec<&str> = lines.clone();
            let i = rng.below(l.len() + 1);
            let spliced: Vec<&str> = take.collect();
            l.splice(i..i, spliced);
            l.join("\n")
        }
        // Replace a number with one at the edge of what a field takes.
        7 => {
            let digits: Vec<usize> = text
                .char_indices()
                .filter(|(_, c)| c.is_ascii_digit())
                .map(|(i, _)| i)
                .collect();
            if digits.is_empty() {
                return text.to_string();
            }
            let i = digits[rng.below(digits.len())];
            let j = text[i..]
                .find(|c: char| !c.is_ascii_digit())
                .map_or(text.len(), |n| i + n);
            let edge = [
                "0",
                "-1",
                "65535",
                "65536",
                "4294967297",
                "99999999999999999999",
                "1e400",
            ];
            format!(
                "{}{}{}",
                &text[..i],
                edge[rng.below(edge.len())],
                &text[j..]
            )
        }
        // Replace one word of the file with another of its words (a node, a step id, a
        // field name, a value): the YAML stays well formed, so the validator is reached.
        8..=10 => swap_values(rng, text, false),
        // Truncate.
        _ => text[..at].to_string(),
    }
}

/// Replace one word of `text` with another of its words; with `values_only`, neither is a
/// mapping key (a word followed by `:`), so the typed model still parses and the
/// validator's cross-checks (names, expressions, templates, metrics) get the input.
fn swap_values(rng: &mut Rng, text: &str, values_only: bool) -> String {
    let mut spans = word_spans(text);
    if values_only {
        spans.retain(|&(_, j)| !text[j..].starts_with(':'));
    }
    if spans.is_empty() {
        return text.to_string();
    }
    let (i, j) = spans[rng.below(spans.len())];
    let (k, l) = spans[rng.below(spans.len())];
    format!("{}{}{}", &text[..i], &text[k..l], &text[j..])
}

/// Byte ranges of the identifier-like words of `text` (`[A-Za-z0-9_.-]+`).
fn word_spans(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        let w = c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
        match (w, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, text.len()));
    }
    out
}

/// Load one input; a refusal must carry a position for every diagnostic, and render.
/// What became of one input.
enum Outcome {
    Loaded,
    /// Refused while parsing (YAML or the typed model).
    RefusedParsing,
    /// Parsed, then refused by validation.
    RefusedValidating,
}

fn check(name: &str, text: &str) -> Result<Outcome, String> {
    let result = std::panic::catch_unwind(|| {
        load_str("fuzz.yaml", text).map_err(|e| (e.render(false), e.diagnostics))
    });
    match result {
        Err(p) => {
            let why = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let shown: String = text.chars().take(3000).collect();
            Err(format!(
                "{name}: the loader panicked: {why}\n--- input ---\n{shown}\n--- end ---"
            ))
        }
        Ok(Ok(_)) => Ok(Outcome::Loaded),
        Ok(Err((rendered, diags))) => {
            if diags.is_empty() {
                return Err(format!("{name}: refused with no diagnostic"));
            }
            for d in &diags {
                if d.line == 0 || d.col == 0 || !d.location().starts_with("fuzz.yaml:") {
                    return Err(format!("{name}: a refusal without file:line:col: {d}"));
                }
                if d.message.trim().is_empty() {
                    return Err(format!(
                        "{name}: a refusal with no message at {}",
                        d.location()
                    ));
                }
                if !rendered.contains(&format!("error: {}:", d.location())) {
                    return Err(format!("{name}: the rendering lacks {}", d.location()));
                }
            }
            // Did it get past the parser, to the validator's deeper checks?
            let parsed =
                std::panic::catch_unwind(|| serde_saphyr::from_str::<iblab_lab::Lab>(text).is_ok())
                    .unwrap_or(false);
            Ok(if parsed {
                Outcome::RefusedValidating
            } else {
                Outcome::RefusedParsing
            })
        }
    }
}

#[test]
fn every_mutated_lab_loads_or_is_refused_at_a_position_never_a_panic() {
    let seeds = seeds();
    assert!(seeds.len() >= 30, "only {} seeds found", seeds.len());
    let words = words();
    let corpus = corpus();
    let seed: u64 = std::env::var("IBLAB_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x1b1a_b5eed);
    let iterations: usize = std::env::var("IBLAB_FUZZ_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    eprintln!(
        "{} seeds, {} corpus inputs, {iterations} mutated inputs, seed {seed} (IBLAB_FUZZ_SEED={seed} replays it)",
        seeds.len(),
        corpus.len()
    );
    // The loop runs in a thread watched from here: an input that hangs the loader fails
    // the test naming it, instead of hanging the suite.
    let done = Arc::new(AtomicUsize::new(0));
    let current = Arc::new(Mutex::new(String::new()));
    let (d, c) = (done.clone(), current.clone());
    let worker = std::thread::spawn(move || -> (Vec<String>, usize, [usize; 2]) {
        // Panics are expected to be caught and reported, not printed by the hook.
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let mut failures = Vec::new();
        let (mut loaded, mut refused) = (0, [0, 0]);
        let mut tally = |r: Result<Outcome, String>| match r {
            Ok(Outcome::Loaded) => loaded += 1,
            Ok(Outcome::RefusedParsing) => refused[0] += 1,
            Ok(Outcome::RefusedValidating) => refused[1] += 1,
            Err(e) => failures.push(e),
        };
        for (name, text) in seeds.iter().chain(&corpus) {
            *c.lock().unwrap() = text.clone();
            tally(check(name, text));
            d.fetch_add(1, Ordering::SeqCst);
        }
        let mut rng = Rng(seed);
        for n in 0..iterations {
            let (_, base) = &seeds[rng.below(seeds.len())];
            let (_, other) = &seeds[rng.below(seeds.len())];
            let mut text = base.clone();
            // Half the inputs only swap values, to get past the parser more often.
            let gentle = rng.below(2) == 0;
            for _ in 0..1 + rng.below(4) {
                text = if gentle {
                    swap_values(&mut rng, &text, true)
                } else {
                    mutate(&mut rng, &text, other, &words)
                };
            }
            *c.lock().unwrap() = text.clone();
            tally(check(&format!("mutation {n} of seed {seed}"), &text));
            d.fetch_add(1, Ordering::SeqCst);
        }
        std::panic::set_hook(hook);
        (failures, loaded, refused)
    });
    let mut last = (0, Instant::now());
    while !worker.is_finished() {
        std::thread::sleep(Duration::from_millis(50));
        let now = done.load(Ordering::SeqCst);
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(10) {
            panic!(
                "the loader took over 10 s on input #{now} (seed {seed}):\n{}",
                current.lock().unwrap()
            );
        }
    }
    let (failures, loaded, refused) = worker.join().unwrap();
    eprintln!(
        "{loaded} loaded; refused with a position: {} while parsing, {} by validation; {} failures",
        refused[0],
        refused[1],
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        refused[0] + refused[1] > iterations / 2,
        "too few refusals: the mutations do not bite"
    );
    assert!(
        refused[1] > iterations / 10,
        "too few inputs reach the validator: {refused:?}"
    );
}
