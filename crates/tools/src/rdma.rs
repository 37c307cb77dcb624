//! What iproute2's `rdma` tool prints as JSON: a port's counters
//! (`rdma -j statistic show link DEV/PORT`), the same hardware counters sysfs has under
//! `/sys/class/infiniband/DEV/ports/PORT/hw_counters`. Over netlink they are readable from
//! any network namespace, where sysfs shows a namespace other than the first only a
//! device's compat entry, which has no `hw_counters` (seen in a pod of Linux 7.2).

use std::collections::HashMap;

/// `rdma -j statistic show link` printed something other than its list of ports (an
/// error message: no RDMA netlink, no such device).
#[derive(Debug, thiserror::Error)]
pub enum NoStatistics {
    #[error("`rdma -j statistic show link` printed no JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("`rdma -j statistic show link` printed no list")]
    NotList,
}

/// Every counter of the port's entries, by name (numbers only: `ifname` and `port` are
/// left out).
pub fn link_statistics(text: &str) -> Result<HashMap<String, u64>, NoStatistics> {
    let v: serde_json::Value = serde_json::from_str(text.trim()).map_err(NoStatistics::NotJson)?;
    let entries = v.as_array().ok_or(NoStatistics::NotList)?;
    let mut out = HashMap::new();
    for e in entries {
        for (k, v) in e.as_object().into_iter().flatten() {
            if k == "port" {
                continue;
            }
            if let Some(n) = v.as_u64() {
                out.insert(k.clone(), n);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_pods_rxe_counters() {
        // Captured in a pod on the test cluster's Linux 7.2 node, after an RDMA WRITE
        // stream over its own rxe.
        let text = include_str!("../tests/fixtures/rdma_statistic_show_link.json");
        let c = link_statistics(text).unwrap();
        assert_eq!(c["sent_pkts"], 47905);
        assert_eq!(c["ack_deferred"], 737);
        assert_eq!(c["rcvd_seq_err"], 0);
        assert!(!c.contains_key("port") && !c.contains_key("ifname"));
        assert!(link_statistics("Failed to open NETLINK_RDMA socket").is_err());
        assert!(link_statistics("[]").unwrap().is_empty());
    }
}
