//! iblab's custom resources: `Lab` (a lab definition, cluster-wide) and `LabRun` (one run
//! of a lab, for someone, in a namespace). Their OpenAPI schemas are derived from the
//! same Rust types as `iblab schema` (the lab file's), made structural.

pub mod structural;

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceValidation, JSONSchemaProps,
};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use iblab_lab::{Lang, PathKind, Text};

/// A lab definition as a Kubernetes object: a lab file's `spec`, with the lab's title,
/// lesson and goal beside it (Kubernetes' metadata has no room for them). Its name is the
/// lab's name.
#[derive(CustomResource, Debug, Clone, Serialize, Deserialize, PartialEq)]
#[kube(
    group = "iblab.dev",
    version = "v1",
    kind = "Lab",
    root = "LabObject",
    schema = "disabled",
    printcolumn = r#"{"name":"Lesson","type":"integer","jsonPath":".spec.lesson"}"#,
    printcolumn = r#"{"name":"Title","type":"string","jsonPath":".spec.title.en"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct LabDefinition {
    /// In every language the lab writes it (`{zh-CN: …, en: …}`), or a string in
    /// `language`.
    pub title: Text,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lesson: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goal: Option<Text>,
    /// The language of the lab's plain strings (`en` unless it says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<Lang>,
    /// The rest of the lab file's spec (topology, paths, steps, expect, …), checked by
    /// iblab's own validator when it is run.
    #[serde(flatten)]
    pub body: BTreeMap<String, Value>,
}

/// Why a Lab object and a lab file could not be made of each other, or the CRDs written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot write lab {name} as YAML: {source}")]
    LabYaml {
        name: String,
        #[source]
        source: serde_saphyr::ser::Error,
    },
    #[error("lab {0} has no spec mapping")]
    NoSpec(String),
    #[error("cannot write the CRD: {0}")]
    CrdYaml(#[source] serde_saphyr::ser::Error),
}

impl LabObject {
    /// The lab file this object stands for, as YAML (what `iblab up` loads).
    pub fn to_lab_file(&self) -> Result<String, Error> {
        let name = self.metadata.name.clone().unwrap_or_default();
        let mut metadata = json!({"name": name, "title": self.spec.title});
        if let Some(l) = self.spec.lesson {
            metadata["lesson"] = json!(l);
        }
        if let Some(g) = &self.spec.goal {
            metadata["goal"] = json!(g);
        }
        if let Some(l) = self.spec.language {
            metadata["language"] = json!(l);
        }
        let doc = json!({
            "apiVersion": iblab_lab::API_VERSION,
            "kind": "Lab",
            "metadata": metadata,
            "spec": self.spec.body,
        });
        serde_saphyr::to_string(&doc).map_err(|source| Error::LabYaml { name, source })
    }

    /// The object for a lab file (`iblab crd --labs` writes the built-in labs so).
    pub fn from_lab(lab: &iblab_lab::Lab) -> Result<LabObject, Error> {
        let body = match serde_json::to_value(&lab.spec) {
            Ok(Value::Object(m)) => m.into_iter().collect(),
            Ok(_) | Err(_) => return Err(Error::NoSpec(lab.metadata.name.clone())),
        };
        let mut o = LabObject::new(
            &lab.metadata.name,
            LabDefinition {
                title: lab.metadata.title.clone(),
                lesson: lab.metadata.lesson,
                goal: lab.metadata.goal.clone(),
                language: lab.metadata.language,
                body,
            },
        );
        o.metadata.labels = Some(BTreeMap::from([(
            "app.kubernetes.io/managed-by".to_string(),
            "iblab".to_string(),
        )]));
        Ok(o)
    }
}

/// One run of a lab: which lab, scenario and paths, for whom. The operator runs it and
/// writes its verdict into the status.
#[derive(CustomResource, Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "iblab.dev",
    version = "v1",
    kind = "LabRun",
    namespaced,
    status = "LabRunStatus",
    shortname = "lr",
    schema = "disabled",
    printcolumn = r#"{"name":"Lab","type":"string","jsonPath":".spec.lab"}"#,
    printcolumn = r#"{"name":"Scenario","type":"string","jsonPath":".spec.scenario"}"#,
    printcolumn = r#"{"name":"Student","type":"string","jsonPath":".spec.student","priority":1}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Verdict","type":"string","jsonPath":".status.verdict"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct LabRunSpec {
    /// A `Lab` object's name, else a built-in lab (`iblab list`), e.g. `lesson4`.
    pub lab: String,
    /// The scenario (default: the lab as written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<String>,
    /// Only these paths of the comparison (default: the lab's own that the cluster can
    /// carry is not guessed: a path it cannot carry fails the run, as `iblab up` does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paths: Option<Vec<PathKind>>,
    /// Whom the run is for (the class tools set it); shown in `kubectl get labruns -o wide`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub student: Option<String>,
    /// How often a run that ended in an environment error (exit 3: a pod that did not
    /// start, a cluster that did not answer) is tried again (default 0, at most 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 5))]
    pub retries: Option<u32>,
}

/// Where a run stands.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum Phase {
    /// Accepted, waiting for a slot (the operator runs a bounded number at once).
    #[default]
    Pending,
    /// Its lab is up and its steps are running.
    Running,
    /// Every expectation held (`iblab up` exit 0).
    Succeeded,
    /// An expectation or a step failed (exit 1): the lesson's claim did not show.
    Failed,
    /// The run could not be judged: bad input (exit 2), the environment (exit 3), an
    /// interruption (130).
    Error,
}

impl Phase {
    pub fn finished(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed | Phase::Error)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
            Phase::Error => "Error",
        }
    }
}

/// What a learner and a teacher read of a finished run, sized for an object's status:
/// the full evidence is in the ConfigMap `evidence` names.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LabRunStatus {
    #[serde(default)]
    pub phase: Phase,
    /// `pass`, `fail`, `error` or `interrupted` (the evidence's own verdict).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// `iblab up`'s exit code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// In words: why it waits, what failed, where to look.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The run's id (`iblab.dev/run` label on its pods).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Where the lab came from: `Lab/NAME` or `builtin/NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lab_source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Runs started for the current generation (retries included).
    #[serde(default)]
    pub attempts: u32,
    /// The generation (and re-run request) this status is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The `iblab.dev/rerun` annotation's value this status is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_rerun: Option<String>,
    /// Each expectation's verdict with what the learner reads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expectations: Vec<ExpectationStatus>,
    /// The lab's comparison rows (values as text, with their provenance).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub comparison: Vec<ComparisonStatus>,
    /// Where the figures were measured, and who could have moved them there: iblab
    /// measures in each lab pod's `node` container, which a class's students may not enter;
    /// from the pod's `shell` container, the only one they may, traffic over the lab's
    /// links can move a network figure, but no tool, output or file can be reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_where: Option<String>,
    /// Where the whole evidence is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<EvidenceRef>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExpectationStatus {
    pub id: String,
    /// `pass`, `fail`, `skipped` or `error`.
    pub verdict: String,
    pub explanation: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ComparisonStatus {
    /// `host` or `network`.
    pub group: String,
    pub row: String,
    /// Per path (`tcp`, `roce`, `ib`): the value with its unit and provenance.
    pub values: BTreeMap<String, String>,
    /// Whether ② and ③ agree by the row's rule (absent: not decided).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roce_equals_ib: Option<bool>,
    /// ② and ③ were measured on one device: they agree by construction, and the row is
    /// not decided here (judged where each has a device of its own).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub same_device: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EvidenceRef {
    /// A ConfigMap in the run's namespace, owned by the LabRun.
    pub config_map: String,
    /// Its keys: `evidence.json`, `junit.xml`, `report.html` (those that fit).
    pub keys: Vec<String>,
    /// Files that did not fit in a ConfigMap (1 MiB in all), kept only in the operator's log.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<String>,
}

/// A type's schema as schemars writes it (draft 2020-12, `$defs`).
fn schema_of<T: JsonSchema>() -> Value {
    serde_json::to_value(schemars::schema_for!(T)).unwrap_or(Value::Null)
}

/// The structural schema of a Lab object's `spec`: the lab file's `spec` with its
/// metadata's title, lesson, goal and language.
fn lab_spec_schema() -> Value {
    let mut spec = structural::structural(&schema_of::<iblab_lab::Spec>());
    let meta = structural::structural(&schema_of::<iblab_lab::Metadata>());
    if let (Some(props), Some(meta_props)) = (
        spec.get_mut("properties").and_then(Value::as_object_mut),
        meta.get("properties").and_then(Value::as_object),
    ) {
        for k in ["title", "lesson", "goal", "language"] {
            if let Some(v) = meta_props.get(k) {
                props.insert(k.into(), v.clone());
            }
        }
    }
    if let Some(r) = spec.get_mut("required").and_then(Value::as_array_mut) {
        r.push(json!("title"));
    }
    spec["description"] = json!(
        "A lab file's spec (see `iblab schema`), with the lab's title, lesson, goal and language."
    );
    spec
}

fn object_schema(spec: Value, status: Option<Value>) -> Value {
    let mut props = serde_json::Map::new();
    props.insert("spec".into(), spec);
    if let Some(s) = status {
        props.insert("status".into(), s);
    }
    json!({"type": "object", "required": ["spec"], "properties": props})
}

fn with_schema(mut crd: CustomResourceDefinition, schema: Value) -> CustomResourceDefinition {
    let props: Option<JSONSchemaProps> = serde_json::from_value(schema).ok();
    for v in &mut crd.spec.versions {
        v.schema = Some(CustomResourceValidation {
            open_api_v3_schema: props.clone(),
        });
    }
    crd
}

/// Both CustomResourceDefinitions, with their structural schemas.
pub fn definitions() -> Vec<CustomResourceDefinition> {
    let lab = with_schema(LabObject::crd(), object_schema(lab_spec_schema(), None));
    let run = with_schema(
        LabRun::crd(),
        object_schema(
            structural::structural(&schema_of::<LabRunSpec>()),
            Some(structural::structural(&schema_of::<LabRunStatus>())),
        ),
    );
    vec![lab, run]
}

/// `iblab crd`: both definitions as one YAML stream.
pub fn render() -> Result<String, Error> {
    let mut out = String::new();
    for d in definitions() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&d).map_err(Error::CrdYaml)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_schemas_are_structural() {
        for d in definitions() {
            let v = serde_json::to_value(&d.spec.versions[0].schema).unwrap();
            let s = &v["openAPIV3Schema"];
            let found = structural::problems(s);
            assert!(found.is_empty(), "{}: {found:?}", d.spec.names.kind);
        }
    }

    #[test]
    fn the_lab_schema_comes_from_the_lab_types() {
        let s = lab_spec_schema();
        let props = s["properties"].as_object().unwrap();
        for k in ["title", "topology", "paths", "steps", "expect", "scenarios"] {
            assert!(props.contains_key(k), "{k} missing");
        }
        assert_eq!(
            s["properties"]["paths"]["items"]["enum"],
            json!(["tcp", "roce", "ib"])
        );
    }

    #[test]
    fn a_builtin_lab_survives_the_object_and_back() {
        for name in ["lesson4", "tcp-loss", "lesson5"] {
            let loaded = iblab_lab::load::resolve(name).unwrap();
            let obj = LabObject::from_lab(&loaded.lab).unwrap();
            let yaml = obj.to_lab_file().unwrap();
            let again = iblab_lab::load::load_str("object.yaml", &yaml)
                .unwrap_or_else(|e| panic!("{name}: {}", e.render(false)));
            assert_eq!(
                serde_json::to_value(&again.lab.spec).unwrap(),
                serde_json::to_value(&loaded.lab.spec).unwrap(),
                "{name}"
            );
        }
    }

    /// The chart installs the CRDs from `charts/iblab/crds/` (Helm's own rule); they must
    /// be what `iblab crd` prints. `IBLAB_BLESS=1` rewrites the file.
    #[test]
    fn the_charts_crds_are_iblab_crds_output() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../charts/iblab/crds/iblab.dev.yaml");
        let text = render().unwrap();
        if std::env::var_os("IBLAB_BLESS").is_some() {
            std::fs::write(&path, &text).unwrap();
            return;
        }
        let want = std::fs::read_to_string(&path).unwrap();
        assert!(
            text == want,
            "{} differs from `iblab crd`: run `iblab crd > {}` (or IBLAB_BLESS=1 cargo test), \
             then `tests/chart/check --update` for manifests/",
            path.display(),
            path.display()
        );
    }

    #[test]
    fn printer_columns_show_lab_phase_and_verdict() {
        let run = &definitions()[1];
        let cols: Vec<&str> = run.spec.versions[0]
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            cols,
            ["Lab", "Scenario", "Student", "Phase", "Verdict", "Age"]
        );
        assert_eq!(run.spec.scope, "Namespaced");
        assert_eq!(definitions()[0].spec.scope, "Cluster");
    }
}
