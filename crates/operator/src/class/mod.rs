//! A class in one step: a class file (a lab and its students) becomes, per student, a
//! namespace with a quota, a Role that lets that student read and enter only their own
//! lab, and a LabRun; its summary is the class's verdicts as a table, JSON or JUnit.

pub mod apply;
pub mod summary;

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation,
};
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota, ResourceQuotaSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::ObjectMeta;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use iblab_k8s::crd::{LabRun, LabRunSpec};
use iblab_lab::PathKind;

/// The field manager of what `iblab class` applies.
pub const MANAGER: &str = "iblab-class";
/// Labels on every object a class makes.
pub const CLASS_LABEL: &str = "iblab.dev/class";
pub const STUDENT_LABEL: &str = "iblab.dev/student";
pub use iblab_k8s::manifest::POD_SECURITY;

/// A class file.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Class {
    /// Always `iblab.dev/v1`.
    pub api_version: String,
    /// Always `Class`.
    pub kind: String,
    pub metadata: ClassMeta,
    pub spec: ClassSpec,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClassMeta {
    /// `[a-z0-9-]`: each student's namespace is `<class>-<student>`.
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClassSpec {
    /// A `Lab` object's name or a built-in lab.
    pub lab: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paths: Option<Vec<PathKind>>,
    /// Retries after an environment error, per run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    /// The students: each a Kubernetes user name (what the cluster's authentication
    /// calls them), `[a-z0-9-]`.
    pub students: Vec<String>,
    /// Each namespace's ResourceQuota (default: 16 pods, 32 ConfigMaps).
    #[serde(default)]
    pub quota: Quota,
    /// The operator that runs the class's LabRuns: each student namespace binds its
    /// ClusterRole for lab rights to its ServiceAccount (the chart's defaults, release
    /// `iblab` in `iblab-system`, unless set).
    #[serde(default)]
    pub operator: OperatorRef,
}

/// The operator a class's namespaces grant lab rights to.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OperatorRef {
    /// `NAMESPACE/NAME` of its ServiceAccount (the chart's `<release>-operator` in the
    /// release's namespace).
    #[serde(default = "default_operator_sa")]
    pub service_account: String,
    /// The ClusterRole of its lab rights (the chart's `<release>-lab`, made with
    /// `operator.labRights=perNamespace`).
    #[serde(default = "default_operator_role")]
    pub cluster_role: String,
}

fn default_operator_sa() -> String {
    "iblab-system/iblab-operator".into()
}
fn default_operator_role() -> String {
    "iblab-lab".into()
}

impl Default for OperatorRef {
    fn default() -> OperatorRef {
        OperatorRef {
            service_account: default_operator_sa(),
            cluster_role: default_operator_role(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Quota {
    #[serde(default = "default_pods")]
    pub pods: u32,
    #[serde(default = "default_config_maps")]
    pub config_maps: u32,
    /// e.g. `4` (cores, over every pod's requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// e.g. `4Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
}

fn default_pods() -> u32 {
    16
}
fn default_config_maps() -> u32 {
    32
}

impl Default for Quota {
    fn default() -> Quota {
        Quota {
            pods: default_pods(),
            config_maps: default_config_maps(),
            cpu: None,
            memory: None,
        }
    }
}

fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// What is wrong with a class file (each says how to fix it), or why its objects could not
/// be written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Not YAML of a class's shape.
    #[error("{file}: {source}")]
    Yaml {
        file: String,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    /// A field's value is not allowed: which, and what it must be.
    #[error("{file}: {what}")]
    Invalid { file: String, what: String },
    #[error("cannot write an object: {0}")]
    Write(#[source] serde_saphyr::ser::Error),
}

impl Class {
    /// Read and check a class file; an error says what is wrong and how to fix it.
    pub fn load(path: &std::path::Path) -> Result<Class, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Class::parse(&text, &path.display().to_string())
    }

    pub fn parse(text: &str, name: &str) -> Result<Class, Error> {
        let c: Class = serde_saphyr::from_str(text).map_err(|source| Error::Yaml {
            file: name.to_string(),
            source: Box::new(source),
        })?;
        let bad = |what: String| {
            Err(Error::Invalid {
                file: name.to_string(),
                what,
            })
        };
        if c.api_version != iblab_lab::API_VERSION || c.kind != "Class" {
            return bad(format!(
                "expected apiVersion {} and kind Class, found {} {}",
                iblab_lab::API_VERSION,
                c.api_version,
                c.kind
            ));
        }
        if !dns_label(&c.metadata.name) {
            return bad(format!(
                "metadata.name `{}` must be lowercase letters, digits and dashes",
                c.metadata.name
            ));
        }
        let sa = c.spec.operator.service_account.split_once('/');
        if !sa.is_some_and(|(ns, n)| dns_label(ns) && !n.is_empty() && n.len() <= 253) {
            return bad(format!(
                "spec.operator.serviceAccount `{}` must be NAMESPACE/NAME (the chart's is <release namespace>/<release>-operator)",
                c.spec.operator.service_account
            ));
        }
        if c.spec.operator.cluster_role.is_empty() {
            return bad("spec.operator.clusterRole is empty (the chart's is <release>-lab)".into());
        }
        if c.spec.students.is_empty() {
            return bad("spec.students is empty: name at least one student".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for s in &c.spec.students {
            let ns = c.namespace_of(s);
            if !dns_label(s) || ns.len() > 63 {
                return bad(format!(
                    "student `{s}` must be lowercase letters, digits and dashes, and \
                     `<class>-<student>` at most 63 characters (a namespace name)"
                ));
            }
            if !seen.insert(s) {
                return bad(format!("student `{s}` is listed twice"));
            }
        }
        Ok(c)
    }

    pub fn namespace_of(&self, student: &str) -> String {
        format!("{}-{student}", self.metadata.name)
    }

    fn labels(&self, student: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (CLASS_LABEL.into(), self.metadata.name.clone()),
            (STUDENT_LABEL.into(), student.into()),
            ("app.kubernetes.io/managed-by".into(), MANAGER.into()),
        ])
    }

    fn meta(&self, student: &str, name: &str, namespaced: bool) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: namespaced.then(|| self.namespace_of(student)),
            labels: Some(self.labels(student)),
            ..Default::default()
        }
    }

    /// The name of the class's admission policy and its binding (cluster-wide objects).
    pub fn policy_name(&self) -> String {
        format!("iblab-class-{}", self.metadata.name)
    }

    /// What a student may change on their LabRun: the re-run annotation, and nothing else.
    /// Their Role lets them `patch` LabRuns (RBAC cannot narrow a patch to one field); this
    /// admission policy refuses any update by one of the class's students that touches the
    /// spec (the lab, scenario, paths, retries), the finalizers, the labels, the owner
    /// references, or any other annotation. The operator and the teacher are not students: their updates pass.
    /// The same policy lets a student into a lab pod's shell container only (`pods/exec`
    /// and `pods/attach` are CONNECT requests whose object names the container): the
    /// other one is where iblab runs and measures.
    pub fn policy(&self) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
        let name = self.policy_name();
        let meta = || ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([
                (CLASS_LABEL.into(), self.metadata.name.clone()),
                ("app.kubernetes.io/managed-by".into(), MANAGER.into()),
            ])),
            ..Default::default()
        };
        let students = self
            .spec
            .students
            .iter()
            .map(|s| format!("'{s}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let rerun = crate::operator::RERUN;
        let (shell, node) = (iblab_k8s::manifest::SHELL, iblab_k8s::manifest::CONTAINER);
        // Each check is about one kind of request: the LabRun's updates, or entering a pod.
        let check = |expression: String, message: &str| Validation {
            expression: format!("request.resource.resource != 'labruns' || ({expression})"),
            message: Some(message.into()),
            reason: Some("Forbidden".into()),
            ..Default::default()
        };
        let ann = |o: &str| format!("{o}.metadata.?annotations.orValue({{}})");
        let policy = ValidatingAdmissionPolicy {
            metadata: meta(),
            spec: Some(ValidatingAdmissionPolicySpec {
                failure_policy: Some("Fail".into()),
                match_constraints: Some(MatchResources {
                    resource_rules: Some(vec![
                        NamedRuleWithOperations {
                            api_groups: Some(vec!["iblab.dev".into()]),
                            api_versions: Some(vec!["*".into()]),
                            operations: Some(vec!["UPDATE".into()]),
                            resources: Some(vec!["labruns".into()]),
                            ..Default::default()
                        },
                        NamedRuleWithOperations {
                            api_groups: Some(vec!["".into()]),
                            api_versions: Some(vec!["v1".into()]),
                            operations: Some(vec!["CONNECT".into()]),
                            resources: Some(vec!["pods/exec".into(), "pods/attach".into()]),
                            ..Default::default()
                        },
                    ]),
                    ..Default::default()
                }),
                match_conditions: Some(vec![MatchCondition {
                    name: "by-a-student-of-the-class".into(),
                    expression: format!("request.userInfo.username in [{students}]"),
                }]),
                validations: Some(vec![
                    check(
                        "object.spec == oldObject.spec".into(),
                        "a student may not change a LabRun's spec (ask the teacher)",
                    ),
                    check(
                        "object.metadata.?finalizers.orValue([]) == oldObject.metadata.?finalizers.orValue([])".into(),
                        "a student may not change a LabRun's finalizers",
                    ),
                    check(
                        "object.metadata.?labels.orValue({}) == oldObject.metadata.?labels.orValue({})".into(),
                        "a student may not change a LabRun's labels",
                    ),
                    check(
                        "object.metadata.?ownerReferences.orValue([]) == oldObject.metadata.?ownerReferences.orValue([])".into(),
                        "a student may not change a LabRun's owners (garbage collection would take it with an owner that is not there)",
                    ),
                    check(
                        format!(
                            "{new}.all(k, k == '{rerun}' || (k in {old} && {old}[k] == {new}[k])) \
                             && {old}.all(k, k == '{rerun}' || k in {new})",
                            new = ann("object"),
                            old = ann("oldObject"),
                        ),
                        &format!("a student may change only the {rerun} annotation of a LabRun"),
                    ),
                    // Into a lab pod's shell only: what measures is in the other container.
                    Validation {
                        expression: format!(
                            "request.resource.resource != 'pods' || \
                             (has(object.container) && object.container == '{shell}')"
                        ),
                        message: Some(format!(
                            "a student may enter a lab pod's {shell} container only (kubectl \
                             exec POD -- …, or -c {shell}): iblab measures in the {node} \
                             container, which no student may touch"
                        )),
                        reason: Some("Forbidden".into()),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let binding = ValidatingAdmissionPolicyBinding {
            metadata: meta(),
            spec: ValidatingAdmissionPolicyBindingSpec {
                policy_name: name.clone(),
                validation_actions: vec!["Deny".into()],
                match_resources: Some(MatchResources {
                    namespace_selector: Some(LabelSelector {
                        match_labels: Some(BTreeMap::from([(
                            CLASS_LABEL.into(),
                            self.metadata.name.clone(),
                        )])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        };
        (policy, binding)
    }

    /// Everything one student gets, in the order it is applied.
    pub fn objects(&self, student: &str) -> StudentObjects {
        let ns_name = self.namespace_of(student);
        let namespace = iblab_k8s::manifest::lab_namespace(&ns_name, self.labels(student));
        let q = &self.spec.quota;
        let mut hard = BTreeMap::from([
            ("pods".to_string(), Quantity(q.pods.to_string())),
            (
                "configmaps".to_string(),
                Quantity(q.config_maps.to_string()),
            ),
        ]);
        if let Some(c) = &q.cpu {
            hard.insert("requests.cpu".into(), Quantity(c.clone()));
        }
        if let Some(m) = &q.memory {
            hard.insert("requests.memory".into(), Quantity(m.clone()));
        }
        let quota = ResourceQuota {
            metadata: self.meta(student, "iblab-class", true),
            spec: Some(ResourceQuotaSpec {
                hard: Some(hard),
                ..Default::default()
            }),
            ..Default::default()
        };
        let rule = |groups: &[&str], resources: &[&str], verbs: &[&str]| PolicyRule {
            api_groups: Some(groups.iter().map(|s| s.to_string()).collect()),
            resources: Some(resources.iter().map(|s| s.to_string()).collect()),
            verbs: verbs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let role = Role {
            metadata: self.meta(student, "iblab-student", true),
            rules: Some(vec![
                // Read their lab's pods and logs, and enter them (`kubectl exec`).
                rule(&[""], &["pods", "pods/log"], &["get", "list", "watch"]),
                rule(&[""], &["pods/exec"], &["create", "get"]),
                // The evidence ConfigMap, and the run's anchor.
                rule(&[""], &["configmaps"], &["get", "list"]),
                rule(&[""], &["events"], &["get", "list", "watch"]),
                // Their LabRun: read it, and ask for a re-run (the iblab.dev/rerun annotation).
                rule(
                    &["iblab.dev"],
                    &["labruns"],
                    &["get", "list", "watch", "patch"],
                ),
            ]),
        };
        let binding = RoleBinding {
            metadata: self.meta(student, "iblab-student", true),
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "Role".into(),
                name: "iblab-student".into(),
            },
            subjects: Some(vec![Subject {
                kind: "User".into(),
                name: student.into(),
                api_group: Some("rbac.authorization.k8s.io".into()),
                ..Default::default()
            }]),
        };
        // Where the operator may make this student's lab: this namespace only.
        let (sa_ns, sa_name) = self
            .spec
            .operator
            .service_account
            .split_once('/')
            .unwrap_or_default();
        let operator = RoleBinding {
            metadata: self.meta(student, "iblab-operator", true),
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "ClusterRole".into(),
                name: self.spec.operator.cluster_role.clone(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: sa_name.into(),
                namespace: Some(sa_ns.into()),
                ..Default::default()
            }]),
        };
        let mut run = LabRun::new(
            &self.spec.lab,
            LabRunSpec {
                lab: self.spec.lab.clone(),
                scenario: self.spec.scenario.clone(),
                paths: self.spec.paths.clone(),
                student: Some(student.into()),
                retries: self.spec.retries,
            },
        );
        run.metadata = self.meta(student, &self.spec.lab, true);
        StudentObjects {
            namespace,
            quota,
            role,
            binding,
            operator,
            run,
        }
    }
}

/// One student's objects.
pub struct StudentObjects {
    pub namespace: Namespace,
    pub quota: ResourceQuota,
    pub role: Role,
    pub binding: RoleBinding,
    /// The operator's lab rights in this namespace.
    pub operator: RoleBinding,
    pub run: LabRun,
}

impl StudentObjects {
    /// As one YAML stream (`iblab class render`).
    pub fn to_yaml(&self) -> Result<String, Error> {
        let mut out = String::new();
        let mut add = |v: Result<String, serde_saphyr::ser::Error>| -> Result<(), Error> {
            out.push_str("---\n");
            out.push_str(&v.map_err(Error::Write)?);
            Ok(())
        };
        add(serde_saphyr::to_string(&with_kind(
            &self.namespace,
            "v1",
            "Namespace",
        )))?;
        add(serde_saphyr::to_string(&with_kind(
            &self.quota,
            "v1",
            "ResourceQuota",
        )))?;
        add(serde_saphyr::to_string(&with_kind(
            &self.role,
            "rbac.authorization.k8s.io/v1",
            "Role",
        )))?;
        add(serde_saphyr::to_string(&with_kind(
            &self.binding,
            "rbac.authorization.k8s.io/v1",
            "RoleBinding",
        )))?;
        add(serde_saphyr::to_string(&with_kind(
            &self.operator,
            "rbac.authorization.k8s.io/v1",
            "RoleBinding",
        )))?;
        add(serde_saphyr::to_string(&self.run))?;
        Ok(out)
    }
}

/// k8s-openapi's types serialize their apiVersion and kind; kept explicit for any type.
fn with_kind<T: Serialize>(o: &T, api_version: &str, kind: &str) -> serde_json::Value {
    let mut v = serde_json::to_value(o).unwrap_or_default();
    v["apiVersion"] = api_version.into();
    v["kind"] = kind.into();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLASS: &str = "apiVersion: iblab.dev/v1
kind: Class
metadata: {name: rdma101}
spec:
  lab: lesson4
  paths: [tcp, ib]
  students: [alice, bob]
";

    /// `class apply` takes over only namespaces it made itself, for the same class and
    /// student; any other namespace of that name is refused, named.
    #[test]
    fn a_namespace_the_class_did_not_make_is_refused() {
        let c = Class::parse(CLASS, "class.yaml").unwrap();
        let ours = c.objects("alice").namespace;
        assert_eq!(apply::not_ours(&c, "alice", &ours), None);
        // Bob's namespace is not Alice's, and a bare one of the same name is nobody's.
        assert!(apply::not_ours(&c, "bob", &ours).is_some());
        let mut bare = Namespace::default();
        bare.metadata.name = Some("rdma101-alice".into());
        let why = apply::not_ours(&c, "alice", &bare).unwrap();
        assert!(
            why.contains("rdma101-alice") && why.contains("nothing was applied"),
            "{why}"
        );
        // Another class's namespace of the same name is not this class's.
        let other = Class::parse(&CLASS.replace("rdma101", "rdma102"), "c.yaml").unwrap();
        let mut theirs = other.objects("alice").namespace;
        theirs.metadata.name = Some("rdma101-alice".into());
        assert!(apply::not_ours(&c, "alice", &theirs).is_some());
    }

    #[test]
    fn each_student_gets_a_namespace_a_quota_a_role_and_a_run() {
        let c = Class::parse(CLASS, "class.yaml").unwrap();
        let o = c.objects("alice");
        assert_eq!(o.namespace.metadata.name.as_deref(), Some("rdma101-alice"));
        let labels = o.namespace.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["pod-security.kubernetes.io/enforce"], "privileged");
        assert_eq!(o.run.metadata.namespace.as_deref(), Some("rdma101-alice"));
        assert_eq!(o.run.spec.student.as_deref(), Some("alice"));
        assert_eq!(
            o.run.spec.paths.as_deref(),
            Some(&[PathKind::Tcp, PathKind::Ib][..])
        );
        let subject = &o.binding.subjects.as_ref().unwrap()[0];
        assert_eq!(
            (subject.kind.as_str(), subject.name.as_str()),
            ("User", "alice")
        );
        // Nothing in the student's Role reaches beyond their namespace or writes pods.
        for r in o.role.rules.as_ref().unwrap() {
            let res = r.resources.as_ref().unwrap();
            if res.contains(&"pods".to_string()) {
                assert!(!r.verbs.iter().any(|v| v == "create" || v == "delete"));
            }
        }
        // The operator's lab rights: the chart's ClusterRole, bound in this namespace only.
        let op = &o.operator;
        assert_eq!(op.metadata.namespace.as_deref(), Some("rdma101-alice"));
        assert_eq!(
            (op.role_ref.kind.as_str(), op.role_ref.name.as_str()),
            ("ClusterRole", "iblab-lab")
        );
        let sa = &op.subjects.as_ref().unwrap()[0];
        assert_eq!(
            (sa.kind.as_str(), sa.name.as_str(), sa.namespace.as_deref()),
            ("ServiceAccount", "iblab-operator", Some("iblab-system"))
        );
        let yaml = o.to_yaml().unwrap();
        assert_eq!(yaml.matches("---\n").count(), 6);
        assert_eq!(yaml.matches("kind: RoleBinding").count(), 2);
    }

    /// The class's policy is asked about a student's `kubectl exec` too, and every check
    /// about a LabRun stands aside for it (CEL on a PodExecOptions has no spec to read).
    #[test]
    fn students_enter_only_the_shell() {
        let c = Class::parse(CLASS, "class.yaml").unwrap();
        let spec = c.policy().0.spec.unwrap();
        let rules = spec.match_constraints.unwrap().resource_rules.unwrap();
        assert!(rules.iter().any(|r| {
            r.operations.as_deref() == Some(&["CONNECT".to_string()][..])
                && r.resources
                    .as_ref()
                    .is_some_and(|v| v.contains(&"pods/exec".to_string()))
        }));
        let checks = spec.validations.unwrap();
        let (pods, runs): (Vec<_>, Vec<_>) = checks.iter().partition(|v| {
            v.expression
                .starts_with("request.resource.resource != 'pods'")
        });
        assert_eq!(pods.len(), 1);
        assert!(pods[0].expression.contains(&format!(
            "object.container == '{}'",
            iblab_k8s::manifest::SHELL
        )));
        assert!(
            runs.iter().all(|v| v
                .expression
                .starts_with("request.resource.resource != 'labruns' || (")),
            "{runs:?}"
        );
    }

    #[test]
    fn a_class_names_the_operator_it_grants_lab_rights_to() {
        let c = Class::parse(
            &format!("{CLASS}  operator: {{serviceAccount: ops/iblab-x-operator, clusterRole: iblab-x-lab}}\n"),
            "c.yaml",
        )
        .unwrap();
        let op = c.objects("bob").operator;
        assert_eq!(op.role_ref.name, "iblab-x-lab");
        let sa = &op.subjects.as_ref().unwrap()[0];
        assert_eq!(
            (sa.name.as_str(), sa.namespace.as_deref()),
            ("iblab-x-operator", Some("ops"))
        );
        let e = Class::parse(
            &format!("{CLASS}  operator: {{serviceAccount: no-namespace}}\n"),
            "c.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("NAMESPACE/NAME"), "{e}");
    }

    #[test]
    fn bad_class_files_say_what_to_fix() {
        let e = Class::parse(&CLASS.replace("bob", "Bob"), "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("student `Bob`"), "{e}");
        let e = Class::parse(&CLASS.replace("[alice, bob]", "[alice, alice]"), "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("listed twice"), "{e}");
        let e = Class::parse(&CLASS.replace("kind: Class", "kind: Klass"), "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("kind Class"), "{e}");
        let e = Class::parse(
            &CLASS.replace("lab: lesson4", "lab: lesson4\n  labz: x"),
            "c.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("labz"), "{e}");
    }
}
