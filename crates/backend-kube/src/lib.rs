//! The kube backend: every node and switch a pod of the lab image on a Kubernetes
//! cluster, links VXLAN pairs made inside the pods over the pod network, switches Linux
//! bridges in switch pods. Objects are k8s-openapi types applied server-side (field
//! manager `iblab`), labelled with the run id and owned by the run's anchor; commands go
//! through the API's exec. A run gets a namespace of its own unless `--namespace` names
//! one. Path ③'s emulated subnet (ibsim, opensm, the diagnostics) runs in a pod of the run.

use iblab_k8s::{cluster, links, manifest, settings, sweep};
pub mod capture;
pub mod exec;
#[cfg(test)]
mod manifest_tests;
pub mod roce;
pub mod sample;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use iblab_core::plan::backend::{Backend, Unfit};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};

use iblab_backend::{BackendOps, Deployment, EnvError, Runner, Scope, Swept};
use iblab_core::caps::HostCaps;
use iblab_core::caps::preflight::{Check, Mark};
use iblab_core::command::Cmd;
use iblab_core::command::ExecOutput;
use iblab_core::fault::LossMechanism;
use iblab_core::plan::backend::Traits;
use iblab_core::plan::{Action, Plan, PlannedNode};
use iblab_core::programs::{Needs, Place, Provider};
use iblab_lab::FaultAction;
use iblab_lab::PathKind;
use iblab_sys::process::Background;
use iblab_sys::state::Owned;
use iblab_sys::state::{Resource, StateFile};
use iblab_wiring as wiring;
use manifest::{FIELD_MANAGER, label};
use settings::Settings;

/// The kube backend, as registered in the binary's list of backends.
pub struct KubeBackend;
pub static BACKEND: KubeBackend = KubeBackend;

/// What the state file calls a run's own namespace, and a run's objects in a namespace
/// it does not own (`NAMESPACE/RUN`).
const NAMESPACE: &str = "namespace";
const RUN_OBJECTS: &str = "run-objects";

/// How long pods may take to be scheduled, pulled and started.
const PODS_WITHIN: Duration = Duration::from_secs(180);
/// Container states that will not get better by waiting.
const HOPELESS: &[&str] = &[
    "ErrImageNeverPull",
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// The backend's name, as preflight rows are filed under it.
pub const BACKEND_NAME: &str = "kube";

/// What path ② in pods needs, where the cluster was not asked.
const NO_ROCE: &str = "Soft-RoCE in pods needs nodes whose kernels give rxe a socket per \
                       network namespace (Linux ≥ 7.1, rdma_rxe loaded), labelled \
                       iblab.dev/rxe-per-netns=true; leave it out with --paths tcp,ib, or \
                       use --backend vm";

impl Backend for KubeBackend {
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }
    fn about(&self) -> &'static str {
        "pods on a Kubernetes cluster (kubeconfig or in-cluster), VXLAN links inside the pods"
    }
    fn traits(&self) -> Traits {
        Traits {
            auto: false,
            own_kernel: false,
            verbs_in_nodes: false,
            nic: "VXLAN over the pod network",
            tcp_carrier: "the node kernel's TCP stack on VXLAN links between pods (no NIC)",
            // A perftest measurement is some seven commands through the API server (0.5–1 s
            // each to the test cluster's emulated node, where one took 10–13 s against
            // the vm backend's 5): taken again after a failed clock calibration, it
            // needs more than 20 s beyond its length.
            traffic_slack_s: 30,
        }
    }
    fn available(&self, _caps: &HostCaps) -> Result<String, Unfit> {
        // Reaching the cluster is provisioning's business (exit 3 with the fix there):
        // `plan` and `render` work without one.
        let s = settings::get();
        let cluster = match cluster::configured() {
            Ok(how) => format!(
                "on the cluster of {how}{}",
                s.context
                    .as_ref()
                    .map(|c| format!(" (context {c})"))
                    .unwrap_or_default()
            ),
            Err(why) => format!(
                "on a cluster still to be configured ({})",
                why.replace("\n  fix: ", "; fix: ")
            ),
        };
        Ok(format!(
            ": nodes and switches are pods of {} (pull policy {}) {cluster}, unprivileged \
             with {}, links VXLAN inside the pods, path ③'s subnet in a pod of its own{}",
            s.image,
            s.pull_policy,
            manifest::CAPABILITIES.join(" + "),
            match &s.rdma_resource {
                Some(r) => format!(
                    "; lab nodes ask for one `{r}` and {} (a real HCA through a device plugin)",
                    manifest::HCA_CAPABILITIES.join(" + ")
                ),
                None => String::new(),
            }
        ))
    }
    fn carries(&self, path: PathKind, caps: &HostCaps) -> Result<(), Unfit> {
        match path {
            // The emulated subnet runs in a pod of the run's own; only its data-path verdict
            // concerns the nodes.
            PathKind::Tcp | PathKind::Ib => Ok(()),
            // Where preflight found nodes whose rxe serves every namespace.
            PathKind::Roce => roce::carries(caps),
        }
    }
    fn verbs_in_nodes(&self, paths: &[PathKind], caps: &HostCaps) -> bool {
        // Where the cluster can give each pod its own rxe, path ③'s bytes ride them as on
        // the vm backend; elsewhere path ③ is its emulated subnet's control plane. Pods
        // given an adapter by a device plugin make no rxe of their own.
        settings::get().rdma_resource.is_none()
            && paths
                .iter()
                .any(|p| matches!(p, PathKind::Roce | PathKind::Ib))
            && roce::carries(caps).is_ok()
    }
    fn hca_in_nodes(&self) -> Result<bool, Unfit> {
        // The adapter is the one the device plugin puts into each lab pod.
        match settings::get().rdma_resource {
            Some(_) => Ok(true),
            None => Err(
                "on the kube backend --hca names the adapter a device plugin gives \
                 each lab pod; set IBLAB_KUBE_RDMA_RESOURCE to the plugin's resource \
                 (e.g. rdma/hca_shared_devices_a) first"
                    .into(),
            ),
        }
    }
    fn rdma_device(&self, run: Option<&str>, node: &str, index: usize) -> String {
        pod_rdma_device(run, node, index)
    }
    fn programs(&self, plan: &Plan, needs: &mut Needs) {
        // Nothing on this host but iblab: in the pods the tools come with the lab image.
        // Every command there runs under `timeout`; `sleep` keeps each pod up; `ip` and a
        // shell wire it; a traffic tool whose counters are reported runs under the sampler.
        let by = "the kube backend";
        wiring::programs(plan, needs, by);
        needs.add_all(Place::Nodes, exec::WRAPPERS, by);
        needs.add_all(Place::Nodes, &[iblab_wiring::IP, manifest::IDLE], by);
        if plan
            .steps
            .iter()
            .any(|s| matches!(s.action, iblab_core::plan::Action::Traffic(_)))
        {
            needs.add_all(
                Place::Nodes,
                sample::PROGRAMS,
                "the kube backend's pod sampler",
            );
        }
        if plan.paths.contains(&PathKind::Ib) {
            needs.add_all(Place::Subnet, exec::WRAPPERS, by);
            needs.add(Place::Subnet, manifest::IDLE, by);
        }
    }
    fn provider(&self, place: Place) -> Provider {
        match place {
            Place::Host => Provider::Host,
            // The emulated subnet too runs in a pod of the lab image.
            Place::Nodes | Place::Subnet => iblab_core::images::LAB_PROVIDER,
        }
    }
    fn iblab_path(&self) -> String {
        // Brought into the pods of a lab that runs iblab by an init container.
        iblab_core::images::in_node_exe()
    }
    fn iblab_in_nodes(&self) -> Option<String> {
        let s = settings::get();
        Some(format!(
            "an init container of {} (pull policy {}) copies it with its libraries into \
             each lab node's pod, read-only at {}",
            s.iblab_image,
            s.iblab_pull_policy,
            iblab_core::images::IN_NODE
        ))
    }
}

#[async_trait]
impl BackendOps for KubeBackend {
    fn preflight(&self, _caps: &HostCaps) -> Vec<Check> {
        // Asked only for labs with path ②: which nodes can give each pod its own rxe.
        roce::preflight()
    }
    fn doctor(&self, _caps: &HostCaps) -> Vec<Check> {
        doctor_rows()
    }
    fn way_in(
        &self,
        run_id: &str,
        node: &str,
        argv: &[String],
        tty: bool,
    ) -> Result<Vec<String>, iblab_backend::NoWayIn> {
        let kubectl = iblab_sys::host::which("kubectl")
            .or_else(|| {
                std::env::var_os("IBLAB_KUBE_BIN")
                    .map(|d| Path::new(&d).join("kubectl"))
                    .filter(|p| p.is_file())
            })
            .ok_or(iblab_backend::NoWayIn::ProgramMissing(
                "kubectl is not installed (or set IBLAB_KUBE_BIN to the folder that has it); \
                 the API's exec is what it uses",
            ))?;
        let s = settings::get();
        let (ns, _) = manifest::namespace_of(run_id, &s);
        let mut v = vec![kubectl.to_string_lossy().into_owned()];
        if let Some(c) = &s.context {
            v.extend(["--context".into(), c.clone()]);
        }
        v.extend([
            "exec".into(),
            "-n".into(),
            ns,
            if tty { "-it" } else { "-i" }.into(),
            node.to_string(),
            "-c".into(),
            manifest::CONTAINER.into(),
            "--".into(),
        ]);
        v.extend(argv.iter().cloned());
        Ok(v)
    }
    fn instantiate(&self, run_id: &str) -> Result<Box<dyn Deployment>, EnvError> {
        Ok(Box::new(Kube::new(run_id, settings::get())))
    }
    async fn undo(&self, owned: &[Owned]) -> Vec<String> {
        if owned.is_empty() {
            return vec![];
        }
        let client = match cluster::connect(&settings::get()).await {
            Ok(c) => c,
            Err(e) => {
                return vec![format!(
                    "cannot reach the cluster to remove {}: {e}",
                    owned
                        .iter()
                        .map(|o| format!("{} {}", o.what, o.name))
                        .collect::<Vec<_>>()
                        .join(", ")
                )];
            }
        };
        let mut problems = Vec::new();
        for o in owned {
            match o.what.as_str() {
                NAMESPACE => problems.extend(sweep::remove_namespace(&client, &o.name).await),
                RUN_OBJECTS => {
                    if let Some((ns, run)) = o.name.split_once('/') {
                        problems.extend(sweep::remove_run_objects(&client, ns, run).await);
                    }
                }
                _ => {}
            }
        }
        problems
    }
    async fn sweep(&self, scope: &Scope<'_>) -> Swept {
        // No cluster configured, or none answering soon: nothing of iblab's to find there.
        if cluster::configured().is_err() {
            return Swept::default();
        }
        let reach = async {
            let c = cluster::connect(&settings::get()).await.ok()?;
            c.apiserver_version().await.ok()?;
            Some(c)
        };
        match tokio::time::timeout(Duration::from_secs(5), reach).await {
            Ok(Some(client)) => sweep::sweep_labelled(&client, scope).await,
            _ => Swept::default(),
        }
    }
}

/// A lab pod's rxe device: `rxe<index>-<node>-<run>`. Pods of every run on a cluster node
/// share its kernel, and one set of names, so the run's id is in it (at most 63
/// characters, the kernel's limit: a long node name is cut). It begins with `rxe`: the
/// node agent takes the RDMA netlink away from the measuring container, and without it
/// libibverbs finds a device's provider by its name (rdma-core's rxe provider matches
/// names that begin with `rxe`; measured: `p1-rxe0` gave "no userspace device-specific
/// driver found", `rxe-p2-0` opened).
pub fn pod_rdma_device(run: Option<&str>, node: &str, index: usize) -> String {
    let head = format!("rxe{index}-");
    match run {
        Some(r) => {
            let tail = format!("-{r}");
            let keep = node
                .char_indices()
                .map(|(i, c)| i + c.len_utf8())
                .take_while(|end| head.len() + *end + tail.len() <= 63)
                .last()
                .unwrap_or(0);
            format!("{head}{}{tail}", &node[..keep])
        }
        None => format!("{head}{node}"),
    }
}

/// Notes and timings for the evidence, as [`Deployment::report`] gives them.
type Facts = (Vec<String>, Vec<(String, f64)>);

/// Why an object of the run could not be created.
#[derive(Debug, thiserror::Error)]
enum CreateError {
    #[error(
        "cannot create {what}: {name} exists already and {whose}; iblab never takes over an \
         object it did not make. Give the run a namespace of its own (leave out --namespace), \
         or end the run that holds it (`iblab down RUN`)"
    )]
    Taken {
        what: String,
        name: String,
        whose: String,
    },
    /// A pod refused because its namespace's service account is not made yet (a fresh
    /// namespace has none for a moment): it is worth asking again.
    #[error("cannot create {what}: {source}")]
    NoServiceAccountYet {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot create {what}: {source}")]
    Refused {
        what: String,
        #[source]
        source: kube::Error,
    },
}

impl iblab_backend::BackendError for CreateError {}

/// Is this the API server's refusal of a pod whose namespace has no service account yet?
/// The ServiceAccount admission plugin refuses it as Forbidden, "error looking up service
/// account NS/default: serviceaccount "default" not found"; the status has no field of its
/// own for that cause, so it is read here, once, from the status the server sent.
fn awaiting_service_account(status: &kube::core::Status) -> bool {
    status.is_forbidden() && status.message.contains("serviceaccount")
}

/// Create an object of the run: a POST, never a forced apply, so that an object of the
/// same name that something else made (another run given the same `--namespace`, a second
/// operator) is refused rather than taken over. `whose` says who holds an existing one.
async fn create<K>(api: Api<K>, obj: &K, what: &str) -> Result<K, CreateError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match api.create(&pp, obj).await {
        Ok(o) => Ok(o),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let name = obj.meta().name.clone().unwrap_or_default();
            let whose = match api.get(&name).await {
                Ok(o) => match o.labels().get(label::RUN) {
                    Some(run) => format!("it belongs to iblab run {run}"),
                    None => "iblab did not make it".into(),
                },
                Err(_) => "it could not be read".into(),
            };
            Err(CreateError::Taken {
                what: what.to_string(),
                name,
                whose,
            })
        }
        Err(kube::Error::Api(s)) if awaiting_service_account(&s) => {
            Err(CreateError::NoServiceAccountYet {
                what: what.to_string(),
                source: kube::Error::Api(s),
            })
        }
        Err(source) => Err(CreateError::Refused {
            what: what.to_string(),
            source,
        }),
    }
}

/// One run on a cluster.
pub struct Kube {
    run_id: String,
    settings: Settings,
    client: OnceLock<Client>,
    namespace: String,
    own_namespace: bool,
    /// Every pod of the run, by name (lab nodes, switches, the subnet's).
    nodes: OnceLock<Vec<String>>,
    subnet: OnceLock<Arc<PodRunner>>,
    facts: Mutex<Facts>,
    /// The VNI of the run's first link (random per run: see `links::run_vni`).
    first_vni: u32,
    /// How loss is made in each lab pod, by what its cluster node's kernel has (probed
    /// when the lab shapes a link); a pod not listed takes the plan's.
    loss: OnceLock<BTreeMap<String, LossMechanism>>,
    /// What the run's pods may make iblab keep of their output, all streams together.
    budget: Arc<capture::Budget>,
    /// The lab nodes whose links and rxe devices their cluster node made (path ②).
    node_made: OnceLock<Vec<String>>,
}

impl Kube {
    pub fn new(run_id: &str, settings: Settings) -> Kube {
        let (namespace, own_namespace) = manifest::namespace_of(run_id, &settings);
        Kube {
            run_id: run_id.to_string(),
            settings,
            client: OnceLock::new(),
            namespace,
            own_namespace,
            nodes: OnceLock::new(),
            subnet: OnceLock::new(),
            facts: Mutex::new((vec![], vec![])),
            first_vni: links::run_vni(),
            loss: OnceLock::new(),
            budget: Arc::new(capture::Budget::default()),
            node_made: OnceLock::new(),
        }
    }

    fn pods(&self) -> Result<Api<Pod>, EnvError> {
        let c = self
            .client
            .get()
            .ok_or_else(|| EnvError::new("the kube backend was used before provisioning"))?;
        Ok(Api::namespaced(c.clone(), &self.namespace))
    }

    fn note(&self, s: String) {
        if let Ok(mut f) = self.facts.lock() {
            f.0.push(s);
        }
    }

    fn timing(&self, what: &str, since: Instant) {
        if let Ok(mut f) = self.facts.lock() {
            f.1.push((what.into(), since.elapsed().as_secs_f64()));
        }
    }

    fn by_run(&self) -> ListParams {
        ListParams::default().labels(&format!("{}={}", label::RUN, self.run_id))
    }

    /// Pods of this run that are gone or no longer running, in words; empty when all run.
    async fn not_running(&self) -> Vec<String> {
        let (Ok(pods), Some(want)) = (self.pods(), self.nodes.get()) else {
            return vec![];
        };
        let Ok(list) = pods.list(&self.by_run()).await else {
            return vec![];
        };
        let mut out = Vec::new();
        for n in want {
            match list.items.iter().find(|p| p.name_any() == *n) {
                None => out.push(format!("node {n} (pod {}/{n}) was deleted", self.namespace)),
                Some(p) if p.metadata.deletion_timestamp.is_some() => out.push(format!(
                    "node {n} (pod {}/{n}) is being deleted",
                    self.namespace
                )),
                Some(p) => {
                    let phase = p
                        .status
                        .as_ref()
                        .and_then(|s| s.phase.clone())
                        .unwrap_or_default();
                    if phase != "Running" {
                        out.push(format!("node {n} (pod {}/{n}) is {phase}", self.namespace));
                    }
                }
            }
        }
        out
    }

    async fn check_alive(&self) -> Result<(), EnvError> {
        let gone = self.not_running().await;
        if gone.is_empty() {
            Ok(())
        } else {
            Err(EnvError::new(format!(
                "a lab pod stopped during the run: {}",
                gone.join("; ")
            )))
        }
    }

    /// Wait until every pod runs and has an IP; refuse at once what waiting cannot mend.
    /// Returns each pod's IP and the cluster node it runs on.
    async fn wait_running(
        &self,
        plan: &Plan,
    ) -> Result<(BTreeMap<String, String>, BTreeMap<String, String>), EnvError> {
        let pods = self.pods()?;
        let deadline = Instant::now() + PODS_WITHIN;
        loop {
            let list = pods
                .list(&self.by_run())
                .await
                .map_err(|e| EnvError::caused(format!("cannot list the run's pods: {e}"), e))?;
            let mut ips = BTreeMap::new();
            let mut waiting = Vec::new();
            for p in &list.items {
                self.refuse_hopeless(p)?;
                let name = p.name_any();
                let st = p.status.clone().unwrap_or_default();
                match (&st.phase, &st.pod_ip) {
                    (Some(phase), Some(ip)) if phase == "Running" => {
                        ips.insert(name, ip.clone());
                    }
                    _ => {
                        let why = st
                            .conditions
                            .iter()
                            .flatten()
                            .find(|c| c.status == "False" && c.message.is_some())
                            .and_then(|c| c.message.clone())
                            .unwrap_or_else(|| st.phase.clone().unwrap_or("Pending".into()));
                        waiting.push(format!("{name}: {why}"));
                    }
                }
            }
            if ips.len() == self.nodes.get().map_or(plan.nodes.len(), Vec::len) {
                return Ok((ips, self.placed(&list.items)));
            }
            if Instant::now() > deadline {
                return Err(EnvError::new(format!(
                    "pods did not run within {}s: {}",
                    PODS_WITHIN.as_secs(),
                    waiting.join("; ")
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Refuse a pod that waiting cannot mend: a container that cannot start (its image,
    /// its configuration), or that ended at once (an init container that failed).
    fn refuse_hopeless(&self, p: &Pod) -> Result<(), EnvError> {
        let name = p.name_any();
        let st = p.status.clone().unwrap_or_default();
        let init = st
            .init_container_statuses
            .iter()
            .flatten()
            .map(|c| (true, c));
        let main = st.container_statuses.iter().flatten().map(|c| (false, c));
        for (is_init, cs) in init.chain(main) {
            let (image, how) = if is_init {
                (
                    &self.settings.iblab_image,
                    "`iblab image build --operator`, then ",
                )
            } else {
                (&self.settings.image, "")
            };
            if let Some(w) = cs.state.as_ref().and_then(|s| s.waiting.as_ref())
                && HOPELESS.contains(&w.reason.as_deref().unwrap_or(""))
            {
                let reason = w.reason.clone().unwrap_or_default();
                let fix = if reason.contains("Image") || reason.contains("Pull") {
                    format!(
                        "\n  fix: make {image} available to the cluster's nodes: on the test \
                         cluster {how}`docker save {image} -o image.tar && kube/cluster import image.tar`, \
                         on kind `kind load docker-image {image}`, elsewhere push it to a \
                         registry and set {}",
                        if is_init {
                            "IBLAB_OPERATOR_IMAGE"
                        } else {
                            "IBLAB_IMAGE"
                        }
                    )
                } else {
                    String::new()
                };
                return Err(EnvError::new(format!(
                    "pod {}/{name} cannot start{}: {reason}: {}{fix}",
                    self.namespace,
                    if is_init {
                        " (its init container, which brings iblab in)"
                    } else {
                        ""
                    },
                    w.message.clone().unwrap_or_default()
                )));
            }
            if let Some(t) = cs.state.as_ref().and_then(|s| s.terminated.as_ref())
                && (!is_init || t.exit_code != 0)
            {
                return Err(EnvError::new(format!(
                    "pod {}/{name} ended at once{}: {} (exit code {}){}",
                    self.namespace,
                    if is_init { " (its init container)" } else { "" },
                    t.reason.clone().unwrap_or_default(),
                    t.exit_code,
                    t.message
                        .as_deref()
                        .map(|m| format!(": {}", m.trim()))
                        .unwrap_or_default()
                )));
            }
        }
        Ok(())
    }

    /// Which cluster node each pod runs on, for the evidence (a lab's links may cross
    /// nodes); said in the run's notes, with each pod's privilege as the API server
    /// admitted it.
    fn placed(&self, pods: &[Pod]) -> BTreeMap<String, String> {
        let placement: BTreeMap<String, String> = pods
            .iter()
            .map(|p| {
                (
                    p.name_any(),
                    p.spec
                        .as_ref()
                        .and_then(|s| s.node_name.clone())
                        .unwrap_or_else(|| "?".into()),
                )
            })
            .collect();
        let on: Vec<String> = placement
            .iter()
            .map(|(pod, node)| format!("{pod} → {node}"))
            .collect();
        self.note(format!(
            "kube backend: pods on cluster nodes: {}",
            on.join(", ")
        ));
        self.note(format!(
            "kube backend: each pod's privilege as the API server admitted it: {}",
            pods.iter().map(privilege_of).collect::<Vec<_>>().join("; ")
        ));
        placement
    }
}

impl Kube {
    /// What the evidence says of where and how the run runs: the cluster, the namespace and
    /// the image; who could move a figure; path ②'s Soft-RoCE in the pods, an adapter
    /// given to the pods, iblab brought into them.
    fn say_how_it_runs(&self, plan: &Plan, version: &str, default_namespace: &str) {
        self.note(format!(
            "kube backend: Kubernetes {version} at {default_namespace}, namespace {}{}, image {} \
             (pull {})",
            self.namespace,
            if self.own_namespace {
                " (the run's own)"
            } else {
                ""
            },
            self.settings.image,
            self.settings.pull_policy
        ));
        self.note(who_could_move_a_figure());
        if manifest::soft_roce(plan, &self.settings) {
            self.note(format!(
                "kube backend: Soft-RoCE in the pods (path ②{}): lab pods on nodes labelled \
                 {}=true, each making its own rxe; {}",
                if plan.paths.contains(&PathKind::Ib) {
                    ", and path ③'s admitted bytes"
                } else {
                    ""
                },
                manifest::label::RXE_PER_NETNS,
                manifest::ROCE_DEVICES_WHY
            ));
        }
        if let (Some(h), Some(r)) = (
            plan.hca.as_ref().filter(|h| h.in_nodes),
            &self.settings.rdma_resource,
        ) {
            self.note(format!(
                "kube backend: path {} {} on the adapter {}:{} that the device plugin's \
                 resource `{r}` gives each lab pod (unprivileged, with {}); its traffic \
                 leaves by the adapter's own port, not the lab's links, so a fault on a lab \
                 link does not touch it; perftest exchanges its addresses out of band over \
                 TCP, and rping (RDMA CM) is not run",
                h.path.mark(),
                h.path,
                h.device,
                h.port,
                manifest::HCA_CAPABILITIES.join(" + ")
            ));
        }
        if plan.runs_iblab_in_nodes(&iblab_core::images::in_node_exe()) {
            self.note(format!(
                "kube backend: iblab in the lab nodes' pods (path ①'s ping-pong or \
                 `{{{{ iblab }}}}`), copied by an init container of {} (pull {}) with the \
                 libraries it runs with",
                self.settings.iblab_image, self.settings.iblab_pull_policy
            ));
        }
    }

    /// The run's namespace (or its objects in the given one), written down first; then the
    /// anchor, which owns the pods, and before any pod the NetworkPolicy by which the run's
    /// pods take traffic only from one another. The anchor's uid.
    async fn make_namespace_and_anchor(
        &self,
        client: &Client,
        plan: &Plan,
        state: &StateFile,
    ) -> Result<String, EnvError> {
        let owned = if self.own_namespace {
            Owned {
                backend: BACKEND.name().into(),
                what: NAMESPACE.into(),
                name: self.namespace.clone(),
            }
        } else {
            Owned {
                backend: BACKEND.name().into(),
                what: RUN_OBJECTS.into(),
                name: format!("{}/{}", self.namespace, self.run_id),
            }
        };
        state
            .record(Resource::Owned(owned))
            .map_err(EnvError::state)?;
        if self.own_namespace {
            let ns = manifest::namespace(&self.run_id, plan, &self.namespace, &self.settings);
            create(
                Api::<Namespace>::all(client.clone()),
                &ns,
                &format!("namespace {}", self.namespace),
            )
            .await?;
        }
        let anchor = manifest::anchor(
            &self.run_id,
            plan,
            &self.namespace,
            &self.settings,
            self.first_vni,
        );
        let anchor = create(
            Api::<ConfigMap>::namespaced(client.clone(), &self.namespace),
            &anchor,
            &format!("the run's anchor in {}", self.namespace),
        )
        .await?;
        let uid = anchor.uid().unwrap_or_default();
        let policy = manifest::network_policy(
            &self.run_id,
            plan,
            &self.namespace,
            &self.settings,
            Some(&uid),
        );
        create(
            Api::<NetworkPolicy>::namespaced(client.clone(), &self.namespace),
            &policy,
            &format!(
                "the run's NetworkPolicy in {} (the run's pods take traffic only from one another)",
                self.namespace
            ),
        )
        .await?;
        Ok(uid)
    }

    /// The run's pods (and the subnet's), owned by the anchor `uid`. A fresh namespace has
    /// no default service account for a moment: a pod refused for that is asked for again,
    /// for up to 30 s.
    async fn make_pods(&self, plan: &Plan, uid: &str) -> Result<Api<Pod>, EnvError> {
        let pods = self.pods()?;
        let wanted = manifest::pods(
            &self.run_id,
            plan,
            &self.namespace,
            &self.settings,
            Some(uid),
            self.first_vni,
        );
        let _ = self
            .nodes
            .set(wanted.iter().map(|p| p.name_any()).collect());
        for pod in &wanted {
            let name = pod.name_any();
            let deadline = Instant::now() + Duration::from_secs(30);
            let what = format!("pod {}/{name}", self.namespace);
            loop {
                match create(pods.clone(), pod, &what).await {
                    Ok(_) => break,
                    Err(CreateError::NoServiceAccountYet { .. }) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(200)).await
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(pods)
    }

    /// Inside each pod: its VXLAN ends, then loopback, bridge, ports, addresses. Path ②'s
    /// lab nodes have theirs from the node agent already (with their rxe devices): only
    /// their peers are set.
    async fn wire_pods(&self, plan: &Plan, ips: &BTreeMap<String, String>) -> Result<(), EnvError> {
        let node_made = |n: &PlannedNode| !n.switch && manifest::soft_roce(plan, &self.settings);
        let _ = self.node_made.set(
            plan.nodes
                .iter()
                .filter(|n| node_made(n))
                .map(|n| n.name.clone())
                .collect(),
        );
        let configured = futures_util::future::join_all(plan.nodes.iter().map(|n| async move {
            if let Some(script) = links::rename_script(n).filter(|_| !node_made(n)) {
                let cmd = Cmd {
                    argv: vec!["sh".into(), "-c".into(), script],
                    stdin: None,
                    may_fail: false,
                };
                let o = self.exec(&n.name, &cmd, Duration::from_secs(30)).await?;
                if !o.success() {
                    return Err(EnvError::new(format!(
                        "provisioning failed: renaming the pod network's interface in pod \
                         {}/{} (a lab interface needs its name) said: {}",
                        self.namespace,
                        n.name,
                        o.stderr.trim()
                    )));
                }
            }
            let ip_of = |peer: &str| ips.get(peer).cloned().unwrap_or_default();
            let mut lines = if node_made(n) {
                links::peer_lines(plan, n, ip_of)
            } else {
                links::vxlan_lines(plan, n, self.first_vni, ip_of)
            };
            lines.extend(wiring::node_lines(n));
            let cmd = Cmd {
                argv: vec![iblab_wiring::IP.into(), "-batch".into(), "-".into()],
                stdin: Some(lines.join("\n") + "\n"),
                may_fail: false,
            };
            match self.exec(&n.name, &cmd, Duration::from_secs(30)).await {
                Ok(o) if o.success() => Ok(()),
                Ok(o) => Err(EnvError::new(format!(
                    "provisioning failed: `ip -batch -` in pod {}/{} said: {}",
                    self.namespace,
                    n.name,
                    o.stderr.trim()
                ))),
                Err(e) => Err(e),
            }
        }))
        .await;
        configured.into_iter().collect::<Result<Vec<()>, _>>()?;
        Ok(())
    }
}

/// What the evidence says of who could move a figure on the kube backend: where iblab
/// measures, what the container a student may enter can and cannot reach.
fn who_could_move_a_figure() -> String {
    format!(
        "kube backend: who could move a figure: iblab measures in each lab pod's {node} \
         container (tools from its read-only root, their output over the exec iblab \
         started, their files in a /tmp no other container mounts); the pod's {shell} \
         container, the one `kubectl exec` enters and the only one a class's students \
         may, has no capability and shares only the network namespace: traffic sent \
         from it over the lab's links can move a network figure (throughput, latency, \
         loss, retransmissions, counters), nothing there reaches a tool, its output or \
         its files, nor answers for one (ports below {ports} need NET_BIND_SERVICE, \
         which only {node} holds, and each server's port is checked to be held by that \
         server before its client starts; the emulated subnet's pod has no {shell}); \
         whoever may exec into {node} could alter any figure",
        node = manifest::CONTAINER,
        shell = manifest::SHELL,
        ports = manifest::UNPRIVILEGED_PORT_START,
    )
}

#[async_trait]
impl Deployment for Kube {
    fn backend(&self) -> &'static dyn BackendOps {
        &BACKEND
    }

    async fn provision(&self, plan: &Plan, state: &StateFile) -> Result<(), EnvError> {
        let t0 = Instant::now();
        let client = cluster::connect(&self.settings).await?;
        let version = client
            .apiserver_version()
            .await
            .map_err(|e| EnvError::caused(format!("the cluster does not answer: {e}"), e))?;
        let client = self.client.get_or_init(|| client).clone();
        self.say_how_it_runs(plan, &version.git_version, client.default_namespace());
        let uid = self.make_namespace_and_anchor(&client, plan, state).await?;
        self.timing("kube: namespace and anchor", t0);
        let t1 = Instant::now();
        let pods = self.make_pods(plan, &uid).await?;
        if plan.paths.contains(&PathKind::Ib) {
            let _ = self.subnet.set(Arc::new(PodRunner {
                pods: pods.clone(),
                namespace: self.namespace.clone(),
                pod: manifest::SUBNET_POD.into(),
                budget: self.budget.clone(),
            }));
        }
        let (ips, placement) = self.wait_running(plan).await?;
        self.timing("kube: pods running", t1);
        if shapes_links(plan) {
            self.probe_loss(plan, &placement).await?;
        }
        let t2 = Instant::now();
        self.wire_pods(plan, &ips).await?;
        wiring::wait_links_up(self, &plan.nodes.iter().collect::<Vec<_>>()).await?;
        self.timing("kube: links up", t2);
        Ok(())
    }

    async fn exec(&self, node: &str, cmd: &Cmd, timeout: Duration) -> Result<ExecOutput, EnvError> {
        self.exec_on(node, cmd, timeout, false).await
    }

    async fn exec_measured(
        &self,
        node: &str,
        cmd: &Cmd,
        timeout: Duration,
    ) -> Result<ExecOutput, EnvError> {
        self.exec_on(node, cmd, timeout, true).await
    }

    fn subnet_site(&self) -> Option<Arc<dyn Runner>> {
        self.subnet.get().map(|r| r.clone() as Arc<dyn Runner>)
    }

    fn rdma_made_by_node(&self, node: &str) -> bool {
        self.node_made
            .get()
            .is_some_and(|v| v.iter().any(|n| n == node))
    }

    fn loss_mechanism(&self, node: &str, plan: LossMechanism) -> LossMechanism {
        // Each pod shapes in its node's kernel, which may differ from this host's.
        self.loss
            .get()
            .and_then(|l| l.get(node).copied())
            .unwrap_or(plan)
    }

    fn report(&self) -> (Vec<String>, Vec<(String, f64)>) {
        let mut f = self.facts.lock().map(|f| f.clone()).unwrap_or_default();
        f.0.push(
            "kube backend: process counters are read inside each pod, by a POSIX shell \
             wrapper around each traffic tool on a lab node that samples /proc/PID/io, stat, \
             status and net/dev every 50 ms and once more from the exited process before it \
             is reaped; the pod's interfaces include the one its VXLAN links ride, so wire \
             bytes are counted twice (which only the data phase's span depends on)"
                .into(),
        );
        f
    }

    async fn spawn(
        &self,
        node: &str,
        argv: &[String],
        log: &Path,
        _state: &StateFile,
    ) -> Result<Background, EnvError> {
        self.spawn_on(node, argv, log, false).await
    }

    async fn spawn_measured(
        &self,
        node: &str,
        argv: &[String],
        log: &Path,
        _state: &StateFile,
    ) -> Result<Background, EnvError> {
        self.spawn_on(node, argv, log, true).await
    }

    fn output_cuts(&self) -> Vec<String> {
        self.budget.take_cuts()
    }
}

/// Whether a step of the lab shapes a link (loss or a rate limit, made by netem or
/// nftables: see [`LossMechanism`]).
/// What a running pod's containers may do, from its admitted spec: `a: runtime iblab-rxe,
/// host paths none, node unprivileged +NET_ADMIN +NET_RAW +NET_BIND_SERVICE, shell unprivileged uid 65534`.
fn privilege_of(p: &Pod) -> String {
    let Some(spec) = &p.spec else {
        return format!("{}: no spec", p.name_any());
    };
    let host_paths: Vec<&str> = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.host_path.as_ref().map(|h| h.path.as_str()))
        .collect();
    let containers: Vec<String> = spec
        .containers
        .iter()
        .map(|c| {
            let sc = c.security_context.clone().unwrap_or_default();
            let mut s = format!(
                "{} {}",
                c.name,
                if sc.privileged == Some(true) {
                    "PRIVILEGED"
                } else {
                    "unprivileged"
                }
            );
            if let Some(u) = sc.run_as_user {
                s.push_str(&format!(" uid {u}"));
            }
            let caps = sc.capabilities.unwrap_or_default();
            if !caps.drop.iter().flatten().any(|x| x == "ALL") {
                s.push_str(" (the runtime's default capabilities)");
            }
            for a in caps.add.iter().flatten() {
                s.push_str(&format!(" +{a}"));
            }
            s
        })
        .collect();
    format!(
        "{}: runtime {}, host paths {}, {}",
        p.name_any(),
        spec.runtime_class_name.as_deref().unwrap_or("default"),
        if host_paths.is_empty() {
            "none".to_string()
        } else {
            host_paths.join(" ")
        },
        containers.join(", ")
    )
}

fn shapes_links(plan: &Plan) -> bool {
    plan.steps.iter().any(|s| {
        matches!(&s.action, Action::Fault(f) if matches!(f.action, FaultAction::Loss | FaultAction::Rate))
    })
}

/// Asks a pod's kernel for netem on the pod's own loopback, and takes it away again.
const NETEM_PROBE: &str =
    "tc qdisc add dev lo root handle 1: netem loss 0% && tc qdisc del dev lo root";

impl Kube {
    /// How loss is made on each lab pod: netem where its cluster node's kernel has
    /// sch_netem (asked in one lab pod per cluster node, switches' pods included: a pod
    /// cannot load a module, the node has it or not), nftables' random drop where it
    /// answers that it has none, and the plan's choice where the probe could not tell.
    async fn probe_loss(
        &self,
        plan: &Plan,
        placement: &BTreeMap<String, String>,
    ) -> Result<(), EnvError> {
        let mut by_node: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for n in &plan.nodes {
            if let Some(on) = placement.get(&n.name) {
                by_node.entry(on).or_default().push(&n.name);
            }
        }
        let cmd = Cmd {
            argv: vec!["sh".into(), "-c".into(), NETEM_PROBE.into()],
            stdin: None,
            may_fail: true,
        };
        let asked = futures_util::future::join_all(by_node.iter().map(|(on, pods)| {
            let cmd = &cmd;
            async move {
                let o = self.exec(pods[0], cmd, Duration::from_secs(20)).await?;
                Ok::<_, EnvError>((*on, pods, loss_from_probe(&o), o.stderr.trim().to_string()))
            }
        }))
        .await;
        let mut loss = BTreeMap::new();
        let mut said = Vec::new();
        for a in asked {
            let (on, pods, mech, err) = a?;
            let mech = mech.unwrap_or(plan.loss_mechanism);
            said.push(format!(
                "{on}: {}{}",
                mech.describe(),
                if err.is_empty() {
                    String::new()
                } else {
                    format!(" (the probe said: {err})")
                }
            ));
            for p in pods {
                loss.insert(p.to_string(), mech);
            }
        }
        self.note(format!(
            "kube backend: loss and rate limits made by each pod's node kernel: {}",
            said.join("; ")
        ));
        let _ = self.loss.set(loss);
        Ok(())
    }
}

/// What the netem probe's answer says: netem if it took, nftables if the kernel has no
/// such qdisc, nothing if it failed for another reason.
fn loss_from_probe(o: &ExecOutput) -> Option<LossMechanism> {
    if o.success() {
        Some(LossMechanism::Netem)
    } else if o.stderr.contains("qdisc kind is unknown") {
        Some(LossMechanism::NftRandomDrop)
    } else {
        None
    }
}

impl Kube {
    /// A command on a lab node; `sampled`: under the in-pod sampler, for its counters.
    async fn exec_on(
        &self,
        node: &str,
        cmd: &Cmd,
        timeout: Duration,
        sampled: bool,
    ) -> Result<ExecOutput, EnvError> {
        let pods = self.pods()?;
        match exec::run(&pods, node, cmd, timeout, sampled, &self.budget).await {
            Ok(out) => {
                if !out.success() {
                    self.check_alive().await?;
                }
                Ok(out)
            }
            Err(e) => {
                self.check_alive().await?;
                Err(EnvError::caused(
                    format!(
                        "cannot run `{}` on {node} (pod {}/{node}): {e}",
                        cmd.argv.join(" "),
                        self.namespace
                    ),
                    e,
                ))
            }
        }
    }

    /// A background command on a lab node; `sampled` as for [`Kube::exec_on`].
    async fn spawn_on(
        &self,
        node: &str,
        argv: &[String],
        log: &Path,
        sampled: bool,
    ) -> Result<Background, EnvError> {
        let pods = self.pods()?;
        match exec::spawn(&pods, node, argv, log, sampled, self.budget.clone()).await {
            Ok(p) => Ok(Background::remote(p.pid(), Box::new(p))),
            Err(e) => {
                self.check_alive().await?;
                Err(EnvError::caused(
                    format!(
                        "cannot start `{}` on {node} (pod {}/{node}): {e}",
                        argv.join(" "),
                        self.namespace
                    ),
                    e,
                ))
            }
        }
    }
}

/// The subnet's pod, as a place to run path ③'s helpers.
pub struct PodRunner {
    pods: Api<Pod>,
    namespace: String,
    pod: String,
    /// The run's allowance for captured output (the run's, shared with its lab nodes).
    budget: Arc<capture::Budget>,
}

#[async_trait]
impl Runner for PodRunner {
    fn describe(&self) -> String {
        format!("pod {}/{}", self.namespace, self.pod)
    }
    async fn exec(&self, cmd: &Cmd, timeout: Duration) -> Result<ExecOutput, EnvError> {
        exec::run(&self.pods, &self.pod, cmd, timeout, false, &self.budget)
            .await
            .map_err(|e| {
                let what = format!(
                    "cannot run `{}` in {}: {e}",
                    cmd.argv.join(" "),
                    self.describe()
                );
                EnvError::caused(what, e)
            })
    }
    async fn spawn(&self, argv: &[String], log: &Path) -> Result<Background, EnvError> {
        let p = exec::spawn(&self.pods, &self.pod, argv, log, false, self.budget.clone())
            .await
            .map_err(|e| {
                let what = format!(
                    "cannot start `{}` in {}: {e}",
                    argv.join(" "),
                    self.describe()
                );
                EnvError::caused(what, e)
            })?;
        Ok(Background::remote(p.pid(), Box::new(p)))
    }
}

/// `doctor`'s rows: the configuration, the server, each node's kernel, RDMA resources and
/// whether Soft-RoCE could serve pods there, and whether the lab image is on the nodes.
pub fn doctor_rows() -> Vec<Check> {
    let mut rows = Vec::new();
    let how = match cluster::configured() {
        Ok(how) => how,
        Err(why) => {
            rows.push(row(Mark::Info, "cluster", why));
            return rows;
        }
    };
    rows.push(row(Mark::Ok, "cluster config", how));
    let s = settings::get();
    let probe = s.clone();
    let probed = iblab_sys::runtime::blocking(move || async move {
        let c = cluster::connect(&probe).await?;
        cluster::facts(&c).await
    });
    let facts = match probed {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => {
            rows.push(row(Mark::Fail, "cluster", e.to_string()));
            return rows;
        }
        Err(e) => {
            rows.push(row(Mark::Fail, "cluster", e.to_string()));
            return rows;
        }
    };
    rows.push(row(
        Mark::Ok,
        "server",
        format!("Kubernetes {}", facts.version),
    ));
    for n in &facts.nodes {
        rows.push(row(
            if n.ready { Mark::Ok } else { Mark::Fail },
            "node",
            format!(
                "{} {}, kernel {} (rxe per namespace needs ≥ 7.1: {}; labelled {}=true for \
                 path ②'s pods: {}), RDMA resources advertised: {}, allocatable: {}",
                n.name,
                if n.ready { "Ready" } else { "not Ready" },
                n.kernel,
                if kernel_at_least(&n.kernel, (7, 1)) {
                    "yes"
                } else {
                    "no"
                },
                manifest::label::RXE_PER_NETNS,
                if n.rxe_per_netns() { "yes" } else { "no" },
                resources_in_words(&n.rdma_capacity),
                resources_in_words(&n.rdma_resources),
            ),
        ));
        let has = cluster::has_image(&n.images, &s.image);
        rows.push(row(
            if has { Mark::Ok } else { Mark::Fail },
            "lab image",
            if has {
                format!("{} on {}", s.image, n.name)
            } else {
                format!(
                    "{} not on {} → `docker save {0} -o lab.tar && kube/cluster import lab.tar` (test cluster), \
                     `kind load docker-image {0}` (kind), or a registry and IBLAB_IMAGE",
                    s.image, n.name
                )
            },
        ));
        let has = cluster::has_image(&n.images, &s.iblab_image);
        rows.push(row(
            if has { Mark::Ok } else { Mark::Warn },
            "iblab image",
            if has {
                format!(
                    "{} on {} (iblab in lab pods: path ①'s latency test, {{{{ iblab }}}})",
                    s.iblab_image, n.name
                )
            } else {
                format!(
                    "{} not on {}: labs that run iblab in their nodes (path ①'s latency test, \
                     `{{{{ iblab }}}}`) cannot start there → `iblab image build --operator`, then \
                     as for the lab image, or a registry and IBLAB_OPERATOR_IMAGE",
                    s.iblab_image, n.name
                )
            },
        ));
    }
    rows.push(network_policy_row(&s));
    rows
}

/// Whether the cluster enforces NetworkPolicy, probed (two short-lived pods of iblab's
/// image and a policy, in the configured namespace, else in a namespace made for the probe
/// and removed after it): what isolates one student's lab pods from another's, and lab
/// pods from the API server.
fn network_policy_row(s: &Settings) -> Check {
    let s = s.clone();
    let asked = iblab_sys::runtime::blocking(move || async move {
        let c = cluster::connect(&s).await?;
        let (ns, made) = match &s.namespace {
            Some(ns) => (ns.clone(), false),
            None => {
                let ns = format!("iblab-netpol-probe-{}", iblab_sys::state::new_run_id());
                let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(c.clone());
                let obj = k8s_openapi::api::core::v1::Namespace {
                    metadata: kube::api::ObjectMeta {
                        name: Some(ns.clone()),
                        labels: Some(BTreeMap::from([(
                            "app.kubernetes.io/managed-by".to_string(),
                            "iblab".to_string(),
                        )])),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                api.create(&kube::api::PostParams::default(), &obj)
                    .await
                    .map_err(|e| {
                        EnvError::caused(format!("cannot make a namespace for the probe: {e}"), e)
                    })?;
                (ns, true)
            }
        };
        let found = iblab_k8s::netpol::probe(
            &c,
            &ns,
            &s.iblab_image,
            &s.iblab_pull_policy,
            &iblab_sys::state::new_run_id(),
        )
        .await;
        if made {
            let _ = iblab_k8s::sweep::remove_namespace(&c, &ns).await;
        }
        Ok::<_, EnvError>((found.clone(), found.describe()))
    });
    use iblab_k8s::netpol::Enforcement;
    match asked {
        Ok(Ok((Enforcement::Enforced, line))) => row(Mark::Ok, "NetworkPolicy", line),
        Ok(Ok((Enforcement::NotEnforced(_), line))) => row(Mark::Fail, "NetworkPolicy", line),
        Ok(Ok((Enforcement::Unknown(_), line))) => row(Mark::Warn, "NetworkPolicy", line),
        Ok(Err(e)) => row(Mark::Warn, "NetworkPolicy", format!("unknown: {e}")),
        Err(e) => row(Mark::Warn, "NetworkPolicy", format!("unknown: {e}")),
    }
}

fn resources_in_words(r: &[(String, String)]) -> String {
    if r.is_empty() {
        "none".into()
    } else {
        r.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Is a kernel release (`6.18.44-fc-v1045`, `7.2.13+deb14-amd64`) at least `want`?
pub fn kernel_at_least(release: &str, want: (u32, u32)) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    (major, minor) >= want
}

fn row(mark: Mark, name: &'static str, text: impl Into<String>) -> Check {
    Check {
        name,
        mark,
        text: text.into(),
    }
}

#[cfg(test)]
mod loss_tests {
    use super::*;

    fn said(code: i32, stderr: &str) -> ExecOutput {
        ExecOutput::exited(code, stderr)
    }

    #[test]
    fn the_netem_probe_tells_netem_nftables_or_nothing() {
        assert_eq!(loss_from_probe(&said(0, "")), Some(LossMechanism::Netem));
        // What tc said on this project's host kernel (6.18, built without sch_netem).
        assert_eq!(
            loss_from_probe(&said(2, "Error: Specified qdisc kind is unknown.\n")),
            Some(LossMechanism::NftRandomDrop)
        );
        // Refused for another reason: the probe cannot tell, the plan's choice stands.
        assert_eq!(
            loss_from_probe(&said(2, "RTNETLINK answers: Operation not permitted\n")),
            None
        );
    }
}

#[cfg(test)]
mod create_tests {
    use super::*;
    use kube::core::Status;

    /// The API server's refusal of a pod in a namespace made a moment ago (the
    /// ServiceAccount admission plugin's words), and refusals that are not that.
    #[test]
    fn only_a_missing_service_account_is_waited_for() {
        let pending = Status::failure(
            "pods \"a\" is forbidden: error looking up service account iblab-r1/default: \
             serviceaccount \"default\" not found",
            "Forbidden",
        )
        .with_code(403);
        assert!(awaiting_service_account(&pending));
        let rbac = Status::failure(
            "pods is forbidden: User \"alice\" cannot create resource \"pods\" in API group \"\" \
             in the namespace \"iblab-r1\"",
            "Forbidden",
        )
        .with_code(403);
        assert!(!awaiting_service_account(&rbac));
        let quota = Status::failure(
            "pods \"a\" is forbidden: exceeded quota: q, requested: requests.cpu=1",
            "Forbidden",
        )
        .with_code(403);
        assert!(!awaiting_service_account(&quota));
        let invalid = Status::failure("serviceaccount name is invalid", "Invalid").with_code(422);
        assert!(!awaiting_service_account(&invalid));
    }
}
