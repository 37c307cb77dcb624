//! The command line: parse arguments, dispatch, map outcomes to exit codes.

mod doctor;
mod down;
mod enter;
mod image;
mod info;
mod install;
#[cfg(feature = "kube")]
mod kube;
mod planning;
mod up;

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

use iblab_lab::{Lang, PathKind};

use iblab_core::exit;

/// The language iblab speaks to its user in this process: `--lang`, else the locale.
static LANG: std::sync::OnceLock<Lang> = std::sync::OnceLock::new();

/// The language of what iblab says (`--lang`, else `LC_ALL`, `LC_MESSAGES`, `LANG`).
pub fn lang() -> Lang {
    *LANG.get_or_init(Lang::from_env)
}

const AFTER_HELP: &str = "\
Examples:
  iblab list                          the built-in labs
  iblab show tcp-loss                 what a lab does and what it must show
  sudo iblab up tcp-loss              run it: bring up, measure, judge, tear down
  sudo iblab up tcp-loss --scenario heavy-loss
  iblab plan tcp-loss --paths tcp     what would run, without touching anything
  iblab report iblab-runs/<run>       the summary of an earlier run
  sudo iblab up tcp-loss --backend docker   the same lab in containers
  sudo iblab image build              build the docker backend's image ahead of time

Exit codes: 0 all expectations held · 1 an expectation failed · 2 bad input ·
3 environment (missing tool, provisioning failed) · 130 interrupted (after teardown).";

/// A declarative lab orchestrator for RDMA networking: RDMA, RoCE and InfiniBand, shown
/// with evidence from real runs.
#[derive(Parser, Debug)]
#[command(name = "iblab", version, about, after_help = AFTER_HELP, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// More logging (-v, -vv); logs go to stderr.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    /// When to use colour.
    #[arg(long, value_enum, default_value_t = Colour::Auto, global = true)]
    color: Colour,
    /// The language of what iblab says, lab texts and reports included: zh-CN (简体中文)
    /// or en (default: the locale: LC_ALL, LC_MESSAGES, LANG).
    #[arg(long, global = true, env = "IBLAB_LANG", value_name = "LANG", value_parser = parse_lang)]
    lang: Option<Lang>,
    /// kube backend: the kubeconfig context to use (default: the current one).
    #[arg(long, global = true, env = "IBLAB_KUBE_CONTEXT", value_name = "NAME")]
    context: Option<String>,
    /// kube backend: run in this existing namespace (default: a namespace per run).
    #[arg(long, global = true, env = "IBLAB_KUBE_NAMESPACE", value_name = "NAME")]
    namespace: Option<String>,
    /// kube backend: run lab node NODE's pod on cluster node CLUSTER_NODE (repeatable, or
    /// `a=n1,b=n2`; default: where the scheduler puts it).
    #[arg(
        long,
        global = true,
        env = "IBLAB_KUBE_PLACE",
        value_name = "NODE=CLUSTER_NODE"
    )]
    place: Vec<String>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq)]
pub enum ShowFormat {
    Text,
    Svg,
    Dot,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq)]
enum Colour {
    Auto,
    Always,
    Never,
}

/// Options that choose what runs: shared by `plan` and `up`.
#[derive(clap::Args, Debug, Clone)]
pub struct Selection {
    /// A built-in lab name (see `iblab list`) or a path to a lab file.
    pub lab: String,
    /// Scenario to run (default: the lab as written).
    #[arg(short, long)]
    pub scenario: Option<String>,
    /// Where nodes live: auto, local, vm, docker, kube.
    #[arg(short, long, default_value = "auto")]
    pub backend: String,
    /// Run only these paths of the comparison, e.g. `--paths tcp` or `--paths tcp,ib`.
    #[arg(long, value_delimiter = ',', value_parser = parse_path)]
    pub paths: Option<Vec<PathKind>>,
    /// Carry a path on a real RDMA adapter of this host, DEVICE[:PORT] (e.g. mlx5_0:1):
    /// an Ethernet link layer carries roce, an InfiniBand one ib. Both ends run on this
    /// host and the adapter loops the traffic back (provenance hardware).
    #[arg(long, value_name = "DEVICE[:PORT]")]
    pub hca: Option<String>,
    /// Give a parameter of the lab a value for this run, KEY=VALUE (repeatable), over the
    /// lab's and the scenario's, e.g. `--set rate_mbit=40` (`iblab show LAB` lists them).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

fn parse_variant(s: &str) -> Result<iblab_backend_docker::image::Variant, String> {
    iblab_backend_docker::image::Variant::ALL
        .into_iter()
        .find(|v| v.as_str() == s)
        .ok_or_else(|| format!("`{s}` is not a variant; use debootstrap or host"))
}

fn parse_lang(s: &str) -> Result<Lang, String> {
    s.parse()
}

fn parse_path(s: &str) -> Result<PathKind, String> {
    PathKind::parse(s).ok_or_else(|| format!("`{s}` is not a path; use tcp, roce or ib"))
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the built-in labs.
    List {
        /// Print them as JSON: name, lesson, title and scenarios of each.
        #[arg(long)]
        json: bool,
    },
    /// Show a lab: its goal, topology, steps and expectations.
    Show {
        lab: String,
        /// `text` (default), or the topology drawn: `svg`, or Graphviz `dot`.
        #[arg(long, value_enum, default_value_t = ShowFormat::Text)]
        format: ShowFormat,
    },
    /// Check a lab file (or built-in lab) without running anything.
    Validate { lab: String },
    /// Print the JSON Schema of lab files (for editors).
    Schema,
    /// Print the concrete plan of a run, touching nothing.
    Plan {
        #[command(flatten)]
        sel: Selection,
        /// Print the plan as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write the objects a run would apply (`--backend kube`), without a cluster.
    Render {
        #[command(flatten)]
        sel: Selection,
        /// Folder to write `<lab>.yaml` into (default: standard output).
        #[arg(short, long)]
        out: Option<PathBuf>,
    },
    /// Print iblab's CustomResourceDefinitions (Lab, LabRun) as YAML, their schemas
    /// derived from the lab file's types; or labs as Lab objects to apply.
    Crd {
        /// Print every built-in lab as a Lab object instead.
        #[arg(long, conflicts_with = "lab")]
        labs: bool,
        /// Print these labs (built-in names or lab files) as Lab objects instead.
        #[arg(long, value_name = "LAB")]
        lab: Vec<String>,
    },
    /// The Kubernetes operator: runs LabRun objects with the kube backend, in a pod (its
    /// service account) or against the kubeconfig's cluster.
    Operator {
        /// Watch LabRuns in this namespace only (default: every namespace).
        #[arg(long, value_name = "NS")]
        watch_namespace: Option<String>,
        /// Runs going at once (one per namespace at a time in any case).
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
        max_concurrent: u16,
        /// Serve GET /healthz and /readyz here, e.g. 0.0.0.0:8080.
        #[arg(long, value_name = "ADDR")]
        health_addr: Option<std::net::SocketAddr>,
        /// Where each run gets its folder (lab file, state, run folder).
        #[arg(
            long,
            env = "IBLAB_OPERATOR_WORK_DIR",
            default_value = "/var/lib/iblab/operator"
        )]
        work_dir: PathBuf,
        /// Do not apply the CRDs at start (they were installed some other way).
        #[arg(long)]
        no_apply_crds: bool,
        /// Elect the one replica that runs LabRuns with this Lease (NAMESPACE/NAME): the
        /// others wait and take over when it goes. Without it, run only one operator.
        #[arg(long, value_name = "NS/NAME")]
        leader_lease: Option<String>,
        /// Only check that the CRDs are established and LabRuns can be listed (exit 0 or 3).
        #[arg(long)]
        check: bool,
        /// Probe whether the cluster enforces NetworkPolicy (three short-lived pods of this
        /// image in NS, the operator's own namespace) and say so in /readyz and the log.
        #[arg(long, value_name = "NS", env = "IBLAB_OPERATOR_PROBE_NAMESPACE")]
        probe_network_policy_in: Option<String>,
        /// Ready only once the probe found NetworkPolicy enforced (lab pods are isolated
        /// by it: students' pods from each other, lab pods from the API server).
        #[arg(long, requires = "probe_network_policy_in")]
        require_network_policy: bool,
    },
    /// A class in one step: per student a namespace, a quota, a Role to read and enter
    /// only their own lab, and a LabRun (run by `iblab operator`); then their verdicts.
    Class {
        #[command(subcommand)]
        action: ClassAction,
    },
    /// Bring a lab up, run its steps, judge the evidence, and tear it down.
    Up {
        #[command(flatten)]
        sel: Selection,
        /// Run folder (default: iblab-runs/<lab>-<scenario>-<time>).
        #[arg(short, long)]
        out: Option<PathBuf>,
        /// Leave the lab running afterwards (remove it with `iblab down`).
        #[arg(long)]
        keep: bool,
        /// Install missing Debian/Ubuntu packages without asking.
        #[arg(short, long)]
        yes: bool,
        /// Run every traffic step N times: expectations read the median of each figure,
        /// the evidence keeps every value and the spread.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
        repeat: u32,
        /// Write the run's events to FILE as JSON lines as they happen (`iblab ui` reads
        /// them); not for people.
        #[arg(long, value_name = "FILE", hide = true)]
        events: Option<PathBuf>,
    },
    /// The course's page in a browser: the lessons, a Run button, the three paths' graphs
    /// live, the runs side by side. Serves on 127.0.0.1 with a random token in the URL it
    /// prints; a run it starts is a real `iblab up` (see `iblab status`).
    Ui {
        /// Address to serve on (default loopback only; another address is warned about:
        /// whoever reaches it with the token runs labs here as root).
        #[arg(long, default_value = "127.0.0.1:8047", value_name = "ADDR:PORT")]
        listen: std::net::SocketAddr,
        /// The runs folder: where runs are listed from and started into.
        #[arg(long, default_value = "iblab-runs", value_name = "DIR")]
        runs: PathBuf,
        /// The backend a run uses unless the page picks another: auto, local, vm, docker.
        #[arg(short, long, default_value = "auto")]
        backend: String,
    },
    /// Remove a lab's runs (by lab name or run id), or every run with --all.
    Down {
        /// Lab name or run id.
        target: Option<String>,
        /// Every run of this state folder, and what crashed runs left: namespaces, containers
        /// and VMs of this machine, and on a cluster the objects this machine and state
        /// folder started (label `iblab.dev/owner`).
        #[arg(long, conflicts_with = "target")]
        all: bool,
        /// With `--all`: on a cluster, every owner's crashed runs too (other machines',
        /// other state folders'). It lists them and asks first (`--yes` on a terminal
        /// or not). Runs whose owner is alive on this machine are still spared, and a
        /// LabRun's run is its operator's to remove; others' live runs are not: for an admin.
        #[arg(long, requires = "all")]
        all_owners: bool,
        /// With `--all-owners`: remove what it lists without asking.
        #[arg(long, requires = "all_owners")]
        yes: bool,
    },
    /// Runs that are up now; with a run id or lab name, that run's nodes and how to enter them.
    Status {
        /// A run id or a lab name (its newest run).
        run: Option<String>,
    },
    /// Run a command on a node of a lab that is up (e.g. kept with `up --keep`); its exit
    /// code passes through.
    Exec {
        /// A run id or a lab name (its newest run).
        run: String,
        node: String,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// An interactive shell on a node of a lab that is up.
    Shell {
        /// A run id or a lab name (its newest run).
        run: String,
        node: String,
    },
    /// Print the summary of a finished run.
    Report {
        run_dir: PathBuf,
        /// Open report.html in a browser.
        #[arg(long)]
        open: bool,
        /// Write report.html and junit.xml again from evidence.json (e.g. after an upgrade).
        #[arg(long)]
        rewrite: bool,
    },
    /// What this host has for each backend and fabric, and how to fix what is missing;
    /// with a lab, also every program a run of it starts and whether it is there.
    Doctor {
        /// A built-in lab or a lab file: list what a run of it starts (as `plan` does).
        lab: Option<String>,
        /// Scenario (with a lab).
        #[arg(short, long, requires = "lab")]
        scenario: Option<String>,
        /// Backend (with a lab): auto, local, vm, docker, kube.
        #[arg(short, long, default_value = "auto")]
        backend: String,
        /// Only these paths (with a lab).
        #[arg(long, value_delimiter = ',', value_parser = parse_path, requires = "lab")]
        paths: Option<Vec<PathKind>>,
    },
    /// Lesson 6: which network to choose, from your situation, with each reason traced to
    /// a lesson; plus this host's RDMA devices and the ratios measured in earlier runs.
    Advise {
        #[command(flatten)]
        situation: crate::advise::Situation,
        /// Read the situation from a YAML file instead (same fields, camelCase).
        #[arg(long, conflicts_with_all = ["rdma_in_use", "across_subnets", "ib_team", "much_tcp", "existing_ib"])]
        file: Option<PathBuf>,
        /// Run folders whose measured ratios to set side by side.
        #[arg(long = "evidence", value_name = "RUN_DIR")]
        evidence: Vec<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The docker backend's lab image (built locally from Debian packages, no registry).
    Image {
        #[command(subcommand)]
        action: ImageAction,
    },
    /// Print shell completions.
    Completions { shell: clap_complete::Shell },
    /// The guest agent of the vm backend (the VM's /init); not for people.
    #[command(hide = true)]
    Agent,
    /// Run a command in a kept VM through its guest agent (`exec` and `shell` on the vm
    /// backend); not for people.
    #[command(hide = true)]
    Attach {
        /// The agent's socket.
        socket: PathBuf,
        /// The node's network namespace in the guest.
        #[arg(long, value_name = "NODE")]
        netns: Option<String>,
        /// A line shell on this node instead of one command.
        #[arg(long, value_name = "NODE")]
        lines: Option<String>,
        /// The run, for what the line shell tells the user.
        #[arg(long, default_value = "RUN")]
        run: String,
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Write this binary with the libraries it runs with into DIR, for nodes that do not
    /// share this host's files (a lab pod's init container does); not for people.
    #[command(hide = true)]
    Bundle { dir: PathBuf },
    /// Reach each TARGET (`tcp:HOST:PORT`, a TCP connection; `udp:HOST:PORT`, a datagram
    /// echoed back; `HOST:PORT` is TCP) within the time: a line `reached T` or `not reached
    /// T` each (also into /dev/termination-log where it can be written), exit 0 if all were
    /// reached, 1 if not; with --listen, accept TCP connections and echo UDP datagrams on
    /// ADDR:PORT until killed (the NetworkPolicy probe's pods run it); not for people.
    #[command(hide = true)]
    Connect {
        #[arg(required = true)]
        targets: Vec<String>,
        #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
        within: std::time::Duration,
        #[arg(long)]
        listen: bool,
        /// Wait this long before connecting (for a network plugin to apply a policy to a
        /// pod that just started).
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        after: std::time::Duration,
    },
    /// What containerd runs in place of runc for path ②'s lab pods (the RuntimeClass
    /// iblab-rxe): makes a pod's links and rxe in its network namespace and gives its
    /// container exactly their device files, then runs runc; not for people.
    #[command(hide = true)]
    NodeRuntime {
        #[arg(long)]
        runc: PathBuf,
        /// At most this many RDMA devices on the node, counting the ones a pod asks for.
        #[arg(long, default_value_t = iblab_node_agent::shape::MAX_DEVICES)]
        max_devices: usize,
        /// An image lab pods' containers may run (repeatable; none: any).
        #[arg(long = "image")]
        images: Vec<String>,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Install the node agent into DIR (a host folder, mounted): iblab with its libraries
    /// and the runtime handler's script, which runs it from AS (DIR as the node sees it)
    /// around RUNC; not for people (the node agent's DaemonSet runs it).
    #[command(hide = true)]
    NodeInstall {
        dir: PathBuf,
        #[arg(long = "as")]
        as_seen: String,
        #[arg(long)]
        runc: String,
        /// The handler's cap on the node's RDMA devices.
        #[arg(long, default_value_t = iblab_node_agent::shape::MAX_DEVICES)]
        max_devices: usize,
        /// The images lab pods' containers may run (repeatable; none: any).
        #[arg(long = "image")]
        images: Vec<String>,
    },
    /// A TCP ping-pong (path tcp's latency test), run inside lab nodes.
    #[command(hide = true)]
    Pingpong {
        #[arg(long)]
        listen: Option<String>,
        #[arg(long)]
        connect: Option<String>,
        #[arg(long, default_value_t = 1000)]
        count: usize,
        #[arg(long, default_value_t = 2)]
        size: usize,
        /// Seconds to wait for the peer.
        #[arg(long, default_value_t = 10.0)]
        wait: f64,
    },
    /// Lesson 3's verbs probe on one device: unregistered memory, SEND without RECV,
    /// posting before RTS; prints every verbs call and completion as JSON.
    #[command(hide = true)]
    VerbsProbe {
        #[arg(long, default_value = "rxe0")]
        device: String,
        #[arg(long, default_value_t = 1)]
        port: u8,
        /// GID index (default: the port's IPv4-mapped RoCEv2 GID).
        #[arg(long)]
        gid_index: Option<i32>,
    },
}

#[derive(Subcommand, Debug)]
enum ClassAction {
    /// Create or update every student's namespace, quota, role and LabRun.
    Apply { file: PathBuf },
    /// The class's verdicts (exit 0 all passed, 1 a claim failed, 3 a run errored or is
    /// missing, 4 some still going).
    Status {
        file: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Also write one JUnit file: a test suite per student.
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
        /// Wait until every run has finished, at most this long (e.g. 10m).
        #[arg(long, value_parser = humantime::parse_duration)]
        wait: Option<std::time::Duration>,
    },
    /// Delete every namespace of the class (the operator tears each lab down first).
    Delete { file: PathBuf },
    /// Print the objects `apply` would create, without a cluster.
    Render { file: PathBuf },
}

#[derive(Subcommand, Debug)]
enum ImageAction {
    /// Build the lab image ($IBLAB_IMAGE, default iblab/lab:<version>) and import it.
    Build {
        /// debootstrap: the lab packages from a Debian mirror (complete, ~1 min, cached);
        /// host: this host's tool binaries and their libraries (<1 s, only what is installed).
        #[arg(long = "from", value_parser = parse_variant, default_value = "debootstrap")]
        variant: iblab_backend_docker::image::Variant,
        /// Debian suite (default: this host's, else bookworm).
        #[arg(long)]
        suite: Option<String>,
        /// Debian mirror (default: the one in this host's apt sources).
        #[arg(long)]
        mirror: Option<String>,
        /// Run debootstrap again even when a cached root filesystem matches.
        #[arg(long)]
        rebuild: bool,
        /// Build the operator's image instead ($IBLAB_OPERATOR_IMAGE, default
        /// iblab/operator:<version>): this binary, its libraries and a non-root user.
        #[arg(long, conflicts_with_all = ["variant", "suite", "mirror", "rebuild"])]
        operator: bool,
    },
    /// Show the lab image and its labels (what went into it).
    Show,
}

use iblab_sys::interrupt::runtime;

/// Why a command stopped short: its exit code, and what to tell the user (`None`: told
/// already, as a lab file's diagnostics are). Printed once, at the edge ([`main`]).
#[derive(Debug)]
pub struct Failure {
    pub code: i32,
    pub message: Option<String>,
}

impl Failure {
    /// `error: {message}`, ending with `code`.
    pub fn new(code: i32, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: Some(message.into()),
        }
    }
}

/// An exit code whose reason was told already (by the helpers that print diagnostics).
impl From<i32> for Failure {
    fn from(code: i32) -> Failure {
        Failure {
            code,
            message: None,
        }
    }
}

/// What a command's exit code is, or why it stopped short.
pub type Outcome = Result<i32, Failure>;

/// How a command meets signals. Commands that only print end quietly when their reader
/// goes away (`iblab list | head`), as Unix tools do. Commands that run labs, or talk to
/// an engine over a socket (doctor), keep SIGPIPE ignored: a write to a dead peer must be
/// an error they handle, never a death before teardown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signals {
    /// SIGPIPE ends it quietly.
    Prints,
    /// SIGPIPE ignored: a write to a dead peer is an error it handles.
    Works,
    /// SIGPIPE ignored, and Ctrl-C and SIGTERM caught from the start, before the host
    /// snapshot, planning, package installs and image builds: one that comes early still
    /// stops the run (130).
    RunsLab,
}

impl Command {
    /// Each command's way with signals: the match has no default, so a new command must
    /// say its own.
    fn signals(&self) -> Signals {
        use Signals::*;
        match self {
            Command::List { .. }
            | Command::Show { .. }
            | Command::Validate { .. }
            | Command::Schema
            | Command::Plan { .. }
            | Command::Render { .. }
            | Command::Crd { .. }
            | Command::Status { .. }
            | Command::Advise { .. }
            | Command::Completions { .. } => Prints,
            Command::Class { action } => match action {
                ClassAction::Render { .. } => Prints,
                ClassAction::Apply { .. }
                | ClassAction::Status { .. }
                | ClassAction::Delete { .. } => Works,
            },
            Command::Report { open, .. } => match open {
                false => Prints,
                true => Works,
            },
            Command::Up { .. } => RunsLab,
            Command::Operator { .. }
            | Command::Ui { .. }
            | Command::Down { .. }
            | Command::Exec { .. }
            | Command::Shell { .. }
            | Command::Doctor { .. }
            | Command::Image { .. }
            | Command::Agent
            | Command::Attach { .. }
            | Command::Bundle { .. }
            | Command::Connect { .. }
            | Command::NodeRuntime { .. }
            | Command::NodeInstall { .. }
            | Command::Pingpong { .. }
            | Command::VerbsProbe { .. } => Works,
        }
    }

    /// A controller's log is its record of what it did: the operator says info by default.
    fn verbosity(&self, asked: u8) -> u8 {
        match self {
            Command::Operator { .. } => asked.max(1),
            _ => asked,
        }
    }
}

impl Signals {
    /// Set this process's signal handling for the command: before any thread is started.
    fn install(self) -> Result<(), Failure> {
        match self {
            Signals::Prints => iblab_sys::interrupt::default_sigpipe(),
            Signals::Works => {}
            Signals::RunsLab => iblab_sys::interrupt::install().map_err(|e| {
                Failure::new(
                    exit::ENVIRONMENT,
                    format!("cannot catch Ctrl-C and SIGTERM: {e}"),
                )
            })?,
        }
        Ok(())
    }
}

/// What every command may read of the global options.
struct Global {
    colour: bool,
    verbose: bool,
}

/// Parse, run, and return the exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    exit::OK
                }
                _ => exit::BAD_INPUT,
            };
        }
    };
    match run(cli) {
        Ok(code) => code,
        Err(Failure { code, message }) => {
            if let Some(m) = message {
                eprintln!("error: {m}");
            }
            code
        }
    }
}

/// The global options taken in, signals set for the command, then the command.
fn run(cli: Cli) -> Outcome {
    let _ = LANG.set(cli.lang.unwrap_or_else(Lang::from_env));
    init_logging(cli.command.verbosity(cli.verbose), cli.log_format);
    cluster_settings(&cli)?;
    let colour = match cli.color {
        Colour::Always => true,
        Colour::Never => false,
        Colour::Auto => std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
    };
    cli.command.signals().install()?;
    let g = Global {
        colour,
        verbose: cli.verbose > 0,
    };
    command(cli.command, &g)
}

/// `--context`, `--namespace` and `--place` for the kube backend.
#[cfg(feature = "kube")]
fn cluster_settings(cli: &Cli) -> Result<(), Failure> {
    Ok(kube::settings(
        cli.context.clone(),
        cli.namespace.clone(),
        &cli.place,
    )?)
}

/// Without the kube backend, `--place` has nothing to place.
#[cfg(not(feature = "kube"))]
fn cluster_settings(cli: &Cli) -> Result<(), Failure> {
    if cli.place.is_empty() {
        return Ok(());
    }
    Err(Failure::new(
        exit::ENVIRONMENT,
        format!(
            "--place puts lab nodes' pods on cluster nodes: {}",
            without_kube()
        ),
    ))
}

/// Each command to its function.
fn command(cmd: Command, g: &Global) -> Outcome {
    let colour = g.colour;
    match cmd {
        Command::List { json } => Ok(info::list(json)),
        Command::Show { lab, format } => Ok(match format {
            ShowFormat::Text => info::show(&lab, colour),
            drawn => info::draw(&lab, drawn == ShowFormat::Svg, colour),
        }),
        Command::Validate { lab } => Ok(info::validate(&lab, colour)),
        Command::Schema => Ok(info::schema()),
        Command::Plan { sel, json } => up::plan(&sel, json, colour),
        Command::Up {
            sel,
            out,
            keep,
            yes,
            repeat,
            events,
        } => {
            open_events(events.as_deref())?;
            let how = up::How {
                out,
                keep,
                yes,
                repeat,
            };
            up::up(&sel, how, g)
        }
        c @ (Command::Render { .. }
        | Command::Crd { .. }
        | Command::Class { .. }
        | Command::Operator { .. }) => cluster_command(c, colour),
        Command::Down {
            target,
            all,
            all_owners,
            yes,
        } => down::down(target.as_deref(), all, all_owners, yes),
        Command::Ui {
            listen,
            runs,
            backend,
        } => Ok(ui(listen, runs, backend)),
        Command::Status { run: None } => Ok(down::status()),
        Command::Status { run: Some(r) } => enter::status_of(&r),
        Command::Exec { run, node, command } => enter::exec(&run, &node, &command),
        Command::Shell { run, node } => enter::shell(&run, &node),
        Command::Report {
            run_dir,
            open,
            rewrite,
        } => Ok(info::report(&run_dir, open, rewrite, colour, g.verbose)),
        Command::Doctor {
            lab,
            scenario,
            backend,
            paths,
        } => Ok(doctor(lab, scenario, backend, paths, colour)),
        Command::Advise {
            situation,
            file,
            evidence,
            json,
        } => Ok(info::advise(situation, file.as_deref(), &evidence, json)),
        Command::Image { action } => Ok(image(action)),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "iblab", &mut std::io::stdout());
            Ok(exit::OK)
        }
        c @ (Command::Agent
        | Command::Bundle { .. }
        | Command::NodeRuntime { .. }
        | Command::NodeInstall { .. }
        | Command::Attach { .. }
        | Command::VerbsProbe { .. }
        | Command::Pingpong { .. }
        | Command::Connect { .. }) => Ok(not_for_people(c)),
    }
}

/// `up --events FILE`: the run's events go there from the start.
fn open_events(events: Option<&std::path::Path>) -> Result<(), Failure> {
    let Some(f) = events else {
        return Ok(());
    };
    iblab_sys::events::open(f).map_err(|e| {
        eprintln!(
            "{}",
            rust_i18n::t!(
                "up.events",
                locale = lang().tag(),
                file = f.display(),
                error = e
            )
        );
        Failure::from(exit::ENVIRONMENT)
    })
}

/// `render`, `crd`, `class` and `operator`: the kube backend's commands.
#[cfg(feature = "kube")]
fn cluster_command(cmd: Command, colour: bool) -> Outcome {
    Ok(match cmd {
        Command::Render { sel, out } => kube::render(&sel, out.as_deref(), colour),
        Command::Crd { labs, lab } => kube::crd(labs, &lab, colour),
        Command::Class { action } => kube::class(action),
        Command::Operator {
            watch_namespace,
            max_concurrent,
            health_addr,
            work_dir,
            no_apply_crds,
            leader_lease,
            check,
            probe_network_policy_in,
            require_network_policy,
        } => kube::operator(
            check,
            iblab_operator::operator::Options {
                watch_namespace,
                max_concurrent: max_concurrent.into(),
                health_addr,
                work_dir,
                apply_crds: !no_apply_crds,
                leader_lease,
                probe_network_policy_in,
                require_network_policy,
            },
        ),
        other => unreachable!("not a command of the kube backend: {other:?}"),
    })
}

/// Without the kube backend, its commands say how to get it.
#[cfg(not(feature = "kube"))]
fn cluster_command(_: Command, _colour: bool) -> Outcome {
    Err(Failure::new(
        exit::ENVIRONMENT,
        format!("this command is the kube backend's: {}", without_kube()),
    ))
}

/// `doctor`, with a lab when one is named.
fn doctor(
    lab: Option<String>,
    scenario: Option<String>,
    backend: String,
    paths: Option<Vec<PathKind>>,
    colour: bool,
) -> i32 {
    let sel = lab.map(|lab| Selection {
        lab,
        scenario,
        backend,
        paths,
        hca: None,
        set: Vec::new(),
    });
    doctor::doctor(colour, sel.as_ref())
}

/// `image build` and `image show`.
fn image(action: ImageAction) -> i32 {
    match action {
        ImageAction::Build { operator: true, .. } => image::build_operator(),
        ImageAction::Build {
            variant,
            suite,
            mirror,
            rebuild,
            operator: false,
        } => image::build(&iblab_backend_docker::image::BuildOptions {
            variant,
            suite,
            mirror,
            rebuild,
        }),
        ImageAction::Show => image::show(),
    }
}

/// The hidden commands: what iblab runs of itself in VMs, pods and nodes.
fn not_for_people(cmd: Command) -> i32 {
    match cmd {
        Command::Agent => iblab_backend_vm::agent::main(),
        Command::Bundle { dir } => iblab_wiring::bundle::main(&dir),
        Command::NodeRuntime {
            runc,
            max_devices,
            images,
            args,
        } => {
            let args = match args.first().map(String::as_str) {
                Some("--") => &args[1..],
                _ => &args[..],
            };
            let policy = iblab_node_agent::shape::Policy {
                images,
                max_devices,
            };
            iblab_node_agent::runtime::main(&runc, &policy, args)
        }
        Command::NodeInstall {
            dir,
            as_seen,
            runc,
            max_devices,
            images,
        } => {
            let policy = iblab_node_agent::shape::Policy {
                images,
                max_devices,
            };
            node_install(&dir, &as_seen, &runc, &policy)
        }
        Command::Attach {
            socket,
            netns,
            lines,
            run,
            command,
        } => iblab_backend_vm::attach::main(
            &socket,
            netns.as_deref(),
            lines.as_deref(),
            &run,
            &command,
        ),
        Command::VerbsProbe {
            device,
            port,
            gid_index,
        } => iblab_verbs::probe::main(&device, port, gid_index),
        Command::Pingpong {
            listen,
            connect,
            count,
            size,
            wait,
        } => iblab_fabric::pingpong::main(listen.as_deref(), connect.as_deref(), count, size, wait),
        Command::Connect {
            targets,
            within,
            listen,
            after,
        } => match listen {
            true => listen_on(&targets[0]),
            false => {
                std::thread::sleep(after);
                connect(&targets, within)
            }
        },
        other => unreachable!("a command for people: {other:?}"),
    }
}

fn init_logging(verbose: u8, format: LogFormat) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("IBLAB_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// `iblab node-install`: the bundle, then the handler's script beside it (written whole,
/// then renamed: containerd may be starting a pod with the old one).
fn node_install(
    dir: &std::path::Path,
    as_seen: &str,
    runc: &str,
    policy: &iblab_node_agent::shape::Policy,
) -> i32 {
    let code = iblab_wiring::bundle::main(dir);
    if code != exit::OK {
        return code;
    }
    let script = dir.join("runc");
    let tmp = dir.join(".runc.tmp");
    let text = iblab_node_agent::runtime::handler_script(as_seen, runc, policy);
    let written = std::fs::write(&tmp, text)
        .and_then(|()| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        })
        .and_then(|()| std::fs::rename(&tmp, &script));
    match written {
        Ok(()) => {
            println!(
                "iblab node agent: {} runs {as_seen}/iblab around {runc}",
                script.display()
            );
            exit::OK
        }
        Err(e) => {
            eprintln!("cannot write {}: {e}", script.display());
            exit::ENVIRONMENT
        }
    }
}

/// `iblab ui`: the page, running this very binary as `iblab up` for each run.
fn ui(listen: std::net::SocketAddr, runs: PathBuf, backend: String) -> i32 {
    if !iblab_ui::runner::BACKENDS.contains(&backend.as_str()) {
        eprintln!(
            "{}",
            rust_i18n::t!(
                "ui.backend",
                locale = lang().tag(),
                backend = backend,
                backends = iblab_ui::runner::BACKENDS.join(", ")
            )
        );
        return exit::BAD_INPUT;
    }
    let iblab = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!(
                "{}",
                rust_i18n::t!("ui.no_binary", locale = lang().tag(), error = e)
            );
            return exit::ENVIRONMENT;
        }
    };
    iblab_ui::main(iblab_ui::Options {
        listen,
        runs,
        backend,
        iblab,
    })
}

/// `iblab connect`: each target reached within `within` or not at all (TCP: a
/// connection; UDP: a datagram and its echo).
fn connect(targets: &[String], within: std::time::Duration) -> i32 {
    use std::net::ToSocketAddrs;
    let mut said = String::new();
    let mut all = true;
    for t in targets {
        let (udp, addr) = match t.split_once(':') {
            Some(("udp", a)) => (true, a),
            Some(("tcp", a)) => (false, a),
            _ => (false, t.as_str()),
        };
        let addrs = match addr.to_socket_addrs() {
            Ok(a) => a.collect::<Vec<_>>(),
            Err(e) => {
                eprintln!("error: {t}: {e}");
                return exit::BAD_INPUT;
            }
        };
        let ok = addrs.iter().any(|a| {
            let r = if udp {
                echoed(a, within)
            } else {
                std::net::TcpStream::connect_timeout(a, within).map(|_| ())
            };
            r.map_err(|e| eprintln!("{t}: {e}")).is_ok()
        });
        all &= ok;
        said.push_str(&format!("{}reached {t}\n", if ok { "" } else { "not " }));
    }
    print!("{said}");
    // The pod's status carries it (what the probe reads), where the kubelet gave the file.
    let _ = std::fs::write("/dev/termination-log", &said);
    if all { exit::OK } else { exit::FAILED }
}

/// A datagram to `to` and its echo back within `within`.
fn echoed(to: &std::net::SocketAddr, within: std::time::Duration) -> std::io::Result<()> {
    let any = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    let s = std::net::UdpSocket::bind(any)?;
    s.connect(to)?;
    s.set_read_timeout(Some(within))?;
    s.send(b"iblab-probe")?;
    let mut buf = [0u8; 64];
    let n = s.recv(&mut buf)?;
    if &buf[..n] == b"iblab-probe" {
        Ok(())
    } else {
        Err(std::io::Error::other("another answer than the echo"))
    }
}

/// `iblab connect ADDR --listen`: accept and close TCP connections, and echo UDP
/// datagrams, until killed.
fn listen_on(addr: &str) -> i32 {
    let l = match std::net::TcpListener::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on {addr}: {e}");
            return exit::ENVIRONMENT;
        }
    };
    let u = match std::net::UdpSocket::bind(addr) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("error: cannot listen on udp {addr}: {e}");
            return exit::ENVIRONMENT;
        }
    };
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while let Ok((n, from)) = u.recv_from(&mut buf) {
            let _ = u.send_to(&buf[..n], from);
        }
    });
    println!("listening on {addr} (TCP and UDP)");
    for c in l.incoming() {
        drop(c);
    }
    exit::OK
}

/// Why a command of the kube backend cannot run in this build, and the fix.
#[cfg(not(feature = "kube"))]
fn without_kube() -> String {
    crate::backends::left_out("kube").unwrap_or_default()
}

/// Load a lab or print its diagnostics; `Err` carries the exit code.
pub fn load_or_report(lab: &str, colour: bool) -> Result<iblab_lab::load::LoadedLab, i32> {
    iblab_lab::load::resolve(lab).map_err(|e| {
        eprint!("{}", e.render(colour && std::io::stderr().is_terminal()));
        exit::BAD_INPUT
    })
}
