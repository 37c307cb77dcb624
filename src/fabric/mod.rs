//! Fabrics: what carries a path. Each sets itself up on the provisioned nodes and moves
//! the data of traffic steps on its path. Adding a fabric touches this folder only.

pub mod ethernet;
pub mod ibsim;
pub mod softroce;

use async_trait::async_trait;

use crate::backend::EnvError;
use crate::evidence::StepRecord;
use crate::lab::{FaultAction, PathKind};
use crate::plan::{Plan, PlannedStep};
use crate::steps::StepCtx;

/// The fabric under one path of the comparison.
#[async_trait]
pub trait Fabric: Send + Sync {
    /// Short name in plans and evidence: `ethernet`, `softroce`, `ibsim`, `hca`.
    fn name(&self) -> &'static str;
    fn path(&self) -> PathKind;
    /// Prepare the fabric on provisioned nodes (devices, a subnet manager, …). Resources
    /// it creates are recorded in the run's state file first.
    async fn setup(&self, _ctx: &mut StepCtx<'_>) -> Result<(), EnvError> {
        Ok(())
    }
    /// Run one traffic step instance on this path.
    async fn traffic(
        &self,
        step: &PlannedStep,
        ctx: &mut StepCtx<'_>,
        at: f64,
    ) -> Result<StepRecord, EnvError>;
    /// Run a step only this fabric knows (a probe, SM control); `None` when not ours.
    async fn control(
        &self,
        _step: &PlannedStep,
        _ctx: &mut StepCtx<'_>,
        _at: f64,
    ) -> Option<Result<StepRecord, EnvError>> {
        None
    }
    /// A fault on a cable: the fabric applies its side of it (e.g. ibsim Unlink for
    /// `down`). Returns what it did, for the evidence.
    async fn link_fault(
        &self,
        _link: &str,
        _action: FaultAction,
        _percent: Option<f64>,
        _ctx: &mut StepCtx<'_>,
    ) -> Result<Vec<serde_json::Value>, EnvError> {
        Ok(vec![])
    }
}

/// The fabrics for the paths a plan runs, in path order.
pub fn for_plan(plan: &Plan) -> Result<Vec<Box<dyn Fabric>>, EnvError> {
    Ok(plan
        .paths
        .iter()
        .map(|p| match p {
            PathKind::Tcp => Box::new(ethernet::Ethernet) as Box<dyn Fabric>,
            PathKind::Roce => Box::new(softroce::SoftRoce::default()) as Box<dyn Fabric>,
            PathKind::Ib => Box::new(ibsim::Ibsim::new(plan)) as Box<dyn Fabric>,
        })
        .collect())
}
