//! report.html: one self-contained page (no external assets) a learner can open.

use crate::evidence::{Evidence, Group, Verdict};
use crate::lab::PathKind;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub fn render(e: &Evidence) -> String {
    let mut body = String::new();
    body.push_str(&format!(
        "<h1>{}</h1><p class=sub>lab <b>{}</b> · scenario <b>{}</b> · backend <b>{}</b> · verdict <b class={v}>{v}</b> · {:.1}s</p>",
        esc(&e.title),
        esc(&e.lab),
        esc(&e.scenario),
        esc(&e.backend),
        e.duration_s,
        v = format!("{:?}", e.verdict).to_lowercase()
    ));
    if !e.comparison.rows.is_empty() {
        body.push_str("<h2>Comparison</h2><table><tr><th>row</th><th>unit</th>");
        for p in PathKind::ALL {
            body.push_str(&format!("<th>{} {p}</th>", p.mark()));
        }
        body.push_str("</tr>");
        for group in [Group::Host, Group::Network] {
            body.push_str(&format!(
                "<tr><td colspan=5 class=group>{}</td></tr>",
                if group == Group::Host {
                    "host-internal"
                } else {
                    "network layer"
                }
            ));
            for r in e.comparison.rows.iter().filter(|r| r.group == group) {
                let class = match r.roce_equals_ib {
                    Some(true) => "same",
                    Some(false) => "differ",
                    None => "",
                };
                body.push_str(&format!(
                    "<tr class={class}><td>{}</td><td>{}</td>",
                    esc(&r.name),
                    esc(&r.unit)
                ));
                for p in PathKind::ALL {
                    match r.values.get(&p) {
                        Some(c) => body.push_str(&format!(
                            "<td>{} <small>{:?}</small></td>",
                            crate::report::terminal::fmt_num(c.value),
                            c.provenance
                        )),
                        None => body.push_str("<td>—</td>"),
                    }
                }
                body.push_str("</tr>");
            }
        }
        body.push_str("</table>");
    }
    body.push_str("<h2>Expectations</h2><ul>");
    for x in &e.expectations {
        body.push_str(&format!(
            "<li class={}><b>{} {}</b> — {}<br><code>{}</code></li>",
            x.verdict.as_str(),
            x.verdict.symbol(),
            esc(&x.id),
            esc(&x.explanation),
            esc(&x.expression)
        ));
    }
    body.push_str("</ul><h2>Steps</h2><table><tr><th>step</th><th>path</th><th>verdict</th><th>seconds</th><th>metrics</th><th>provenance</th><th>log</th></tr>");
    for s in &e.steps {
        let metrics: Vec<String> = s
            .metrics
            .iter()
            .map(|(k, m)| {
                format!(
                    "{k} = {} {}",
                    crate::report::terminal::fmt_num(m.value),
                    esc(&m.unit)
                )
            })
            .collect();
        body.push_str(&format!(
            "<tr class={}><td>{}</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            s.verdict.as_str(),
            esc(&s.id),
            s.path.map(|p| format!("{} {p}", p.mark())).unwrap_or_default(),
            s.verdict.as_str(),
            s.duration_s,
            metrics.join("<br>"),
            s.provenance.as_ref().map(|p| format!("{:?}: {}", p.kind, esc(&p.source))).unwrap_or_default(),
            s.log.as_ref().map(|l| format!("<a href=\"{0}\">{0}</a>", esc(l))).unwrap_or_default(),
        ));
    }
    body.push_str("</table>");
    for n in &e.notes {
        body.push_str(&format!("<p class=note>{}</p>", esc(n)));
    }
    let _ = Verdict::Pass;
    format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>iblab {lab} {sc}</title><style>{CSS}</style></head><body>{body}</body></html>\n",
        lab = esc(&e.lab),
        sc = esc(&e.scenario)
    )
}

const CSS: &str = "body{font-family:system-ui,sans-serif;margin:2em;max-width:70em;color:#222}\
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}\
.same{color:#888}.differ{background:#e8f7e8}.group{font-weight:bold;background:#f4f4f4}\
.pass{color:#176b1f}.fail,.error{color:#b00020}.skipped{color:#888}.sub{color:#555}.note{color:#555;font-size:.9em}\
small{color:#777}code{background:#f4f4f4;padding:0 .3em}";
