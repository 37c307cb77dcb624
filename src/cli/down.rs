//! `down` and `status`: runs found through their state files.

use super::{Failure, Outcome, exit};
use iblab_sys::state;

pub fn down(target: Option<&str>, all: bool, all_owners: bool, yes: bool) -> Outcome {
    if !all && target.is_none() {
        return Err(Failure::new(
            exit::BAD_INPUT,
            "say which runs to remove: `iblab down LAB`, `iblab down RUN_ID`, or `iblab down --all`",
        ));
    }
    let rt = super::runtime()?;
    rt.block_on(remove(target, all, all_owners, yes))
}

/// The runs named (or every run, with `all`), then with `all` what crashed runs left;
/// every problem is told, and makes it an environment error.
async fn remove(target: Option<&str>, all: bool, all_owners: bool, yes: bool) -> Outcome {
    let mut problems = Vec::new();
    let removed = remove_runs(target, all, &mut problems).await;
    if all {
        sweep_leftovers(all_owners, yes, &mut problems).await?;
    }
    for p in &problems {
        eprintln!("error: {p}");
    }
    if removed == 0 && problems.is_empty() {
        println!("nothing to remove");
    }
    Ok(if problems.is_empty() {
        exit::OK
    } else {
        exit::ENVIRONMENT
    })
}

/// Tear down each run of this state folder that `target` names (its lab or its id), or
/// every one with `all`: how many were removed whole.
async fn remove_runs(target: Option<&str>, all: bool, problems: &mut Vec<String>) -> usize {
    let mut removed = 0;
    for f in state::all_runs() {
        let s = f.snapshot();
        if !(all || target == Some(s.lab.as_str()) || target == Some(s.run_id.as_str())) {
            continue;
        }
        if s.owner_running() {
            // Stop the owner first, so it does not create more while we remove (its
            // pid and start time: a pid that another process reuses is not killed).
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(s.owner_pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let n = s.resources.len();
        let p = f
            .teardown(&iblab_backend::Backends(crate::backends::BACKENDS))
            .await;
        if p.is_empty() {
            println!(
                "removed run {} ({} {}, {n} resources)",
                s.run_id, s.lab, s.scenario
            );
            removed += 1;
        }
        problems.extend(p);
    }
    removed
}

/// What runs whose state file is gone left behind (a crash before `down`, or a state
/// folder lost), asked of every backend. A run whose owner is alive is spared (one
/// started with another IBLAB_STATE_DIR). On a cluster, only this owner's, unless told
/// every owner's (`all_owners`): those only once listed, object by object, and confirmed.
async fn sweep_leftovers(
    all_owners: bool,
    yes: bool,
    problems: &mut Vec<String>,
) -> Result<(), Failure> {
    let spare = |run: &str| state::run_is_live(run);
    let owner = state::owner();
    let mine = iblab_backend::Scope {
        spare: &spare,
        owner: Some(owner.as_str()),
        only: None,
    };
    let listed = sweep(&mine, problems).await;
    if all_owners {
        sweep_every_owner(&mine, listed, yes, problems).await?;
    }
    remove_orphan_namespaces(&spare, problems);
    Ok(())
}

/// Every owner's leftovers: exactly the objects shown and confirmed are taken, each by
/// its uid; an object of another owner that appears while the prompt is open (a new pod
/// of a listed run, a run that just started) is listed and asked for again, never taken
/// unseen (a few rounds at most, for a cluster that keeps starting runs).
async fn sweep_every_owner(
    mine: &iblab_backend::Scope<'_>,
    mut listed: Vec<iblab_backend::Listed>,
    yes: bool,
    problems: &mut Vec<String>,
) -> Result<(), Failure> {
    let mut shown: std::collections::BTreeSet<String> = Default::default();
    for round in 0..3 {
        if listed.is_empty() {
            break;
        }
        let runs: std::collections::BTreeSet<&str> =
            listed.iter().map(|l| l.run.as_str()).collect();
        println!(
            "every owner's sweep would also remove {} object(s) of {} run(s) of other \
             owners{} (this machine cannot tell whether they are live elsewhere):",
            listed.len(),
            runs.len(),
            if round == 0 {
                ""
            } else {
                " that appeared since the last list"
            },
        );
        for l in &listed {
            println!("  run {}: {} (uid {})", l.run, l.what, l.uid);
        }
        if !(yes || confirmed()) {
            return Err(Failure::new(
                exit::BAD_INPUT,
                "other owners' runs not removed: confirm on a terminal, or pass \
                 `iblab down --all --all-owners --yes`",
            ));
        }
        shown.extend(listed.iter().map(|l| l.uid.clone()));
        let everyone = iblab_backend::Scope {
            spare: mine.spare,
            owner: None,
            only: Some(&shown),
        };
        sweep(&everyone, problems).await;
        listed = others_unseen(mine, &shown).await;
    }
    if !listed.is_empty() {
        println!(
            "left {} object(s) of other owners that kept appearing: {}",
            listed.len(),
            listed
                .iter()
                .map(|l| l.what.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

/// Namespaces whose state file is gone, unless a live run owns them; and the live markers
/// of dead runs.
fn remove_orphan_namespaces(spare: &iblab_backend::Spare<'_>, problems: &mut Vec<String>) {
    let orphans: Vec<String> = state::lab_namespaces()
        .into_iter()
        .filter(|n| !state::run_of_namespace(n).is_some_and(spare))
        .collect();
    for n in &orphans {
        if let Some(run) = state::run_of_namespace(n) {
            state::forget(run);
        }
    }
    state::forget_dead_runs();
    if !orphans.is_empty() {
        problems.extend(state::delete_namespaces(&orphans));
        println!(
            "removed {} leftover namespace(s) with no state file",
            orphans.len()
        );
    }
}

pub fn status() -> i32 {
    let runs = state::all_runs();
    let orphans = state::lab_namespaces();
    if runs.is_empty() && orphans.is_empty() {
        println!("no lab is up");
        return exit::OK;
    }
    println!(
        "{:<16} {:<14} {:<14} {:<8} {:<10} {:<22} resources",
        "RUN", "LAB", "SCENARIO", "BACKEND", "STATE", "STARTED"
    );
    for f in runs {
        let s = f.snapshot();
        let st = s.standing().as_str();
        println!(
            "{:<16} {:<14} {:<14} {:<8} {:<10} {:<22} {}",
            s.run_id,
            s.lab,
            s.scenario,
            s.backend,
            st,
            s.started,
            s.resources.len()
        );
    }
    println!("\n`iblab status RUN` shows a run's nodes and how to enter them.");
    let known: Vec<String> = state::all_runs()
        .iter()
        .flat_map(|f| f.snapshot().resources)
        .filter_map(|r| match r {
            state::Resource::Netns { name } => Some(name),
            _ => None,
        })
        .collect();
    // A run that is up under another state folder (its owner alive, or kept) is no stray.
    let stray: Vec<&String> = orphans
        .iter()
        .filter(|o| !known.contains(o))
        .filter(|o| !state::run_of_namespace(o).is_some_and(state::run_is_live))
        .collect();
    if !stray.is_empty() {
        println!(
            "namespaces with no state file (remove with `iblab down --all`): {}",
            stray
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    exit::OK
}

/// One sweep of every backend for what crashed runs left, saying what it removed and
/// left; the other owners' objects a sweep of every owner would take.
async fn sweep(
    scope: &iblab_backend::Scope<'_>,
    problems: &mut Vec<String>,
) -> Vec<iblab_backend::Listed> {
    let mut others = Vec::new();
    for k in crate::backends::BACKENDS {
        let swept = k.sweep(scope).await;
        for r in &swept.removed {
            println!("removed {r}");
        }
        for l in &swept.left {
            println!("left {l}");
        }
        others.extend(swept.listed);
        problems.extend(swept.problems);
    }
    others
}

/// The other owners' objects a sweep of every owner would take that were not shown yet
/// (asked of every backend with this owner's scope, removing nothing of theirs: this owner's
/// own leftovers were swept already).
async fn others_unseen(
    mine: &iblab_backend::Scope<'_>,
    shown: &std::collections::BTreeSet<String>,
) -> Vec<iblab_backend::Listed> {
    let mut unseen = Vec::new();
    for k in crate::backends::BACKENDS {
        let swept = k.sweep(mine).await;
        unseen.extend(swept.listed.into_iter().filter(|l| !shown.contains(&l.uid)));
    }
    unseen.sort_by(|a, b| (&a.run, &a.what).cmp(&(&b.run, &b.what)));
    unseen.dedup();
    unseen
}

/// Asked on a terminal: remove the runs just listed? Never yes without one.
fn confirmed() -> bool {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return false;
    }
    eprint!("remove them? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    if std::io::stdin().lock().read_line(&mut answer).is_err() {
        return false;
    }
    matches!(answer.trim(), "y" | "Y" | "yes")
}
