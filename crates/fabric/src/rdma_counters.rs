//! What the RDMA devices of the lab's nodes counted: rxe's transport counters by name,
//! and the packets a node's devices sent and received, read before and after a step.

use std::collections::HashMap;
use std::time::Duration;

use crate::ctx::StepCtx;
use iblab_backend::EnvError;
use iblab_core::command::Cmd;
use iblab_lab::PathKind;

const SH: &str = "sh";

/// rxe's transport counters (`hw_counters`), by name: `grep -r` prints `path:value`.
/// Where the node's sysfs shows the device without them (a pod's network namespace sees
/// only a compat entry), the same counters through netlink, in the same command:
/// `rdma -j statistic`, which prints JSON; under the kube node agent, which takes that
/// netlink away, from the copy it binds into the container.
pub(crate) async fn rxe_counters(
    ctx: &mut StepCtx<'_>,
    node: &str,
    device: &str,
) -> Result<HashMap<String, u64>, EnvError> {
    let dir = format!("/sys/class/infiniband/{device}/ports/1/hw_counters");
    // Where the kube node agent binds them into a pod that has no RDMA netlink
    // (iblab_node_agent::oci::COUNTERS_IN_POD).
    let bound = format!("/run/iblab/hw_counters/{device}");
    let link = format!("{device}/1");
    let out = ctx
        .backend
        .exec(
            node,
            &Cmd {
                argv: [
                    SH,
                    "-c",
                    "grep -r . \"$1\" 2>/dev/null || grep -r . \"$3\" 2>/dev/null || \
                     rdma -j statistic show link \"$2\"",
                    SH,
                    &dir,
                    &link,
                    &bound,
                ]
                .map(String::from)
                .to_vec(),
                stdin: None,
                may_fail: true,
            },
            Duration::from_secs(10),
        )
        .await?;
    Ok(if out.stdout.trim_start().starts_with('[') {
        iblab_tools::rdma::link_statistics(&out.stdout).unwrap_or_default()
    } else {
        parse_hw_counters(&out.stdout)
    })
}

/// What the RDMA devices of some nodes carried: packets sent and received, summed.
pub(crate) struct RdmaPackets {
    pub devices: usize,
    pub packets: u64,
}

/// The packets the RDMA devices the plan made on `nodes` have sent and received so far
/// (rxe's `sent_pkts` and `rcvd_pkts`): read before and after a transfer of another path,
/// it shows whether that path used them. No devices (a run without path ②): none read.
pub(crate) async fn rdma_packets(
    ctx: &mut StepCtx<'_>,
    nodes: &[&String],
) -> Result<RdmaPackets, EnvError> {
    let mut total = RdmaPackets {
        devices: 0,
        packets: 0,
    };
    if !ctx.plan.paths.contains(&PathKind::Roce) {
        return Ok(total);
    }
    for node in nodes {
        let devices = ctx
            .plan
            .backend_facts
            .rdma_devices
            .get(node.as_str())
            .cloned()
            .unwrap_or_default();
        for d in devices {
            let c = rxe_counters(ctx, node, &d).await?;
            if let (Some(sent), Some(rcvd)) = (c.get("sent_pkts"), c.get("rcvd_pkts")) {
                total.devices += 1;
                total.packets += sent + rcvd;
            }
        }
    }
    Ok(total)
}

pub(crate) fn parse_hw_counters(text: &str) -> HashMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (path, value) = l.rsplit_once(':')?;
            let name = path.rsplit('/').next()?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}
