//! What a LabRun needs next, decided from its status alone (no I/O): nothing, or a run
//! (a first one, a re-run the user asked for, a retry, one that the operator's restart
//! cut short).

use std::time::{Duration, SystemTime};

use iblab_core::exit;
use iblab_k8s::crd::{LabRunStatus, Phase};

/// A re-run asked for with the annotation (what a student may do) starts at most this
/// long after the previous attempt started: a class's students cannot starve each other's
/// runs by re-running without pause.
pub const RERUN_GAP: Duration = Duration::from_secs(60);

/// How long a re-run request must wait before it is honoured (`None`: now, or this is no
/// re-run request: a new LabRun or a changed spec starts at once).
pub fn rerun_wait(status: Option<&LabRunStatus>, want: &Want, now: SystemTime) -> Option<Duration> {
    let st = status?;
    if st.observed_generation != Some(want.generation) || st.observed_rerun == want.rerun {
        return None;
    }
    let started = humantime::parse_rfc3339(st.started_at.as_deref()?).ok()?;
    let since = now.duration_since(started).unwrap_or_default();
    (since < RERUN_GAP).then(|| RERUN_GAP - since)
}

/// What the user wants run: the object's generation and its re-run annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    pub generation: i64,
    pub rerun: Option<String>,
}

/// More attempts than this for one generation are never made, whatever caused them.
pub const MAX_ATTEMPTS: u32 = 6;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Finished for what is wanted (or being run here): wait for a change.
    Nothing,
    /// Start attempt `attempt`; `sweep` names a run of an earlier operator whose objects
    /// may still be in the namespace.
    Start {
        attempt: u32,
        why: String,
        sweep: Option<String>,
    },
    /// Give up: too many attempts.
    GiveUp { why: String },
}

/// Whether `status` is about what is wanted now.
pub fn current(status: &LabRunStatus, want: &Want) -> bool {
    status.observed_generation == Some(want.generation) && status.observed_rerun == want.rerun
}

pub fn decide(
    status: Option<&LabRunStatus>,
    want: &Want,
    retries: u32,
    running_here: bool,
) -> Decision {
    if running_here {
        return Decision::Nothing;
    }
    let st = status.cloned().unwrap_or_default();
    if !current(&st, want) {
        let why = match (&st.observed_generation, &st.observed_rerun, &want.rerun) {
            (None, _, _) => "new".to_string(),
            (Some(g), _, _) if *g != want.generation => {
                format!("the spec changed (generation {g} → {})", want.generation)
            }
            (_, _, Some(r)) => format!("a re-run was asked for (iblab.dev/rerun={r})"),
            _ => "the re-run annotation was removed".to_string(),
        };
        return Decision::Start {
            attempt: 1,
            why,
            sweep: None,
        };
    }
    let next = st.attempts + 1;
    let start = |why: String, sweep: Option<String>| {
        if st.attempts >= MAX_ATTEMPTS {
            Decision::GiveUp {
                why: format!("{} attempts made; not trying again ({why})", st.attempts),
            }
        } else {
            Decision::Start {
                attempt: next,
                why,
                sweep,
            }
        }
    };
    match st.phase {
        Phase::Succeeded | Phase::Failed => Decision::Nothing,
        Phase::Error
            if st.exit_code == Some(exit::ENVIRONMENT) && st.attempts < retries.min(5) + 1 =>
        {
            start(
                format!(
                    "retry {} of {} after an environment error",
                    st.attempts,
                    retries.min(5)
                ),
                st.run_id.clone(),
            )
        }
        Phase::Error => Decision::Nothing,
        Phase::Pending => start("a slot is free".into(), st.run_id.clone()),
        // Running, but not here: the operator that ran it is gone (a restart, a crash).
        Phase::Running => start(
            format!(
                "attempt {} was cut short when the operator stopped; its objects are removed \
                 and the lab runs again",
                st.attempts
            ),
            st.run_id.clone(),
        ),
    }
}

/// A deleted LabRun's teardown gives up after this long: its finalizer is removed with a
/// Warning event that names what may be left, so that a cluster whose API refuses the
/// cleanup (a namespace stuck terminating, rights taken away) cannot hold the LabRun, and
/// its namespace, forever.
pub const FINALIZER_DEADLINE: Duration = Duration::from_secs(600);

/// A failed reconcile (a cleanup the API refused, a status it did not take) is tried again
/// after `BACKOFF_FIRST`, doubled at each failure in a row up to `BACKOFF_MAX`.
pub const BACKOFF_FIRST: Duration = Duration::from_secs(5);
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The wait before the next try after `failures` failures in a row (1 for the first).
pub fn backoff(failures: u32) -> Duration {
    let doubled = BACKOFF_FIRST.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    doubled.min(BACKOFF_MAX)
}

/// What a deleted LabRun's cleanup does after it failed, deleted `deleting_for` ago.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cleanup {
    /// Try again (after the backoff).
    Retry,
    /// Past [`FINALIZER_DEADLINE`]: let the LabRun go and say what may be left.
    Release,
}

pub fn after_failed_cleanup(deleting_for: Duration) -> Cleanup {
    if deleting_for >= FINALIZER_DEADLINE {
        Cleanup::Release
    } else {
        Cleanup::Retry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want(g: i64) -> Want {
        Want {
            generation: g,
            rerun: None,
        }
    }

    fn status(phase: Phase, exit: Option<i32>, attempts: u32) -> LabRunStatus {
        LabRunStatus {
            phase,
            exit_code: exit,
            attempts,
            observed_generation: Some(1),
            run_id: Some("abc123".into()),
            ..Default::default()
        }
    }

    /// A re-run request waits out the gap after the last start; a new spec does not.
    #[test]
    fn a_rerun_waits_for_the_gap_after_the_last_start() {
        let t0 = humantime::parse_rfc3339("2026-12-03T08:00:00Z").unwrap();
        let mut st = status(Phase::Succeeded, Some(0), 1);
        st.started_at = Some("2026-12-03T08:00:00Z".into());
        let rerun = Want {
            generation: 1,
            rerun: Some("1".into()),
        };
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(
            rerun_wait(Some(&st), &rerun, at(20)),
            Some(Duration::from_secs(40))
        );
        assert_eq!(rerun_wait(Some(&st), &rerun, at(61)), None);
        // Nothing asked (the same annotation), a changed spec, a new LabRun: no wait.
        assert_eq!(rerun_wait(Some(&st), &want(1), at(20)), None);
        assert_eq!(
            rerun_wait(
                Some(&st),
                &Want {
                    generation: 2,
                    ..rerun.clone()
                },
                at(20)
            ),
            None
        );
        assert_eq!(rerun_wait(None, &rerun, at(20)), None);
    }

    #[test]
    fn a_new_run_starts_once_and_a_finished_one_stays_finished() {
        assert!(matches!(
            decide(None, &want(1), 0, false),
            Decision::Start { attempt: 1, .. }
        ));
        assert_eq!(decide(None, &want(1), 0, true), Decision::Nothing);
        for (p, e) in [(Phase::Succeeded, 0), (Phase::Failed, 1), (Phase::Error, 2)] {
            let s = status(p, Some(e), 1);
            assert_eq!(decide(Some(&s), &want(1), 3, false), Decision::Nothing);
        }
    }

    #[test]
    fn a_changed_spec_or_a_rerun_request_runs_again_from_attempt_one() {
        let s = status(Phase::Succeeded, Some(0), 1);
        match decide(Some(&s), &want(2), 0, false) {
            Decision::Start { attempt, why, .. } => {
                assert_eq!(attempt, 1);
                assert!(why.contains("generation 1 → 2"), "{why}");
            }
            d => panic!("{d:?}"),
        }
        let again = Want {
            generation: 1,
            rerun: Some("2".into()),
        };
        assert!(matches!(
            decide(Some(&s), &again, 0, false),
            Decision::Start { attempt: 1, .. }
        ));
    }

    #[test]
    fn environment_errors_are_retried_as_many_times_as_asked() {
        let s = status(Phase::Error, Some(3), 1);
        assert_eq!(decide(Some(&s), &want(1), 0, false), Decision::Nothing);
        match decide(Some(&s), &want(1), 2, false) {
            Decision::Start { attempt, sweep, .. } => {
                assert_eq!(attempt, 2);
                assert_eq!(sweep.as_deref(), Some("abc123"));
            }
            d => panic!("{d:?}"),
        }
        let s = status(Phase::Error, Some(3), 3);
        assert_eq!(decide(Some(&s), &want(1), 2, false), Decision::Nothing);
    }

    #[test]
    fn a_run_the_operator_lost_is_swept_and_run_again_but_not_forever() {
        let s = status(Phase::Running, None, 1);
        match decide(Some(&s), &want(1), 0, false) {
            Decision::Start { attempt, sweep, .. } => {
                assert_eq!(attempt, 2);
                assert_eq!(sweep.as_deref(), Some("abc123"));
            }
            d => panic!("{d:?}"),
        }
        let s = status(Phase::Running, None, MAX_ATTEMPTS);
        assert!(matches!(
            decide(Some(&s), &want(1), 0, false),
            Decision::GiveUp { .. }
        ));
    }

    #[test]
    fn failures_back_off_doubling_up_to_the_cap() {
        let waits: Vec<u64> = (1..=9).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(backoff(0), BACKOFF_FIRST);
        assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
    }

    #[test]
    fn a_cleanup_is_retried_until_the_deadline_then_released() {
        assert_eq!(after_failed_cleanup(Duration::ZERO), Cleanup::Retry);
        assert_eq!(
            after_failed_cleanup(FINALIZER_DEADLINE - Duration::from_secs(1)),
            Cleanup::Retry
        );
        assert_eq!(after_failed_cleanup(FINALIZER_DEADLINE), Cleanup::Release);
    }
}
