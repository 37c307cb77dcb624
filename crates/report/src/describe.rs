//! A plan in words (`iblab plan`): the run's choices, its nodes, every step it will take
//! and the programs it will start. Pure functions of the plan and what its backend said of
//! it; the binary prints them.

use iblab_core::caps::preflight::{Check, Mark};
use iblab_core::plan::{Action, Fault, Plan, PlannedStep, Probe, SmControl, Traffic, Wait};
use iblab_core::programs::{Needs, Place, Provider};
use iblab_lab::PathKind;

/// The plan in words. `iblab_in_nodes`: how iblab gets into the nodes, when the plan runs
/// it there (its backend knows; the binary asks it).
pub fn plan(p: &Plan, iblab_in_nodes: Option<&str>) -> String {
    let mut o = header(p);
    if let Some(how) = iblab_in_nodes {
        o.push_str(&format!("iblab in the nodes: {how}\n"));
    }
    if !p.preflight.is_empty() {
        o.push_str(&format!("preflight (softroce on {}):\n", p.backend));
        for c in &p.preflight {
            o.push_str(&format!("{}\n", preflight_line(c, false)));
        }
    }
    o.push_str(&nodes(p));
    o.push_str("steps:\n");
    for s in &p.steps {
        o.push_str(&step_line(p, s));
        o.push('\n');
    }
    o.push_str(&format!(
        "expectations: {}\n",
        p.expectations
            .iter()
            .map(|e| e.id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    o
}

/// What the run is, on which backend and why, its paths (and those left out), the
/// adapter that carries a path, and the parameters.
fn header(p: &Plan) -> String {
    let mut o = format!(
        "plan for {} · scenario {} · backend {}\n  ({})\n",
        p.lab, p.scenario, p.backend, p.backend_reason
    );
    o.push_str(&format!(
        "paths: {}\n",
        p.paths
            .iter()
            .map(|x| format!("{} {x}", x.mark()))
            .collect::<Vec<_>>()
            .join(" ")
    ));
    for (path, why) in &p.excluded {
        o.push_str(&format!("  {} {path} left out: {why}\n", path.mark()));
    }
    if let Some(h) = &p.hca {
        let place = if h.in_nodes {
            format!(
                " in every lab node, given to it by the {} backend (its link layer, {}, is checked there before the steps)",
                p.backend, h.link_layer
            )
        } else {
            format!(" on this host (link layer {})", h.link_layer)
        };
        o.push_str(&format!(
            "adapter: {}:{} carries {} {}{place}\n",
            h.device,
            h.port,
            h.path.mark(),
            h.path,
        ));
    }
    if !p.params.is_empty() {
        o.push_str(&format!(
            "params: {}\n",
            p.params
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    o
}

/// Each node: host or switch, and its interfaces with their addresses and links.
fn nodes(p: &Plan) -> String {
    let mut o = String::from("nodes:\n");
    for n in &p.nodes {
        let ifs: Vec<String> = n
            .interfaces
            .iter()
            .map(|i| {
                format!(
                    "{}{} ({})",
                    i.name,
                    i.address
                        .as_deref()
                        .map(|a| format!(" {a}"))
                        .unwrap_or_default(),
                    i.link
                )
            })
            .collect();
        let role = if n.stp {
            "switch+stp"
        } else if n.switch {
            "switch"
        } else {
            "host"
        };
        o.push_str(&format!("  {:<8} {:<7} {}\n", n.name, role, ifs.join(", ")));
    }
    o
}

/// A step: its id, what it does, and when it runs (`finally`, `when`) or why it will not.
fn step_line(p: &Plan, s: &PlannedStep) -> String {
    let mut line = format!("  {:<12} {}", s.id, action(p, s));
    if s.finally {
        line.push_str("  [finally]");
    }
    if let Some(w) = &s.when {
        line.push_str(&format!("  [when {w}]"));
    }
    if let Some(why) = &s.skip {
        line.push_str(&format!("  [skipped: {why}]"));
    }
    line
}

/// What a step does, in words.
fn action(p: &Plan, s: &PlannedStep) -> String {
    match &s.action {
        Action::Exec { node, argv, .. } => format!("exec on {node}: {}", argv.join(" ")),
        Action::Traffic(t) => traffic(s.path, t),
        Action::Fault(f) => fault(p, f),
        Action::Wait(Wait { inner, until, .. }) => match inner.as_ref() {
            Action::Exec { node, argv, .. } => {
                format!("wait on {node}: {} until {until}", argv.join(" "))
            }
            Action::Probe(Probe { what, node, .. }) => {
                format!("wait on {node}: probe {} until {until}", what.as_str())
            }
            _ => format!("wait until {until}"),
        },
        Action::Probe(Probe {
            what,
            node,
            from,
            to,
            ..
        }) => match (from, to) {
            (Some(f), Some(t)) => format!("ib probe {} {f} → {t}", what.as_str()),
            _ => format!("ib probe {} from {node}", what.as_str()),
        },
        Action::Sm(SmControl { name, action }) => {
            format!("ib subnet manager {name}: {}", action.as_str())
        }
        Action::Sleep { duration } => format!("sleep {:.1}s", duration.as_secs_f64()),
    }
}

/// A traffic step: its path, test and verb (and how its ends exchange), who sends to whom,
/// for how long, in how many streams.
fn traffic(path: Option<PathKind>, t: &Traffic) -> String {
    let Traffic {
        test,
        verb,
        from,
        to,
        to_address,
        seconds,
        streams,
        exchange,
        ..
    } = t;
    let verb = if path == Some(PathKind::Tcp) || *test == iblab_lab::TrafficTest::Connect {
        String::new()
    } else if *exchange == iblab_lab::Exchange::Tcp {
        format!(" ({}, ends exchange over TCP)", verb.as_str())
    } else {
        format!(" ({})", verb.as_str())
    };
    format!(
        "{} {}{verb} {from} → {to} ({to_address}) {seconds}s ×{streams}",
        path.map(|p| p.as_str()).unwrap_or(""),
        test.as_str()
    )
}

/// A fault: what it does to which link at which ends, with its loss (and how the plan
/// makes it) or rate.
fn fault(p: &Plan, f: &Fault) -> String {
    let Fault {
        link,
        action,
        targets,
        loss_percent,
        rate_bps,
        ..
    } = f;
    let mut t = format!(
        "fault {} on {link} at {}",
        action.as_str(),
        targets
            .iter()
            .map(|(n, i)| format!("{n}:{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    if let Some(l) = loss_percent {
        t.push_str(&format!(" {l}% via {}", p.loss_mechanism.describe()));
    }
    if let Some(r) = rate_bps {
        t.push_str(&format!(" {} Mbit/s", r / 1_000_000));
    }
    t
}

/// A check's mark: ✔ or ✘, green or red with colour.
pub fn mark(ok: bool, colour: bool) -> &'static str {
    match (ok, colour) {
        (true, true) => "\x1b[32m✔\x1b[0m",
        (false, true) => "\x1b[31m✘\x1b[0m",
        (true, false) => "✔",
        (false, false) => "✘",
    }
}

/// One preflight check, as `plan` and `doctor` show it.
pub fn preflight_line(c: &Check, colour: bool) -> String {
    let symbol = match (c.mark, colour) {
        (Mark::Ok, _) => mark(true, colour).to_string(),
        (Mark::Fail, _) => mark(false, colour).to_string(),
        (Mark::Warn, true) => format!("\x1b[33m{}\x1b[0m", c.mark.symbol()),
        (m, _) => m.symbol().to_string(),
    };
    format!("  {symbol} {:<20} {}", c.name, c.text)
}

/// The programs a run of the plan starts, by where they run and who provides them
/// (`provider`: the backend's answer for each place).
pub fn programs(needs: &Needs, provider: impl Fn(Place) -> Provider) -> String {
    let mut o = String::from("programs it starts:\n");
    for place in [Place::Host, Place::Nodes, Place::Subnet] {
        let at = needs.at(place);
        if at.is_empty() {
            continue;
        }
        let whose = match provider(place) {
            Provider::Host => "this host's".to_string(),
            Provider::Image { what, .. } => format!("from {what}"),
        };
        let words = match place {
            Place::Host => "on this host",
            Place::Nodes => "in the nodes",
            Place::Subnet => "where the IB subnet runs",
        };
        o.push_str(&format!(
            "  {words} ({whose}): {}\n",
            at.into_iter().collect::<Vec<_>>().join(" ")
        ));
    }
    o
}
