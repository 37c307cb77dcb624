//! `iblab operator`: a controller that runs LabRun objects. Each run is `iblab up` on the
//! kube backend in the LabRun's namespace (the engine of the command line, as a child
//! process); its verdict goes into the LabRun's status and its evidence into a ConfigMap
//! the LabRun owns. A finalizer tears a run down when its LabRun is deleted.

pub mod child;
pub mod decide;
pub mod health;
pub mod lease;
pub mod status;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizing, finalizer};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use decide::{Decision, Want, decide};
use iblab_core::exit;
use iblab_k8s::crd::{EvidenceRef, LabObject, LabRun, LabRunStatus, Phase};
use iblab_k8s::{cluster, settings, sweep};

/// The field manager of everything the operator writes.
pub const MANAGER: &str = "iblab-operator";
/// The finalizer on every LabRun it has seen.
pub const FINALIZER: &str = "iblab.dev/teardown";
/// Changing this annotation's value asks for a new run of the same spec.
pub const RERUN: &str = "iblab.dev/rerun";
/// A ConfigMap holds at most 1 MiB; the evidence files fill at most this much of it.
const EVIDENCE_BUDGET: usize = 900 * 1024;
/// How long a run may take at the most before it is stopped (labs keep their own
/// deadlines; this bounds a wedged cluster).
const RUN_AT_MOST: Duration = Duration::from_secs(3600);

/// How the operator is started.
#[derive(Debug, Clone)]
pub struct Options {
    /// Watch LabRuns in this namespace only (default: every namespace).
    pub watch_namespace: Option<String>,
    /// Runs going at once.
    pub max_concurrent: usize,
    /// Where `/healthz` and `/readyz` are served (none: not served).
    pub health_addr: Option<SocketAddr>,
    /// Where each run gets its folder.
    pub work_dir: PathBuf,
    /// Apply the CRDs at start (Helm never upgrades its `crds/`).
    pub apply_crds: bool,
    /// `NAMESPACE/NAME` of the Lease that elects the one replica that runs LabRuns (none:
    /// no election, so only one operator may run).
    pub leader_lease: Option<String>,
    /// Probe NetworkPolicy enforcement with pods in this namespace (none: not probed).
    pub probe_network_policy_in: Option<String>,
    /// Ready only once the probe found it enforced.
    pub require_network_policy: bool,
}

/// RFC 3339, seconds.
pub fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// A run going in this process.
struct Going {
    want: Want,
    namespace: String,
    /// The owner label its run's objects carry (`labrun-<uid>`).
    owner: String,
    /// Asks its supervisor to stop the child (SIGTERM: it tears down, exit 130).
    stop: Arc<Notify>,
    /// Why it was asked to stop: "deleted", "changed", "shutdown".
    stop_why: Arc<Mutex<Option<&'static str>>>,
}

struct Ctx {
    client: Client,
    iblab: PathBuf,
    work_dir: PathBuf,
    slots: Arc<Semaphore>,
    max: usize,
    going: Mutex<HashMap<String, Going>>,
    /// Signalled whenever a run ends.
    ended: Notify,
    shutting_down: AtomicBool,
    recorder: Recorder,
    /// Failed reconciles in a row, per LabRun: the next try backs off (`decide::backoff`).
    failures: Mutex<HashMap<String, u32>>,
    /// Asked before every write to a LabRun or its evidence: does this replica still hold
    /// the Lease?
    fence: Arc<lease::Fence>,
}

/// Why a reconcile failed (it is tried again after a backoff).
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("a LabRun without a namespace")]
    NoNamespace,
    /// Adding or removing the finalizer, or what ran under it, failed.
    #[error(transparent)]
    Finalizer(Box<kube::runtime::finalizer::Error<Error>>),
    /// This replica may not write (it does not hold the Lease now).
    #[error(transparent)]
    Fenced(#[from] lease::Error),
    #[error(
        "writing the status of {labrun}: no answer before this replica's lease window or the \
         request deadline ({} s) ended",
        lease::REQUEST_DEADLINE.as_secs()
    )]
    StatusUnanswered { labrun: String },
    /// What of a run could not be removed yet.
    #[error("{}", .0.join("; "))]
    TeardownLeft(Vec<String>),
    #[error(transparent)]
    Runs(#[from] sweep::ListError),
}

fn key(lr: &LabRun) -> String {
    format!("{}/{}", lr.namespace().unwrap_or_default(), lr.name_any())
}

fn want_of(lr: &LabRun) -> Want {
    Want {
        generation: lr.metadata.generation.unwrap_or(0),
        rerun: lr.annotations().get(RERUN).cloned(),
    }
}

/// `iblab operator`.
pub fn main(opts: Options) -> i32 {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return exit::ENVIRONMENT;
        }
    };
    if let Err(e) = iblab_sys::interrupt::install() {
        eprintln!("error: cannot catch SIGTERM: {e}");
        return exit::ENVIRONMENT;
    }
    rt.block_on(operate(opts))
}

/// `iblab operator --check`: both CRDs established and LabRuns listable (the chart's
/// `helm test`).
pub fn check() -> i32 {
    let rt = match iblab_sys::interrupt::runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    rt.block_on(async {
        let client = match cluster::connect(&settings::get()).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: {e}");
                return exit::ENVIRONMENT;
            }
        };
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for name in ["labs.iblab.dev", "labruns.iblab.dev"] {
            match crds.get_opt(name).await {
                Ok(Some(c)) if established(&c) => println!("✔ CRD {name} established"),
                Ok(Some(_)) => {
                    eprintln!("✘ CRD {name} exists but is not established");
                    return exit::ENVIRONMENT;
                }
                Ok(None) => {
                    eprintln!("✘ CRD {name} is missing: is the operator running?");
                    return exit::ENVIRONMENT;
                }
                Err(e) => {
                    eprintln!("✘ cannot read CRD {name}: {e}");
                    return exit::ENVIRONMENT;
                }
            }
        }
        let runs: Api<LabRun> = Api::all(client);
        match runs.list(&ListParams::default().limit(50)).await {
            Ok(l) => {
                println!("✔ {} LabRun(s) listed", l.items.len());
                exit::OK
            }
            Err(e) => {
                eprintln!("✘ cannot list LabRuns: {e}");
                exit::ENVIRONMENT
            }
        }
    })
}

fn established(c: &CustomResourceDefinition) -> bool {
    c.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

async fn apply_crds(client: &Client) -> Result<(), CrdError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply(MANAGER).force();
    for d in iblab_k8s::crd::definitions() {
        let name = d.name_any();
        api.patch(&name, &pp, &Patch::Apply(&d))
            .await
            .map_err(|source| CrdError::Apply {
                name: name.clone(),
                source,
            })?;
        let mut established_yet = false;
        for _ in 0..100 {
            if let Ok(Some(c)) = api.get_opt(&name).await
                && established(&c)
            {
                established_yet = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !established_yet {
            return Err(CrdError::NotEstablished(name));
        }
        tracing::info!(crd = %name, "CRD applied and established");
    }
    Ok(())
}

async fn operate(opts: Options) -> i32 {
    match start(opts).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    }
}

/// Why the operator could not start, or stopped (said as `error: …`).
#[derive(Debug, thiserror::Error)]
enum Stopped {
    /// `--leader-lease` is not `NAMESPACE/NAME`.
    #[error(transparent)]
    Election(lease::Error),
    #[error(transparent)]
    Connect(Box<dyn std::error::Error + Send + Sync>),
    #[error("cannot serve health probes on {addr}: {source}")]
    Health {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot take the lease {lease}: {source}")]
    Lease {
        lease: String,
        #[source]
        source: lease::Error,
    },
    #[error(transparent)]
    Crds(#[from] CrdError),
    #[error("cannot find this program's own path: {0}")]
    OwnPath(#[source] std::io::Error),
    #[error("cannot create {}: {source}", path.display())]
    WorkDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The Lease was lost: why (restarted, it waits for the Lease as any other replica).
    #[error("{0}")]
    LostLease(String),
}

impl Stopped {
    fn exit_code(&self) -> i32 {
        match self {
            Stopped::Election(_) => exit::BAD_INPUT,
            _ => exit::ENVIRONMENT,
        }
    }
}

/// Why the CRDs could not be applied.
#[derive(Debug, thiserror::Error)]
enum CrdError {
    #[error("cannot apply CRD {name}: {source}")]
    Apply {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("CRD {0} was applied but not established within 10 s")]
    NotEstablished(String),
}

/// The operator from its options to its end: refuses bad input before anything is
/// connected to or served, serves its probes, takes the Lease (if elected), watches and runs
/// LabRuns until it is interrupted or loses the Lease, then stops its runs.
async fn start(opts: Options) -> Result<i32, Stopped> {
    let instance = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "iblab-operator".into());
    let election = match opts.leader_lease.as_deref() {
        None => None,
        Some(a) => Some(lease::parse(a, &instance).map_err(Stopped::Election)?),
    };
    let client = cluster::connect(&settings::get())
        .await
        .map_err(|e| Stopped::Connect(Box::new(e)))?;
    let ready = Arc::new(AtomicBool::new(false));
    let policy = Arc::new(health::Policy {
        found: Default::default(),
        required: opts.require_network_policy,
    });
    if let Some(addr) = opts.health_addr {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Stopped::Health { addr, source })?;
        tokio::spawn(health::serve(l, ready.clone(), policy.clone()));
    }
    // A replica that waits for the Lease is ready: it is up and takes over when the
    // holder goes (a Deployment of two counts both).
    ready.store(true, Ordering::SeqCst);
    if let Some(ns) = opts.probe_network_policy_in.clone() {
        // The same names at every start of this pod: a probe a crash cut short is cleaned
        // up by the next one.
        tokio::spawn(probe_network_policy(
            client.clone(),
            ns,
            probe_suffix(&instance),
            policy.clone(),
        ));
    }
    let fence = Arc::new(match &election {
        Some(e) => lease::Fence::of(e),
        None => lease::Fence::unelected(),
    });
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel::<String>();
    if let Some(e) = &election {
        tokio::select! {
            r = e.acquire(&client, &fence) => if let Err(source) = r {
                let lease = format!("{}/{}", e.namespace, e.name);
                return Err(Stopped::Lease { lease, source });
            },
            _ = iblab_sys::interrupt::wait() => return Ok(exit::OK),
        }
        let (e, c, f) = (e.clone(), client.clone(), fence.clone());
        tokio::spawn(async move {
            let _ = lost_tx.send(e.keep(&c, &f).await);
        });
    } else {
        tracing::info!("no --leader-lease: this operator elects no leader, run only one");
    }
    if opts.apply_crds {
        apply_crds(&client).await?;
    }
    let ctx = context(&opts, &client, instance, fence.clone())?;
    let lost = watch(&opts, ctx.clone(), lost_rx).await;
    ready.store(false, Ordering::SeqCst);
    shutdown(&ctx).await;
    match (&election, lost) {
        // Restarted, it waits for the Lease as any other replica.
        (_, Some(why)) => Err(Stopped::LostLease(why)),
        (Some(e), None) => {
            e.release(&client, &fence).await;
            Ok(exit::OK)
        }
        (None, None) => Ok(exit::OK),
    }
}

/// Probe NetworkPolicy enforcement in `ns` until it can tell (a probe that could not run
/// is asked again), and tell the readiness `policy`.
async fn probe_network_policy(
    client: Client,
    ns: String,
    probe_suffix: String,
    policy: Arc<health::Policy>,
) {
    use iblab_k8s::netpol::Enforcement;
    loop {
        let s = settings::get();
        let e = iblab_k8s::netpol::probe(
            &client,
            &ns,
            &s.iblab_image,
            &s.iblab_pull_policy,
            &probe_suffix,
        )
        .await;
        let line = e.describe();
        match &e {
            Enforcement::Enforced => {
                tracing::info!(networkpolicy = %line, "NetworkPolicy probed")
            }
            _ => tracing::warn!(networkpolicy = %line, "NetworkPolicy probed"),
        }
        *policy.found.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((e == Enforcement::Enforced, line));
        if !matches!(e, Enforcement::Unknown(_)) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
}

/// What every reconcile shares: the client, this program (each run is `iblab up`), the
/// work folder, the run slots, the events' reporter and the fence.
fn context(
    opts: &Options,
    client: &Client,
    instance: String,
    fence: Arc<lease::Fence>,
) -> Result<Arc<Ctx>, Stopped> {
    let iblab = std::env::current_exe().map_err(Stopped::OwnPath)?;
    std::fs::create_dir_all(&opts.work_dir).map_err(|source| Stopped::WorkDir {
        path: opts.work_dir.clone(),
        source,
    })?;
    let max = opts.max_concurrent.max(1);
    Ok(Arc::new(Ctx {
        client: client.clone(),
        iblab,
        work_dir: opts.work_dir.clone(),
        slots: Arc::new(Semaphore::new(max)),
        max,
        going: Mutex::new(HashMap::new()),
        ended: Notify::new(),
        shutting_down: AtomicBool::new(false),
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: MANAGER.into(),
                instance: Some(instance),
            },
        ),
        failures: Mutex::new(HashMap::new()),
        fence,
    }))
}

/// Watch and run LabRuns until interrupted or the Lease is lost (`lost` says why: `Some`).
async fn watch(
    opts: &Options,
    ctx: Arc<Ctx>,
    lost_rx: tokio::sync::oneshot::Receiver<String>,
) -> Option<String> {
    let runs: Api<LabRun> = match &opts.watch_namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    tracing::info!(
        namespace = opts.watch_namespace.as_deref().unwrap_or("*"),
        max_concurrent = ctx.max,
        "operator watching LabRuns"
    );
    let lost = Arc::new(Mutex::new(None::<String>));
    let lost_why = lost.clone();
    let on_lost = async move {
        match lost_rx.await {
            Ok(why) => {
                tracing::error!(%why, "lost the lease: stopping the runs going here");
                *lost_why.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
            }
            // No election: never.
            Err(_) => std::future::pending::<()>().await,
        }
    };
    Controller::new(runs, watcher::Config::default())
        .graceful_shutdown_on(iblab_sys::interrupt::wait())
        .graceful_shutdown_on(on_lost)
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "reconcile");
            }
        })
        .await;
    lost.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// The NetworkPolicy probe's name suffix for this operator pod: its name's last, random
/// segment (the Deployment's pod hash), else a hash of the whole, short enough for names.
fn probe_suffix(instance: &str) -> String {
    let tail = instance.rsplit('-').next().unwrap_or(instance);
    if !tail.is_empty() && tail.len() <= 16 && tail.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return tail.to_ascii_lowercase();
    }
    let h = instance.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    });
    format!("{h:016x}")
}

/// Stop every run going here: each tears its lab down (exit 130) and its LabRun goes back
/// to Pending, to run again when an operator is back.
async fn shutdown(ctx: &Ctx) {
    ctx.shutting_down.store(true, Ordering::SeqCst);
    let n = {
        let going = ctx.going.lock().unwrap_or_else(|e| e.into_inner());
        for g in going.values() {
            if let Ok(mut w) = g.stop_why.lock() {
                *w = Some("shutdown");
            }
            g.stop.notify_one();
        }
        going.len()
    };
    tracing::info!(runs = n, "shutting down: stopping the runs going here");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while !ctx.going.lock().map(|g| g.is_empty()).unwrap_or(true)
        && tokio::time::Instant::now() < deadline
    {
        let _ = tokio::time::timeout(Duration::from_millis(500), ctx.ended.notified()).await;
    }
}

fn error_policy(lr: Arc<LabRun>, e: &Error, ctx: Arc<Ctx>) -> Action {
    let k = key(&lr);
    let n = {
        let mut f = ctx.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = f.entry(k.clone()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let wait = decide::backoff(n);
    tracing::warn!(labrun = %k, error = %e, failures = n, again_in_s = wait.as_secs(), "reconcile failed");
    Action::requeue(wait)
}

async fn reconcile(lr: Arc<LabRun>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = lr.namespace().ok_or(Error::NoNamespace)?;
    let api: Api<LabRun> = Api::namespaced(ctx.client.clone(), &ns);
    let k = key(&lr);
    let done = finalizer(&api, FINALIZER, lr, |ev| async {
        match ev {
            Finalizing::Apply(lr) => apply(lr, ctx.clone()).await,
            Finalizing::Cleanup(lr) => cleanup(lr, ctx.clone()).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))?;
    if let Ok(mut f) = ctx.failures.lock() {
        f.remove(&k);
    }
    Ok(done)
}

/// Write a LabRun's status, if this replica still holds the Lease (fenced: a former
/// holder writes nothing), within the request deadline.
async fn patch_status(ctx: &Ctx, lr: &LabRun, st: &LabRunStatus) -> Result<(), Error> {
    let deadline = match ctx.fence.check(&ctx.client).await {
        Ok(d) => d,
        Err(why) => {
            tracing::warn!(labrun = %key(lr), "{why}: its status is not written");
            return Err(Error::Fenced(why));
        }
    };
    let api: Api<LabRun> = Api::namespaced(ctx.client.clone(), &lr.namespace().unwrap_or_default());
    let body = serde_json::json!({
        "apiVersion": "iblab.dev/v1",
        "kind": "LabRun",
        "status": st,
    });
    // Answered within the fence's deadline, or abandoned: a write still going when the
    // window closes is not waited for.
    match tokio::time::timeout_at(
        deadline,
        api.patch_status(
            &lr.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&body),
        ),
    )
    .await
    {
        Ok(r) => r.map(|_| ()).map_err(Error::from),
        Err(_) => Err(Error::StatusUnanswered { labrun: key(lr) }),
    }
}

async fn event(ctx: &Ctx, lr: &LabRun, warning: bool, reason: &str, note: String) {
    let ev = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.into(),
        note: Some(status::cut(&note, 1000)),
        action: "Run".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &lr.object_ref(&())).await {
        tracing::debug!(error = %e, "cannot publish an event");
    }
}

/// Why a LabRun's lab could not be had.
#[derive(Debug, thiserror::Error)]
enum LabError {
    #[error(
        "no Lab object and no built-in lab is called `{0}`: `kubectl get labs` and `iblab \
         list` show what there is"
    )]
    NoSuchLab(String),
    #[error("cannot look up Lab {name}: {source}")]
    LookUp {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Object(#[from] iblab_k8s::crd::Error),
    #[error(transparent)]
    File(#[from] iblab_sys::fs::PathError),
}

/// The run's lab: a `Lab` object of that name, else a built-in lab.
async fn resolve_lab(
    ctx: &Ctx,
    name: &str,
    dir: &std::path::Path,
) -> Result<(String, String), LabError> {
    let labs: Api<LabObject> = Api::all(ctx.client.clone());
    match labs.get_opt(name).await {
        Ok(Some(obj)) => {
            let yaml = obj.to_lab_file()?;
            std::fs::create_dir_all(dir).map_err(iblab_sys::fs::PathError::of("create", dir))?;
            let file = dir.join(format!("{name}.yaml"));
            std::fs::write(&file, yaml).map_err(iblab_sys::fs::PathError::of("write", &file))?;
            Ok((file.to_string_lossy().into_owned(), format!("Lab/{name}")))
        }
        Ok(None) if iblab_lab::builtin::find(name).is_some() => {
            Ok((name.to_string(), format!("builtin/{name}")))
        }
        Ok(None) => Err(LabError::NoSuchLab(name.to_string())),
        Err(source) => Err(LabError::LookUp {
            name: name.to_string(),
            source,
        }),
    }
}

/// Remove what runs of LabRuns not running here left in `ns` (an operator that died took
/// their supervisors with it). `Err`: what is still there.
async fn sweep_leftovers(ctx: &Ctx, ns: &str) -> Result<(), Error> {
    let going: Vec<String> = ctx
        .going
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .map(|g| g.owner.clone())
        .collect();
    let runs = sweep::runs_in(&ctx.client, ns).await?;
    let mut left = Vec::new();
    for (run, owner) in runs {
        let Some(owner) = owner else { continue };
        if !owner.starts_with(sweep::LABRUN_OWNER_PREFIX) || going.contains(&owner) {
            continue;
        }
        tracing::info!(run = %run, owner = %owner, namespace = ns, "removing a run an earlier operator left");
        left.extend(sweep::remove_run_objects(&ctx.client, ns, &run).await);
    }
    match left.is_empty() {
        true => Ok(()),
        false => Err(Error::TeardownLeft(left)),
    }
}

/// For the tests that kill the operator between accepting a LabRun and its run's first
/// objects: with `IBLAB_OPERATOR_TEST_CRASH_AT=<point>` the operator dies at once the
/// first time it reaches that point (a marker in its work folder keeps the restarted
/// container from doing it again). Unset, as everywhere but in those tests, it does
/// nothing.
fn crash_point(point: &str) {
    let Ok(at) = std::env::var("IBLAB_OPERATOR_TEST_CRASH_AT") else {
        return;
    };
    if at != point {
        return;
    }
    let marker = std::env::var_os("IBLAB_OPERATOR_TEST_CRASH_MARKER")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("iblab-test-crashed"));
    if std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&marker)
        .is_ok()
    {
        tracing::warn!(point, "IBLAB_OPERATOR_TEST_CRASH_AT: killing myself here");
        // Not a signal: as PID 1 of its container the kernel would not deliver one sent
        // from inside. Exiting at once is the same crash: no teardown, no status, and the
        // container's end takes its child runs along.
        std::process::exit(137);
    }
}

async fn apply(lr: Arc<LabRun>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let k = key(&lr);
    let want = want_of(&lr);
    let ns = lr.namespace().unwrap_or_default();
    let (here, busy_with) = stop_older(&ctx, &k, &want, &ns);
    if here {
        return Ok(Action::requeue(Duration::from_secs(30)));
    }
    if ctx.shutting_down.load(Ordering::SeqCst) {
        return Ok(Action::await_change());
    }
    let mut st = lr.status.clone().unwrap_or_default();
    let (attempt, why) = match decided(&ctx, &lr, &want, &ns, &mut st).await? {
        Ok(start) => start,
        Err(action) => return Ok(action),
    };
    crash_point("decided");
    let permit = match admitted(&ctx, &lr, &ns, busy_with, &mut st).await? {
        Ok(permit) => permit,
        Err(action) => return Ok(action),
    };
    crash_point("swept");
    let started = Started {
        key: k,
        want,
        attempt,
        why,
        permit,
    };
    start_run(ctx, lr, started, st).await
}

/// A run going here for an older spec is stopped (the new one starts when it has ended).
/// Whether one is going here for this LabRun, and which other LabRun runs in its
/// namespace, if any.
fn stop_older(ctx: &Ctx, k: &str, want: &Want, ns: &str) -> (bool, Option<String>) {
    let going = ctx.going.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(g) = going.get(k)
        && g.want != *want
    {
        if let Ok(mut w) = g.stop_why.lock() {
            *w = Some("changed");
        }
        g.stop.notify_one();
    }
    let busy = going
        .iter()
        .find(|(other, g)| g.namespace == ns && other.as_str() != k)
        .map(|(other, _)| other.clone());
    (going.contains_key(k), busy)
}

/// Whether to start a run now: `Ok(Ok((attempt, why)))` to start (the status made ready
/// for it, an earlier attempt's objects swept), `Ok(Err(action))` when not now (a re-run
/// asked too soon, nothing to do, given up).
async fn decided(
    ctx: &Ctx,
    lr: &LabRun,
    want: &Want,
    ns: &str,
    st: &mut LabRunStatus,
) -> Result<Result<(u32, String), Action>, Error> {
    let retries = lr.spec.retries.unwrap_or(0);
    if let Some(wait) = decide::rerun_wait(lr.status.as_ref(), want, std::time::SystemTime::now()) {
        let note = format!(
            "a re-run was asked for: it starts in {} s (at most one a minute after the last \
             start)",
            wait.as_secs().max(1)
        );
        if st.message.as_deref() != Some(note.as_str()) {
            st.message = Some(note);
            patch_status(ctx, lr, st).await?;
        }
        return Ok(Err(Action::requeue(wait.max(Duration::from_secs(1)))));
    }
    let (attempt, why, sweep_run) = match decide(lr.status.as_ref(), want, retries, false) {
        Decision::Nothing => return Ok(Err(Action::await_change())),
        Decision::GiveUp { why } => {
            st.phase = Phase::Error;
            st.message = Some(why);
            patch_status(ctx, lr, st).await?;
            return Ok(Err(Action::await_change()));
        }
        Decision::Start {
            attempt,
            why,
            sweep,
        } => (attempt, why, sweep),
    };
    if !decide::current(st, want) {
        *st = LabRunStatus::default();
    }
    st.observed_generation = Some(want.generation);
    st.observed_rerun = want.rerun.clone();
    if let Some(run) = sweep_run {
        let left = sweep::remove_run_objects(&ctx.client, ns, &run).await;
        if !left.is_empty() {
            tracing::warn!(run = %run, problems = ?left, "sweeping an earlier run's objects");
        }
    }
    Ok(Ok((attempt, why)))
}

/// A run may start now: no other LabRun runs in its namespace (pods are named after the
/// lab's nodes), a slot is free, and what a dead operator left there is gone. `Ok(Err)`:
/// it waits (said in its status).
async fn admitted(
    ctx: &Ctx,
    lr: &LabRun,
    ns: &str,
    busy_with: Option<String>,
    st: &mut LabRunStatus,
) -> Result<Result<OwnedSemaphorePermit, Action>, Error> {
    let wait = |st: &mut LabRunStatus, message: String| {
        st.phase = Phase::Pending;
        st.message = Some(message);
    };
    // One run per namespace at a time: pods are named after the lab's nodes.
    if let Some(other) = busy_with {
        wait(
            st,
            format!(
                "waiting: {other} is running in this namespace (one run per namespace at a \
                 time: pods are named after the lab's nodes)"
            ),
        );
        patch_status(ctx, lr, st).await?;
        return Ok(Err(Action::requeue(Duration::from_secs(5))));
    }
    let Ok(permit) = ctx.slots.clone().try_acquire_owned() else {
        wait(
            st,
            format!(
                "waiting for a free slot ({} runs at once; `--max-concurrent`)",
                ctx.max
            ),
        );
        patch_status(ctx, lr, st).await?;
        return Ok(Err(Action::requeue(Duration::from_secs(5))));
    };
    // What a dead operator left of any LabRun's run in this namespace (found by label:
    // the run id may never have reached a status) goes before a run starts here, so that
    // no pod name is taken (one run per namespace at a time).
    if let Err(left) = sweep_leftovers(ctx, ns).await {
        wait(
            st,
            format!(
                "waiting: what an earlier run left in this namespace is still being removed: \
                 {left}"
            ),
        );
        patch_status(ctx, lr, st).await?;
        return Ok(Err(Action::requeue(Duration::from_secs(5))));
    }
    Ok(Ok(permit))
}

/// A run about to start: its LabRun's key and spec, its attempt and why, its slot.
struct Started {
    key: String,
    want: Want,
    attempt: u32,
    why: String,
    permit: OwnedSemaphorePermit,
}

/// Start the run: its lab resolved, its id written ahead into the LabRun's status, the
/// child started and supervised.
async fn start_run(
    ctx: Arc<Ctx>,
    lr: Arc<LabRun>,
    started: Started,
    mut st: LabRunStatus,
) -> Result<Action, Error> {
    let Started {
        key: k,
        want,
        attempt,
        why,
        permit,
    } = started;
    let ns = lr.namespace().unwrap_or_default();
    let dir =
        ctx.work_dir
            .join(&ns)
            .join(format!("{}-g{}-a{attempt}", lr.name_any(), want.generation));
    let _ = std::fs::remove_dir_all(&dir);
    let (lab, source) = match resolve_lab(&ctx, &lr.spec.lab, &dir).await {
        Ok(x) => x,
        Err(why) => {
            st.phase = Phase::Error;
            st.exit_code = Some(exit::BAD_INPUT);
            st.verdict = Some("error".into());
            st.attempts = attempt;
            st.message = Some(why.to_string());
            patch_status(&ctx, &lr, &st).await?;
            event(&ctx, &lr, true, "NoSuchLab", why.to_string()).await;
            return Ok(Action::await_change());
        }
    };
    let launch = child::Launch {
        lab,
        scenario: lr.spec.scenario.clone(),
        paths: lr.spec.paths.clone(),
        namespace: ns.clone(),
        dir: dir.clone(),
        labrun_uid: lr.uid().unwrap_or_default(),
        run_id: iblab_sys::state::new_run_id(),
    };
    crash_point("resolved");
    // Write-ahead: the run id is in the LabRun's status before the run creates anything,
    // so an operator that dies from here on leaves a run its successor finds by id (and
    // by the owner label every object of it carries).
    st.phase = Phase::Running;
    st.attempts = attempt;
    st.lab_source = Some(source.clone());
    st.started_at = Some(now());
    st.finished_at = None;
    st.verdict = None;
    st.exit_code = None;
    st.run_id = Some(launch.run_id.clone());
    st.expectations.clear();
    st.comparison.clear();
    st.message = Some(format!("attempt {attempt}: {why}"));
    if let Err(e) = patch_status(&ctx, &lr, &st).await {
        tracing::warn!(labrun = %k, error = %e, "cannot write the run's id: not starting it");
        return Err(e);
    }
    crash_point("written");
    let child = match child::start(&ctx.iblab, &launch) {
        Ok(c) => c,
        Err(why) => {
            st.phase = Phase::Error;
            st.exit_code = Some(exit::ENVIRONMENT);
            st.message = Some(why.to_string());
            patch_status(&ctx, &lr, &st).await?;
            return Ok(Action::requeue(Duration::from_secs(10)));
        }
    };
    let stop = Arc::new(Notify::new());
    let stop_why = Arc::new(Mutex::new(None));
    ctx.going.lock().unwrap_or_else(|e| e.into_inner()).insert(
        k.clone(),
        Going {
            want: want.clone(),
            namespace: ns.clone(),
            owner: launch.owner(),
            stop: stop.clone(),
            stop_why: stop_why.clone(),
        },
    );
    crash_point("started");
    event(
        &ctx,
        &lr,
        false,
        "Started",
        format!("{} ({source}) attempt {attempt}: {why}", lr.spec.lab),
    )
    .await;
    tracing::info!(labrun = %k, lab = %lr.spec.lab, attempt, "run started");
    tokio::spawn(supervise(
        ctx.clone(),
        (*lr).clone(),
        child,
        launch,
        st,
        permit,
        stop,
        stop_why,
    ));
    Ok(Action::requeue(Duration::from_secs(30)))
}

#[allow(clippy::too_many_arguments)]
async fn supervise(
    ctx: Arc<Ctx>,
    lr: LabRun,
    mut child: tokio::process::Child,
    launch: child::Launch,
    mut st: LabRunStatus,
    permit: OwnedSemaphorePermit,
    stop: Arc<Notify>,
    stop_why: Arc<Mutex<Option<&'static str>>>,
) {
    let k = key(&lr);
    let deadline = tokio::time::Instant::now() + RUN_AT_MOST;
    let mut signalled = false;
    let code = loop {
        tokio::select! {
            r = child.wait() => break match r {
                Ok(s) => s.code().unwrap_or_else(|| {
                    use std::os::unix::process::ExitStatusExt;
                    128 + s.signal().unwrap_or(0)
                }),
                Err(_) => exit::ENVIRONMENT,
            },
            _ = stop.notified(), if !signalled => {
                signalled = true;
                terminate(&child);
            }
            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                if child::run_id(&launch).is_some() {
                    crash_point("provisioning");
                }
                if tokio::time::Instant::now() > deadline && !signalled {
                    signalled = true;
                    tracing::warn!(labrun = %k, "run over its hour: stopping it");
                    terminate(&child);
                }
            }
        }
    };
    let why = stop_why.lock().ok().and_then(|w| *w);
    let left = child::collect(&launch);
    tracing::info!(labrun = %k, exit_code = code, stopped = why.unwrap_or("-"), "run ended");
    if why != Some("deleted") {
        st.evidence = store_evidence(&ctx, &lr, &left).await;
        let mut done = status::finished(left.evidence.as_ref(), code, &left.stderr, &st);
        if left.evidence.is_some() {
            done.measured_where = Some(status::measured_where(
                &lr.namespace().unwrap_or_default(),
                lr.spec.student.as_deref(),
            ));
        }
        if why == Some("shutdown") {
            done.phase = Phase::Pending;
            done.message = Some(
                "interrupted by the operator's shutdown (its lab was torn down): it runs again \
                 when an operator is back"
                    .into(),
            );
        }
        if let Err(e) = patch_status(&ctx, &lr, &done).await {
            tracing::warn!(labrun = %k, error = %e, "cannot write the run's status");
        }
        event(
            &ctx,
            &lr,
            done.phase != Phase::Succeeded,
            done.phase.as_str(),
            done.message.clone().unwrap_or_default(),
        )
        .await;
    }
    let _ = std::fs::remove_dir_all(&launch.dir);
    ctx.going
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&k);
    drop(permit);
    ctx.ended.notify_waiters();
}

/// SIGTERM: `iblab up` tears its lab down and ends with 130.
fn terminate(child: &tokio::process::Child) {
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
}

/// The run's files in a ConfigMap `<labrun>-evidence` that the LabRun owns (so deleting
/// the LabRun collects it), as many as fit.
async fn store_evidence(ctx: &Ctx, lr: &LabRun, left: &child::Left) -> Option<EvidenceRef> {
    let deadline = match ctx.fence.check(&ctx.client).await {
        Ok(d) => d,
        Err(why) => {
            tracing::warn!(labrun = %key(lr), "{why}: its evidence is not written");
            return None;
        }
    };
    let mut files = left.files.clone();
    if !left.stderr.trim().is_empty() {
        files.push(("iblab.log".into(), status::tail(&left.stderr, 64 * 1024)));
    }
    if files.is_empty() {
        return None;
    }
    // Smallest first: evidence.json and junit.xml before report.html.
    files.sort_by_key(|(_, t)| t.len());
    let (mut data, mut keys, mut left_out, mut used) =
        (std::collections::BTreeMap::new(), vec![], vec![], 0usize);
    for (name, text) in files {
        if used + text.len() <= EVIDENCE_BUDGET {
            used += text.len();
            keys.push(name.clone());
            data.insert(name, text);
        } else {
            left_out.push(name);
        }
    }
    let name = format!("{}-evidence", lr.name_any());
    let ns = lr.namespace().unwrap_or_default();
    let owner = OwnerReference {
        api_version: "iblab.dev/v1".into(),
        kind: "LabRun".into(),
        name: lr.name_any(),
        uid: lr.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns.clone()),
            labels: Some(std::collections::BTreeMap::from([
                ("app.kubernetes.io/managed-by".into(), MANAGER.into()),
                ("iblab.dev/labrun".into(), lr.name_any()),
            ])),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    // Under the fence's deadline like a status write.
    match tokio::time::timeout_at(
        deadline,
        api.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&cm),
        ),
    )
    .await
    {
        Ok(Ok(_)) => Some(EvidenceRef {
            config_map: name,
            keys,
            left_out,
        }),
        Ok(Err(e)) => {
            tracing::warn!(configmap = %name, error = %e, "cannot store the evidence");
            None
        }
        Err(_) => {
            tracing::warn!(
                configmap = %name,
                "cannot store the evidence: no answer before this replica's lease window or \
                 the request deadline ended"
            );
            None
        }
    }
}

/// The LabRun is being deleted: stop its run (it tears its lab down) or sweep what an
/// earlier operator left, then let it go.
async fn cleanup(lr: Arc<LabRun>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let k = key(&lr);
    let going = {
        let going = ctx.going.lock().unwrap_or_else(|e| e.into_inner());
        going.get(&k).map(|g| {
            if let Ok(mut w) = g.stop_why.lock() {
                *w = Some("deleted");
            }
            g.stop.notify_one();
        })
    };
    if going.is_some() {
        tracing::info!(labrun = %k, "deleted while running: tearing its lab down");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        while ctx
            .going
            .lock()
            .map(|g| g.contains_key(&k))
            .unwrap_or(false)
            && tokio::time::Instant::now() < deadline
        {
            let _ = tokio::time::timeout(Duration::from_millis(500), ctx.ended.notified()).await;
        }
    } else if let Some(run) = lr.status.as_ref().and_then(|s| s.run_id.clone())
        && lr.status.as_ref().is_some_and(|s| !s.phase.finished())
    {
        let ns = lr.namespace().unwrap_or_default();
        let left = sweep::remove_run_objects(&ctx.client, &ns, &run).await;
        if !left.is_empty() {
            let deleting_for = lr
                .metadata
                .deletion_timestamp
                .as_ref()
                .map(|t| std::time::SystemTime::from(t.0))
                .and_then(|t| std::time::SystemTime::now().duration_since(t).ok())
                .unwrap_or_default();
            match decide::after_failed_cleanup(deleting_for) {
                decide::Cleanup::Retry => return Err(Error::TeardownLeft(left)),
                decide::Cleanup::Release => {
                    let why = format!(
                        "teardown of run {run} still failing after {} s; the LabRun is let go \
                         and these may be left: {}. Remove them with `kubectl delete pods,\
                         configmaps,networkpolicies -n {ns} -l iblab.dev/run={run}`",
                        deleting_for.as_secs(),
                        left.join("; ")
                    );
                    tracing::warn!(labrun = %k, "{why}");
                    event(&ctx, &lr, true, "TeardownAbandoned", why).await;
                }
            }
        }
    }
    Ok(Action::await_change())
}
