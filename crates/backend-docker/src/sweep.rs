//! Removing what the docker backend created: containers by name (teardown) and, for
//! `down --all`, everything that carries iblab's run label (containers whose state file is
//! gone, and any network or volume a future design might add).

use std::collections::HashMap;

use bollard::query_parameters::{
    ListContainersOptions, ListNetworksOptions, ListVolumesOptions, RemoveContainerOptions,
    RemoveVolumeOptions,
};

use super::engine::{Engine, is_not_found};
use super::labels::RUN;
use iblab_backend::Swept;

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

/// Remove every container, network and volume labelled with a run id, except those of
/// the runs `spare` names (a run with a state file, or whose owner is alive).
pub async fn sweep_labelled(engine: &Engine, spare: &iblab_backend::Spare<'_>) -> Swept {
    let mut out = Swept::default();
    let filters = HashMap::from([("label".to_string(), vec![RUN.to_string()])]);
    let spared = |labels: Option<&HashMap<String, String>>| {
        labels.and_then(|l| l.get(RUN)).is_some_and(|r| spare(r))
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
            out.removed.extend(
                names
                    .into_iter()
                    .map(|n| format!("container {n} (by label {RUN})")),
            );
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
                    Ok(()) => out.removed.push(format!("network {name} (by label {RUN})")),
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
                    Ok(()) => out
                        .removed
                        .push(format!("volume {} (by label {RUN})", v.name)),
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
