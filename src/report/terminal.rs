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

pub fn render(e: &Evidence, colour: bool) -> String {
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

    if !e.comparison.rows.is_empty() {
        out.push_str("\n  comparison");
        for path in PathKind::ALL {
            out.push_str(&format!("{:>16}", format!("{} {path}", path.mark())));
        }
        out.push('\n');
        for group in [Group::Host, Group::Network] {
            let rows: Vec<_> = e
                .comparison
                .rows
                .iter()
                .filter(|r| r.group == group)
                .collect();
            if rows.is_empty() {
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
            for r in rows {
                let unit = if r.unit.is_empty() {
                    String::new()
                } else {
                    format!(" [{}]", r.unit)
                };
                let texts = r.values.values().any(|c| c.number().is_none());
                let line = if texts {
                    // Observations (text) read better one after another than in columns.
                    let cells: Vec<String> = PathKind::ALL
                        .iter()
                        .filter_map(|p| {
                            r.values.get(p).map(|c| {
                                format!(
                                    "{} {} ({})",
                                    p.mark(),
                                    fmt_text(&c.value),
                                    short(c.provenance)
                                )
                            })
                        })
                        .collect();
                    format!("    {}{unit}: {}", r.name, cells.join(" · "))
                } else {
                    let mut line = format!("    {:<34}", format!("{}{unit}", r.name));
                    for path in PathKind::ALL {
                        let cell = match r.values.get(&path) {
                            Some(c) => format!("{} ({})", fmt_value(&c.value), short(c.provenance)),
                            None => "—".into(),
                        };
                        line.push_str(&format!("{cell:>16}"));
                    }
                    line
                };
                let line = match r.roce_equals_ib {
                    Some(true) => p.code("90", &line),
                    Some(false) => p.code("32", &line),
                    None => line,
                };
                out.push_str(&line);
                out.push('\n');
            }
        }
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
            if matches!(x.verdict, Verdict::Fail | Verdict::Error) {
                out.push_str(&format!(
                    "      {} {}\n",
                    p.code("90", "that:"),
                    x.expression
                ));
                for (k, v) in &x.observed {
                    out.push_str(&format!("      {} {k} = {v}\n", p.code("90", "saw:")));
                }
            }
        }
    }
    for n in &e.notes {
        out.push_str(&format!("\n  note: {n}"));
    }
    let passed = e
        .expectations
        .iter()
        .filter(|x| x.verdict == Verdict::Pass)
        .count();
    let failed = e
        .expectations
        .iter()
        .filter(|x| matches!(x.verdict, Verdict::Fail | Verdict::Error))
        .count();
    let skipped = e
        .expectations
        .iter()
        .filter(|x| x.verdict == Verdict::Skipped)
        .count();
    let verdict = match e.verdict {
        RunVerdict::Pass => p.code("32;1", "PASS"),
        RunVerdict::Fail => p.code("31;1", "FAIL"),
        RunVerdict::Error => p.code("31;1", "ERROR"),
        RunVerdict::Interrupted => p.code("33;1", "INTERRUPTED"),
    };
    out.push_str(&format!(
        "\n\n  {verdict}  {passed} held, {failed} failed, {skipped} skipped · {:.1}s · evidence in {}\n",
        e.duration_s,
        shown(&e.run_dir).display()
    ));
    out
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

/// A cell: numbers as [`fmt_num`], text cut to fit a column.
pub fn fmt_value(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Number(n) => fmt_num(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) if s.chars().count() > 16 => {
            format!("{}…", s.chars().take(15).collect::<String>())
        }
        serde_json::Value::String(s) => s.clone(),
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
