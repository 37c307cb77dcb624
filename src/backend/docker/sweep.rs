//! Removing what the docker backend created: containers by name (teardown) and, for
//! `down --all`, everything that carries iblab's run label (containers whose state file is
//! gone, and any network or volume a future design might add).

use std::collections::HashMap;

use bollard::query_parameters::{
    ListContainersOptions, ListNetworksOptions, ListVolumesOptions, RemoveContainerOptions,
    RemoveVolumeOptions,
};

use super::engine::{self, Engine, is_not_found};
use super::labels::RUN;

/// Remove containers (killing what runs in them); a container already gone is fine.
/// Returns what could not be removed.
pub async fn remove(engine: &Engine, names: &[String]) -> Vec<String> {
    let opts = RemoveContainerOptions {
        force: true,
        v: true,
        link: false,
    };
    let results = futures_util::future::join_all(names.iter().map(|n| {
        let opts = opts.clone();
        async move {
            match engine.docker.remove_container(n, Some(opts)).await {
                Ok(()) => None,
                Err(e) if is_not_found(&e) => None,
                Err(e) => Some(format!("container {n} could not be removed: {e}")),
            }
        }
    }))
    .await;
    results.into_iter().flatten().collect()
}

/// [`remove`] from synchronous code (the state file's teardown).
pub fn remove_blocking(names: Vec<String>) -> Vec<String> {
    let outcome = engine::blocking(move || async move {
        match engine::connect().await {
            Ok(e) => remove(&e, &names).await,
            Err(err) => vec![format!(
                "cannot reach the Docker engine to remove container(s) {}: {err}",
                names.join(", ")
            )],
        }
    });
    outcome.unwrap_or_else(|e| vec![e])
}

/// What a label sweep removed.
#[derive(Debug, Default)]
pub struct Swept {
    pub containers: Vec<String>,
    pub networks: Vec<String>,
    pub volumes: Vec<String>,
    pub problems: Vec<String>,
}

/// Remove every container, network and volume labelled with a run id, except those of the
/// runs in `spare_runs`. No engine here means nothing to sweep.
pub fn sweep_labelled_blocking(spare_runs: Vec<String>) -> Swept {
    engine::blocking(move || async move {
        let Ok(engine) = engine::connect().await else {
            return Swept::default();
        };
        sweep_labelled(&engine, &spare_runs).await
    })
    .unwrap_or_else(|e| Swept {
        problems: vec![e],
        ..Swept::default()
    })
}

async fn sweep_labelled(engine: &Engine, spare_runs: &[String]) -> Swept {
    let mut out = Swept::default();
    let filters = HashMap::from([("label".to_string(), vec![RUN.to_string()])]);
    let spared = |labels: Option<&HashMap<String, String>>| {
        labels
            .and_then(|l| l.get(RUN))
            .is_some_and(|r| spare_runs.contains(r))
    };
    match engine
        .docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(filters.clone()),
            ..Default::default()
        }))
        .await
    {
        Ok(list) => {
            let names: Vec<String> = list
                .iter()
                .filter(|c| !spared(c.labels.as_ref()))
                .filter_map(|c| {
                    c.names
                        .as_ref()
                        .and_then(|n| n.first())
                        .map(|n| n.trim_start_matches('/').to_string())
                        .or_else(|| c.id.clone())
                })
                .collect();
            out.problems.extend(remove(engine, &names).await);
            out.containers = names;
        }
        Err(e) => out.problems.push(format!("cannot list containers: {e}")),
    }
    match engine
        .docker
        .list_networks(Some(ListNetworksOptions {
            filters: Some(filters.clone()),
        }))
        .await
    {
        Ok(list) => {
            for n in list.iter().filter(|n| !spared(n.labels.as_ref())) {
                let Some(name) = n.name.clone() else { continue };
                match engine.docker.remove_network(&name).await {
                    Ok(()) => out.networks.push(name),
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => out
                        .problems
                        .push(format!("network {name} could not be removed: {e}")),
                }
            }
        }
        Err(e) => out.problems.push(format!("cannot list networks: {e}")),
    }
    match engine
        .docker
        .list_volumes(Some(ListVolumesOptions {
            filters: Some(filters),
        }))
        .await
    {
        Ok(list) => {
            for v in list.volumes.unwrap_or_default() {
                if spared(Some(&v.labels)) {
                    continue;
                }
                match engine
                    .docker
                    .remove_volume(&v.name, Some(RemoveVolumeOptions { force: true }))
                    .await
                {
                    Ok(()) => out.volumes.push(v.name),
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => out
                        .problems
                        .push(format!("volume {} could not be removed: {e}", v.name)),
                }
            }
        }
        Err(e) => out.problems.push(format!("cannot list volumes: {e}")),
    }
    out
}
