//! `exec`, `shell` and `status RUN`: into the nodes of a lab that is up (kept with
//! `--keep`, or still running), through its backend's own way in.

use std::io::IsTerminal;
use std::os::unix::process::ExitStatusExt;

use super::{Failure, Outcome, exit};
use iblab_sys::state::{self, RunState, Standing};

/// No run of the state folder is the one a user named.
#[derive(Debug, thiserror::Error)]
pub enum NoRun {
    #[error("no run `{0}`: no lab is up (start one with `iblab up LAB --keep`)")]
    NoneUp(String),
    #[error("no run `{target}`; runs up now: {}", up.join(", "))]
    Other { target: String, up: Vec<String> },
}

impl From<NoRun> for Failure {
    fn from(e: NoRun) -> Failure {
        Failure::new(exit::BAD_INPUT, e.to_string())
    }
}

/// The run a user means: a run id, or the newest run of a lab by that name.
pub fn find_run(target: &str) -> Result<RunState, NoRun> {
    let runs: Vec<RunState> = state::all_runs().iter().map(|f| f.snapshot()).collect();
    if let Some(r) = runs.iter().find(|r| r.run_id == target) {
        return Ok(r.clone());
    }
    // all_runs is sorted oldest first: the newest of that lab is the last.
    match runs.iter().rev().find(|r| r.lab == target) {
        Some(r) => Ok(r.clone()),
        None if runs.is_empty() => Err(NoRun::NoneUp(target.to_string())),
        None => Err(NoRun::Other {
            target: target.to_string(),
            up: runs
                .iter()
                .map(|r| format!("{} ({})", r.run_id, r.lab))
                .collect(),
        }),
    }
}

/// The host command that runs `argv` on `node` of the run, or the reason it cannot.
fn way_in(run: &RunState, node: &str, argv: &[String], tty: bool) -> Result<Vec<String>, Failure> {
    if !run.nodes.is_empty() && !run.nodes.iter().any(|n| n.name == node) {
        return Err(Failure::new(
            exit::BAD_INPUT,
            format!(
                "run {} ({}) has no node `{node}`; its nodes: {}",
                run.run_id,
                run.lab,
                run.nodes
                    .iter()
                    .map(|n| n.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    if run.standing() == Standing::Stale {
        return Err(Failure::new(
            exit::ENVIRONMENT,
            format!(
                "run {} is stale (its iblab ended without tearing it down and it was not kept); remove it with `iblab down {}`",
                run.run_id, run.run_id
            ),
        ));
    }
    let backend = crate::backends::named(&run.backend).ok_or_else(|| {
        Failure::new(
            exit::ENVIRONMENT,
            format!(
                "run {} is on backend `{}`, which this build does not know",
                run.run_id, run.backend
            ),
        )
    })?;
    backend
        .way_in(&run.run_id, node, argv, tty)
        .map_err(|why| Failure::new(exit::ENVIRONMENT, why.to_string()))
}

/// Run a command with this terminal's stdin, stdout and stderr; its exit code passes
/// through (a signal `N` as 128 + N, as shells do).
fn run_attached(cmd: &[String]) -> i32 {
    let Some((program, args)) = cmd.split_first() else {
        return exit::BAD_INPUT;
    };
    // Ctrl-C is the command's to handle, not ours: wait for it and pass its code on.
    iblab_sys::interrupt::leave_sigint_to_the_child();
    match std::process::Command::new(program).args(args).status() {
        Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
        Err(e) => {
            eprintln!("error: cannot run {program}: {e}");
            exit::ENVIRONMENT
        }
    }
}

pub fn exec(target: &str, node: &str, argv: &[String]) -> Outcome {
    if argv.is_empty() {
        return Err(Failure::new(
            exit::BAD_INPUT,
            format!("say what to run: `iblab exec {target} {node} -- COMMAND ARGS…`"),
        ));
    }
    let run = find_run(target)?;
    Ok(run_attached(&way_in(&run, node, argv, false)?))
}

pub fn shell(target: &str, node: &str) -> Outcome {
    let run = find_run(target)?;
    let tty = std::io::stdin().is_terminal();
    // Local nodes run the host's programs; containers and guests have a POSIX sh.
    let sh = if run.backend == "local" && iblab_sys::host::which("bash").is_some() {
        "bash"
    } else {
        "sh"
    };
    let cmd = way_in(&run, node, &[sh.to_string()], tty)?;
    if tty {
        eprintln!(
            "{node} of run {} ({}): exit the shell to leave",
            run.run_id, run.lab
        );
    }
    Ok(run_attached(&cmd))
}

/// The nodes of a run: name, what it is, its addresses, and the command to get in.
pub fn node_table(run: &RunState) -> String {
    let mut rows = vec![[
        "NODE".to_string(),
        "KIND".into(),
        "ADDRESSES".into(),
        "WAY IN".into(),
    ]];
    for n in &run.nodes {
        let enter = match crate::backends::named(&run.backend)
            .map(|k| k.way_in(&run.run_id, &n.name, &[], false))
        {
            Some(Ok(_)) => format!("iblab shell {} {}", run.run_id, n.name),
            Some(Err(why)) => why.to_string(),
            None => "—".into(),
        };
        rows.push([
            n.name.clone(),
            if n.switch { "switch" } else { "host" }.into(),
            {
                let mut a = n.addresses.clone();
                for g in &n.gids {
                    // `DEVICE GID`, shown as `② GID gid (device)`.
                    match g.split_once(' ') {
                        Some((dev, gid)) => a.push(format!("② GID {gid} ({dev})")),
                        None => a.push(format!("② GID {g}")),
                    }
                }
                if let Some(lid) = n.lid.filter(|l| *l > 0) {
                    a.push(format!("③ LID {lid}"));
                }
                if a.is_empty() {
                    "—".into()
                } else {
                    a.join(", ")
                }
            },
            enter,
        ]);
    }
    let widths: Vec<usize> = (0..3)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        for (c, w) in widths.iter().enumerate() {
            out.push_str(&format!("{:<w$}  ", r[c], w = w));
        }
        out.push_str(&r[3]);
        out.push('\n');
    }
    out
}

/// `status RUN`: how the run stands, and its nodes.
pub fn status_of(target: &str) -> Outcome {
    let run = find_run(target)?;
    println!(
        "run {} · lab {} · scenario {} · backend {} · {} · started {}",
        run.run_id,
        run.lab,
        run.scenario,
        run.backend,
        run.standing().as_str(),
        run.started
    );
    match run.standing() {
        Standing::Running => println!("its `iblab up` is still running"),
        Standing::Kept => println!(
            "kept with --keep: enter a node with `iblab shell {0} NODE` or run a command with `iblab exec {0} NODE -- CMD`; remove it with `iblab down {0}`",
            run.run_id
        ),
        Standing::Stale => println!(
            "stale: its iblab ended without tearing it down; remove it with `iblab down {}`",
            run.run_id
        ),
    }
    println!();
    print!("{}", node_table(&run));
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iblab_sys::state::NodeEntry;

    #[test]
    fn node_table_gives_every_address_a_learner_connects_with() {
        let run = RunState {
            run_id: "abc123".into(),
            lab: "lesson1".into(),
            scenario: "default".into(),
            backend: "local".into(),
            owner_pid: 0,
            owner_start_ticks: None,
            started: "2026-12-01T00:00:00Z".into(),
            run_dir: "run".into(),
            resources: vec![],
            nodes: vec![
                NodeEntry {
                    name: "a".into(),
                    switch: false,
                    addresses: vec!["eth0 198.18.0.1/24".into()],
                    lid: Some(1),
                    gids: vec!["a-rxe0 ::ffff:198.18.0.1".into()],
                },
                NodeEntry {
                    name: "sw1".into(),
                    switch: true,
                    addresses: vec![],
                    lid: None,
                    gids: vec![],
                },
            ],
            kept: true,
        };
        let table = node_table(&run);
        let a = table.lines().find(|l| l.starts_with("a ")).unwrap();
        assert!(
            a.contains("eth0 198.18.0.1/24, ② GID ::ffff:198.18.0.1 (a-rxe0), ③ LID 1"),
            "{table}"
        );
        assert!(a.ends_with("iblab shell abc123 a"), "{table}");
        let sw = table.lines().find(|l| l.starts_with("sw1")).unwrap();
        assert!(sw.contains("switch") && sw.contains('—'), "{table}");
    }
}
