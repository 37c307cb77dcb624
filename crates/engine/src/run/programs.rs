//! What a run will start: every program iblab execs for a plan, where it runs and what
//! starts it, derived from the plan by the parts that start them (the backend, the link
//! check, the fabrics, the steps). `up` (what is missing, `--yes`), `plan` and `doctor`
//! read this one list; while the run goes, [`Declared`] holds the executor to it: a
//! program started that the list does not name is a bug in iblab, refused in debug builds
//! (every test) and noted in the evidence otherwise. A program that cannot be started is
//! an environment error naming it and its package, never a result (see [`not_started`]).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use iblab_backend::{BackendOps, Deployment, EnvError, Runner};
use iblab_core::command::Cmd;
use iblab_core::command::ExecOutput;
use iblab_core::fault::LossMechanism;
use iblab_core::plan::Plan;
use iblab_core::plan::backend::Backend;
use iblab_sys::process::{Background, Refused};
use iblab_sys::state::StateFile;

use iblab_core::programs::base;
use iblab_core::programs::{Needs, NotStarted, Place, Provider, not_started, program_of};

/// Everything a run of `plan` starts.
pub fn of(plan: &Plan, backend: &dyn Backend) -> Needs {
    let mut n = Needs::default();
    backend.programs(plan, &mut n);
    crate::run::linkcheck::programs(plan, &mut n);
    iblab_fabric::programs(plan, backend, &mut n);
    crate::steps::programs(plan, &mut n);
    n.sorted()
}

/// Is `program` iblab itself, as the nodes of `backend` see it (path ①'s ping-pong,
/// `{{ iblab }}` in a command)? iblab brings itself there.
pub fn is_iblab(backend: &dyn Backend, program: &str) -> bool {
    program == backend.iblab_path() || base(program) == "iblab"
}

/// A program a run would start that no package of this host can bring.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unprovided {
    /// A program to run on this host that is not installed, of no package iblab knows.
    #[error(
        "{by} runs `{program}` on this host, and it is not installed; iblab knows no \
         package that brings it\n  fix: install it, or correct the command"
    )]
    OnHost { by: String, program: String },
    /// A program to run in the nodes that the image of iblab's they run does not carry:
    /// the lab's own step's (the fix is the lab's), or iblab's (a bug in iblab).
    #[error("{}", not_in_image(by, program, image))]
    NotInImage {
        by: String,
        program: String,
        image: String,
    },
}

fn not_in_image(by: &str, program: &str, image: &str) -> String {
    if by.starts_with("step") {
        format!(
            "{by} runs `{program}` in the nodes, and {image} does not carry it\n  fix: \
             use a program the image has, or another backend"
        )
    } else {
        format!(
            "{by} runs `{program}` in the nodes, but {image} does not carry it: a bug in \
             iblab (please report it)"
        )
    }
}

/// Programs of `needs` that this host must have but lacks, with the package that brings
/// each; `Err` names one an image of iblab's lacks (a bug in iblab: no package helps).
pub fn missing(
    backend: &dyn Backend,
    needs: &Needs,
    caps: &iblab_core::caps::HostCaps,
) -> Result<Vec<(String, &'static str)>, Unprovided> {
    let mut out: Vec<(String, &'static str)> = Vec::new();
    for n in needs.all() {
        if is_iblab(backend, &n.program) {
            continue;
        }
        match backend.provider(n.place) {
            Provider::Host => {
                let name = base(&n.program);
                let known = iblab_core::caps::package_of(name).is_some();
                // The snapshot knows the programs iblab has packages for; any other (a
                // lab's own command) is looked for on PATH here.
                if caps.has(name)
                    || (!known && iblab_sys::host::which(name).is_some())
                    || (n.program.contains('/') && Path::new(&n.program).is_file())
                {
                    continue;
                }
                match iblab_core::caps::package_of(name) {
                    Some(pkg) => {
                        if !out.iter().any(|(p, _)| p == name) {
                            out.push((name.to_string(), pkg));
                        }
                    }
                    None => {
                        return Err(Unprovided::OnHost {
                            by: n.by.clone(),
                            program: n.program.clone(),
                        });
                    }
                }
            }
            Provider::Image { what, has } => {
                // A program iblab knows the package of, which the image does not carry.
                // Any other (a lab's own command) is the lab's to know: if it is not
                // there, the run says so when it cannot start it.
                let name = base(&n.program);
                if iblab_core::caps::package_of(name).is_some() && !has(name) {
                    return Err(Unprovided::NotInImage {
                        by: n.by.clone(),
                        program: n.program.clone(),
                        image: what.to_string(),
                    });
                }
            }
        }
    }
    Ok(out)
}

/// The error for a program that could not be started at `place`, with the fix; `by`
/// says what started it (a lab's own step, or a part of iblab).
pub fn not_started_error(
    backend: &dyn Backend,
    place: Place,
    node: &str,
    ns: &NotStarted,
    by: Option<&str>,
) -> EnvError {
    let name = base(&ns.program);
    let at = match place {
        Place::Host => "this host".to_string(),
        Place::Nodes => format!("node {node}"),
        Place::Subnet => format!("{node}, where the emulated subnet runs"),
    };
    let lab_own = by.is_some_and(|b| b.starts_with("step"));
    let fix = match backend.provider(place) {
        Provider::Host => match iblab_core::caps::package_of(name) {
            Some(pkg) => {
                format!("apt-get install {pkg} (or run `iblab up` with --yes to let it install it)")
            }
            None => format!("install `{name}` on this host"),
        },
        Provider::Image { what, .. } if lab_own => format!(
            "{} names a program {what} does not carry: use one it has (`iblab doctor LAB` \
             lists what a run starts), or another backend",
            by.unwrap_or("the step")
        ),
        Provider::Image { what, .. } => format!(
            "{what} should carry it: rebuild it (`iblab image build --rebuild` for the lab \
             image, a new cache folder for the vm backend's), or report a bug"
        ),
    };
    EnvError::new(format!(
        "could not start `{}` on {at}: {} (it said: {})\n  fix: {fix}",
        ns.program, ns.why, ns.said
    ))
}

/// What started `argv`'s program at `place`, by the plan's list.
fn started_by<'n>(needs: &'n Needs, place: Place, argv: &[String]) -> Option<&'n str> {
    let p = program_of(argv)?;
    needs
        .all()
        .iter()
        .find(|n| n.place == place && (n.program == p || base(&n.program) == base(p)))
        .map(|n| n.by.as_str())
}

/// Programs started that the plan did not list, as a run saw them.
#[derive(Debug, Default)]
pub struct Undeclared(Mutex<BTreeSet<String>>);

impl Undeclared {
    pub fn list(&self) -> Vec<String> {
        self.0
            .lock()
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Hold a launch to the list: `Err` in debug builds when the list does not name it (a
/// bug in iblab, which every test then shows), and remember it for the evidence always.
fn check(
    needs: &Needs,
    undeclared: &Undeclared,
    place: Place,
    argv: &[String],
    iblab: &str,
) -> Result<(), Refused> {
    let Some(program) = program_of(argv) else {
        return Ok(());
    };
    if needs.has(place, program) || program == iblab || base(program) == "iblab" {
        return Ok(());
    }
    let said = format!("{program} ({})", place.as_str());
    if let Ok(mut s) = undeclared.0.lock() {
        s.insert(said);
    }
    if cfg!(debug_assertions) {
        return Err(Refused {
            program: program.to_string(),
            why: format!(
                "iblab started `{program}` ({}), which the plan's program list does not name: a \
                 bug in iblab (run/programs.rs derives that list; add it where the command is \
                 built)",
                place.as_str()
            ),
        });
    }
    Ok(())
}

/// The host-side guard for [`iblab_sys::process`]: launches of this host's programs
/// during a run are held to the places this host provides.
pub fn host_guard(
    backend: &dyn Backend,
    needs: Arc<Needs>,
    undeclared: Arc<Undeclared>,
) -> iblab_sys::process::Guard {
    let places: Vec<Place> = [Place::Host, Place::Nodes, Place::Subnet]
        .into_iter()
        .filter(|p| matches!(backend.provider(*p), Provider::Host))
        .collect();
    let iblab = backend.iblab_path();
    Arc::new(move |argv: &[String]| {
        let Some(program) = program_of(argv) else {
            return Ok(());
        };
        if places.iter().any(|p| needs.has(*p, program)) {
            return Ok(());
        }
        check(&needs, &undeclared, Place::Host, argv, &iblab)
    })
}

/// The run's backend as the executor sees it: every command on a node or in the subnet's
/// site is held to the plan's list, and one that could not start becomes an environment
/// error that names the program and the fix.
pub struct Declared<'a> {
    pub inner: &'a dyn Deployment,
    pub needs: Arc<Needs>,
    pub undeclared: Arc<Undeclared>,
}

impl Declared<'_> {
    fn hold(&self, place: Place, argv: &[String]) -> Result<(), EnvError> {
        check(
            &self.needs,
            &self.undeclared,
            place,
            argv,
            &self.inner.iblab_path(),
        )
        .map_err(EnvError::from)
    }

    fn started(
        &self,
        place: Place,
        node: &str,
        argv: &[String],
        out: ExecOutput,
    ) -> Result<ExecOutput, EnvError> {
        match program_of(argv).and_then(|p| not_started(&out, p)) {
            Some(ns) => Err(not_started_error(
                self.inner.backend(),
                place,
                node,
                &ns,
                started_by(&self.needs, place, argv),
            )),
            None => Ok(out),
        }
    }
}

#[async_trait]
impl Deployment for Declared<'_> {
    fn backend(&self) -> &'static dyn BackendOps {
        self.inner.backend()
    }
    async fn provision(&self, plan: &Plan, state: &StateFile) -> Result<(), EnvError> {
        self.inner.provision(plan, state).await
    }
    async fn exec(&self, node: &str, cmd: &Cmd, timeout: Duration) -> Result<ExecOutput, EnvError> {
        self.hold(Place::Nodes, &cmd.argv)?;
        let out = self.inner.exec(node, cmd, timeout).await?;
        self.started(Place::Nodes, node, &cmd.argv, out)
    }
    fn iblab_path(&self) -> String {
        self.inner.iblab_path()
    }
    fn loss_mechanism(&self, node: &str, plan: LossMechanism) -> LossMechanism {
        self.inner.loss_mechanism(node, plan)
    }
    fn report(&self) -> (Vec<String>, Vec<(String, f64)>) {
        self.inner.report()
    }
    async fn host_side_diagnostics(&self, plan: &Plan) -> String {
        self.inner.host_side_diagnostics(plan).await
    }
    fn keep(&self) {
        self.inner.keep()
    }
    fn output_cuts(&self) -> Vec<String> {
        self.inner.output_cuts()
    }
    fn rdma_made_by_node(&self, node: &str) -> bool {
        self.inner.rdma_made_by_node(node)
    }
    fn subnet_site(&self) -> Option<Arc<dyn Runner>> {
        self.inner.subnet_site().map(|r| {
            Arc::new(DeclaredRunner {
                inner: r,
                backend: self.inner.backend(),
                needs: self.needs.clone(),
                undeclared: self.undeclared.clone(),
            }) as Arc<dyn Runner>
        })
    }
    async fn spawn(
        &self,
        node: &str,
        argv: &[String],
        log: &Path,
        state: &StateFile,
    ) -> Result<Background, EnvError> {
        self.hold(Place::Nodes, argv)?;
        self.inner.spawn(node, argv, log, state).await
    }
    async fn exec_measured(
        &self,
        node: &str,
        cmd: &Cmd,
        timeout: Duration,
    ) -> Result<ExecOutput, EnvError> {
        self.hold(Place::Nodes, &cmd.argv)?;
        let out = self.inner.exec_measured(node, cmd, timeout).await?;
        self.started(Place::Nodes, node, &cmd.argv, out)
    }
    async fn spawn_measured(
        &self,
        node: &str,
        argv: &[String],
        log: &Path,
        state: &StateFile,
    ) -> Result<Background, EnvError> {
        self.hold(Place::Nodes, argv)?;
        self.inner.spawn_measured(node, argv, log, state).await
    }
}

/// The subnet's site, held to the list like the nodes.
struct DeclaredRunner {
    inner: Arc<dyn Runner>,
    backend: &'static dyn BackendOps,
    needs: Arc<Needs>,
    undeclared: Arc<Undeclared>,
}

#[async_trait]
impl Runner for DeclaredRunner {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn exec(&self, cmd: &Cmd, timeout: Duration) -> Result<ExecOutput, EnvError> {
        check(
            &self.needs,
            &self.undeclared,
            Place::Subnet,
            &cmd.argv,
            &self.backend.iblab_path(),
        )
        .map_err(EnvError::from)?;
        let out = self.inner.exec(cmd, timeout).await?;
        match program_of(&cmd.argv).and_then(|p| not_started(&out, p)) {
            Some(ns) => Err(not_started_error(
                self.backend,
                Place::Subnet,
                &self.inner.describe(),
                &ns,
                started_by(&self.needs, Place::Subnet, &cmd.argv),
            )),
            None => Ok(out),
        }
    }
    async fn spawn(&self, argv: &[String], log: &Path) -> Result<Background, EnvError> {
        check(
            &self.needs,
            &self.undeclared,
            Place::Subnet,
            argv,
            &self.backend.iblab_path(),
        )
        .map_err(EnvError::from)?;
        self.inner.spawn(argv, log).await
    }
}
