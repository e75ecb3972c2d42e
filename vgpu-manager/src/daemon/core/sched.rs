//! Time-slice scheduling in the daemon: read back, plan and apply through the GPU's vendor backend
//! ([`crate::backend`]). Detection runs per call (it reads a few sysfs attributes), so the answer always
//! reflects the host now, including a driver loaded since.

use vgpu_host::discover::discover;

use super::Core;
use crate::backend::{BackendError, detect, detect_gpu};
use crate::client::SchedulingView;
use crate::daemon::api::{CoreError, Reply};
use crate::sched::{PlanOptions, SchedRequest};

fn backend_error(e: BackendError) -> CoreError {
    match e {
        BackendError::UnknownGpu { .. } => CoreError::Invalid(e.to_string()),
        other => CoreError::State(other.to_string()),
    }
}

fn report<T: serde::Serialize>(what: &str, v: &T) -> Result<Reply, CoreError> {
    serde_json::to_value(v)
        .map(Reply::Report)
        .map_err(|e| CoreError::State(format!("cannot encode the {what}: {e}")))
}

impl Core {
    /// [`Command::GetScheduling`](crate::daemon::api::Command::GetScheduling): never fails for a GPU
    /// that exists; a GPU without backend, or a read that failed, is a view with a `reason`.
    pub(super) fn get_scheduling(&self, gpu: &str) -> Result<Reply, CoreError> {
        let inv = discover(self.host.as_ref())?;
        let Some(g) = inv.gpus.iter().find(|g| g.id == gpu) else {
            return Err(CoreError::Invalid(format!(
                "no GPU {gpu} on {}: `vgpuctl status` lists the GPUs",
                inv.host
            )));
        };
        let detected = detect(self.host.as_ref(), &inv).map_err(backend_error)?;
        let d = detected.into_iter().find(|d| d.gpu == g.id);
        let view = match d.as_ref().and_then(|d| d.backend.as_ref()) {
            Some(b) => match b.read_back(self.host.as_ref()) {
                Ok(state) => SchedulingView {
                    gpu: g.id.clone(),
                    backend: Some(b.kind().to_string()),
                    state: Some(state),
                    reason: None,
                },
                Err(e) => SchedulingView {
                    gpu: g.id.clone(),
                    backend: Some(b.kind().to_string()),
                    state: None,
                    reason: Some(e.to_string()),
                },
            },
            None => SchedulingView {
                gpu: g.id.clone(),
                backend: None,
                state: None,
                reason: Some(
                    d.and_then(|d| d.why_none)
                        .unwrap_or_else(|| "no vGPU backend detected".into()),
                ),
            },
        };
        report("scheduling", &view)
    }

    /// The plan for `requests` on `gpu` (weight 1 for each existing slot when empty).
    fn sched_plan(
        &self,
        gpu: &str,
        requests: &[SchedRequest],
    ) -> Result<(Box<dyn crate::backend::Backend>, crate::sched::SchedPlan), CoreError> {
        let inv = discover(self.host.as_ref())?;
        let b = detect_gpu(self.host.as_ref(), &inv, gpu).map_err(backend_error)?;
        let reqs = if requests.is_empty() {
            b.default_requests()
        } else {
            requests.to_vec()
        };
        if reqs.is_empty() {
            return Err(CoreError::Invalid(format!(
                "{gpu} has no vGPU yet: give one request per vGPU that will run there, e.g. [{{\"weight\":10}},{{\"weight\":30}}]"
            )));
        }
        let plan = b.plan(&reqs, &PlanOptions::default());
        Ok((b, plan))
    }

    /// [`Command::PlanScheduling`](crate::daemon::api::Command::PlanScheduling).
    pub(super) fn plan_scheduling(
        &self,
        gpu: &str,
        requests: &[SchedRequest],
    ) -> Result<Reply, CoreError> {
        let (_, plan) = self.sched_plan(gpu, requests)?;
        report("scheduling plan", &plan)
    }

    /// [`Command::ApplyScheduling`](crate::daemon::api::Command::ApplyScheduling): refused (nothing
    /// written) when the plan has refusals.
    pub(super) fn apply_scheduling(
        &self,
        gpu: &str,
        requests: &[SchedRequest],
    ) -> Result<Reply, CoreError> {
        let (b, plan) = self.sched_plan(gpu, requests)?;
        let applied = b.apply(self.host.as_ref(), &plan).map_err(|e| match e {
            BackendError::UnknownGpu { .. } => CoreError::Invalid(e.to_string()),
            other => CoreError::State(other.to_string()),
        })?;
        report("scheduling report", &applied)
    }
}
