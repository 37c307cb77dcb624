//! report.html: one self-contained page (inline CSS and SVG, no external assets, no
//! script): the lab drawn, throughput over time per path ([`super::graphs`]), stage
//! diagrams per path, the comparison, throughput and retention, the expectations with
//! their explanations, the steps with links to their logs, and last the run's notes.

use minijinja::value::Kwargs;
use minijinja::{AutoEscape, Environment};
use serde::Serialize;

use super::stages;
use iblab_core::evidence::{Evidence, ProvenanceKind};
use iblab_lab::{Lang, PathKind};

const TEMPLATE: &str = include_str!("report.html");

#[derive(Serialize)]
struct Bar {
    label: String,
    value: f64,
    unit: String,
    provenance: String,
    /// Retention as the labs define it (see [`super::retention`]); absent where no fault
    /// was in place or no clean measurement of the path came before (no baseline).
    retention: Option<f64>,
    /// What the retention is a share of.
    retention_of: Option<String>,
    colour: &'static str,
}

use super::graphs::colour;

/// One bar per traffic measurement that reported a throughput.
fn bars(e: &Evidence) -> Vec<Bar> {
    let mut out = Vec::new();
    for p in PathKind::ALL {
        for s in e.steps.iter().filter(|s| s.path == Some(p)) {
            let Some((name, m)) = ["throughput_mbps", "bandwidth_gbps"]
                .iter()
                .find_map(|n| s.metrics.get(*n).map(|m| (*n, m)))
            else {
                continue;
            };
            let _ = name;
            let kept = super::retention::of(e, &s.id, p);
            out.push(Bar {
                label: format!("{} {} · {}", p.mark(), p, s.id),
                value: m.value,
                unit: m.unit.clone(),
                provenance: s
                    .provenance
                    .as_ref()
                    .map(|p| p.kind.as_str().to_string())
                    .unwrap_or_default(),
                retention: kept.as_ref().map(|r| r.share),
                retention_of: kept.as_ref().map(|r| r.of_in(e.lang)),
                colour: colour(p),
            });
        }
    }
    out
}

/// The report's own words in `lang`, for the template: `t("key", name=value)` fills in
/// `%{name}`.
fn words(lang: Lang) -> impl Fn(&str, Kwargs) -> Result<String, minijinja::Error> {
    move |key: &str, args: Kwargs| {
        let mut text = rust_i18n::t!(key, locale = lang.tag()).into_owned();
        for name in args.args() {
            let v: minijinja::Value = args.get(name)?;
            text = text.replace(&format!("%{{{name}}}"), &v.to_string());
        }
        Ok(text)
    }
}

pub fn render(e: &Evidence) -> String {
    let mut env = Environment::new();
    env.set_auto_escape_callback(|_| AutoEscape::Html);
    env.add_function("t", words(e.lang));
    if let Err(err) = env.add_template("report.html", TEMPLATE) {
        return format!(
            "<!doctype html><title>iblab report</title><p>report template error: {err}</p>"
        );
    }
    let bars = bars(e);
    let max_bar = bars
        .iter()
        .map(|b| b.value)
        .fold(0.0_f64, f64::max)
        .max(f64::MIN_POSITIVE);
    let rendered = env.get_template("report.html").and_then(|t| {
        let ctx = serde_json::json!({
            "e": e,
            "topology": (!e.topology.nodes.is_empty()).then(|| {
                super::topology::svg(&e.topology, &iblab_core::evidence::topology::Marks::from_evidence(e), e.lang)
            }),
            "stages": stages::paths(e),
            "graphs": super::graphs::html(
                &super::graphs::Run {
                    paths: &e.paths,
                    excluded: &e.excluded_paths,
                    steps: &e.steps,
                    running: false,
                },
                &super::graphs::Words::of(e.lang),
            ),
            "bars": bars,
            "max_bar": max_bar,
            // What produced a figure, in the reader's words, by the word evidence.json writes.
            "prov": ProvenanceKind::ALL
                .iter()
                .map(|k| (k.as_str(), k.word(e.lang)))
                .collect::<std::collections::BTreeMap<_, _>>(),
        });
        t.render(minijinja::Value::from(minijinja::value::Serde(ctx)))
    });
    match rendered {
        Ok(html) => html,
        Err(err) => format!(
            "<!doctype html><title>iblab report</title><p>report rendering failed: {err}</p>"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence() -> Evidence {
        serde_json::from_str(include_str!(
            "../../../tests/fixtures/evidence/tcp-loss.json"
        ))
        .unwrap()
    }

    #[test]
    fn renders_every_section_from_real_evidence() {
        let html = render(&evidence());
        for part in [
            "Throughput over time",
            "How the bytes travel",
            "Comparison",
            "Throughput",
            "Expectations",
            "Steps",
            "loss_costs_throughput",
            "clean.tcp.iperf3-client.log",
        ] {
            assert!(html.contains(part), "{part} missing");
        }
        assert_eq!(
            html.matches("<svg").count(),
            7,
            "three graphs over time, three stage diagrams and one chart"
        );
        assert!(!html.contains("report rendering failed"));
        assert!(!html.contains("<script"), "the report needs no script");
        assert!(
            !html.contains("http://")
                || html.matches("http://").count() == html.matches("http://www.w3.org/").count(),
            "no external assets"
        );
    }

    #[test]
    fn retention_is_shown_only_against_a_baseline() {
        let b = bars(&evidence());
        assert_eq!(b.len(), 2);
        assert_eq!(
            b[0].retention, None,
            "the clean measurement is the baseline"
        );
        let r = b[1].retention.unwrap();
        assert!(r < 1.0 && r > 0.0);
        assert_eq!(
            b[1].retention_of
                .as_deref()
                .map(|s| s.starts_with("of clean ")),
            Some(true)
        );
        let html = render(&evidence());
        assert!(
            html.contains("retained of clean"),
            "the chart says what the share is of"
        );
    }

    #[test]
    fn a_group_without_rows_has_no_heading() {
        let heading = |g: &str| format!("<td class=\"group\" colspan=\"6\">{g}</td>");
        let html = render(&evidence());
        assert_eq!(html.matches(&heading("host-internal")).count(), 1);
        assert_eq!(html.matches(&heading("network layer")).count(), 1);

        // Lesson 4: network rows only.
        let mut e = evidence();
        e.comparison
            .rows
            .retain(|r| r.group == iblab_core::evidence::Group::Network);
        assert!(!e.comparison.rows.is_empty());
        let html = render(&e);
        assert!(
            !html.contains(">host-internal</td>"),
            "an empty group drawn"
        );
        assert_eq!(html.matches(&heading("network layer")).count(), 1);
        assert!(!html.contains("report rendering failed"));

        e.comparison.rows.clear();
        let html = render(&e);
        assert!(!html.contains(">network layer</td>"));
    }

    /// The lab first, the backend's notes after it (they were five paragraphs before the
    /// lab on the vm backend).
    #[test]
    fn the_notes_come_after_the_lab() {
        let mut e = evidence();
        e.notes = vec!["a note of the backend".into()];
        let html = render(&e);
        let note = html.find("a note of the backend").unwrap();
        for before in [
            "<h2>Throughput over time",
            "<h2>How the bytes travel",
            "<h2>Expectations",
            "<h2>Steps",
        ] {
            assert!(
                html.find(before).unwrap() < note,
                "{before} after the notes"
            );
        }
    }

    #[test]
    fn text_from_the_lab_is_escaped() {
        let mut e = evidence();
        e.title = "<script>alert(1)</script>".into();
        let html = render(&e);
        assert!(!html.contains("<script>alert(1)"));
        assert!(html.contains("&lt;script&gt;"));
    }
}
