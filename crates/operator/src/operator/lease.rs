//! Leader election with a `coordination.k8s.io/v1` Lease, so that two operator replicas
//! never both run LabRuns: the one holding the Lease watches and runs them, the other
//! waits. The holder renews the Lease every third of its duration; a replica takes it
//! over when it is released, or when its holder has not renewed it for a whole duration,
//! timed on the waiting replica's own clock from the moment it last saw the record change
//! (as client-go does), so that clocks that disagree between nodes do not matter. Every
//! write is a replace at the resourceVersion read, so of two replicas racing for it one
//! wins and the other reads again.
//!
//! Fencing: every request here has a deadline ([`REQUEST_DEADLINE`]) shorter than a
//! renewal's interval; a holder that has not renewed for [`RENEW_DEADLINE`] (shorter than
//! the Lease's [`DURATION`], after which another replica may take it) gives up and stops its
//! runs; and before any write to a LabRun the operator asks its [`Fence`]: within that
//! window, and the Lease still names it with the transition count it took it at. A former
//! holder, however it was cut off, writes nothing.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::time::Instant;

/// How long a Lease stays held without a renewal.
pub const DURATION: Duration = Duration::from_secs(15);
/// A holder that could not renew for this long stops acting as the holder: well before
/// another replica may take the Lease ([`DURATION`]).
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// Every request of the election and of the fence gives up after this long (kube's client
/// sets no read timeout of its own): a hung request cannot keep a holder believing it holds.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(4);

/// Why the election or the fence could not go on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused a request (`what`: reading, writing, renewing the Lease).
    #[error("{what}: {source}")]
    Api {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    /// No answer within [`REQUEST_DEADLINE`].
    #[error("{what}: no answer within {} s", REQUEST_DEADLINE.as_secs())]
    NoAnswer { what: &'static str },
    /// Fenced: this replica's window since its last renewal is over.
    #[error(
        "fenced: this replica has not renewed the lease {lease} for {} s",
        RENEW_DEADLINE.as_secs()
    )]
    NotRenewed { lease: String },
    /// Fenced: the Lease names another holder, or another term.
    #[error(
        "fenced: the lease {lease} is held by {holder} (transition {transitions}), not by this \
         replica (transition {term})"
    )]
    HeldElsewhere {
        lease: String,
        holder: String,
        transitions: i32,
        term: i32,
    },
    /// `--leader-lease` is not `NAMESPACE/NAME`.
    #[error(
        "--leader-lease `{0}` must be NAMESPACE/NAME (the chart's is <release namespace>/<release>-operator)"
    )]
    BadArgument(String),
}

/// A request under [`REQUEST_DEADLINE`].
async fn within<T>(
    what: &'static str,
    f: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(REQUEST_DEADLINE, f).await {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(source)) => Err(Error::Api { what, source }),
        Err(_) => Err(Error::NoAnswer { what }),
    }
}

/// What this replica may do as the holder: when it last renewed, and the Lease's
/// transition count when it took it. Without an election it always holds.
#[derive(Debug, Default)]
pub struct Fence {
    election: Option<Election>,
    held: std::sync::Mutex<Option<(Instant, i32)>>,
}

impl Fence {
    /// No election: this operator is the only one, and holds for ever.
    pub fn unelected() -> Fence {
        Fence::default()
    }

    pub fn of(election: &Election) -> Fence {
        Fence {
            election: Some(election.clone()),
            held: Default::default(),
        }
    }

    fn set(&self, at: Instant, transitions: i32) {
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = Some((at, transitions));
    }

    fn dropped(&self) {
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Within the window of the last renewal (the local half of the check, I/O-free).
    pub fn within_window(&self, now: Instant) -> Option<i32> {
        let held = *self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.filter(|(at, _)| now.saturating_duration_since(*at) < RENEW_DEADLINE)
            .map(|(_, t)| t)
    }

    /// The end of this replica's window: its last renewal plus [`RENEW_DEADLINE`] (the
    /// Lease cannot be another's before it).
    fn window_end(&self) -> Option<Instant> {
        let held = *self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.map(|(at, _)| at + RENEW_DEADLINE)
    }

    /// May this replica write now, and until when? Within its window, and the Lease (read
    /// now, within the request deadline) still names it at the transition count it took it
    /// at: `Ok(deadline)`, by which the write must have been answered (the window's end,
    /// or the request deadline if sooner; a write not answered by then is abandoned). `Err`
    /// says why not.
    pub async fn check(&self, client: &Client) -> Result<Instant, Error> {
        let Some(e) = &self.election else {
            return Ok(Instant::now() + REQUEST_DEADLINE);
        };
        let Some(term) = self.within_window(Instant::now()) else {
            return Err(Error::NotRenewed {
                lease: format!("{}/{}", e.namespace, e.name),
            });
        };
        let lease = within("reading the lease", e.api(client).get_opt(&e.name)).await?;
        let spec = lease.and_then(|l| l.spec).unwrap_or_default();
        let record = Record::of(&spec);
        if record.holder.as_deref() == Some(e.me.as_str()) && record.transitions == term {
            let end = self.window_end().unwrap_or_else(Instant::now);
            Ok(end.min(Instant::now() + REQUEST_DEADLINE))
        } else {
            Err(Error::HeldElsewhere {
                lease: format!("{}/{}", e.namespace, e.name),
                holder: record.holder.unwrap_or_else(|| "nobody".into()),
                transitions: record.transitions,
                term,
            })
        }
    }
}

/// Where the Lease is and who this replica is.
#[derive(Debug, Clone)]
pub struct Election {
    pub namespace: String,
    pub name: String,
    /// This replica's identity (its pod's name).
    pub me: String,
}

/// What a replica does next, given the Lease it read.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// No Lease yet: create it, held by this replica.
    Create,
    /// Released, or not renewed for a whole duration: take it over.
    Take,
    /// Held by this replica: renew it.
    Renew,
    /// Held by another replica that renews it: wait.
    Wait { holder: String },
}

/// The record a replica compares between two reads: whether the holder renewed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Record {
    holder: Option<String>,
    renewed: Option<String>,
    transitions: i32,
}

impl Record {
    fn of(spec: &LeaseSpec) -> Record {
        Record {
            holder: spec.holder_identity.clone().filter(|h| !h.is_empty()),
            renewed: spec.renew_time.as_ref().map(|t| t.0.to_string()),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }
}

/// The next step for `me` (I/O-free): `unchanged_for` is how long this replica has seen
/// the same record.
pub fn step(me: &str, lease: Option<&LeaseSpec>, unchanged_for: Duration) -> Step {
    let Some(spec) = lease else {
        return Step::Create;
    };
    let record = Record::of(spec);
    let Some(holder) = record.holder else {
        return Step::Take;
    };
    if holder == me {
        return Step::Renew;
    }
    let duration = spec
        .lease_duration_seconds
        .filter(|s| *s > 0)
        .map_or(DURATION, |s| Duration::from_secs(s as u64));
    if unchanged_for >= duration {
        Step::Take
    } else {
        Step::Wait { holder }
    }
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// The Lease's spec as `me` writes it: held, renewed now; `acquired` when it changes hands.
fn held_by(me: &str, old: Option<&LeaseSpec>, acquired: bool) -> LeaseSpec {
    let mut spec = old.cloned().unwrap_or_default();
    spec.holder_identity = Some(me.to_string());
    spec.lease_duration_seconds = Some(DURATION.as_secs() as i32);
    spec.renew_time = Some(now());
    if acquired {
        spec.acquire_time = spec.renew_time.clone();
        spec.lease_transitions = Some(old.and_then(|s| s.lease_transitions).unwrap_or(0) + 1);
    }
    spec
}

impl Election {
    fn api(&self, client: &Client) -> Api<Lease> {
        Api::namespaced(client.clone(), &self.namespace)
    }

    /// Wait until this replica holds the Lease, and tell `fence`. Says who holds it while
    /// it waits.
    pub async fn acquire(&self, client: &Client, fence: &Fence) -> Result<(), Error> {
        let api = self.api(client);
        let mut seen: Option<(Record, Instant)> = None;
        let mut said: Option<String> = None;
        loop {
            let lease = within("reading the lease", api.get_opt(&self.name)).await?;
            let spec = lease.as_ref().and_then(|l| l.spec.clone());
            let record = spec.as_ref().map(Record::of).unwrap_or_default();
            let since = match &seen {
                Some((r, t)) if *r == record => *t,
                _ => Instant::now(),
            };
            seen = Some((record, since));
            let next = step(&self.me, spec.as_ref(), since.elapsed());
            let asked = Instant::now();
            let wrote = match &next {
                Step::Create => {
                    let l = Lease {
                        metadata: ObjectMeta {
                            name: Some(self.name.clone()),
                            namespace: Some(self.namespace.clone()),
                            ..Default::default()
                        },
                        spec: Some(held_by(&self.me, None, true)),
                    };
                    tokio::time::timeout(REQUEST_DEADLINE, api.create(&PostParams::default(), &l))
                        .await
                }
                Step::Take | Step::Renew => {
                    let Some(mut l) = lease.clone() else {
                        continue;
                    };
                    l.spec = Some(held_by(&self.me, spec.as_ref(), next == Step::Take));
                    tokio::time::timeout(
                        REQUEST_DEADLINE,
                        api.replace(&self.name, &PostParams::default(), &l),
                    )
                    .await
                }
                Step::Wait { holder } => {
                    if said.as_deref() != Some(holder) {
                        tracing::info!(
                            lease = %format!("{}/{}", self.namespace, self.name),
                            %holder,
                            "waiting for the lease: another replica runs the LabRuns"
                        );
                        said = Some(holder.clone());
                    }
                    tokio::time::sleep(DURATION / 5).await;
                    continue;
                }
            };
            match wrote {
                Ok(Ok(l)) => {
                    let term = l
                        .spec
                        .as_ref()
                        .map(Record::of)
                        .unwrap_or_default()
                        .transitions;
                    fence.set(asked, term);
                    tracing::info!(
                        lease = %format!("{}/{}", self.namespace, self.name),
                        me = %self.me,
                        transition = term,
                        "holding the lease: this replica runs the LabRuns"
                    );
                    return Ok(());
                }
                // Another replica wrote first (409): read again.
                Ok(Err(kube::Error::Api(e))) if e.code == 409 => continue,
                Ok(Err(source)) => {
                    return Err(Error::Api {
                        what: "writing the lease",
                        source,
                    });
                }
                // No answer in time: the write may or may not have landed; read again.
                Err(_) => continue,
            }
        }
    }

    /// Renew the Lease, each request within its deadline, until it was not renewed for
    /// [`RENEW_DEADLINE`] (or another replica took it); then tell `fence` and return why,
    /// and the caller stops running LabRuns, before another replica may take the Lease.
    pub async fn keep(&self, client: &Client, fence: &Fence) -> String {
        let api = self.api(client);
        let mut last_renewed = Instant::now();
        let lost = loop {
            let wait = (DURATION / 3).min(RENEW_DEADLINE.saturating_sub(last_renewed.elapsed()));
            tokio::time::sleep(wait).await;
            let asked = Instant::now();
            let r = async {
                let Some(mut l) = within("reading the lease", api.get_opt(&self.name)).await?
                else {
                    return Ok(Err("the lease was deleted".to_string()));
                };
                let spec = l.spec.clone();
                match step(&self.me, spec.as_ref(), Duration::ZERO) {
                    Step::Renew => {}
                    Step::Wait { holder } => {
                        return Ok(Err(format!("replica {holder} took the lease")));
                    }
                    other => return Ok(Err(format!("the lease was released ({other:?})"))),
                }
                l.spec = Some(held_by(&self.me, spec.as_ref(), false));
                let l = within(
                    "renewing the lease",
                    api.replace(&self.name, &PostParams::default(), &l),
                )
                .await?;
                Ok::<_, Error>(Ok(l
                    .spec
                    .as_ref()
                    .map(Record::of)
                    .unwrap_or_default()
                    .transitions))
            }
            .await;
            match r {
                Ok(Ok(term)) => {
                    last_renewed = asked;
                    fence.set(asked, term);
                }
                Ok(Err(lost)) => break lost,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot renew the lease; trying again");
                    if last_renewed.elapsed() >= RENEW_DEADLINE {
                        break format!(
                            "the lease was not renewed for {} s: {e}",
                            RENEW_DEADLINE.as_secs()
                        );
                    }
                }
            }
        };
        fence.dropped();
        lost
    }

    /// Give the Lease up at shutdown, so that a waiting replica takes it at once.
    pub async fn release(&self, client: &Client, fence: &Fence) {
        let api = self.api(client);
        fence.dropped();
        if let Ok(Some(mut l)) = within("reading the lease", api.get_opt(&self.name)).await
            && let Some(spec) = l.spec.as_mut()
            && spec.holder_identity.as_deref() == Some(&self.me)
        {
            spec.holder_identity = None;
            spec.renew_time = Some(now());
            match within(
                "releasing the lease",
                api.replace(&self.name, &PostParams::default(), &l),
            )
            .await
            {
                Ok(_) => tracing::info!("lease released"),
                Err(e) => tracing::warn!(error = %e, "cannot release the lease"),
            }
        }
    }
}

/// `NAMESPACE/NAME` of `--leader-lease`.
pub fn parse(arg: &str, me: &str) -> Result<Election, Error> {
    match arg.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok(Election {
                namespace: ns.to_string(),
                name: name.to_string(),
                me: me.to_string(),
            })
        }
        _ => Err(Error::BadArgument(arg.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(by: &str, renewed_s: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(by.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(
                k8s_openapi::jiff::Timestamp::from_second(renewed_s).unwrap(),
            )),
            ..Default::default()
        }
    }

    #[test]
    fn no_lease_is_created_and_a_released_one_is_taken() {
        assert_eq!(step("a", None, Duration::ZERO), Step::Create);
        let mut free = held("b", 100);
        free.holder_identity = Some(String::new());
        assert_eq!(step("a", Some(&free), Duration::ZERO), Step::Take);
        free.holder_identity = None;
        assert_eq!(step("a", Some(&free), Duration::ZERO), Step::Take);
    }

    #[test]
    fn another_holder_is_waited_for_until_it_stops_renewing() {
        let l = held("b", 100);
        assert_eq!(
            step("a", Some(&l), Duration::from_secs(14)),
            Step::Wait { holder: "b".into() }
        );
        assert_eq!(step("a", Some(&l), Duration::from_secs(15)), Step::Take);
        assert_eq!(step("b", Some(&l), Duration::ZERO), Step::Renew);
    }

    /// The holder's clock is not read: a renew time far in the past or the future is only
    /// a record that changes or does not.
    #[test]
    fn expiry_is_timed_on_the_waiters_clock_not_the_holders() {
        let past = held("b", 0);
        assert_eq!(
            step("a", Some(&past), Duration::from_secs(1)),
            Step::Wait { holder: "b".into() }
        );
        assert_ne!(Record::of(&held("b", 100)), Record::of(&held("b", 105)));
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_does_not() {
        let old = held("b", 100);
        let taken = held_by("a", Some(&old), true);
        assert_eq!(taken.holder_identity.as_deref(), Some("a"));
        assert_eq!(taken.lease_transitions, Some(1));
        assert_eq!(taken.acquire_time, taken.renew_time);
        let renewed = held_by("a", Some(&taken), false);
        assert_eq!(renewed.lease_transitions, Some(1));
        assert_eq!(renewed.acquire_time, taken.acquire_time);
    }

    #[test]
    fn a_holder_is_fenced_before_another_replica_may_take_the_lease() {
        assert!(RENEW_DEADLINE < DURATION);
        assert!(REQUEST_DEADLINE < DURATION / 3);
        let f = Fence::of(&parse("ns/l", "a").unwrap());
        let t0 = Instant::now();
        assert_eq!(f.within_window(t0), None, "not held yet");
        f.set(t0, 3);
        assert_eq!(f.within_window(t0 + Duration::from_secs(9)), Some(3));
        assert_eq!(f.within_window(t0 + RENEW_DEADLINE), None);
        // A write's deadline is the window's end: it cannot be waited for once another
        // replica may hold the Lease.
        assert_eq!(f.window_end(), Some(t0 + RENEW_DEADLINE));
        assert!(t0 + RENEW_DEADLINE < t0 + DURATION);
        f.dropped();
        assert_eq!(f.window_end(), None);
        assert_eq!(f.within_window(t0), None);
    }

    #[test]
    fn the_argument_is_namespace_slash_name() {
        let e = parse("iblab-system/iblab-operator", "pod-1").unwrap();
        assert_eq!(
            (e.namespace.as_str(), e.name.as_str()),
            ("iblab-system", "iblab-operator")
        );
        for bad in ["iblab-operator", "/x", "ns/", "a/b/c"] {
            assert!(parse(bad, "p").is_err(), "{bad}");
        }
    }
}
