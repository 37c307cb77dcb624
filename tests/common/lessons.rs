//! The course's prediction for every lesson and scenario: which expectations hold (every
//! other one is skipped, never passed). lessons_e2e holds the vm backend to it, and
//! kube_node_e2e the kube backend's pods on the same kernel, so both give the course's
//! verdicts, and so each other's.

use serde_json::Value;

/// (lab, scenario, expectations that must hold; every other one must be skipped)
pub const CASES: &[(&str, &str, &[&str])] = &[
    (
        "lesson1",
        "default",
        &[
            "tcp_has_no_rdma_device",
            "roce_and_ib_have_verbs_devices",
            "roce_carries_the_ib_transport",
            "link_layers_differ",
            "roce_address_from_ip",
            "ib_address_is_a_lid",
            "roce_is_udp_4791",
        ],
    ),
    (
        "lesson2",
        "default",
        &[
            "every_path_moves_data",
            "tcp_works_the_peer_cpu",
            "the_peer_cpu_is_not_involved",
            "passive_side_makes_no_data_syscalls",
        ],
    ),
    (
        "lesson3",
        "default",
        &[
            "both_pay_the_verbs_costs",
            "address_source_differs",
            "forwarding_table_source_differs",
            "roce_borrows_tcp_to_connect",
            "ib_asks_the_sa_to_connect",
            "connection_setup_differs",
        ],
    ),
    (
        "lesson3",
        "forgot-register-memory",
        &[
            "roce_refuses_unregistered_memory",
            "ib_refuses_unregistered_memory",
            "tcp_needs_no_registration",
        ],
    ),
    (
        "lesson4",
        "default",
        &[
            "ethernet_needs_no_manager",
            "sm_assigns_lids",
            "sm_writes_every_lft",
            "ib_delivers",
            "standby_takes_over",
            "sm_not_on_data_path",
        ],
    ),
    (
        "lesson4",
        "sm-off",
        &[
            "ethernet_carries_without_sm",
            "ethernet_needs_no_manager",
            "no_sm_no_lid",
            "no_sm_no_route",
        ],
    ),
    (
        "lesson5",
        "default",
        &[
            "tcp_loses_a_bit",
            "roce_collapses_without_lossless",
            "roce_goes_back",
            "the_bottleneck_dropped",
            "ib_barely_moves",
        ],
    ),
    (
        "lesson5",
        "congestion",
        &[
            "tcp_loses_a_bit",
            "roce_collapses_without_lossless",
            "roce_goes_back",
            "the_bottleneck_dropped",
            "ib_barely_moves",
        ],
    ),
    (
        "lesson5",
        "congestion-lossless",
        &[
            "tcp_loses_a_bit",
            "roce_recovers_with_lossless",
            "ib_barely_moves",
        ],
    ),
    (
        "lesson6",
        "default",
        &[
            "rdma_gain_is_inside_the_host",
            "rdma_is_the_big_decision",
            "under_congestion_ib_is_worth_it",
            "the_host_has_an_rdma_device_on_the_lab_nodes",
        ],
    ),
];

/// The expectations `held` for a run of `lab` `scenario`, where the course has one.
pub fn held(lab: &str, scenario: &str) -> Option<&'static [&'static str]> {
    CASES
        .iter()
        .find(|c| c.0 == lab && c.1 == scenario)
        .map(|c| c.2)
}

/// Each of the run's expectations passed if the course says it holds, else was skipped;
/// and every one the course names is there. `unobserved`: those the run could not judge
/// where it ran (a step's figure its place could not observe), skipped whatever the course
/// says. `what` names the run in a failure.
pub fn as_the_course_predicts(e: &Value, held: &[&str], unobserved: &[String], what: &str) {
    let verdicts = super::verdicts(e);
    for (id, v) in &verdicts {
        let want = if unobserved.contains(id) {
            "skipped"
        } else if held.contains(&id.as_str()) {
            "pass"
        } else {
            "skipped"
        };
        assert_eq!(v, want, "{what}: {id}");
    }
    for id in held {
        assert!(
            verdicts.iter().any(|(i, _)| i == id),
            "{what}: no expectation {id}"
        );
    }
}
