//! `down` and `status`: runs found through their state files.

use super::exit;
use crate::run::state::{self, alive};

pub fn down(target: Option<&str>, all: bool) -> i32 {
    if !all && target.is_none() {
        eprintln!(
            "error: say which runs to remove: `iblab down LAB`, `iblab down RUN_ID`, or `iblab down --all`"
        );
        return exit::BAD_INPUT;
    }
    let mut removed = 0;
    let mut problems = Vec::new();
    for f in state::all_runs() {
        let s = f.snapshot();
        if all || target == Some(s.lab.as_str()) || target == Some(s.run_id.as_str()) {
            if alive(s.owner_pid) && s.owner_pid != std::process::id() {
                // Stop the owner first, so it does not create more while we remove.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(s.owner_pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let n = s.resources.len();
            let p = f.teardown();
            if p.is_empty() {
                println!(
                    "removed run {} ({} {}, {n} resources)",
                    s.run_id, s.lab, s.scenario
                );
                removed += 1;
            }
            problems.extend(p);
        }
    }
    if all {
        // Temporary folders of vm runs whose state file is gone and whose owner is dead.
        let known: Vec<String> = state::all_runs()
            .iter()
            .map(|f| f.snapshot().run_id)
            .collect();
        for path in crate::backend::vm::remove_orphans(&known) {
            println!("removed {path} (left by a vm run with no state file)");
        }
        // Containers, networks and volumes of runs whose state file is gone (a crash
        // before `down`): found by the run label.
        let swept = crate::backend::docker::sweep::sweep_labelled_blocking(vec![]);
        if !swept.containers.is_empty() || !swept.networks.is_empty() || !swept.volumes.is_empty() {
            println!(
                "removed by label {}: {} container(s), {} network(s), {} volume(s)",
                crate::backend::docker::labels::RUN,
                swept.containers.len(),
                swept.networks.len(),
                swept.volumes.len()
            );
        }
        problems.extend(swept.problems);
        // Strays: namespaces whose state file is gone, unless a live run owns them (one
        // started with another IBLAB_STATE_DIR).
        let orphans: Vec<String> = state::lab_namespaces()
            .into_iter()
            .filter(|n| !state::run_of_namespace(n).is_some_and(state::run_is_live))
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
    for p in &problems {
        eprintln!("error: {p}");
    }
    if removed == 0 && problems.is_empty() {
        println!("nothing to remove");
    }
    if problems.is_empty() {
        exit::OK
    } else {
        exit::ENVIRONMENT
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
        "{:<8} {:<14} {:<14} {:<8} {:<10} {:<22} resources",
        "RUN", "LAB", "SCENARIO", "BACKEND", "STATE", "STARTED"
    );
    for f in runs {
        let s = f.snapshot();
        let st = if alive(s.owner_pid) {
            "running"
        } else {
            "kept/stale"
        };
        println!(
            "{:<8} {:<14} {:<14} {:<8} {:<10} {:<22} {}",
            s.run_id,
            s.lab,
            s.scenario,
            s.backend,
            st,
            s.started,
            s.resources.len()
        );
    }
    let known: Vec<String> = state::all_runs()
        .iter()
        .flat_map(|f| f.snapshot().resources)
        .filter_map(|r| match r {
            state::Resource::Netns { name } => Some(name),
            _ => None,
        })
        .collect();
    let stray: Vec<&String> = orphans.iter().filter(|o| !known.contains(o)).collect();
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
