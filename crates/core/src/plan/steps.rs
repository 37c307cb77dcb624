//! Each kind of step planned: a resolved step of the lab ([`iblab_lab::Step`]) becomes its
//! planned instances, one function per kind (a traffic step is one instance per path), the
//! kinds side by side in one match.

use std::collections::BTreeMap;
use std::time::Duration;

use iblab_lab::expr::{self, ExprError};
use iblab_lab::{
    DurationSpec, ExecSpec, FaultSpec, Lab, Lang, Param, PathKind, ProbeKind, ProbeSpec,
    SmControlSpec, Step, StepAction, TrafficSpec, TrafficTest, Verb, WaitSpec, limits,
};

use super::backend::Backend;
use super::{
    Action, Fault, PlannedHca, PlannedLink, PlannedNode, PlannedStep, Probe, SmControl, Traffic,
    Wait,
};

/// What a step's planner reads of the plan made so far.
pub(super) struct Planning<'a> {
    pub lab: &'a Lab,
    pub scenario: &'a str,
    pub lang: Lang,
    /// What templates and plan-time conditions read ([`super::context`]).
    pub ctx: &'a serde_json::Value,
    pub nodes: &'a [PlannedNode],
    pub links: &'a [PlannedLink],
    /// The paths of the run, and those of the lab left out of it (with the reason).
    pub paths: &'a [PathKind],
    pub excluded: &'a BTreeMap<PathKind, String>,
    pub backend: &'a dyn Backend,
    pub hca: Option<&'a PlannedHca>,
    /// The backend's own devices carry verbs in the nodes (see `Traits::verbs_in_nodes`).
    pub verbs_in_nodes: bool,
}

/// Why a step cannot be planned (bad input: a template or a parameter gives a value the
/// step cannot take). Its words follow `step `ID`: ` in the planner's message.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("when: {0}")]
    When(#[source] ExprError),
    #[error(transparent)]
    Template(#[from] ExprError),
    #[error("template `{template}` gave `{text}`, which is not a number")]
    NotANumber { template: String, text: String },
    #[error(
        "seconds is {} after templating: expected {} (fix the template or the parameter it reads)",
        .0,
        limits::SECONDS
    )]
    Seconds(f64),
    #[error(
        "streams is {} after templating: expected {} (fix the template or the parameter it reads)",
        .0,
        limits::STREAMS
    )]
    Streams(u32),
    #[error("no link `{0}`")]
    NoLink(String),
    #[error("loss of {0}% is out of range (0 < p <= 100)")]
    Loss(f64),
    #[error("rate `{0}` is not a rate (write e.g. 100mbit)")]
    Rate(String),
    #[error("queue `{0}` is not a size (write e.g. 16kb)")]
    Queue(String),
    #[error("a wait needs exec or probe")]
    WaitWithoutAction,
}

/// The planned instances of one step, by its kind.
pub(super) fn plan_step(p: &Planning, s: &Step) -> Result<Vec<PlannedStep>, StepError> {
    // A `when` over scenario and params is decided now; one over results, at run time.
    let (when, skip) = match &s.when {
        None => (None, None),
        Some(w) if reads_results(w) => (Some(w.clone()), None),
        Some(w) => match expr::eval_bool(w, p.ctx) {
            Ok(true) => (None, None),
            Ok(false) => (
                None,
                Some(format!("`when: {w}` is false in scenario {}", p.scenario)),
            ),
            Err(e) => return Err(StepError::When(e)),
        },
    };
    let base = Base {
        s,
        name: s.name.as_ref().map(|n| n.get(p.lang).to_string()),
        when,
    };
    let one = |step: PlannedStep| vec![step];
    Ok(match &s.action {
        StepAction::Exec(e) => one(exec(p, &base, e, skip)?),
        StepAction::Traffic(t) => traffic(p, &base, t, skip)?,
        StepAction::Fault(f) => one(fault(p, &base, f, skip)?),
        StepAction::Wait(w) => one(wait(p, &base, w, skip)?),
        StepAction::Sleep(d) => one(sleep(&base, d, skip)),
        StepAction::Probe(pr) => one(probe(p, &base, pr, skip)),
        StepAction::Sm(c) => one(sm(p, &base, c, skip)),
    })
}

/// What every planned instance of a step shares.
struct Base<'a> {
    s: &'a Step,
    /// Its name in the run's language.
    name: Option<String>,
    /// A `when` left for the run (it reads results).
    when: Option<String>,
}

impl Base<'_> {
    /// An instance: its path, action, deadline (the step's own, else `default_timeout`)
    /// and why it is skipped, if it is.
    fn planned(
        &self,
        path: Option<PathKind>,
        action: Action,
        default_timeout: Duration,
        skip: Option<String>,
    ) -> PlannedStep {
        PlannedStep {
            id: self.s.id.clone(),
            name: self.name.clone(),
            path,
            action,
            timeout: self.s.timeout.map(|d| d.0).unwrap_or(default_timeout),
            finally: self.s.finally,
            continue_on_error: self.s.continue_on_error,
            when: self.when.clone(),
            skip,
        }
    }
}

fn exec(
    p: &Planning,
    base: &Base,
    e: &ExecSpec,
    skip: Option<String>,
) -> Result<PlannedStep, StepError> {
    Ok(base.planned(None, exec_action(p, e)?, limits::EXEC_TIMEOUT, skip))
}

fn exec_action(p: &Planning, e: &ExecSpec) -> Result<Action, StepError> {
    Ok(Action::Exec {
        node: e.node.clone(),
        argv: render_all(&e.command, p.ctx)?,
        expect_exit: e.expect_exit.unwrap_or(0),
    })
}

/// One instance per path the step names (default: the lab's), each skipped where its path
/// is left out of the run.
fn traffic(
    p: &Planning,
    base: &Base,
    t: &TrafficSpec,
    skip: Option<String>,
) -> Result<Vec<PlannedStep>, StepError> {
    let seconds = resolve(t.seconds.as_ref(), 3.0, p.ctx)?;
    let streams = resolve(t.streams.as_ref(), 1u32, p.ctx)?;
    // A template may give any number: the same range as a literal, now.
    if !limits::seconds_ok(seconds) {
        return Err(StepError::Seconds(seconds));
    }
    if !limits::streams_ok(streams) {
        return Err(StepError::Streams(streams));
    }
    let to_address = super::address_toward(p.lab, p.nodes, &t.from, &t.to).unwrap_or_default();
    // A step that asks for N runs gets N runs' deadline, as `--repeat` gives.
    let runs = t.repeat.unwrap_or(1).max(1);
    let deadline = Duration::from_secs_f64(seconds + f64::from(p.backend.traits().traffic_slack_s))
        + limits::TRAFFIC_MARGIN;
    let wanted = t.paths.clone().unwrap_or_else(|| p.lab.spec.paths.clone());
    let mut out = Vec::new();
    for path in wanted {
        let path_skip = skip.clone().or_else(|| {
            p.excluded
                .get(&path)
                .map(|why| format!("path {path} {why}"))
        });
        let action = Action::Traffic(Traffic {
            test: t.test,
            verb: t.verb.unwrap_or(match t.test {
                TrafficTest::Latency => Verb::Send,
                _ => Verb::Write,
            }),
            size: t.size.unwrap_or(match t.test {
                TrafficTest::Bandwidth => 65536,
                _ => 2,
            }),
            from: t.from.clone(),
            to: t.to.clone(),
            to_address: to_address.clone(),
            seconds,
            streams,
            exchange: t.exchange.unwrap_or_default(),
            ack_timeout: None,
            count_links: t.count_links,
            capture: t.capture,
            repeat: t.repeat.unwrap_or(1),
        });
        let mut step = base.planned(Some(path), action, deadline, path_skip);
        step.timeout *= runs;
        out.push(step);
    }
    Ok(out)
}

/// A fault on a link, at the ends its frames leave from; loss, rate and queue rendered.
fn fault(
    p: &Planning,
    base: &Base,
    f: &FaultSpec,
    skip: Option<String>,
) -> Result<PlannedStep, StepError> {
    let link = p
        .links
        .iter()
        .find(|l| l.name == f.link)
        .ok_or_else(|| StepError::NoLink(f.link.clone()))?;
    let targets: Vec<(String, String)> = link
        .ends
        .iter()
        .enumerate()
        .filter(|(k, _)| match &f.toward {
            // Frames toward end X leave from the other end.
            Some(t) => link.ends[1 - k].0 == *t,
            None => true,
        })
        .map(|(_, e)| e.clone())
        .collect();
    let loss_percent = match &f.percent {
        Some(pc) => Some(resolve(Some(pc), 0.0, p.ctx)?),
        None => None,
    };
    if let Some(pc) = loss_percent
        && !(pc > 0.0 && pc <= 100.0)
    {
        return Err(StepError::Loss(pc));
    }
    // Rate and queue may be templates over params (`"{{ params.queue }}"`).
    let rate_bps = match &f.rate {
        None => None,
        Some(r) => {
            let text = expr::render(r, p.ctx)?;
            Some(iblab_lab::quantity::parse_rate(&text).ok_or(StepError::Rate(text))?)
        }
    };
    let queue_bytes = match &f.queue {
        None => Some(64 * 1024),
        Some(q) => {
            let text = expr::render(q, p.ctx)?;
            Some(iblab_lab::quantity::parse_size(&text).ok_or(StepError::Queue(text))?)
        }
    };
    let action = Action::Fault(Fault {
        link: link.name.clone(),
        action: f.action,
        targets,
        loss_percent,
        rate_bps,
        queue_bytes,
    });
    Ok(base.planned(None, action, limits::STEP_TIMEOUT, skip))
}

/// A command or a probe repeated until `until` holds.
fn wait(
    p: &Planning,
    base: &Base,
    w: &WaitSpec,
    skip: Option<String>,
) -> Result<PlannedStep, StepError> {
    let inner = match (&w.exec, &w.probe) {
        (Some(e), _) => exec_action(p, e)?,
        (None, Some(pr)) => probe_action(p.lab, pr),
        (None, None) => return Err(StepError::WaitWithoutAction),
    };
    let skip = match &w.probe {
        Some(pr) => skip.or_else(|| path_skip(p, pr.path_or_default())),
        None => skip,
    };
    let interval = w
        .interval
        .map(|d| d.0)
        .unwrap_or(Duration::from_millis(500));
    let action = Action::Wait(Wait {
        inner: Box::new(inner),
        until: w.until.clone(),
        interval,
    });
    Ok(base.planned(None, action, limits::STEP_TIMEOUT, skip))
}

fn sleep(base: &Base, d: &DurationSpec, skip: Option<String>) -> PlannedStep {
    base.planned(
        None,
        Action::Sleep { duration: d.0 },
        d.0 + limits::SLEEP_MARGIN,
        skip,
    )
}

/// A probe, skipped where its path is not in the run, and a verbs probe of ③ where no
/// verbs device carries ③.
fn probe(p: &Planning, base: &Base, pr: &ProbeSpec, skip: Option<String>) -> PlannedStep {
    let on_hca_ib = p.hca.is_some_and(|h| h.path == PathKind::Ib);
    let skip = skip
        .or_else(|| path_skip(p, pr.path_or_default()))
        .or_else(|| {
            (pr.what == ProbeKind::Verbs
                && pr.path_or_default() == PathKind::Ib
                && !on_hca_ib
                && !p.verbs_in_nodes)
                .then(|| {
                    format!(
                        "path ③ ib has no verbs device on the {} backend: ibsim has no data path, and its nodes have no rxe to carry ③",
                        p.backend.name()
                    )
                })
        });
    base.planned(None, probe_action(p.lab, pr), limits::STEP_TIMEOUT, skip)
}

fn sm(p: &Planning, base: &Base, c: &SmControlSpec, skip: Option<String>) -> PlannedStep {
    let skip = skip.or_else(|| path_skip(p, PathKind::Ib));
    let action = Action::Sm(SmControl {
        name: c.name.clone(),
        action: c.action,
    });
    base.planned(None, action, limits::STEP_TIMEOUT, skip)
}

/// The skip reason of a step that works on path `path`, when it is not in the run.
fn path_skip(p: &Planning, path: PathKind) -> Option<String> {
    if p.paths.contains(&path) {
        None
    } else {
        Some(format!(
            "path {} {path} {}",
            path.mark(),
            p.excluded
                .get(&path)
                .map(String::as_str)
                .unwrap_or("is not in this run")
        ))
    }
}

fn probe_action(lab: &Lab, p: &ProbeSpec) -> Action {
    Action::Probe(Probe {
        what: p.what,
        path: p.path_or_default(),
        node: p
            .node
            .clone()
            .or_else(|| p.from.clone())
            .unwrap_or_else(|| lab.spec.topology.nodes[0].clone()),
        from: p.from.clone(),
        to: p.to.clone(),
    })
}

/// Does an expression read the results of steps (so it must wait for the run)?
fn reads_results(src: &str) -> bool {
    expr::check_expression(src)
        .map(|vars| vars.iter().any(|v| v.starts_with("steps")))
        .unwrap_or(false)
}

fn render_all(args: &[String], ctx: &serde_json::Value) -> Result<Vec<String>, ExprError> {
    args.iter().map(|a| expr::render(a, ctx)).collect()
}

/// A number the lab writes, or a template of one rendered now.
fn resolve<T>(p: Option<&Param<T>>, default: T, ctx: &serde_json::Value) -> Result<T, StepError>
where
    T: Clone + std::str::FromStr,
{
    match p {
        None => Ok(default),
        Some(Param::Value(v)) => Ok(v.clone()),
        Some(Param::Template(t)) => {
            let text = expr::render(t, ctx)?;
            text.trim().parse::<T>().map_err(|_| StepError::NotANumber {
                template: t.clone(),
                text,
            })
        }
    }
}
