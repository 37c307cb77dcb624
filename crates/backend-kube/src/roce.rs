//! Path ② in pods: which nodes of the cluster can give each pod a Soft-RoCE device of its
//! own (a kernel whose rxe has a socket per network namespace, labelled so), read once
//! before planning, so that planning itself asks nothing and `plan` shows where the pods
//! will go.

use std::time::Duration;

use iblab_core::caps::HostCaps;
use iblab_core::caps::preflight::{Check, Mark, check};
use iblab_k8s::cluster::{self, NodeFacts};
use iblab_k8s::manifest::{self, label};
use iblab_k8s::settings;

/// The preflight row that says where path ②'s pods go, or why there is nowhere.
pub const PLACEMENT: &str = "rxe in pods";
/// How long preflight waits for the cluster: planning must not hang on one that is down.
const ASK_WITHIN: Duration = Duration::from_secs(5);

/// Ask the cluster (read-only: its nodes) and say where path ②'s pods can run.
pub fn preflight() -> Vec<Check> {
    if let Err(why) = cluster::configured() {
        return vec![check(
            PLACEMENT,
            Mark::Fail,
            why.replace("\n  fix: ", "; fix: "),
        )];
    }
    let s = settings::get();
    let asked = iblab_sys::runtime::blocking(move || async move {
        tokio::time::timeout(ASK_WITHIN, async {
            let c = cluster::connect(&s).await?;
            cluster::facts(&c).await
        })
        .await
    });
    match asked {
        Ok(Ok(Ok(facts))) => rows(
            &facts.nodes,
            facts.runtime_classes.as_deref(),
            &settings::get().runtime_class,
        ),
        Ok(Ok(Err(e))) => vec![check(PLACEMENT, Mark::Fail, e.to_string())],
        Ok(Err(_)) => vec![check(
            PLACEMENT,
            Mark::Fail,
            format!(
                "the cluster did not answer within {} s",
                ASK_WITHIN.as_secs()
            ),
        )],
        Err(e) => vec![check(PLACEMENT, Mark::Fail, e.to_string())],
    }
}

/// The rows for these nodes and RuntimeClasses (`None`: not allowed to list them): where
/// the pods go, and what makes their devices (the node agent's RuntimeClass `wanted`).
pub fn rows(nodes: &[NodeFacts], runtime_classes: Option<&[String]>, wanted: &str) -> Vec<Check> {
    let fit: Vec<&NodeFacts> = nodes
        .iter()
        .filter(|n| n.ready && n.rxe_per_netns())
        .collect();
    if fit.is_empty() {
        let seen = nodes
            .iter()
            .map(|n| {
                format!(
                    "{} ({}, kernel {}{})",
                    n.name,
                    if n.ready { "Ready" } else { "not Ready" },
                    n.kernel,
                    if n.rxe_per_netns() {
                        format!(", {}=true", label::RXE_PER_NETNS)
                    } else {
                        String::new()
                    }
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        return vec![check(
            PLACEMENT,
            Mark::Fail,
            format!(
                "no Ready node of the cluster is labelled {}=true (its kernel gives rxe a \
                 socket per network namespace, Linux ≥ 7.1, and rdma_rxe is loaded): {}; \
                 label such nodes (`iblab doctor --backend kube` shows each node's kernel), \
                 or use --backend vm",
                label::RXE_PER_NETNS,
                if seen.is_empty() {
                    "it lists no node".into()
                } else {
                    seen
                }
            ),
        )];
    }
    let agent = match runtime_classes {
        Some(have) if !have.iter().any(|r| r == wanted) => {
            return vec![check(
                PLACEMENT,
                Mark::Fail,
                format!(
                    "the cluster has no RuntimeClass {wanted}: path ②'s pods get their rxe \
                     from iblab's node agent on the nodes labelled {}=true; install it \
                     (kubectl apply -f manifests/node-agent.yaml, or the chart with \
                     nodeAgent.enabled=true, and the runtime handler in containerd's config: \
                     docs/kube.md), or use --backend vm",
                    label::RXE_PER_NETNS
                ),
            )];
        }
        Some(_) => check(
            "verbs devices",
            Mark::Ok,
            format!("RuntimeClass {wanted}: {}", manifest::ROCE_DEVICES_WHY),
        ),
        None => check(
            "verbs devices",
            Mark::Warn,
            format!(
                "cannot list RuntimeClasses to see that {wanted} is there (the node agent's, \
                 docs/kube.md); {}",
                manifest::ROCE_DEVICES_WHY
            ),
        ),
    };
    vec![
        check(
            PLACEMENT,
            Mark::Ok,
            format!(
                "path ②'s lab pods go to nodes labelled {}=true (and tolerate a taint of \
                 that key): {}; the node's agent makes each one's rxe on its lab interfaces",
                label::RXE_PER_NETNS,
                fit.iter()
                    .map(|n| format!("{} (kernel {})", n.name, n.kernel))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        agent,
    ]
}

/// Can the cluster, as preflight found it, carry path ②? `Err` says why not.
pub fn carries(caps: &HostCaps) -> Result<(), iblab_core::plan::backend::Unfit> {
    let Some(rows) = caps.preflight.get(super::BACKEND_NAME) else {
        return Err(format!(
            "whether a node of the cluster can give pods Soft-RoCE devices was not asked \
             (no preflight of the kube backend); {}",
            super::NO_ROCE
        )
        .into());
    };
    match rows.iter().find(|c| c.name == PLACEMENT) {
        Some(c) if c.mark == Mark::Ok => Ok(()),
        Some(c) => Err(c.text.clone().into()),
        None => Err(super::NO_ROCE.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn node(name: &str, ready: bool, kernel: &str, rxe: bool) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            kernel: kernel.into(),
            ready,
            labels: if rxe {
                BTreeMap::from([(label::RXE_PER_NETNS.to_string(), "true".to_string())])
            } else {
                BTreeMap::new()
            },
            ..Default::default()
        }
    }

    fn snapshot(rows: Vec<Check>) -> HostCaps {
        let mut caps = HostCaps::for_tests();
        caps.preflight.insert(crate::BACKEND_NAME.into(), rows);
        caps
    }

    #[test]
    fn pods_go_to_ready_labelled_nodes_only() {
        let nodes = [
            node("iblab-node", true, "6.18.44", false),
            node("iblab-vmnode", true, "7.2.12+deb13-amd64", true),
            node("down", false, "7.2.12", true),
        ];
        let agent = ["iblab-rxe".to_string()];
        let r = rows(&nodes, Some(&agent), "iblab-rxe");
        assert_eq!(r[0].mark, Mark::Ok);
        assert_eq!(r[1].mark, Mark::Ok);
        assert!(
            r[0].text
                .contains("iblab-vmnode (kernel 7.2.12+deb13-amd64)")
        );
        assert!(!r[0].text.contains("iblab-node "));
        assert!(!r[0].text.contains("down"), "a node not Ready is no place");
        assert!(carries(&snapshot(r)).is_ok());
        // No node agent: refused, saying how to install it; not allowed to look: a warning.
        let none = rows(&nodes, Some(&[]), "iblab-rxe");
        assert_eq!(none[0].mark, Mark::Fail);
        assert!(
            none[0].text.contains("manifests/node-agent.yaml"),
            "{}",
            none[0].text
        );
        assert!(carries(&snapshot(none)).is_err());
        let unknown = rows(&nodes, None, "iblab-rxe");
        assert_eq!((unknown[0].mark, unknown[1].mark), (Mark::Ok, Mark::Warn));
    }

    #[test]
    fn no_labelled_node_refuses_with_what_was_seen() {
        // A kernel ≥ 7.1 alone is not enough: the label says rdma_rxe is there too.
        let nodes = [
            node("a", true, "6.18.44", false),
            node("b", true, "7.2.12", false),
        ];
        let r = rows(&nodes, Some(&["iblab-rxe".to_string()]), "iblab-rxe");
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].mark, Mark::Fail);
        assert!(
            r[0].text.contains("a (Ready, kernel 6.18.44)"),
            "{}",
            r[0].text
        );
        let why = carries(&snapshot(r)).unwrap_err();
        assert!(why.0.contains(label::RXE_PER_NETNS), "{why}");
        // Without preflight nothing was asked, and nothing is assumed.
        assert!(carries(&HostCaps::for_tests()).is_err());
    }
}
