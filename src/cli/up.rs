//! `plan` and `up`: from a lab to a concrete plan, preflight, and a run.

use std::path::PathBuf;

use rust_i18n::t;

use super::planning::make_plan;
use super::{Failure, Global, Outcome, Selection, exit};
use iblab_core::caps::HostCaps;
use iblab_core::plan::Plan;

pub fn plan(sel: &Selection, json: bool, colour: bool) -> Outcome {
    let mut caps = iblab_sys::host::probe();
    let plan = make_plan(sel, &mut caps, colour, None)?;
    let needs = crate::backends::named(&plan.backend)
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
        return Ok(exit::OK);
    }
    print!("{}", describe(&plan));
    print!("{}", describe_programs(&plan, &needs));
    let missing = needed_programs(&plan, &caps)?;
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
    Ok(exit::OK)
}

/// The plan in words ([`iblab_report::describe`]), with what its backend says of running
/// iblab in the nodes when the plan does.
pub fn describe(p: &Plan) -> String {
    let in_nodes = crate::backends::named(&p.backend).and_then(|k| {
        k.iblab_in_nodes()
            .filter(|_| p.runs_iblab_in_nodes(&k.iblab_path()))
    });
    iblab_report::describe::plan(p, in_nodes.as_deref())
}

/// The programs a run of the plan starts, by where they run and who provides them.
pub fn describe_programs(plan: &Plan, needs: &iblab_core::programs::Needs) -> String {
    match crate::backends::named(&plan.backend) {
        Some(k) => iblab_report::describe::programs(needs, |place| k.provider(place)),
        None => String::new(),
    }
}

/// What the plan will start that this host lacks, with the package of each (the one
/// list of [`iblab_engine::run::programs`], and the backend's own preparation); `Err` names a
/// program that no package of this host can bring (an image of iblab's lacks it).
fn needed_programs(
    plan: &Plan,
    caps: &HostCaps,
) -> Result<Vec<(String, &'static str)>, iblab_engine::run::programs::Unprovided> {
    let Some(k) = crate::backends::named(&plan.backend) else {
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

impl From<iblab_engine::run::programs::Unprovided> for Failure {
    fn from(e: iblab_engine::run::programs::Unprovided) -> Failure {
        Failure::new(exit::ENVIRONMENT, e.to_string())
    }
}

/// Ctrl-C or SIGTERM came before the run started: nothing was created, nothing to undo.
fn interrupted_before_the_run() -> Result<(), Failure> {
    if !iblab_sys::interrupt::interrupted() {
        return Ok(());
    }
    eprintln!(
        "{}",
        t!("up.interrupted_early", locale = super::lang().tag())
    );
    Err(exit::INTERRUPTED.into())
}

/// How `up` runs the lab: its options beside the selection.
pub struct How {
    pub out: Option<PathBuf>,
    pub keep: bool,
    pub yes: bool,
    pub repeat: u32,
}

/// `up`: the run's id, the plan, root and the programs it needs (installed with `--yes`
/// or after asking), then the run, its summary and, when kept, the way into its nodes.
pub fn up(sel: &Selection, how: How, g: &Global) -> Outcome {
    let mut caps = iblab_sys::host::probe();
    let run = run_id()?;
    let mut plan = make_plan(sel, &mut caps, g.colour, Some(&run))?.with_repeat(how.repeat);
    interrupted_before_the_run()?;
    if let Some(why) = crate::backends::named(&plan.backend).and_then(|k| k.needs_root())
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
        return Err(exit::ENVIRONMENT.into());
    }
    if install_missing(&plan, &caps, how.yes)? {
        caps = iblab_sys::host::probe();
        plan = make_plan(sel, &mut caps, g.colour, Some(&run))?.with_repeat(how.repeat);
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
    let rt = super::runtime()?;
    interrupted_before_the_run()?;
    let opts = iblab_engine::run::Options {
        out: how.out,
        keep: how.keep,
    };
    let Some(backend) = crate::backends::named(&plan.backend) else {
        return Err(Failure::new(
            exit::ENVIRONMENT,
            format!("the {} backend is not part of this build", plan.backend),
        ));
    };
    let done = rt
        .block_on(iblab_engine::run::up(plan, &caps, &opts, backend))
        .map_err(|e| Failure::new(exit::ENVIRONMENT, e.to_string()))?;
    Ok(finished(&done, g))
}

/// The run's id: the operator chooses its runs' ids, and writes them in the LabRun's
/// status before it starts them (a run it loses in a crash is then always found and
/// swept); else a new one.
fn run_id() -> Result<String, Failure> {
    match std::env::var("IBLAB_RUN_ID") {
        Ok(id) if !id.is_empty() => {
            if !iblab_sys::state::is_run_id(&id) {
                return Err(Failure::new(
                    exit::BAD_INPUT,
                    format!(
                        "IBLAB_RUN_ID={id} is not a run id (16 lowercase hex digits)\n  fix: \
                         leave IBLAB_RUN_ID unset and iblab picks one"
                    ),
                ));
            }
            Ok(id)
        }
        _ => Ok(iblab_engine::run::new_run_id()),
    }
}

/// Install what the plan needs and this host lacks (asking first, unless `yes`): whether
/// anything was installed (the host must then be probed and the lab planned again), or
/// why the run cannot go on.
fn install_missing(plan: &Plan, caps: &HostCaps, yes: bool) -> Result<bool, Failure> {
    let missing = needed_programs(plan, caps)?;
    if missing.is_empty() {
        return Ok(false);
    }
    let named: Vec<&str> = missing.iter().map(|m| m.1).collect();
    let pkgs = iblab_core::caps::with_companions(&named);
    let installed = super::install::install(&pkgs, yes);
    interrupted_before_the_run()?;
    if installed {
        return Ok(true);
    }
    let l = super::lang().tag();
    eprintln!(
        "{}",
        t!(
            "up.missing",
            locale = l,
            programs = missing
                .iter()
                .map(|(p, k)| t!("up.program_package", locale = l, program = p, package = k))
                .collect::<Vec<_>>()
                .join(", "),
            packages = pkgs.join(" ")
        )
    );
    Err(exit::ENVIRONMENT.into())
}

/// The run's summary; a kept lab ends with its nodes and the way into each, as
/// containerlab does. The run's exit code.
fn finished(done: &iblab_engine::run::Finished, g: &Global) -> i32 {
    print!(
        "{}",
        iblab_report::terminal::render(&done.evidence, g.colour, g.verbose)
    );
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
