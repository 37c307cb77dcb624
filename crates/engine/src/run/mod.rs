//! The executor: provision, run the steps in order under deadlines, run `finally` steps,
//! tear down whatever happened (interrupts included), judge, and write the evidence.
//!
//! A run is a value ([`Run`]) with one method per phase, in order: [`Run::start`] (the
//! run folder, the backend, the fabrics and the state file), [`Run::steps`] (provision,
//! link check, fabric setup, the steps, `finally`, under the program guard and the
//! interrupt), [`Run::teardown`] (or keep), [`Run::reap`], then [`Ended::finish`] (judge,
//! write). Teardown and reaping themselves are [`teardown`]'s, testable alone.

pub mod linkcheck;
pub mod programs;
pub mod teardown;

use iblab_sys::{interrupt, process, progress, state};

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use rust_i18n::t;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::steps;
use iblab_backend::{self as backend, EnvError, EnvKind};
use iblab_core::caps::HostCaps;
use iblab_core::evidence::judge::{context, judge};
use iblab_core::evidence::{
    Evidence, ExpectationRecord, HostInfo, RunVerdict, SCHEMA, StepRecord, Verdict,
};
use iblab_core::exit;
use iblab_core::plan::Plan;
use iblab_fabric::ctx::StepCtx;
use iblab_fabric::{self as fabric, Fabric};
use iblab_lab::expr;
use iblab_lab::names;
use progress::Progress;
use state::{RunState, StateFile};

/// How `up` should behave.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub out: Option<PathBuf>,
    /// Leave the lab running after the steps (until `iblab down`).
    pub keep: bool,
}

/// A finished run: its evidence and the exit code `up` returns.
pub struct Finished {
    pub evidence: Evidence,
    pub exit_code: i32,
    /// Why the evidence could not be written to the run folder (a full disk), if so.
    pub write_error: Option<String>,
}

pub use iblab_sys::state::{RUN_ID_BYTES, new_run_id};

fn stamp() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// Run a plan end to end on `backend`, the one it was made for. `Err` only when nothing
/// could be started (no run folder).
pub async fn up(
    plan: Plan,
    caps: &HostCaps,
    opts: &Options,
    backend: &'static dyn backend::BackendOps,
) -> Result<Finished, EnvError> {
    let mut run = Run::start(plan, opts, backend)?;
    run.steps().await;
    run.teardown(opts.keep).await;
    Ok(run.reap().await.finish(caps))
}

/// What a run has gathered, whatever phase it is in.
struct Log {
    run_id: String,
    started: String,
    run_dir: PathBuf,
    t0: Instant,
    timings: BTreeMap<String, f64>,
    notes: Vec<String>,
    records: Vec<StepRecord>,
    interrupted: bool,
    env_error: Option<EnvError>,
    /// Left running (`--keep`): decided at teardown.
    kept: bool,
    teardown_from: Option<Instant>,
}

/// A run that is up: the plan, its deployment on the backend, the fabrics on it, the state
/// file naming every resource before it is created, and what it has gathered.
pub struct Run {
    plan: Plan,
    deployment: Box<dyn backend::Deployment>,
    fabrics: Vec<Box<dyn Fabric>>,
    state: Option<StateFile>,
    undeclared: Arc<programs::Undeclared>,
    needs: Arc<iblab_core::programs::Needs>,
    log: Log,
}

/// A run torn down (or kept) and reaped: what is left to do is judge and write.
pub struct Ended {
    plan: Plan,
    log: Log,
}

impl Run {
    /// The run folder (`opts.out`, else one under `iblab-runs/`), a deployment of `backend`,
    /// the plan's fabrics and the state file; nothing of the lab is created yet.
    pub fn start(
        plan: Plan,
        opts: &Options,
        backend: &'static dyn backend::BackendOps,
    ) -> Result<Run, EnvError> {
        // The id the plan was made for (names in the plan carry it), or a new one.
        let run_id = plan.run_id.clone().unwrap_or_else(new_run_id);
        let started = stamp();
        let run_dir = run_folder(&plan, opts, &started)?;
        if backend.name() != plan.backend {
            return Err(EnvError::new(format!(
                "the plan is for the {} backend, not {}",
                plan.backend,
                backend.name()
            )));
        }
        let deployment = backend.instantiate(&run_id)?;
        tracing::info!(run = %run_id, backend = deployment.name(), "run starting");
        let fabrics = fabric::for_plan(&plan)?;
        let state = state_file(&plan, &run_id, &started, &run_dir)?;
        // For a watcher of the run (`up --events`): the run and what it will do.
        iblab_sys::events::emit("run", planned(&plan, &run_id, &run_dir, &started));
        let log = Log {
            run_id,
            started,
            run_dir,
            t0: Instant::now(),
            timings: BTreeMap::new(),
            // What the plan says the reader must know (a lab text read in another
            // language) first.
            notes: plan.notes.clone(),
            records: Vec::new(),
            interrupted: false,
            env_error: None,
            kept: false,
            teardown_from: None,
        };
        Ok(Run {
            // Everything the run starts is held to the plan's list of programs.
            needs: Arc::new(programs::of(&plan, backend)),
            undeclared: Arc::new(programs::Undeclared::default()),
            plan,
            deployment,
            fabrics,
            state: Some(state),
            log,
        })
    }

    /// Provision, check the links, set up the fabrics, run the steps, then the `finally`
    /// steps; each stage only if no Ctrl-C or SIGTERM came (caught since the process
    /// started: one that came before this point stops the run before it provisions
    /// anything). Everything started is held to the plan's programs: in the nodes and the
    /// subnet's site through the backend the steps see, on this host through the guard.
    /// A step the run never reached gets a record saying why.
    pub async fn steps(&mut self) {
        let Some(state) = self.state.as_ref() else {
            return;
        };
        let declared = programs::Declared {
            inner: self.deployment.as_ref(),
            needs: self.needs.clone(),
            undeclared: self.undeclared.clone(),
        };
        let guard = programs::host_guard(
            self.deployment.backend(),
            self.needs.clone(),
            self.undeclared.clone(),
        );
        let mut ctx = StepCtx {
            plan: &self.plan,
            backend: &declared,
            state,
            run_dir: self.log.run_dir.clone(),
            started: self.log.t0,
            shaping: HashMap::new(),
            drops: HashMap::new(),
            done: Vec::new(),
        };
        let progress = Progress::new();
        let log = &mut self.log;
        tokio::select! {
            r = process::guarded(guard.clone(), main_phase(&mut ctx, &self.fabrics, &mut log.timings, &progress)) => { if let Err(e) = r { log.env_error = Some(e) } }
            _ = interrupt::wait() => {}
        }
        log.interrupted = interrupt::interrupted();
        if log.interrupted {
            log.notes.push(interrupt_note(&ctx, false));
        } else {
            tokio::select! {
                r = process::guarded(guard.clone(), run_finally(&mut ctx, &self.fabrics, &progress)) => { if let Err(e) = r { log.env_error.get_or_insert(e); } }
                _ = interrupt::wait() => {}
            }
            log.interrupted |= interrupt::interrupted();
            if log.interrupted {
                log.notes.push(interrupt_note(&ctx, true));
            }
        }
        progress.finish();
        log.records = std::mem::take(&mut ctx.done);
        let (backend_notes, backend_timings) = self.deployment.report();
        log.notes.extend(backend_notes);
        log.timings.extend(backend_timings);
        // Steps that never got to run because of an interrupt or an environment error.
        let reason = if log.interrupted {
            "interrupted"
        } else {
            "not reached: the run stopped on an environment error"
        };
        for s in &self.plan.steps {
            if !log.records.iter().any(|r| r.id == s.id && r.path == s.path) {
                let at = log.t0.elapsed().as_secs_f64();
                log.records.push(steps::skipped(s, reason.into(), at));
            }
        }
        let unlisted = self.undeclared.list();
        if !unlisted.is_empty() {
            log.notes.push(format!(
                "iblab started programs its plan's list does not name: {} (a bug in iblab: \
                 `iblab plan` and `--yes` do not know of them; please report it)",
                unlisted.join(", ")
            ));
        }
    }

    /// Leave the lab running (`keep`, when the run was neither interrupted nor stopped by
    /// an environment error: its state file says so, with the nodes' addresses), or undo
    /// every resource its state file names. The signal handlers stay installed, so a
    /// second Ctrl-C cannot cut teardown short.
    pub async fn teardown(&mut self, keep: bool) {
        if self.log.interrupted {
            eprintln!(
                "interrupted: tearing down (this takes a moment; a second Ctrl-C is ignored)"
            );
        }
        self.log.teardown_from = Some(Instant::now());
        self.log.kept = keep && !self.log.interrupted && self.log.env_error.is_none();
        let Some(state) = self.state.take() else {
            return;
        };
        if self.log.kept {
            self.keep(&state).await;
        } else {
            let backends = [self.deployment.backend()];
            let notes = teardown::undo(state, &backend::Backends(&backends)).await;
            self.log.notes.extend(notes);
        }
    }

    /// `--keep`: the fabrics and the backend let go of what they run, and the state file
    /// marks the run kept, with path ②'s addresses as the nodes' rxe devices hold them now.
    async fn keep(&mut self, state: &StateFile) {
        let gids = if self.plan.paths.contains(&iblab_lab::PathKind::Roce) {
            fabric::softroce::node_gids(&self.plan, self.deployment.as_ref()).await
        } else {
            BTreeMap::new()
        };
        for f in &self.fabrics {
            f.keep().await;
        }
        self.deployment.keep();
        let lids = iblab_core::evidence::topology::lids(&self.log.records);
        self.log.notes.push(match state.mark_kept(&lids, &gids) {
            Ok(()) => format!(
                "kept running (--keep): `iblab status {run}` shows its nodes and how to enter them; remove it with `iblab down {run}`",
                run = self.log.run_id
            ),
            Err(e) => format!("kept running, but the state file could not say so: {e}"),
        });
    }

    /// The deployment and fabrics hold the handles of processes teardown killed (a VM's
    /// qemu, a subnet's ibsim): drop them, then wait for every child, so none is left a
    /// zombie for init to reap. A kept run's processes go on running: only reap the dead.
    pub async fn reap(self) -> Ended {
        let Run {
            plan,
            deployment,
            fabrics,
            state,
            mut log,
            ..
        } = self;
        drop(fabrics);
        drop(deployment);
        drop(state);
        let grace = if log.kept {
            Duration::ZERO
        } else {
            teardown::GRACE
        };
        let running = teardown::reap(grace).await;
        if !log.kept {
            log.notes.extend(running);
        }
        let from = log.teardown_from.unwrap_or_else(Instant::now);
        log.timings
            .insert("teardown_s".into(), from.elapsed().as_secs_f64());
        Ended { plan, log }
    }
}

/// Where in the run an interrupt came, for the notes: in the steps or after them (`finally`
/// false), in the `finally` steps or after them, in teardown (`finally` true).
fn interrupt_note(ctx: &StepCtx<'_>, finally: bool) -> String {
    let all_ran = ctx
        .plan
        .steps
        .iter()
        .filter(|s| s.finally == finally)
        .all(|s| ctx.done.iter().any(|r| r.id == s.id && r.path == s.path));
    let l = ctx.plan.lang.tag();
    match (finally, all_ran) {
        (false, true) => t!("notes.interrupted_after_steps", locale = l),
        (false, false) => t!("notes.interrupted_in_steps", locale = l),
        (true, true) => t!("notes.interrupted_in_teardown", locale = l),
        (true, false) => t!("notes.interrupted_in_finally", locale = l),
    }
    .into_owned()
}

/// The run folder with its `logs/`, made and absolute: tools run from other folders
/// (ibsim and opensm from logs/ib), so every path handed to them must be.
fn run_folder(plan: &Plan, opts: &Options, started: &str) -> Result<PathBuf, EnvError> {
    let run_dir = opts.out.clone().unwrap_or_else(|| {
        PathBuf::from("iblab-runs").join(format!(
            "{}-{}-{}",
            plan.lab,
            plan.scenario,
            started.replace([':', '-'], "")
        ))
    });
    std::fs::create_dir_all(run_dir.join("logs")).map_err(|e| {
        EnvError::new(format!("cannot create {}: {e}", run_dir.display())).because(e)
    })?;
    Ok(std::fs::canonicalize(&run_dir).unwrap_or(run_dir))
}

/// The run's state file, written before anything of the lab is created.
fn state_file(
    plan: &Plan,
    run_id: &str,
    started: &str,
    run_dir: &std::path::Path,
) -> Result<StateFile, EnvError> {
    let (owner_pid, owner_start_ticks) = iblab_sys::state::this_owner();
    StateFile::create(RunState {
        run_id: run_id.to_string(),
        lab: plan.lab.clone(),
        scenario: plan.scenario.clone(),
        backend: plan.backend.clone(),
        owner_pid,
        owner_start_ticks,
        started: started.to_string(),
        run_dir: run_dir.to_path_buf(),
        resources: vec![],
        nodes: plan
            .nodes
            .iter()
            .map(|n| state::NodeEntry {
                name: n.name.clone(),
                switch: n.switch,
                addresses: n.addresses(),
                lid: None,
                gids: vec![],
            })
            .collect(),
        kept: false,
    })
    .map_err(|e| {
        let message = format!(
            "cannot write the state file in {}: {e}",
            state::state_dir().display()
        );
        EnvError::of(EnvKind::State, message).because(e)
    })
}

impl Ended {
    /// Judge the expectations and write the evidence into the run folder.
    pub fn finish(mut self, caps: &HostCaps) -> Finished {
        let l = self.plan.lang.tag();
        if self.plan.repeat > 1 {
            let note = t!("notes.repeat", locale = l, n = self.plan.repeat).into_owned();
            self.log.notes.push(note);
        }
        // A signal that came while the run tore down is still an interrupt before the
        // run's end: 130, like any other. Teardown was not cut short by it (the handlers
        // stayed in place), and every step had run, so the expectations are judged as usual.
        if !self.log.interrupted && !self.log.kept && interrupt::interrupted() {
            self.log.interrupted = true;
            let note = t!("notes.interrupted_in_teardown", locale = l).into_owned();
            self.log.notes.push(note);
        }
        let ctx_json = context(&self.plan, &self.log.records);
        let expectations = self.judged(&ctx_json);
        let (verdict, exit_code) = self.verdict(&expectations);
        self.path_notes();
        let interrupted = self.log.interrupted;
        let evidence = self.evidence(caps, &ctx_json, verdict, expectations);
        write(evidence, exit_code, interrupted)
    }

    /// Every expectation judged on the records; after an interrupt, one that reads a step
    /// the interrupt kept from running is not judged.
    fn judged(&self, ctx_json: &serde_json::Value) -> Vec<ExpectationRecord> {
        let records = &self.log.records;
        let mut expectations: Vec<_> = self
            .plan
            .expectations
            .iter()
            .map(|e| judge(&self.plan, e, ctx_json, records))
            .collect();
        if self.log.interrupted {
            not_judged_after_interrupt(&mut expectations, records);
        }
        expectations
    }

    /// The run's verdict and exit code. A failed step fails the run, unless the lab marked
    /// it `continueOnError`: then its failure is evidence for the expectations to judge
    /// (e.g. traffic refused without an SM).
    fn verdict(&mut self, expectations: &[ExpectationRecord]) -> (RunVerdict, i32) {
        let plan = &self.plan;
        let tolerated = |r: &StepRecord| {
            plan.steps
                .iter()
                .any(|s| s.id == r.id && s.path == r.path && s.continue_on_error)
        };
        let step_failed = self
            .log
            .records
            .iter()
            .any(|r| matches!(r.verdict, Verdict::Fail | Verdict::Error) && !tolerated(r));
        let expect_failed = expectations
            .iter()
            .any(|e| matches!(e.verdict, Verdict::Fail | Verdict::Error));
        if self.log.interrupted {
            (RunVerdict::Interrupted, exit::INTERRUPTED)
        } else if let Some(e) = &self.log.env_error {
            self.log.notes.push(format!("environment: {e}"));
            (RunVerdict::Error, exit::ENVIRONMENT)
        } else if step_failed || expect_failed {
            (RunVerdict::Fail, exit::FAILED)
        } else {
            (RunVerdict::Pass, exit::OK)
        }
    }

    /// What the reader must know of the paths as this backend carries them.
    fn path_notes(&mut self) {
        let plan = &self.plan;
        let l = plan.lang.tag();
        if plan.paths.contains(&iblab_lab::PathKind::Tcp) {
            // The backend's own words where this crate has them in the run's language.
            let key = format!("carrier.{}", plan.backend);
            let carrier = match t!(&key, locale = l) {
                w if w != key => w.into_owned(),
                _ => plan.backend_traits.tcp_carrier.to_string(),
            };
            let note = t!("notes.tcp", locale = l, carrier = carrier).into_owned();
            self.log.notes.push(note);
        }
        let ib_on_hca = plan
            .hca
            .as_ref()
            .is_some_and(|h| h.path == iblab_lab::PathKind::Ib);
        if plan.paths.contains(&iblab_lab::PathKind::Ib) && !ib_on_hca {
            let note = if plan.backend_traits.verbs_in_nodes {
                t!("notes.ib_on_rxe", locale = l)
            } else {
                t!(
                    "notes.ib_admission_only",
                    locale = l,
                    backend = plan.backend
                )
            };
            self.log.notes.push(note.into_owned());
        }
    }

    /// The evidence document: the lab's declared rows are the lesson's table; every raw
    /// figure is a measurement.
    fn evidence(
        self,
        caps: &HostCaps,
        ctx_json: &serde_json::Value,
        verdict: RunVerdict,
        expectations: Vec<ExpectationRecord>,
    ) -> Evidence {
        let Ended { plan, log } = self;
        let mut evidence = Evidence {
            schema: SCHEMA.into(),
            lang: plan.lang,
            lab: plan.lab.clone(),
            title: plan.title.clone(),
            lesson: plan.lesson,
            scenario: plan.scenario.clone(),
            backend: plan.backend.clone(),
            backend_reason: plan.backend_reason.clone(),
            nic: plan.backend_traits.nic.to_string(),
            run_id: log.run_id,
            started: log.started,
            duration_s: log.t0.elapsed().as_secs_f64(),
            verdict,
            paths: plan.paths.clone(),
            excluded_paths: plan.excluded.clone(),
            params: plan.params.clone(),
            host: HostInfo {
                kernel: caps.kernel.clone(),
                loss_mechanism: plan.loss_mechanism.describe().into(),
            },
            steps: log.records,
            expectations,
            comparison: Default::default(),
            measurements: Default::default(),
            topology: iblab_core::evidence::topology::Topology::of(&plan),
            timings: log.timings,
            notes: log.notes,
            run_dir: log.run_dir,
        };
        evidence.build_measurements();
        evidence.comparison.rows =
            iblab_core::evidence::judge::declared_rows(&plan, ctx_json, &evidence.steps);
        evidence
    }
}

/// Write the evidence into its run folder and tell a watcher the run ended. A run folder
/// on a full disk: the lab is torn down already; say what the run saw and that its
/// evidence could not be kept, and end as an environment error.
fn write(evidence: Evidence, exit_code: i32, interrupted: bool) -> Finished {
    let run_dir = evidence.run_dir.clone();
    let (exit_code, write_error) = match iblab_report::write_all(&evidence, &run_dir) {
        Ok(()) => (exit_code, None),
        Err(e) => (
            if interrupted {
                exit_code
            } else {
                exit::ENVIRONMENT
            },
            Some(format!(
                "cannot write the evidence to {}: {e}; the lab was torn down all the same (nothing of it is left), but this run has no evidence",
                run_dir.display()
            )),
        ),
    };
    iblab_sys::events::emit(
        "end",
        serde_json::json!({
            "verdict": evidence.verdict,
            "exit_code": exit_code,
            "run_dir": run_dir,
            "write_error": write_error,
        }),
    );
    Finished {
        evidence,
        exit_code,
        write_error,
    }
}

/// The run as planned, for a watcher: who it is, its paths and parameters, and every
/// step instance it will run, in order.
fn planned(
    plan: &Plan,
    run_id: &str,
    run_dir: &std::path::Path,
    started: &str,
) -> serde_json::Value {
    let steps: Vec<serde_json::Value> = plan
        .steps
        .iter()
        .map(|s| {
            serde_json::json!({
                "id": s.id,
                "name": s.name,
                "path": s.path,
                "kind": iblab_core::evidence::blank(s, 0.0).kind.word(),
                "finally": s.finally,
                "skip": s.skip,
            })
        })
        .collect();
    serde_json::json!({
        "run_id": run_id,
        "run_dir": run_dir,
        "started": started,
        "lab": plan.lab,
        "title": plan.title,
        "lang": plan.lang,
        "lesson": plan.lesson,
        "scenario": plan.scenario,
        "backend": plan.backend,
        "backend_reason": plan.backend_reason,
        "paths": plan.paths,
        "excluded_paths": plan.excluded,
        "params": plan.params,
        "steps": steps,
    })
}

/// A step is about to run, or has ended (its whole record), for a watcher of the run.
fn step_event(started: Option<(&iblab_core::plan::PlannedStep, f64)>, done: Option<&StepRecord>) {
    if let Some((s, at)) = started {
        iblab_sys::events::emit(
            "step_started",
            serde_json::json!({ "id": s.id, "path": s.path, "at": at }),
        );
    }
    if let Some(r) = done {
        iblab_sys::events::emit("step", serde_json::json!({ "record": r }));
    }
}

async fn main_phase(
    ctx: &mut StepCtx<'_>,
    fabrics: &[Box<dyn Fabric>],
    timings: &mut BTreeMap<String, f64>,
    progress: &Progress,
) -> Result<(), EnvError> {
    // Every stage starts only if no Ctrl-C came: a stage that blocks (an image build, a
    // boot) may keep the select above from noticing until it ends.
    if interrupt::interrupted() {
        return Ok(());
    }
    let t = Instant::now();
    let l = ctx.plan.lang.tag();
    progress.start(&t!("progress.provisioning", locale = l));
    ctx.backend.provision(ctx.plan, ctx.state).await?;
    timings.insert("provision_s".into(), t.elapsed().as_secs_f64());
    progress.line(&t!(
        "progress.provisioned",
        locale = l,
        nodes = ctx.plan.nodes.len(),
        links = ctx.plan.links.len(),
        backend = ctx.backend.name(),
        secs = format!("{:.2}", t.elapsed().as_secs_f64())
    ));
    if interrupt::interrupted() {
        return Ok(());
    }
    progress.start(&t!("progress.link_check", locale = l));
    let took = linkcheck::check(ctx.plan, ctx.backend, &ctx.run_dir).await?;
    timings.insert("link_check_s".into(), took.as_secs_f64());
    for f in fabrics {
        if interrupt::interrupted() {
            return Ok(());
        }
        let t = Instant::now();
        progress.start(&t!("progress.setting_up", locale = l, fabric = f.name()));
        f.setup(ctx).await?;
        timings.insert(format!("setup_{}_s", f.name()), t.elapsed().as_secs_f64());
    }
    let t = Instant::now();
    let mut failed: Option<String> = None;
    for step in ctx.plan.steps.iter().filter(|s| !s.finally) {
        if interrupt::interrupted() {
            return Ok(());
        }
        let at = ctx.started.elapsed().as_secs_f64();
        let rec = if let Some(why) = &step.skip {
            steps::skipped(step, why.clone(), at)
        } else if let Some(f) = &failed {
            steps::skipped(step, format!("not run: step `{f}` failed before it"), at)
        } else if let Some(reason) = runtime_skip(step, ctx) {
            steps::skipped(step, reason, at)
        } else {
            progress.start(&label(step));
            step_event(Some((step, at)), None);
            run_with_deadline(step, ctx, fabrics).await?
        };
        progress.line(&summary_line(&rec, ctx.plan.lang));
        step_event(None, Some(&rec));
        if matches!(rec.verdict, Verdict::Fail | Verdict::Error)
            && !step.continue_on_error
            && failed.is_none()
        {
            failed = Some(rec.id.clone());
        }
        ctx.done.push(rec);
    }
    timings.insert("steps_s".into(), t.elapsed().as_secs_f64());
    Ok(())
}

async fn run_finally(
    ctx: &mut StepCtx<'_>,
    fabrics: &[Box<dyn Fabric>],
    progress: &Progress,
) -> Result<(), EnvError> {
    for step in ctx.plan.steps.iter().filter(|s| s.finally) {
        if interrupt::interrupted() {
            return Ok(());
        }
        let at = ctx.started.elapsed().as_secs_f64();
        let rec = match &step.skip {
            Some(why) => steps::skipped(step, why.clone(), at),
            None => {
                progress.start(&label(step));
                step_event(Some((step, at)), None);
                run_with_deadline(step, ctx, fabrics).await?
            }
        };
        progress.line(&summary_line(&rec, ctx.plan.lang));
        step_event(None, Some(&rec));
        ctx.done.push(rec);
    }
    Ok(())
}

/// After an interrupt, an expectation that reads a step the interrupt kept from running is
/// not judged (it did not fail): it says which step it waited for.
fn not_judged_after_interrupt(
    expectations: &mut [iblab_core::evidence::ExpectationRecord],
    records: &[StepRecord],
) {
    let cut: Vec<&str> = records
        .iter()
        .filter(|r| r.verdict == Verdict::Skipped && r.reason.as_deref() == Some("interrupted"))
        .map(|r| r.id.as_str())
        .collect();
    for x in expectations.iter_mut() {
        let reads = expr::check_expression(&x.expression).unwrap_or_default();
        let missed = reads.iter().find_map(|v| {
            let id = v.strip_prefix("steps.")?.split('.').next()?;
            cut.contains(&id).then_some(id)
        });
        if let Some(id) = missed {
            x.verdict = Verdict::Skipped;
            x.explanation = format!("not judged: the run was interrupted before step `{id}` ran");
        }
    }
}

/// A `when` over earlier results, judged now.
fn runtime_skip(step: &iblab_core::plan::PlannedStep, ctx: &StepCtx<'_>) -> Option<String> {
    let w = step.when.as_ref()?;
    match expr::eval_bool(w, &context(ctx.plan, &ctx.done)) {
        Ok(true) => None,
        Ok(false) => Some(format!("`when: {w}` is false")),
        Err(e) => Some(format!("`when: {w}` could not be evaluated: {e}")),
    }
}

async fn run_with_deadline(
    step: &iblab_core::plan::PlannedStep,
    ctx: &mut StepCtx<'_>,
    fabrics: &[Box<dyn Fabric>],
) -> Result<StepRecord, EnvError> {
    let at = ctx.started.elapsed().as_secs_f64();
    // Tools get the step's deadline themselves; this outer one catches anything else.
    let rec = match tokio::time::timeout(
        step.timeout + Duration::from_secs(5),
        steps::run(step, ctx, fabrics),
    )
    .await
    {
        Ok(r) => r?,
        Err(_) => {
            let mut rec = iblab_core::evidence::blank(step, at);
            rec.verdict = Verdict::Fail;
            rec.duration_s = ctx.started.elapsed().as_secs_f64() - at;
            rec.reason = Some(format!(
                "deadline of {:.0}s passed",
                step.timeout.as_secs_f64()
            ));
            rec
        }
    };
    Ok(with_output_cuts(rec, ctx.backend.output_cuts()))
}

/// A step during which the backend cut output at a cap fails, saying what was cut: its
/// evidence is not whole, and a node that floods iblab with output is not measured.
fn with_output_cuts(mut rec: StepRecord, cuts: Vec<String>) -> StepRecord {
    if cuts.is_empty() {
        return rec;
    }
    let why = cuts.join("; ");
    if !matches!(rec.verdict, Verdict::Fail | Verdict::Error) {
        rec.verdict = Verdict::Fail;
        rec.reason = Some(why.clone());
    } else if let Some(r) = rec.reason.as_mut() {
        r.push_str(&format!("; {why}"));
    }
    let cuts = serde_json::Value::from(cuts);
    if rec.detail.is_null() {
        rec.detail = serde_json::json!({});
    }
    if let Some(o) = rec.detail.as_object_mut() {
        o.insert("output_cuts".into(), cuts);
    }
    rec
}

fn label(step: &iblab_core::plan::PlannedStep) -> String {
    match step.path {
        Some(p) => format!("{} [{} {p}]", step.id, p.mark()),
        None => step.id.clone(),
    }
}

fn summary_line(r: &StepRecord, lang: iblab_lab::Lang) -> String {
    let name = match r.path {
        Some(p) => format!("{} [{} {p}]", r.id, p.mark()),
        None => r.id.clone(),
    };
    let mut line = format!("{} {:<28} {:>7.2}s", r.verdict.symbol(), name, r.duration_s);
    if let Some(m) = r.metrics.get(names::THROUGHPUT_MBPS) {
        line.push_str(&format!("  {:.0} Mbit/s", m.value));
    }
    if let Some(b) = r.detail["resolution"].as_str() {
        line.push_str(&format!(
            "  {}",
            t!("progress.held", locale = lang.tag(), when = b)
        ));
    }
    if let Some(why) = &r.reason {
        line.push_str(&format!("  ({why})"));
    }
    if r.allowed_to_fail && matches!(r.verdict, Verdict::Fail | Verdict::Error) {
        line.push_str(&format!(
            "  {}",
            t!("progress.allowed_to_fail", locale = lang.tag())
        ));
    }
    line
}

#[cfg(test)]
mod run_id_tests {
    use super::new_run_id;

    #[test]
    fn what_is_not_a_run_id_is_told() {
        for bad in [
            "",
            "abc",
            "0123456789ABCDEF",
            "0123456789abcdeg",
            "../../etc/passwd0",
        ] {
            assert!(!iblab_sys::state::is_run_id(bad), "{bad}");
        }
    }

    #[test]
    fn run_ids_are_64_bits_of_hex_and_differ() {
        let ids: std::collections::BTreeSet<String> = (0..1000).map(|_| new_run_id()).collect();
        assert_eq!(ids.len(), 1000, "a run id repeated in 1000 draws");
        for id in &ids {
            assert_eq!(id.len(), 16, "{id}");
            assert!(id.bytes().all(|c| c.is_ascii_hexdigit()), "{id}");
            // A namespace `iblab-<run>` and the kube labels take it whole.
            assert!(format!("{}{id}", iblab_sys::state::PREFIX).len() <= 63);
            assert!(iblab_sys::state::is_run_id(id), "{id}");
        }
    }
}

#[cfg(test)]
mod output_cut_tests {
    use super::*;

    fn record(verdict: Verdict, detail: serde_json::Value) -> StepRecord {
        let mut r: StepRecord = serde_json::from_value(serde_json::json!({
            "id": "stream", "kind": "traffic", "verdict": "pass", "started_s": 0.0,
            "duration_s": 1.0, "metrics": {}, "detail": null
        }))
        .unwrap();
        r.verdict = verdict;
        r.detail = detail;
        r
    }

    #[test]
    fn a_step_whose_output_was_cut_fails_saying_what_was_cut() {
        let r = with_output_cuts(record(Verdict::Pass, serde_json::Value::Null), vec![]);
        assert_eq!(r.verdict, Verdict::Pass);
        let cut = "output past the cap: `iperf3 -s` on b, stdout was cut at 8 MiB, 9 bytes dropped";
        let r = with_output_cuts(
            record(Verdict::Pass, serde_json::json!({"client": []})),
            vec![cut.into()],
        );
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(r.reason.as_deref(), Some(cut));
        assert_eq!(r.detail["output_cuts"][0], cut);
        assert!(
            r.detail["client"].is_array(),
            "the rest of the detail stays"
        );
        // A step that failed already keeps its own reason first.
        let mut failed = record(Verdict::Fail, serde_json::Value::Null);
        failed.reason = Some("iperf3 said no".into());
        let r = with_output_cuts(failed, vec![cut.into()]);
        assert_eq!(
            r.reason.as_deref(),
            Some(&*format!("iperf3 said no; {cut}"))
        );
    }
}
