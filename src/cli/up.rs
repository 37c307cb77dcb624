//! `plan` and `up`: from a lab to a concrete plan, preflight, and a run.

use std::path::PathBuf;

use rust_i18n::t;

use super::planning::make_plan;
use super::{Selection, exit};
use iblab_core::caps::HostCaps;
use iblab_core::plan::{Action, Fault, Plan, Probe, SmControl, Traffic, Wait};
use iblab_lab::PathKind;

pub fn plan(sel: &Selection, json: bool, colour: bool) -> i32 {
    let mut caps = iblab_sys::host::probe();
    let plan = match make_plan(sel, &mut caps, colour, None) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let needs = crate::homes::kind(&plan.backend)
        .map(|k| iblab_engine::run::programs::of(&plan, k))
        .unwrap_or_default();
    if json {
        let mut v = serde_json::to_value(&plan).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert(
                "programs".into(),
                serde_json::to_value(&needs).unwrap_or_default(),
            );
        }
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        print!("{}", describe(&plan));
        print!("{}", describe_programs(&plan, &needs));
        let missing = match needed_programs(&plan, &caps) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("error: {e}");
                return exit::ENVIRONMENT;
            }
        };
        if !missing.is_empty() {
            println!(
                "\nmissing on this host: {}",
                missing
                    .iter()
                    .map(|(p, k)| format!("{p} ({k})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    exit::OK
}

/// The plan in words.
pub fn describe(p: &Plan) -> String {
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
        o.push_str(&format!(
            "adapter: {}:{} carries {} {}{}\n",
            h.device,
            h.port,
            h.path.mark(),
            h.path,
            if h.in_nodes {
                format!(
                    " in every lab node, given to it by the {} backend (its link layer, {}, is checked there before the steps)",
                    p.backend, h.link_layer
                )
            } else {
                format!(" on this host (link layer {})", h.link_layer)
            }
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
    if let Some(k) = crate::homes::kind(&p.backend)
        && let Some(how) = k.iblab_in_nodes()
        && p.runs_iblab_in_nodes(&k.iblab_path())
    {
        o.push_str(&format!("iblab in the nodes: {how}\n"));
    }
    if !p.preflight.is_empty() {
        o.push_str(&format!("preflight (softroce on {}):\n", p.backend));
        for c in &p.preflight {
            o.push_str(&format!("{}\n", super::doctor::preflight_line(c, false)));
        }
    }
    o.push_str("nodes:\n");
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
        o.push_str(&format!(
            "  {:<8} {:<7} {}\n",
            n.name,
            if n.stp {
                "switch+stp"
            } else if n.switch {
                "switch"
            } else {
                "host"
            },
            ifs.join(", ")
        ));
    }
    o.push_str("steps:\n");
    for s in &p.steps {
        let what = match &s.action {
            Action::Exec { node, argv, .. } => format!("exec on {node}: {}", argv.join(" ")),
            Action::Traffic(Traffic {
                test,
                verb,
                from,
                to,
                to_address,
                seconds,
                streams,
                exchange,
                ..
            }) => {
                let path = s.path.map(|p| p.as_str()).unwrap_or("");
                let verb =
                    if s.path == Some(PathKind::Tcp) || *test == iblab_lab::TrafficTest::Connect {
                        String::new()
                    } else if *exchange == iblab_lab::Exchange::Tcp {
                        format!(" ({}, ends exchange over TCP)", verb.as_str())
                    } else {
                        format!(" ({})", verb.as_str())
                    };
                format!(
                    "{path} {}{verb} {from} → {to} ({to_address}) {seconds}s ×{streams}",
                    test.as_str()
                )
            }
            Action::Fault(Fault {
                link,
                action,
                targets,
                loss_percent,
                rate_bps,
                ..
            }) => {
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
        };
        let mut line = format!("  {:<12} {what}", s.id);
        if s.finally {
            line.push_str("  [finally]");
        }
        if let Some(w) = &s.when {
            line.push_str(&format!("  [when {w}]"));
        }
        if let Some(why) = &s.skip {
            line.push_str(&format!("  [skipped: {why}]"));
        }
        o.push_str(&line);
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

/// What the plan will start that this host lacks, with the package of each (the one
/// list of [`iblab_engine::run::programs`], and the backend's own preparation); `Err` names a
/// program that no package of this host can bring (an image of iblab's lacks it).
fn needed_programs(plan: &Plan, caps: &HostCaps) -> Result<Vec<(String, &'static str)>, String> {
    let Some(k) = crate::homes::kind(&plan.backend) else {
        return Ok(vec![]);
    };
    let needs = iblab_engine::run::programs::of(plan, k);
    let mut missing = iblab_engine::run::programs::missing(k, &needs, caps)?;
    for p in k.missing_packages() {
        if !missing.iter().any(|(_, q)| *q == p) {
            missing.push((p.to_string(), p));
        }
    }
    Ok(missing)
}

/// The programs a run of the plan starts, by where they run and who provides them.
pub fn describe_programs(plan: &Plan, needs: &iblab_core::programs::Needs) -> String {
    use iblab_core::programs::{Place, Provider};
    let Some(k) = crate::homes::kind(&plan.backend) else {
        return String::new();
    };
    let mut o = String::from("programs it starts:\n");
    for place in [Place::Host, Place::Nodes, Place::Subnet] {
        let at = needs.at(place);
        if at.is_empty() {
            continue;
        }
        let whose = match k.provider(place) {
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

/// Ctrl-C or SIGTERM came before the run started: nothing was created, nothing to undo.
fn interrupted_before_the_run() -> Option<i32> {
    iblab_sys::interrupt::interrupted().then(|| {
        eprintln!(
            "{}",
            t!("up.interrupted_early", locale = super::lang().tag())
        );
        exit::INTERRUPTED
    })
}

pub fn up(
    sel: &Selection,
    out: Option<PathBuf>,
    keep: bool,
    yes: bool,
    repeat: u32,
    colour: bool,
    verbose: bool,
) -> i32 {
    let mut caps = iblab_sys::host::probe();
    // The operator chooses its runs' ids, and writes them in the LabRun's status before it
    // starts them (a run it loses in a crash is then always found and swept).
    let run = match std::env::var("IBLAB_RUN_ID") {
        Ok(id) if !id.is_empty() => {
            if !iblab_sys::state::is_run_id(&id) {
                eprintln!(
                    "error: IBLAB_RUN_ID={id} is not a run id (16 lowercase hex digits)\n  fix: \
                     leave IBLAB_RUN_ID unset and iblab picks one"
                );
                return exit::BAD_INPUT;
            }
            id
        }
        _ => iblab_engine::run::new_run_id(),
    };
    let mut plan = match make_plan(sel, &mut caps, colour, Some(&run)) {
        Ok(p) => p.with_repeat(repeat),
        Err(code) => return code,
    };
    if let Some(code) = interrupted_before_the_run() {
        return code;
    }
    if let Some(why) = crate::homes::kind(&plan.backend).and_then(|k| k.needs_root())
        && !caps.root
    {
        eprintln!(
            "{}",
            t!(
                "up.needs_root",
                locale = plan.lang.tag(),
                backend = plan.backend,
                why = why,
                lab = sel.lab
            )
        );
        return exit::ENVIRONMENT;
    }
    let missing = match needed_programs(&plan, &caps) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::ENVIRONMENT;
        }
    };
    if !missing.is_empty() {
        let named: Vec<&str> = missing.iter().map(|m| m.1).collect();
        let pkgs = iblab_core::caps::with_companions(&named);
        let installed = super::install::install(&pkgs, yes);
        if let Some(code) = interrupted_before_the_run() {
            return code;
        }
        if !installed {
            let l = super::lang().tag();
            eprintln!(
                "{}",
                t!(
                    "up.missing",
                    locale = l,
                    programs = missing
                        .iter()
                        .map(|(p, k)| t!(
                            "up.program_package",
                            locale = l,
                            program = p,
                            package = k
                        ))
                        .collect::<Vec<_>>()
                        .join(", "),
                    packages = pkgs.join(" ")
                )
            );
            return exit::ENVIRONMENT;
        }
        caps = iblab_sys::host::probe();
        match make_plan(sel, &mut caps, colour, Some(&run)) {
            Ok(p) => plan = p.with_repeat(repeat),
            Err(code) => return code,
        }
    }
    eprintln!(
        "{}",
        t!(
            "up.starting",
            locale = plan.lang.tag(),
            lab = plan.lab,
            title = plan.title,
            scenario = plan.scenario,
            backend = plan.backend,
            reason = plan.backend_reason
        )
    );
    let rt = match super::runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    if let Some(code) = interrupted_before_the_run() {
        return code;
    }
    let opts = iblab_engine::run::Options { out, keep };
    let Some(kind) = crate::homes::kind(&plan.backend) else {
        eprintln!(
            "error: the {} backend is not part of this build",
            plan.backend
        );
        return exit::ENVIRONMENT;
    };
    match rt.block_on(iblab_engine::run::up(plan, &caps, &opts, kind)) {
        Ok(done) => {
            print!(
                "{}",
                iblab_report::terminal::render(&done.evidence, colour, verbose)
            );
            // A kept lab ends with its nodes and the way into each, as containerlab does.
            if let Ok(run) = super::enter::find_run(&done.evidence.run_id)
                && run.kept
            {
                println!(
                    "\n{}\n",
                    t!(
                        "up.kept",
                        locale = done.evidence.lang.tag(),
                        run = run.run_id
                    )
                );
                print!("{}", super::enter::node_table(&run));
            }
            if let Some(e) = &done.write_error {
                eprintln!("error: {e}");
            }
            done.exit_code
        }
        Err(e) => {
            eprintln!("error: {e}");
            exit::ENVIRONMENT
        }
    }
}
