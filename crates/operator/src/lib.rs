//! Labs as Kubernetes objects for platform teams: the operator that runs each LabRun as a
//! child `iblab up` with the kube backend and writes its verdicts into the LabRun's
//! status (`operator`), and a class of students in one step (`class`). They need the lab
//! model, the evidence and the Kubernetes objects; nothing of the other backends.

pub mod class;
pub mod operator;
