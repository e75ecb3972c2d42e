//! Time-slice scheduling in the daemon: read back, plan and apply through the GPU's vendor backend
//! ([`crate::backend`]). Detection runs per call (it reads a few sysfs attributes), so the answer always
//! reflects the host now, including a driver loaded since.

use vgpu_host::discover::discover;

use std::sync::Arc;

use crate::backend::{detect, detect_gpu};
use crate::daemon::api::{CoreError, RequestError};
use crate::sched::{ApplyReport, PlanOptions, SchedPlan, SchedRequest};
use vgpu_client::SchedulingView;
use vgpu_host::Host;

/// The scheduling service: reads, plans and applies through the GPUs' vendor backends.
pub(super) struct Scheduling {
    host: Arc<dyn Host>,
}

impl Scheduling {
    /// The service over `host`.
    pub(super) fn new(host: Arc<dyn Host>) -> Scheduling {
        Scheduling { host }
    }

    /// [`GetScheduling`](crate::daemon::api::GetScheduling): never fails for a GPU
    /// that exists; a GPU without backend, or a read that failed, is a view with a `reason`.
    pub(super) fn get(&self, gpu: &str) -> Result<SchedulingView, CoreError> {
        let inv = discover(self.host.as_ref())?;
        let Some(g) = inv.gpus.iter().find(|g| g.id == gpu) else {
            return Err(RequestError::NoSchedulingGpu {
                gpu: gpu.to_string(),
                host: inv.host.clone(),
            }
            .into());
        };
        let detected = detect(self.host.as_ref(), &inv)?;
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
        Ok(view)
    }

    /// The plan for `requests` on `gpu` (weight 1 for each existing slot when empty).
    fn sched_plan(
        &self,
        gpu: &str,
        requests: &[SchedRequest],
    ) -> Result<(Box<dyn crate::backend::Backend>, SchedPlan), CoreError> {
        let inv = discover(self.host.as_ref())?;
        let b = detect_gpu(self.host.as_ref(), &inv, gpu)?;
        let reqs = if requests.is_empty() {
            b.default_requests()
        } else {
            requests.to_vec()
        };
        if reqs.is_empty() {
            return Err(RequestError::NoVgpuYet {
                gpu: gpu.to_string(),
            }
            .into());
        }
        let plan = b.plan(&reqs, &PlanOptions::default());
        Ok((b, plan))
    }

    /// [`PlanScheduling`](crate::daemon::api::PlanScheduling).
    pub(super) fn plan(
        &self,
        gpu: &str,
        requests: &[SchedRequest],
    ) -> Result<SchedPlan, CoreError> {
        let (_, plan) = self.sched_plan(gpu, requests)?;
        Ok(plan)
    }

    /// [`ApplyScheduling`](crate::daemon::api::ApplyScheduling): refused (nothing
    /// written) when the plan has refusals.
    pub(super) fn apply(
        &self,
        gpu: &str,
        requests: &[SchedRequest],
    ) -> Result<ApplyReport, CoreError> {
        let (b, plan) = self.sched_plan(gpu, requests)?;
        Ok(b.apply(self.host.as_ref(), &plan)?)
    }
}
