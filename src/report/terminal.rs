//! The summary printed at the end of a run (colour only on a terminal).

use crate::evidence::{Evidence, Group, RunVerdict, Verdict};
use crate::lab::PathKind;

struct Paint(bool);

impl Paint {
    fn code(&self, code: &str, s: &str) -> String {
        if self.0 {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    fn verdict(&self, v: Verdict, s: &str) -> String {
        match v {
            Verdict::Pass => self.code("32", s),
            Verdict::Fail | Verdict::Error => self.code("31", s),
            Verdict::Skipped => self.code("90", s),
        }
    }
}

/// The summary of a run: what it is about (the lab's declared comparison, each
/// expectation with the values it judged), then the verdict. `verbose` adds every raw
/// measurement.
pub fn render(e: &Evidence, colour: bool, verbose: bool) -> String {
    let p = Paint(colour);
    let mut out = String::new();
    out.push_str(&format!(
        "\n{}  {}\n  scenario {} · backend {} · paths {}\n",
        p.code("1", &e.lab),
        e.title,
        e.scenario,
        e.backend,
        e.paths
            .iter()
            .map(|x| format!("{} {x}", x.mark()))
            .collect::<Vec<_>>()
            .join(" ")
    ));
    for (path, why) in &e.excluded_paths {
        out.push_str(&format!("  {} {path} not run: {why}\n", path.mark()));
    }
    out.push_str(&table(&p, "comparison", &e.comparison.rows));
    if verbose {
        out.push_str(&table(&p, "all measurements", &e.measurements.rows));
    } else if !e.measurements.rows.is_empty() {
        out.push_str(&format!(
            "\n  {} raw measurements: -v here, or evidence.json and report.html\n",
            e.measurements.rows.len()
        ));
    }

    if !e.expectations.is_empty() {
        out.push_str("\n  expectations\n");
        for x in &e.expectations {
            out.push_str(&format!(
                "  {} {}\n",
                p.verdict(x.verdict, x.verdict.symbol()),
                p.code("1", &x.id)
            ));
            out.push_str(&format!("      {}\n", x.explanation));
            let failed = matches!(x.verdict, Verdict::Fail | Verdict::Error);
            if failed {
                out.push_str(&format!(
                    "      {} {}\n",
                    p.code("90", "that:"),
                    x.expression
                ));
            }
            if x.verdict != Verdict::Skipped && !x.observed.is_empty() {
                let seen: Vec<String> = x
                    .observed
                    .iter()
                    .map(|(k, v)| format!("{k} = {}", fmt_observed(v)))
                    .collect();
                out.push_str(&format!(
                    "      {} {}\n",
                    p.code("90", "saw:"),
                    seen.join(" · ")
                ));
            }
        }
    }
    let tolerated: Vec<String> = e
        .steps
        .iter()
        .filter(|s| s.allowed_to_fail && matches!(s.verdict, Verdict::Fail | Verdict::Error))
        .map(|s| match s.path {
            Some(path) => format!("{} [{} {path}]", s.id, path.mark()),
            None => s.id.clone(),
        })
        .collect();
    if !tolerated.is_empty() {
        out.push_str(&format!(
            "\n  {} failed as the lab allows (continueOnError: the failure is evidence the expectations judge)\n",
            tolerated.join(", ")
        ));
    }
    for n in &e.notes {
        out.push_str(&format!("\n  note: {n}"));
    }
    let count =
        |f: &dyn Fn(Verdict) -> bool| e.expectations.iter().filter(|x| f(x.verdict)).count();
    let passed = count(&|v| v == Verdict::Pass);
    let failed = count(&|v| matches!(v, Verdict::Fail | Verdict::Error));
    let skipped = count(&|v| v == Verdict::Skipped);
    let verdict = match e.verdict {
        RunVerdict::Pass => p.code("32;1", "PASS"),
        RunVerdict::Fail => p.code("31;1", "FAIL"),
        RunVerdict::Error => p.code("31;1", "ERROR"),
        RunVerdict::Interrupted => p.code("33;1", "INTERRUPTED"),
    };
    let skipped_word = if e.verdict == RunVerdict::Interrupted {
        "not judged"
    } else {
        "skipped"
    };
    out.push_str(&format!(
        "\n\n  {verdict}  {passed} held, {failed} failed, {skipped} {skipped_word} · {:.1}s · evidence in {}\n",
        e.duration_s,
        shown(&e.run_dir).display()
    ));
    out
}

/// Width of a value column: room for the widest cell, at most this.
const CELL_MAX: usize = 22;

/// Rows under ① ② ③ in aligned columns, grouped host-internal / network layer; a row
/// where ② = ③ by its rule is grey and marked `=`, one where they differ green `≠`.
fn table(p: &Paint, title: &str, rows: &[crate::evidence::ComparisonRow]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let label = |r: &crate::evidence::ComparisonRow| {
        let hw = if r.needs_hardware {
            " (gain: needs hardware)"
        } else {
            ""
        };
        if r.unit.is_empty() {
            format!("{}{hw}", r.name)
        } else {
            format!("{} [{}]{hw}", r.name, r.unit)
        }
    };
    let cell = |r: &crate::evidence::ComparisonRow, path: PathKind| match r.values.get(&path) {
        Some(c) => format!(
            "{} ({})",
            cut(&fmt_text(&c.value), CELL_MAX - 8),
            short(c.provenance)
        ),
        None => "—".into(),
    };
    let name_w = rows
        .iter()
        .map(|r| label(r).chars().count())
        .chain([title.chars().count()])
        .max()
        .unwrap_or(0)
        .min(60);
    let cell_w = rows
        .iter()
        .flat_map(|r| PathKind::ALL.map(|path| cell(r, path).chars().count()))
        .max()
        .unwrap_or(0)
        .clamp(8, CELL_MAX);
    let mut out = format!("\n  {}", pad(title, name_w));
    for path in PathKind::ALL {
        out.push_str(&format!(
            "  {}",
            lpad(&format!("{} {path}", path.mark()), cell_w)
        ));
    }
    out.push('\n');
    for group in [Group::Host, Group::Network] {
        let in_group: Vec<_> = rows.iter().filter(|r| r.group == group).collect();
        if in_group.is_empty() {
            continue;
        }
        out.push_str(&format!(
            "  {}\n",
            if group == Group::Host {
                "host-internal"
            } else {
                "network layer"
            }
        ));
        for r in in_group {
            let mut line = format!("  {}", pad(&cut(&label(r), name_w), name_w));
            for path in PathKind::ALL {
                line.push_str(&format!("  {}", lpad(&cell(r, path), cell_w)));
            }
            let line = match r.roce_equals_ib {
                Some(true) => p.code("90", &format!("{line}  =")),
                Some(false) => p.code("32", &format!("{line}  ≠")),
                None => line,
            };
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// Pad on the right to `w` characters (not bytes: ① and → are one character each).
fn pad(s: &str, w: usize) -> String {
    let n = s.chars().count();
    format!("{s}{}", " ".repeat(w.saturating_sub(n)))
}

/// Pad on the left to `w` characters.
fn lpad(s: &str, w: usize) -> String {
    let n = s.chars().count();
    format!("{}{s}", " ".repeat(w.saturating_sub(n)))
}

/// At most `w` characters, an ellipsis marking a cut.
fn cut(s: &str, w: usize) -> String {
    if s.chars().count() <= w {
        s.to_string()
    } else {
        format!(
            "{}…",
            s.chars().take(w.saturating_sub(1)).collect::<String>()
        )
    }
}

/// An observed value, short: numbers formatted, long texts cut.
fn fmt_observed(v: &serde_json::Value) -> String {
    cut(&fmt_text(v), 60)
}

/// A run folder as the user would type it: relative to the current folder when inside it.
fn shown(dir: &std::path::Path) -> std::path::PathBuf {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| dir.strip_prefix(cwd).ok().map(|p| p.to_path_buf()))
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| dir.to_path_buf())
}

fn short(k: crate::evidence::ProvenanceKind) -> &'static str {
    use crate::evidence::ProvenanceKind::*;
    match k {
        Hardware => "hw",
        Soft => "soft",
        Emulated => "emul",
        Modelled => "model",
    }
}

/// A text cell in full (strings without their JSON quotes).
fn fmt_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => fmt_num(n.as_f64().unwrap_or(0.0)),
        other => other.to_string(),
    }
}

pub fn fmt_num(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}
