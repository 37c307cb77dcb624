//! Read-only commands: list, show, validate, schema, report.

use std::io::IsTerminal;
use std::path::Path;

use rust_i18n::t;

use super::{exit, load_or_report};
use iblab_lab::{self as lab, builtin};

/// `s` padded to `w` terminal columns (a Chinese character takes two).
fn pad(s: &str, w: usize) -> String {
    let n = iblab_report::terminal::cols(s);
    format!("{s}{}", " ".repeat(w.saturating_sub(n)))
}

pub fn list(json: bool) -> i32 {
    let lang = super::lang();
    let l = lang.tag();
    if json {
        let labs: Vec<serde_json::Value> = builtin::all()
            .iter()
            .filter_map(|b| lab::load::load_str(b.name, b.text).ok())
            .map(|l| {
                let m = &l.lab.metadata;
                serde_json::json!({
                    "name": m.name,
                    "lesson": m.lesson,
                    // In the chosen language; `titles` in every language the lab has.
                    "title": m.title.get(lang),
                    "titles": m.title,
                    "scenarios": std::iter::once("default")
                        .chain(l.lab.spec.scenarios.keys().map(String::as_str))
                        .collect::<Vec<_>>(),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&labs).unwrap_or_default()
        );
        return exit::OK;
    }
    println!(
        "{} {} {} {}",
        pad(&t!("list.name", locale = l), 16),
        pad(&t!("list.lesson", locale = l), 7),
        pad(&t!("list.title", locale = l), 64),
        t!("list.scenarios", locale = l)
    );
    for b in builtin::all() {
        match lab::load::load_str(b.name, b.text) {
            Ok(l) => {
                let m = &l.lab.metadata;
                let scenarios: Vec<&str> = std::iter::once("default")
                    .chain(l.lab.spec.scenarios.keys().map(String::as_str))
                    .collect();
                println!(
                    "{} {} {} {}",
                    pad(&m.name, 16),
                    pad(&m.lesson.map(|n| n.to_string()).unwrap_or("-".into()), 7),
                    pad(m.title.get(lang), 64),
                    scenarios.join(", ")
                );
            }
            Err(e) => println!("{:<16} ({} {e})", b.name, t!("list.broken", locale = l)),
        }
    }
    exit::OK
}

/// `show LAB --format svg|dot`: the lab's topology drawn, without a run.
pub fn draw(name: &str, svg: bool, colour: bool) -> i32 {
    use iblab_core::evidence::topology::{Marks, Topology};
    use iblab_report::topology;
    let loaded = match load_or_report(name, colour) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let lab = &loaded.lab;
    let (nodes, links) = iblab_core::plan::wire(lab);
    let sms: Vec<String> = lab
        .spec
        .subnet_managers
        .iter()
        .map(|s| s.on.clone())
        .collect();
    let t = Topology::from_plan(&nodes, &links, &sms);
    if svg {
        println!("{}", topology::svg(&t, &Marks::default(), super::lang()));
    } else {
        print!("{}", topology::dot(&t, &lab.metadata.name));
    }
    exit::OK
}

pub fn show(name: &str, colour: bool) -> i32 {
    let loaded = match load_or_report(name, colour) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let lang = super::lang();
    let tag = lang.tag();
    let l = &loaded.lab;
    let m = &l.metadata;
    println!("{} — {}", m.name, m.title.get(lang));
    if let Some(n) = m.lesson {
        println!("{}", t!("show.lesson", locale = tag, n = n));
    }
    if let Some(g) = &m.goal {
        println!("\n{}", g.get(lang).trim());
    }
    let t = &l.spec.topology;
    println!("\n{}", t!("show.topology", locale = tag));
    println!(
        "  {} {}",
        t!("show.nodes", locale = tag),
        t.nodes.join(", ")
    );
    if !t.switches.is_empty() {
        println!(
            "  {} {}",
            t!("show.switches", locale = tag),
            t.switches.join(", ")
        );
    }
    for link in &t.links {
        println!(
            "  {} {:<10} {}",
            t!("show.link", locale = tag),
            link.id(),
            link.ends.join(" — ")
        );
    }
    println!(
        "{} {}",
        t!("show.paths", locale = tag),
        l.spec
            .paths
            .iter()
            .map(|p| format!("{} {p}", p.mark()))
            .collect::<Vec<_>>()
            .join("  ")
    );
    if !l.spec.params.is_empty() {
        println!(
            "{} {}",
            t!("show.params", locale = tag),
            l.spec
                .params
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("  ")
        );
    }
    println!(
        "\n{}\n  default  {}",
        t!("show.scenarios", locale = tag),
        t!("show.as_written", locale = tag)
    );
    for (name, sc) in &l.spec.scenarios {
        let over: Vec<String> = sc.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!(
            "  {name:<8} {} [{}]",
            sc.description.as_ref().map(|d| d.get(lang)).unwrap_or(""),
            over.join(" ")
        );
    }
    println!("\n{}", t!("show.steps", locale = tag));
    for (i, s) in l.spec.steps.iter().enumerate() {
        let id = lab::step_id(s, i);
        let mut line = format!("  {:>2}. {:<12} {:<8}", i + 1, id, s.kind().unwrap_or("?"));
        if let Some(n) = &s.name {
            line.push_str(n.get(lang));
        }
        if s.finally {
            line.push_str(" [finally]");
        }
        if let Some(w) = &s.when {
            line.push_str(&format!(" [when {w}]"));
        }
        println!("{line}");
    }
    println!("\n{}", t!("show.expectations", locale = tag));
    for (i, e) in l.spec.expect.iter().enumerate() {
        println!("  {}: {}", lab::expectation_id(e, i), e.that);
        println!("      {}", e.because.get(lang).trim());
        if let Some(w) = &e.when {
            println!("      {}", t!("show.judged_when", locale = tag, when = w));
        }
    }
    let others = l.falls_back(lang);
    if !others.is_empty() {
        println!(
            "\n{}",
            t!(
                "show.falls_back",
                locale = tag,
                lang = lang.name(),
                other = others
                    .iter()
                    .map(|o| o.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        );
    }
    exit::OK
}

pub fn validate(name: &str, colour: bool) -> i32 {
    match load_or_report(name, colour) {
        Ok(l) => {
            let scenarios = std::iter::once("default".to_string())
                .chain(l.lab.spec.scenarios.keys().cloned())
                .collect::<Vec<_>>()
                .join(", ");
            println!(
                "{}",
                t!(
                    "validate.ok",
                    locale = super::lang().tag(),
                    file = l.source.name,
                    lab = l.lab.metadata.name,
                    steps = l.lab.spec.steps.len(),
                    expectations = l.lab.spec.expect.len(),
                    scenarios = scenarios
                )
            );
            exit::OK
        }
        Err(code) => code,
    }
}

pub fn schema() -> i32 {
    let schema = schemars::schema_for!(lab::Lab);
    println!(
        "{}",
        serde_json::to_string_pretty(&schema).unwrap_or_default()
    );
    exit::OK
}

pub fn report(dir: &Path, open: bool, rewrite: bool, colour: bool, verbose: bool) -> i32 {
    let e = match iblab_report::read(dir) {
        Ok(e) => e,
        Err(m) => {
            eprintln!("error: {m}");
            return exit::BAD_INPUT;
        }
    };
    if rewrite {
        let written = std::fs::write(dir.join("report.html"), iblab_report::html::render(&e))
            .and_then(|_| std::fs::write(dir.join("junit.xml"), iblab_report::junit::render(&e)));
        if let Err(err) = written {
            eprintln!("error: cannot write into {}: {err}", dir.display());
            return exit::ENVIRONMENT;
        }
    }
    print!(
        "{}",
        iblab_report::terminal::render(&e, colour && std::io::stdout().is_terminal(), verbose)
    );
    if open {
        let page = dir.join("report.html");
        let opened = std::process::Command::new("xdg-open")
            .arg(&page)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !opened {
            eprintln!("could not open a browser; the report is {}", page.display());
        }
    }
    exit::OK
}

pub fn advise(
    situation: crate::advise::Situation,
    file: Option<&Path>,
    runs: &[std::path::PathBuf],
    json: bool,
) -> i32 {
    use crate::advise;
    let situation = match file {
        None => situation,
        Some(f) => {
            let text = match std::fs::read_to_string(f) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("error: {}: cannot read: {e}", f.display());
                    return exit::BAD_INPUT;
                }
            };
            match serde_saphyr::from_str::<advise::Situation>(&text) {
                Ok(s) => s,
                Err(e) => {
                    let at = e
                        .location()
                        .map(|l| format!(":{}:{}", l.line(), l.column()))
                        .unwrap_or_default();
                    eprintln!(
                        "error: {}{at}: {}\n  help: fields are rdmaInUse, nodes, congestion (rare|sometimes|constant), tailLatency (normal|sensitive|extreme), acrossSubnets, ibTeam, muchTcp, existingIb",
                        f.display(),
                        e.without_snippet()
                    );
                    return exit::BAD_INPUT;
                }
            }
        }
    };
    let mut evidence = Vec::new();
    for dir in runs {
        match iblab_report::read(dir) {
            Ok(e) => evidence.push((dir.clone(), e)),
            Err(m) => {
                eprintln!("error: {m}");
                return exit::BAD_INPUT;
            }
        }
    }
    let lang = super::lang();
    let l = lang.tag();
    let advice = advise::advise(&situation, lang);
    let inventory = advise::inventory();
    let ratios = advise::ratios(&evidence);
    if json {
        let doc = serde_json::json!({"situation": situation, "advice": advice, "host_rdma_devices": inventory, "measured_ratios": ratios});
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return exit::OK;
    }
    println!("{}\n", advice.summary);
    println!("{}", t!("advise.why", locale = l));
    for r in &advice.reasons {
        let side = match r.favours {
            advise::Choice::Infiniband => t!("advise.for_ib", locale = l),
            advise::Choice::Roce => t!("advise.for_roce", locale = l),
            advise::Choice::StartWithRoce => t!("advise.for_rdma", locale = l),
        };
        println!(
            "  {}",
            t!(
                "advise.reason_line",
                locale = l,
                side = side,
                weight = r.weight,
                lesson = t!("show.lesson", locale = l, n = r.lesson),
                text = r.text
            )
        );
    }
    println!("\n{}", t!("advise.this_host", locale = l));
    if inventory.is_empty() {
        println!("  {}", t!("advise.no_device", locale = l));
    }
    for d in &inventory {
        println!(
            "  {}",
            t!(
                "advise.device",
                locale = l,
                name = d.name,
                port = d.port,
                link_layer = d.link_layer,
                state = d.state
            )
        );
    }
    if !runs.is_empty() {
        println!("\n{}", t!("advise.measured", locale = l));
        if ratios.is_empty() {
            println!("  {}", t!("advise.no_pairs", locale = l));
        }
        for r in &ratios {
            println!("  {}", advise::ratio_line(r, lang));
        }
    }
    exit::OK
}

#[cfg(test)]
mod tests {
    /// Every step kind of the lab model (`StepKind::ALL`) is a field of a step in the
    /// schema `iblab schema` prints and is described on the lab format's page (the planner
    /// and the evidence: `iblab-core`'s plan tests).
    #[test]
    fn every_step_kind_is_in_the_schema_and_the_format_page() {
        let schema = serde_json::to_value(schemars::schema_for!(iblab_lab::RawStep)).unwrap();
        let page = include_str!("../../docs/lab-format.md");
        for k in iblab_lab::StepKind::ALL {
            let w = k.word();
            assert!(
                schema["properties"].get(w).is_some(),
                "the lab schema has no step field `{w}`"
            );
            assert!(
                page.contains(&format!("`{w}`")),
                "docs/lab-format.md does not describe the step kind `{w}`"
            );
        }
    }
}
