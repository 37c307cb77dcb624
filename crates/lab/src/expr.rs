//! The one expression and template engine of lab files (minijinja): `when`, `until`,
//! `that`, and `{{ … }}` in commands and numbers.

use std::collections::BTreeSet;

use minijinja::{Environment, UndefinedBehavior, Value};

/// When a name is there to be read; each phase also sees the names of the phases before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// When the lab is planned, before anything runs: templates (`{{ … }}` in commands,
    /// numbers, rates, queues) and subnet managers' `when`.
    Plan,
    /// While and after the steps run: a step's `when`, expectations, comparison cells.
    Run,
    /// Inside `wait.until`, which also reads the last attempt.
    Until,
}

impl Phase {
    /// Why a name of this phase cannot be read earlier, for a diagnostic.
    pub fn why_not_before(self) -> &'static str {
        match self {
            Phase::Plan => "",
            Phase::Run => {
                "this is read when the lab is planned, before any step has run (templates are rendered then)"
            }
            Phase::Until => "`result` is the last attempt of a wait, read only in its `until`",
        }
    }
}

/// Names an expression or template may start from, the phase from which each is there to
/// be read (templates and expressions share one context: `plan::context`, plus
/// `steps` and `result` when they exist), and what each holds.
pub const ROOTS: &[(&str, Phase, &str)] = &[
    (
        "scenario",
        Phase::Plan,
        "the scenario's name, e.g. `scenario == 'loss'`",
    ),
    (
        "params",
        Phase::Plan,
        "the lab's parameters after the scenario's overrides",
    ),
    (
        "paths",
        Phase::Plan,
        "the paths this run covers, e.g. `'ib' in paths`",
    ),
    (
        "nodes",
        Phase::Plan,
        "nodes by name: `nodes.a.ip`, `nodes.a.interfaces` (their names, in link order), `nodes.a.rdma_devices` (path ②'s Soft-RoCE devices, e.g. `{{ nodes.a.rdma_devices[0] }}`)",
    ),
    ("backend", Phase::Plan, "the backend's name"),
    (
        "iblab",
        Phase::Plan,
        "the iblab binary as the nodes see it, e.g. `{{ iblab }} verbs-probe` in an exec step",
    ),
    (
        "steps",
        Phase::Run,
        "results of steps by id, e.g. `steps.clean.tcp.throughput_mbps`",
    ),
    (
        "repeat",
        Phase::Run,
        "how many times each traffic step ran (`up --repeat N`, else 1): its figures are medians of one run, while a fault's counts cover every run",
    ),
    (
        "result",
        Phase::Until,
        "inside `wait.until` only: the last attempt",
    ),
];

/// What `nodes.NAME.` holds.
pub const NODE_FIELDS: &[&str] = &["ip", "interfaces", "rdma_devices"];

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    // A bounded amount of work per template or expression: a loop that never ends (or
    // runs for hours) is an error, not a hung run.
    env.set_fuel(Some(crate::limits::FUEL));
    env
}

/// Why an expression or template cannot be compiled, evaluated or rendered, with
/// minijinja's error as its source. Its words are what a diagnostic or a step's reason
/// shows.
#[derive(Debug, thiserror::Error)]
pub enum ExprError {
    /// It did more work than [`crate::limits::FUEL`] allows (a loop too long for a lab).
    #[error(
        "it did more than {} steps of work and was stopped (out of fuel): a loop too long for a lab; \
         write the value, or loop over less",
        crate::limits::FUEL
    )]
    OutOfFuel(#[source] minijinja::Error),
    /// minijinja refused it: its kind, detail and cause.
    #[error("{}", describe(.0))]
    Refused(#[source] minijinja::Error),
    /// Its value is not one JSON can hold.
    #[error("{0}")]
    Value(#[from] serde_json::Error),
}

impl From<minijinja::Error> for ExprError {
    fn from(e: minijinja::Error) -> ExprError {
        if e.kind() == minijinja::ErrorKind::OutOfFuel {
            ExprError::OutOfFuel(e)
        } else {
            ExprError::Refused(e)
        }
    }
}

/// Compile an expression and list the variables it reads (dotted, e.g. `steps.a.ok`).
pub fn check_expression(src: &str) -> Result<BTreeSet<String>, ExprError> {
    let env = environment();
    let expr = env.compile_expression(src)?;
    Ok(expr.undeclared_variables(true).into_iter().collect())
}

/// Compile a template and list the variables it reads.
pub fn check_template(src: &str) -> Result<BTreeSet<String>, ExprError> {
    let env = environment();
    let tmpl = env.template_from_str(src)?;
    Ok(tmpl.undeclared_variables(true).into_iter().collect())
}

/// Evaluate an expression against a JSON context.
pub fn eval(src: &str, ctx: &serde_json::Value) -> Result<serde_json::Value, ExprError> {
    let env = environment();
    let expr = env.compile_expression(src)?;
    let v = expr.eval(Value::from(minijinja::value::Serde(ctx)))?;
    Ok(serde_json::to_value(&v)?)
}

/// Evaluate an expression as a truth value.
pub fn eval_bool(src: &str, ctx: &serde_json::Value) -> Result<bool, ExprError> {
    let env = environment();
    let expr = env.compile_expression(src)?;
    let v = expr.eval(Value::from(minijinja::value::Serde(ctx)))?;
    Ok(v.is_true())
}

/// Render a template against a JSON context.
pub fn render(src: &str, ctx: &serde_json::Value) -> Result<String, ExprError> {
    if !src.contains("{{") && !src.contains("{%") {
        return Ok(src.to_string());
    }
    Ok(environment().render_str(src, Value::from(minijinja::value::Serde(ctx)))?)
}

/// minijinja's error in words: its kind, detail and cause.
fn describe(e: &minijinja::Error) -> String {
    let mut msg = match e.detail() {
        Some(d) => format!("{}: {d}", e.kind()),
        None => e.kind().to_string(),
    };
    if let Some(src) = std::error::Error::source(e) {
        msg.push_str(&format!(" ({src})"));
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lists_dotted_variables() {
        let vars =
            check_expression("steps.a.tcp.x < 0.5 * steps.b.tcp.x and scenario == 'l'").unwrap();
        assert!(vars.contains("steps.a.tcp.x"), "{vars:?}");
        assert!(vars.contains("scenario"));
    }

    #[test]
    fn syntax_errors_are_reported() {
        assert!(check_expression("steps.a.ok ==").is_err());
        assert!(check_template("{{ nodes.a.ip ").is_err());
    }

    #[test]
    fn strict_about_missing_values() {
        let ctx = json!({"steps": {"a": {"ok": true, "n": 3}}});
        assert!(eval_bool("steps.a.ok", &ctx).unwrap());
        assert!(eval_bool("steps.b.ok", &ctx).is_err());
        assert_eq!(render("x{{ steps.a.n }}", &ctx).unwrap(), "x3");
    }
}
